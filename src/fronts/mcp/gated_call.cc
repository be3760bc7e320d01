// McpSession's gated calls, each on a worker thread, run by the gated call's
// driver (gate/gated_call.h): this file is the MCP front's phases (forward
// and wait for the answer, classify it with ClassifyToolAnswer, render), a
// late answer to a call given up, and the reconcile lookup of
// on_unknown = "reconcile".
#include "fronts/mcp/session_core.h"

#include <algorithm>

#include "core/fault_point.h"
#include "gate/gated_call.h"

namespace idem::mcp {

void McpSession::Core::FinishCall(const std::shared_ptr<GatedCall>& gc, bool holds_budget,
                                  bool on_channel_thread) {
  bool close_client;
  {
    std::lock_guard g(mu_);
    if (holds_budget && !gc->abandoned) {
      auto it = pending_.find(gc->id_key);
      if (it != pending_.end() && it->second.call == gc) pending_.erase(it);
    }
    if (--active_calls_ == 0) drain_cv_.notify_all();
    close_client = MaybeFinishLocked();
  }
  if (holds_budget) budget_->Release();
  if (!close_client) return;
  // Not on the client channel's own thread: closing the channel from its
  // callback may end the HTTP session that is delivering it. The pool is
  // still up while a channel callback runs (Detach waits for callbacks
  // first).
  if (on_channel_thread && pool_.Submit([self = shared_from_this()] { self->Finish(); })) return;
  Finish();
}

void McpSession::Core::Answer(GatedCall& gc, std::string response) {
  {
    std::lock_guard g(mu_);
    if (gc.cancelled) return;  // the client no longer expects an answer
  }
  FaultPoint("before_reply");
  client_.Send(std::move(response));
}

// One gated call's front for the driver (gate/gated_call.h): forwards on
// the worker thread that runs the call and waits there for the upstream's
// answer (Threading::kCallersThread), classifies it, and renders.
class McpSession::Core::CallFront final : public gate::GatedFront {
 public:
  // `answer`: the client still expects an answer (false for a late one).
  CallFront(std::shared_ptr<Core> core, std::shared_ptr<GatedCall> gc, bool on_channel_thread)
      : core_(std::move(core)), gc_(std::move(gc)), on_channel_thread_(on_channel_thread) {}

  // What the upstream's answer says (the client-side classify_delivery for
  // an HTTP upstream's own errors, else ClassifyToolAnswer).
  gate::Upstream Classify(std::string response, const Message& msg);
  // How a settled execution is answered; the note for the log.
  std::string Render(const Decision& d, const gate::Settled& s);
  void set_answer(bool answer) { answer_ = answer; }

  // ---- gate::GatedFront
  const Call& call() const override { return gc_->prepared.call; }
  bool Offload(std::function<void()> work) override {
    work();  // already on the call's worker
    return true;
  }
  void Forward(const Decision& d, std::function<void(gate::Upstream)> done) override;
  std::string RenderAnswer(const Decision& d, const gate::Answer& a) override;
  std::string RenderBeginFailed(const gate::BeginFailure& f) override;
  std::string RenderSettled(const Decision& d, const gate::Settled& s) override {
    return Render(d, s);
  }
  void Log(std::string line) override { core_->Log(std::move(line)); }
  void Finish(std::string_view note, const Decision* d) override {
    Core& c = *core_;
    if (c.options_.verbose) {
      const auto ms = d ? c.ledger_.clock().Now() - d->started_at : Duration(0);
      c.Log("tools/call " + call().tool + " key=" + call().id.key + ": " + std::string(note) +
            " (" + std::to_string(ms.count()) + " ms)");
    }
    c.FinishCall(gc_, true, on_channel_thread_);
  }

 private:
  // What came of forwarding, for Render.
  enum class Wire {
    kRefused,       // not sent: cancelled, the upstream gone or idemgate stopping first
    kNotSent,       // the upstream's connection was closed
    kNoAnswer,      // sent, and no answer (gone, the cancel or stop grace, call_timeout)
    kNotDelivered,  // an HTTP upstream's error: the request never reached it
    kLost,          // an HTTP upstream's error: it may have been delivered
    kAnswered,      // the upstream answered: `why` is ClassifyToolAnswer's
  };
  void Answer(std::string response) {
    if (answer_) core_->Answer(*gc_, std::move(response));
  }

