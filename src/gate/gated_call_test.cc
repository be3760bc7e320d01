// The gated call's driver with a fake front over a real ledger on the memory
// store and a fake clock: every path a call can take, in both concurrency
// models. No sleeps: every path here completes before RunGatedCall returns.
#include "gate/gated_call.h"

#include <gtest/gtest.h>

#include "gate/upstream_class.h"
#include "memory_store.h"
#include "store_wrapper.h"

namespace idem::gate {
namespace {

using namespace std::chrono_literals;

// A front that records what the driver asked of it. Forward answers with
// `upstream` (or an HTTP status classified as the proxy does).
class FakeFront final : public GatedFront {
 public:
  explicit FakeFront(Call call) : call_(std::move(call)) {}

  Upstream upstream;
  int forwards = 0;
  int offloads = 0;
  bool refuse_offload = false;
  std::optional<Answer::Kind> answered;
  std::optional<BeginFailure> begin_failed;
  std::optional<Settled> settled;
  std::vector<std::string> logged;
  std::string note;
  bool finished = false;

  void AnswerHttp(int status, std::string body) {
    upstream = {.kind = ClassOfHttpStatus(status),
                .outcome = Outcome{status >= 400 ? OutcomeClass::kToolError : OutcomeClass::kSuccess,
                                   std::move(body)},
                .answered = true};
  }

  const Call& call() const override { return call_; }
  bool Offload(std::function<void()> work) override {
    ++offloads;
    if (refuse_offload) return false;
    work();
    return true;
  }
  void Forward(const Decision&, std::function<void(Upstream)> done) override {
    ++forwards;
    done(upstream);
  }
  std::string RenderAnswer(const Decision&, const Answer& a) override {
    answered = a.kind;
    return {};
  }
  std::string RenderBeginFailed(const BeginFailure& f) override {
    begin_failed = f;
    return {};
  }
  std::string RenderSettled(const Decision&, const Settled& s) override {
    settled = s;
    return {};
  }
  void Log(std::string line) override { logged.push_back(std::move(line)); }
  void Finish(std::string_view n, const Decision*) override {
    EXPECT_FALSE(finished) << "finished twice";
    note = n;
    finished = true;
  }

 private:
  Call call_;
};

// Fails every Complete (kUnavailable), or every Claim with `claim_error`.
class FailingWrites final : public testing::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  bool fail_complete = false;
  std::optional<ErrorCode> claim_error;

  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    if (claim_error) return std::unexpected(Error{*claim_error, "injected claim failure"});
    return StoreWrapper::Claim(req);
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    if (fail_complete) return std::unexpected(Error{ErrorCode::kUnavailable, "injected: store down"});
    return StoreWrapper::Complete(id, fence, outcome, retention, logged);
  }
};

class GatedCallTest : public ::testing::TestWithParam<Threading> {
 protected:
  Call MakeCall(std::string key = "k1", std::string fp = "fp-a") {
    Call c;
    c.id = RecordId{"default", std::move(key)};
    c.fingerprint = std::move(fp);
    c.tool = "charge";
    c.policy.wait = 0ms;  // a running owner answers in progress at once
    return c;
  }
  // Runs `front` to its end (every path here finishes before this returns).
  std::shared_ptr<FakeFront> Run(std::shared_ptr<FakeFront> front) {
    RunGatedCall(ledger_, front, GetParam());
    EXPECT_TRUE(front->finished);
    return front;
  }
  std::shared_ptr<FakeFront> RunHttp(const Call& call, int status, std::string body) {
    auto f = std::make_shared<FakeFront>(call);
    f->AnswerHttp(status, std::move(body));
    return Run(f);
  }
  std::optional<Record> Stored(const Call& call) { return *ledger_.Read(call.id); }

  FakeClock clock_;
  std::unique_ptr<Store> memory_ = NewMemoryStore(clock_);
  FailingWrites store_{*memory_};
  Ledger ledger_{store_, clock_, LedgerOptions{"test", nullptr, false}};
};

