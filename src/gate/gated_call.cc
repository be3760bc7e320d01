#include "gate/gated_call.h"

#include <utility>

#include "core/fault_point.h"

namespace idem::gate {
namespace {

Settled StoredOrNot(const Result<Record>& stored) {
  if (stored) return {Settled::Kind::kStored, std::nullopt};
  return {Settled::Kind::kNotStored, stored.error()};
}

// One call in flight: the front, the decision and the lease, carried through
// the continuations by shared_ptr.
class Driver : public std::enable_shared_from_this<Driver> {
 public:
  Driver(Ledger& ledger, std::shared_ptr<GatedFront> front, Threading threading)
      : ledger_(ledger), front_(std::move(front)), threading_(threading) {}

  void Begin() {
    const Call& call = front_->call();
    if (threading_ == Threading::kCallersThread) return Decided(ledger_.Begin(call));
    auto self = shared_from_this();
    ledger_.BeginWithoutBlocking(
        call,
        [self](std::function<void()> work) {
          if (self->front_->Offload(std::move(work))) return;
          self->BeginFailed({BeginFailure::Kind::kStopping,
                             Error{ErrorCode::kUnavailable, "idemgate is stopping"}});
        },
        [self](Result<Decision> begun) { self->Decided(std::move(begun)); });
  }

  void Decided(Result<Decision> begun) {
    if (!begun) return BeginFailed(BeginFailureOf(std::move(begun.error())));
    decision_ = std::move(*begun);
    const Answer a = AnswerFor(decision_);
    if (a.kind == Answer::Kind::kRun) return Run();
    std::string note = front_->RenderAnswer(decision_, a);
    Finish(note.empty() ? std::string(a.note) : std::move(note));
  }

 private:
  void BeginFailed(const BeginFailure& f) {
    std::string note = front_->RenderBeginFailed(f);
    if (note.empty()) note = "refused: " + f.error.ToString();
    front_->Finish(note, nullptr);
  }

  void Run() {
    const Call& call = front_->call();
    if (decision_.kind == Decision::Kind::kExecute) {
      lease_ = ledger_.KeepAlive(call, decision_.fence);
    }
    auto self = shared_from_this();
    front_->Forward(decision_, [self](Upstream up) { self->Answered(std::move(up)); });
  }

  void Answered(Upstream up) {
    lease_ = Ledger::LeaseGuard();  // stop renewing before the final write
    if (up.answered) FaultPoint("after_answer");
    const Call& call = front_->call();
    if (threading_ == Threading::kCallersThread) {
      return Settle(SettleHere(ledger_, call, decision_, std::move(up), Logger()));
    }
    auto self = shared_from_this();
    const bool outcome = Ledger::SettlesAsOutcome(call, up.kind);
    if (outcome) {
      outcome_ = std::move(up.outcome);
      // The store's non-blocking write where it has one (the answer then
      // never waits for a worker), else a worker.
      if (ledger_.CompleteAsync(call, decision_, outcome_, [self](Result<Record> r) {
            self->Settle(StoredOrNot(r));
          })) {
        return;
      }
    }
    auto shared = std::make_shared<Upstream>(std::move(up));
    auto work = [self, shared, outcome] {
      if (outcome) shared->outcome = std::move(self->outcome_);
      self->Settle(SettleHere(self->ledger_, self->front_->call(), self->decision_,
                              std::move(*shared), self->Logger()));
    };
    if (!front_->Offload(work)) work();
  }

  void Settle(const Settled& s) {
    std::string note = front_->RenderSettled(decision_, s);
    if (note.empty()) {
      switch (s.kind) {
        case Settled::Kind::kStored:
          note = "executed";
          break;
        case Settled::Kind::kNotStored:
          note = "executed, not stored: " + s.error->ToString();
          break;
        case Settled::Kind::kReleased:
          note = "released";
          break;
        case Settled::Kind::kUnknown:
          note = "outcome unknown";
          break;
      }
    }
    Finish(std::move(note));
  }

  void Finish(std::string note) { front_->Finish(note, &decision_); }

  std::function<void(std::string)> Logger() {
    return [front = front_](std::string line) { front->Log(std::move(line)); };
  }

  Ledger& ledger_;
  const std::shared_ptr<GatedFront> front_;
  const Threading threading_;
  Decision decision_;
  Ledger::LeaseGuard lease_;
  Outcome outcome_;  // kept alive for CompleteAsync
};

}  // namespace

Settled SettleHere(Ledger& ledger, const Call& call, const Decision& d, Upstream up,
                   const std::function<void(std::string)>& log) {
  const bool outcome = Ledger::SettlesAsOutcome(call, up.kind);
  auto settled = ledger.Settle(call, d, up.kind, std::move(up.outcome));
  if (settled) {
    switch (settled->kind) {
      case Settlement::Kind::kReleased:
        return {Settled::Kind::kReleased, std::nullopt};
      case Settlement::Kind::kUnknown:
        return {Settled::Kind::kUnknown, std::nullopt};
      case Settlement::Kind::kStored:
        break;
    }
    return {Settled::Kind::kStored, std::nullopt};
  }
  if (outcome) return {Settled::Kind::kNotStored, settled.error()};
  // A release or a mark that failed: the caller is told what the answer
  // meant all the same, and the record waits for its lease to run out.
  const std::string error = settled.error().ToString();
  if (up.kind == Execution::Kind::kMaybeSent) {
    log("could not mark " + call.id.key + " unknown: " + error);
    return {Settled::Kind::kUnknown, std::nullopt};
  }
  log("could not release " + call.id.key + " (" + error +
      "); it stays claimed until its lease runs out");
  return {Settled::Kind::kReleased, std::nullopt};
}

void RunGatedCall(Ledger& ledger, std::shared_ptr<GatedFront> front, Threading threading) {
  std::make_shared<Driver>(ledger, std::move(front), threading)->Begin();
}

void RunDecided(Ledger& ledger, std::shared_ptr<GatedFront> front, Threading threading,
                Result<Decision> begun) {
  std::make_shared<Driver>(ledger, std::move(front), threading)->Decided(std::move(begun));
}

}  // namespace idem::gate