  const std::shared_ptr<Core> core_;
  const std::shared_ptr<GatedCall> gc_;
  const bool on_channel_thread_;
  bool answer_ = true;
  Wire wire_ = Wire::kAnswered;
  std::string why_;       // the note's reason
  std::string refusal_;   // kRefused: the answer, if any
  std::string response_;  // kAnswered: the upstream's answer as received
};

void McpSession::Core::RunGatedCall(const std::shared_ptr<GatedCall>& gc) {
  gate::RunGatedCall(ledger_, std::make_shared<CallFront>(shared_from_this(), gc, false),
                     gate::Threading::kCallersThread);
}

void McpSession::Core::Decided(const std::shared_ptr<GatedCall>& gc, Decision d,
                               bool on_channel_thread) {
  gate::RunDecided(ledger_, std::make_shared<CallFront>(shared_from_this(), gc, on_channel_thread),
                   gate::Threading::kCallersThread, std::move(d));
}

std::string McpSession::Core::CallFront::RenderBeginFailed(const gate::BeginFailure& f) {
  const Error& e = f.error;
  switch (f.kind) {
    case gate::BeginFailure::Kind::kStoreUnavailable:
      Answer(ErrorResponse(gc_->id_text, kRpcStoreUnavailable,
                           "idemgate could not reach its store (" + e.message +
                               "), so the tool call was not executed. It is safe to retry "
                               "it once the store is reachable again: nothing ran, and "
                               "idemgate takes back any claim this attempt left in the "
                               "store, so the retry is not taken for a repeat.",
                           RetryableData("store_unavailable")));
      break;
    case gate::BeginFailure::Kind::kClaimFailed:
      Answer(ErrorResponse(gc_->id_text, kRpcInternalError,
                           "idemgate could not claim the tool call (" + e.ToString() +
                               "), so it was not executed."));
      break;
    case gate::BeginFailure::Kind::kStopping:
      Answer(core_->StoppingError(gc_->id_text));
      break;
  }
  return {};
}

std::string McpSession::Core::CallFront::RenderAnswer(const Decision& d, const gate::Answer& a) {
  const Call& call = gc_->prepared.call;
  const std::string& id = gc_->id_text;
  const bool stateless = gc_->prepared.stateless;
  switch (a.kind) {
    case gate::Answer::Kind::kRun:
      break;  // the driver runs it
    case gate::Answer::Kind::kReplay:
    case gate::Answer::Kind::kNoOutcome:
      if (auto result = ReplayResult(d, a, core_->config_)) {
        Answer(ResultResponse(id, CompleteResult(std::move(*result), stateless)));
        break;
      } else {
        Answer(ErrorResponse(id, kRpcInternalError,
                             "idemgate could not read the stored result of an identical "
                             "earlier call (" +
                                 result.error().message + "); the action was not performed again.",
                             ConditionData("unreadable", call.id.key)));
        return "replay failed: " + result.error().message;
      }
    case gate::Answer::Kind::kTooLarge:
      Answer(ResultResponse(id, CompleteResult(TooLargeResult(call, a), stateless)));
      break;
    case gate::Answer::Kind::kInProgress:
      Answer(ResultResponse(id, CompleteResult(InProgressResult(call, a), stateless)));
      break;
    case gate::Answer::Kind::kUnknown:
      Answer(ResultResponse(id, CompleteResult(OutcomeUnknownResult(call, a), stateless)));
      break;
    case gate::Answer::Kind::kDrift:
      Answer(ResultResponse(
          id, CompleteResult(DriftResult(call, d, a, gc_->prepared.gate.mode), stateless)));
      break;
  }
  return {};
}

void McpSession::Core::CallFront::Forward(const Decision& d,
                                          std::function<void(gate::Upstream)> done) {
  Core& c = *core_;
  GatedCall& gc = *gc_;
  {
    std::unique_lock g(c.mu_);
    const bool gone = c.upstream_closed_ || c.detached_;
    const bool stopped = c.phase_ >= SessionPhase::kClosing;
    if (gc.cancelled) {
      why_ = "cancelled by the client before it was sent";
    } else if (gone) {
      why_ = "the upstream is gone";
    } else if (stopped) {
      why_ = "idemgate is stopping";
    }
    if (!why_.empty()) {
      wire_ = Wire::kRefused;
      if ((gone || stopped) && !gc.cancelled) {
        refusal_ = gone ? c.UpstreamGone(gc.id_text, c.upstream_reason_, false)
                        : c.StoppingError(gc.id_text);
      }
      g.unlock();
      return done({.kind = Execution::Kind::kNotSent});
    }
    gc.forwarded = true;
  }
  const bool sent = c.upstream_.Send(gc.prepared.forward);
  if (!sent) {
    wire_ = Wire::kNotSent;
    return done({.kind = Execution::Kind::kNotSent});
  }
  FaultPoint("after_send");

  std::optional<std::string> response;
  std::optional<Message> response_msg;
  bool cancelled, gone, stopped, timed_out = false;
  std::string reason;
  {
    std::unique_lock g(c.mu_);
    Clock& clock = c.ledger_.clock();
    const Duration timeout = c.config_.mcp.call_timeout;
    const std::optional<TimePoint> answer_by =
        timeout > Duration(0) ? std::optional(clock.Now() + timeout) : std::nullopt;
    while (!gc.response && !c.upstream_closed_ && !c.detached_ && !gc.cut_off) {
      std::optional<TimePoint> deadline = answer_by;
      if (gc.cancelled) {
        const TimePoint grace_end = gc.cancelled_at + c.options_.cancel_grace;
        deadline = deadline ? std::min(*deadline, grace_end) : grace_end;
      }
      if (!deadline) {
        gc.cv.wait(g);
        continue;
      }
      if (clock.Now() >= *deadline) {
        timed_out = answer_by && clock.Now() >= *answer_by;
        break;
      }
      clock.WaitUntil(gc.cv, g, *deadline);
    }
    response = std::move(gc.response);
    response_msg = std::move(gc.response_msg);
    gc.response.reset();
    cancelled = gc.cancelled;
    gone = c.upstream_closed_ || c.detached_;
    stopped = gc.cut_off;
    reason = c.upstream_reason_.empty() ? "the proxy is shutting down" : c.upstream_reason_;
    if (!response && !gone) {  // no answer within the cancel grace or the stop grace
      gc.abandoned = true;
      gc.decision = d;
    }
  }
  answer_ = !cancelled;
  if (response) return done(Classify(std::move(*response), *response_msg));
  wire_ = Wire::kNoAnswer;
  if (stopped && !cancelled) {
    refusal_ = "idemgate stopped before the tool answered (it waited [mcp] stop_grace for it)";
    why_ = "still running when the stop grace ran out";
  } else if (timed_out && !gone) {
    refusal_ = "the tool server did not answer within [mcp] call_timeout (" +
               FormatDuration(c.config_.mcp.call_timeout) +
               "); the tool may still be running, and its late answer is stored if it comes";
    why_ = "no answer within call_timeout";
  } else {
    refusal_ = "the tool server went away before answering (" + reason + ")";
    why_ = gone ? reason : "cancelled and no answer within the grace period";
  }
  done({.kind = Execution::Kind::kMaybeSent});
}

gate::Upstream McpSession::Core::CallFront::Classify(std::string response, const Message& msg) {
  const SessionOptions& options = core_->options_;
  if (msg.kind == Message::Kind::kError && options.classify_delivery) {
    const UpstreamDelivery delivery = options.classify_delivery(response);
    if (delivery != UpstreamDelivery::kAnswered) {
      why_ = "the request could not be delivered";
      if (auto message = json_text::View(response)["error"]["message"].string()) {
        why_ = std::move(*message);
      }
      const bool lost = delivery == UpstreamDelivery::kMaybeSent;
      wire_ = lost ? Wire::kLost : Wire::kNotDelivered;
      return {.kind = lost ? Execution::Kind::kMaybeSent : Execution::Kind::kNotSent,
              .answered = true};
    }
  }
  ToolAnswer a = ClassifyToolAnswer(response, msg);
  wire_ = Wire::kAnswered;
  why_ = std::move(a.why);
  response_ = std::move(response);
  const OutcomeClass cls =
      a.kind == Execution::Kind::kSuccess ? OutcomeClass::kSuccess : OutcomeClass::kToolError;
  return {.kind = a.kind, .outcome = Outcome{cls, std::move(a.body)}, .answered = true};
}

std::string McpSession::Core::CallFront::Render(const Decision& d, const gate::Settled& s) {
  const Call& call = gc_->prepared.call;
  const std::string& id = gc_->id_text;
  // A condition, like every idempotency condition: a tool result the model
  // reads (docs/DESIGN.md §6.1), not a transport error a host may hide.
  auto unanswered = [&](std::string_view why) {
    Answer(ResultResponse(id, CompleteResult(UnansweredResult(call, why),
                                             gc_->prepared.stateless)));
  };
  switch (wire_) {
    case Wire::kRefused:
      if (!refusal_.empty()) core_->client_.Send(std::move(refusal_));
      return "released: " + why_;
    case Wire::kNotSent:
      Answer(core_->UpstreamGone(id, "its connection is closed", false));
      return "released: not sent, the upstream is closed";
    case Wire::kNoAnswer:
      unanswered(refusal_);
      return "outcome unknown: " + why_;
    case Wire::kLost:
      unanswered("no answer came back (" + why_ + ")");
      return "outcome unknown: " + why_;
    case Wire::kNotDelivered:
      Answer(core_->UpstreamGone(id, why_, false));
      return "released: not delivered: " + why_;
    case Wire::kAnswered:
      break;
  }
  // Persisted before acknowledged: an outcome the store refused is withheld.
  // An answer that is not an outcome (released, or unknown: the server's
  // error as it was) goes to the client whatever the store said.
  if (s.kind == gate::Settled::Kind::kNotStored) {
    Answer(ErrorResponse(id, kRpcOutcomeNotStored,
                         "The tool ran, but idemgate could not store its result (" +
                             s.error->message +
                             "), so the result is withheld. The action has probably "
                             "happened: do not repeat it blindly. An operator can check "
                             "with `idemgate inspect " +
                             call.id.key + "`.",
                         ConditionData("not_stored", call.id.key)));
    return "executed, but not stored: " + s.error->ToString();
  }
  Answer(std::move(response_));
  if (d.kind == Decision::Kind::kPassThrough) {
    return d.observed ? "executed (observe mode)" : "executed unguarded (store down)";
  }
  switch (s.kind) {
    case gate::Settled::Kind::kStored:
      return "executed: " + why_ + ", stored";
    case gate::Settled::Kind::kReleased:
      return "released: " + why_;
    case gate::Settled::Kind::kUnknown:
    case gate::Settled::Kind::kNotStored:
      break;
  }
  return "outcome unknown: " + why_ + " (the tool may have run)";
}

void McpSession::Core::SettleLate(const std::shared_ptr<GatedCall>& gc, std::string response,
                                  Message msg) {
  CallFront front(shared_from_this(), gc, false);
  front.set_answer(false);  // the client was answered when the call was given up
  gate::Upstream up = front.Classify(std::move(response), msg);
  std::string note;
  if (up.kind == Execution::Kind::kMaybeSent) {
    note = "outcome unknown (already marked)";
  } else {
    const gate::Settled s = gate::SettleHere(ledger_, gc->prepared.call, gc->decision,
                                             std::move(up), [this](std::string line) { Log(line); });
    note = front.Render(gc->decision, s);
  }
  Log("tools/call " + gc->prepared.call.tool + " key=" + gc->prepared.call.id.key +
      ": a late answer, after the call was given up, settled the record (" + note + ")");
  FinishCall(gc, false);
}

Result<std::optional<Outcome>> McpSession::Core::Reconcile(const PreparedCall& p) {
  const Call& call = p.call;
  if (!p.reconcile_tool) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "no reconcile tool is configured for " + call.tool);
  }
  auto request = std::make_shared<ProxyRequest>();
  std::string id;
  {
    std::lock_guard g(mu_);
    if (upstream_closed_ || detached_) {
      return MakeError(ErrorCode::kUnavailable, "the upstream is gone; cannot reconcile");
    }
    // Its own namespace ("idemgate-reconcile-N"; the stateless HTTP front
    // rewrites client ids to "idemgate-client-N"), and never an id a client
    // request in flight holds, so no answer is taken for another's.
    do {
      id = "idemgate-reconcile-" + std::to_string(next_proxy_id_++);
    } while (IdInUse("s:" + id));
    proxy_["s:" + id] = request;
  }
  std::string text = R"({"jsonrpc":"2.0","id":)" + json_text::Quote(id) +
                     R"(,"method":"tools/call","params":{"name":)" +
                     json_text::Quote(*p.reconcile_tool) + R"(,"arguments":)" +
                     p.forward_arguments + R"(,"_meta":{)" + json_text::Quote(kMetaIdempotencyKey) +
                     ":" + json_text::Quote(p.forward_key) + "}}}";
  std::optional<std::string> response;
  if (upstream_.Send(std::move(text))) {
    std::unique_lock g(mu_);
    Clock& clock = ledger_.clock();
    const TimePoint deadline = clock.Now() + options_.reconcile_timeout;
    while (!request->response && !upstream_closed_ && !detached_ &&
           phase_ < SessionPhase::kClosing && clock.Now() < deadline) {
      clock.WaitUntil(request->cv, g, deadline);
    }
    response = std::move(request->response);
  }
  {
    std::lock_guard g(mu_);
    proxy_.erase("s:" + id);
  }
  if (!response) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "the reconcile tool " + *p.reconcile_tool + " did not answer");
  }
  auto msg = ParseMessage(*response);
  if (!msg) {
    return MakeError(ErrorCode::kUnavailable, "the reconcile tool " + *p.reconcile_tool +
                                                  " answered unreadably: " + msg.error().message);
  }
  LookupAnswer a = ClassifyLookupAnswer(*response, *msg);
  switch (a.verdict) {
    case gate::LookupVerdict::kFound:
      return std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, std::move(a.body)});
    case gate::LookupVerdict::kNotFound:
      return std::optional<Outcome>();
    case gate::LookupVerdict::kCannotTell:
      break;
  }
  return MakeError(ErrorCode::kUnavailable,
                   "the reconcile tool " + *p.reconcile_tool + " cannot tell: " + a.why);
}

}  // namespace idem::mcp