TEST_P(GatedCallTest, RunStoresTheOutcomeThenAReplayAnswersIt) {
  const Call call = MakeCall();
  auto first = RunHttp(call, 201, "charged");
  EXPECT_EQ(first->forwards, 1);
  ASSERT_TRUE(first->settled);
  EXPECT_EQ(first->settled->kind, Settled::Kind::kStored);
  EXPECT_EQ(first->note, "executed");
  ASSERT_TRUE(Stored(call));
  EXPECT_EQ(Stored(call)->state, RecordState::kCompleted);
  EXPECT_EQ(Stored(call)->outcome->body, "charged");

  auto retry = RunHttp(call, 201, "charged again");
  EXPECT_EQ(retry->forwards, 0);
  EXPECT_EQ(retry->answered, Answer::Kind::kReplay);
  EXPECT_EQ(retry->note, "replayed");
  EXPECT_FALSE(retry->settled);
}

TEST_P(GatedCallTest, A429IsReleasedAndTheRetryRuns) {
  const Call call = MakeCall();
  auto first = RunHttp(call, 429, "slow down");
  ASSERT_TRUE(first->settled);
  EXPECT_EQ(first->settled->kind, Settled::Kind::kReleased);
  EXPECT_FALSE(Stored(call)) << "a 429 must leave no record to replay";
  auto retry = RunHttp(call, 200, "done");
  EXPECT_EQ(retry->forwards, 1);
  EXPECT_EQ(retry->settled->kind, Settled::Kind::kStored);
}

TEST_P(GatedCallTest, A5xxMakesTheRecordUnknownAndTheRetryIsRefused) {
  const Call call = MakeCall();
  auto first = RunHttp(call, 502, "bad gateway");
  ASSERT_TRUE(first->settled);
  EXPECT_EQ(first->settled->kind, Settled::Kind::kUnknown);
  EXPECT_EQ(Stored(call)->state, RecordState::kUnknown);
  auto retry = RunHttp(call, 200, "done");
  EXPECT_EQ(retry->forwards, 0);
  EXPECT_EQ(retry->answered, Answer::Kind::kUnknown);
}

TEST_P(GatedCallTest, AToolErrorIsStoredOrReleasedAsThePolicySays) {
  Call kept = MakeCall("kept");
  EXPECT_EQ(RunHttp(kept, 400, "bad card")->settled->kind, Settled::Kind::kStored);
  EXPECT_EQ(Stored(kept)->outcome->cls, OutcomeClass::kToolError);
  Call released = MakeCall("released");
  released.policy.errors = ErrorPolicy::kRelease;
  EXPECT_EQ(RunHttp(released, 400, "bad card")->settled->kind, Settled::Kind::kReleased);
  EXPECT_FALSE(Stored(released));
}

TEST_P(GatedCallTest, AnOutcomeTheStoreRefusesIsNotStoredAndSaysWhy) {
  store_.fail_complete = true;
  const Call call = MakeCall();
  auto f = RunHttp(call, 200, "charged");
  ASSERT_TRUE(f->settled);
  EXPECT_EQ(f->settled->kind, Settled::Kind::kNotStored);
  ASSERT_TRUE(f->settled->error);
  EXPECT_EQ(f->settled->error->code, ErrorCode::kUnavailable);
  EXPECT_NE(f->note.find("executed, not stored"), std::string::npos) << f->note;
}

TEST_P(GatedCallTest, AFailedBeginRunsNothingAndSaysWhetherToRetry) {
  store_.claim_error = ErrorCode::kUnavailable;
  auto down = RunHttp(MakeCall("a"), 200, "x");
  EXPECT_EQ(down->forwards, 0);
  ASSERT_TRUE(down->begin_failed);
  EXPECT_EQ(down->begin_failed->kind, BeginFailure::Kind::kStoreUnavailable);
  EXPECT_TRUE(down->begin_failed->retryable());
  EXPECT_EQ(down->note.rfind("refused: ", 0), 0u) << down->note;

  store_.claim_error = ErrorCode::kDataLoss;
  auto corrupt = RunHttp(MakeCall("b"), 200, "x");
  EXPECT_EQ(corrupt->forwards, 0);
  ASSERT_TRUE(corrupt->begin_failed);
  EXPECT_EQ(corrupt->begin_failed->kind, BeginFailure::Kind::kClaimFailed);
  EXPECT_FALSE(corrupt->begin_failed->retryable());
}

TEST_P(GatedCallTest, EachRefusalIsRenderedAndNothingRuns) {
  // In progress: another owner holds the claim.
  const Call running = MakeCall("running");
  auto owner = ledger_.Begin(running);
  ASSERT_TRUE(owner);
  auto busy = RunHttp(running, 200, "x");
  EXPECT_EQ(busy->answered, Answer::Kind::kInProgress);
  EXPECT_EQ(busy->note, "in progress");

  // Drift: the key first used for other arguments.
  ASSERT_EQ(RunHttp(MakeCall("drift", "fp-a"), 200, "x")->settled->kind, Settled::Kind::kStored);
  auto drift = RunHttp(MakeCall("drift", "fp-b"), 200, "y");
  EXPECT_EQ(drift->answered, Answer::Kind::kDrift);

  // Too large: only a marker was stored.
  Call big = MakeCall("big");
  big.policy.max_result_bytes = 4;
  ASSERT_EQ(RunHttp(big, 200, "more than four")->settled->kind, Settled::Kind::kStored);
  EXPECT_EQ(Stored(big)->outcome->cls, OutcomeClass::kTooLarge);
  auto marker = RunHttp(big, 200, "x");
  EXPECT_EQ(marker->answered, Answer::Kind::kTooLarge);

  for (auto* f : {busy.get(), drift.get(), marker.get()}) {
    EXPECT_EQ(f->forwards, 0);
    EXPECT_FALSE(f->settled);
  }
}

TEST_P(GatedCallTest, NothingSentIsReleased) {
  const Call call = MakeCall();
  auto f = std::make_shared<FakeFront>(call);
  f->upstream = {.kind = Execution::Kind::kNotSent};
  Run(f);
  EXPECT_EQ(f->settled->kind, Settled::Kind::kReleased);
  EXPECT_FALSE(Stored(call));
}

INSTANTIATE_TEST_SUITE_P(BothModels, GatedCallTest,
                         ::testing::Values(Threading::kCallersThread, Threading::kContinuations),
                         [](const auto& info) {
                           return info.param == Threading::kCallersThread ? "CallersThread"
                                                                          : "Continuations";
                         });

// kContinuations with a store that writes without blocking: the outcome is
// stored with CompleteAsync, never on the front's worker.
TEST(GatedCallContinuations, AnOutcomeIsStoredWithoutAWorkerWhereTheStoreCan) {
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  testing::InlineAsyncWrites store(*memory);
  Ledger ledger(store, clock, LedgerOptions{"test", nullptr, false});
  Call call;
  call.id = RecordId{"default", "k"};
  call.tool = "charge";
  auto f = std::make_shared<FakeFront>(call);
  f->AnswerHttp(200, "ok");
  f->refuse_offload = true;  // a worker would be refused: the write must not need one
  RunGatedCall(ledger, f, Threading::kContinuations);
  ASSERT_TRUE(f->finished);
  EXPECT_EQ(f->settled->kind, Settled::Kind::kStored);
  EXPECT_EQ((*ledger.Read(call.id))->outcome->body, "ok");
}

// A front that cannot take work while the begin needs a worker answers
// "stopping": nothing is claimed, nothing runs.
TEST(GatedCallContinuations, ABeginRefusedByAStoppingFrontAnswersStopping) {
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  Ledger ledger(*memory, clock, LedgerOptions{"test", nullptr, false});
  Call call;
  call.id = RecordId{"default", "k"};
  auto f = std::make_shared<FakeFront>(call);
  f->refuse_offload = true;
  RunGatedCall(ledger, f, Threading::kContinuations);
  ASSERT_TRUE(f->finished);
  if (f->offloads == 0) GTEST_SKIP() << "the memory store began without a worker";
  ASSERT_TRUE(f->begin_failed);
  EXPECT_EQ(f->begin_failed->kind, BeginFailure::Kind::kStopping);
  EXPECT_EQ(f->forwards, 0);
  EXPECT_FALSE(*ledger.Read(call.id));
}

}  // namespace
}  // namespace idem::gate
