// Every transition of docs/DESIGN.md §4, on the memory store and a FakeClock: no
// sleeps; threads are synchronised on the clock's waiters and store events.
#include "idem/ledger.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "memory_store.h"
#include "store_wrapper.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using Kind = Decision::Kind;

class LedgerTest : public ::testing::Test {
 protected:
  Call MakeCall(std::string key = "v1t.turn.charge.fp", std::string fp = "fp-a") {
    Call c;
    c.id = RecordId{"default", std::move(key)};
    c.fingerprint = std::move(fp);
    c.tool = "charge";
    c.turn = "turn-1";
    return c;
  }
  Execution Ok(std::string body) { return Execution{Execution::Kind::kSuccess, std::move(body)}; }

  FakeClock clock_;
  std::unique_ptr<Store> store_ = NewMemoryStore(clock_);
  Ledger ledger_{*store_, clock_, LedgerOptions{"test", nullptr, true}};
};

TEST_F(LedgerTest, FirstAttemptExecutesAndRetryReplays) {
  int runs = 0;
  Call call = MakeCall();
  auto first = ledger_.Run(call, [&] { ++runs; return Ok("charged 42"); });
  ASSERT_TRUE(first) << first.error().ToString();
  EXPECT_EQ(first->decision.kind, Kind::kExecute);
  auto retry = ledger_.Run(call, [&] { ++runs; return Ok("charged again"); });
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->decision.kind, Kind::kReplay);
  EXPECT_FALSE(retry->decision.attached);
  ASSERT_TRUE(retry->outcome);
  EXPECT_EQ(retry->outcome->body, "charged 42");
  EXPECT_EQ(runs, 1);
}

TEST_F(LedgerTest, DriftIsRejectedByDefault) {
  Call call = MakeCall("explicit-key", "fp-a");
  ASSERT_TRUE(ledger_.Run(call, [&] { return Ok("first"); }));
  Call drifted = MakeCall("explicit-key", "fp-b");
  int runs = 0;
  auto r = ledger_.Run(drifted, [&] { ++runs; return Ok("second"); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->decision.kind, Kind::kDrift);
  EXPECT_EQ(r->decision.record.fingerprint, "fp-a");
  EXPECT_EQ(runs, 0);
}

TEST_F(LedgerTest, DriftReplaysWhenConfigured) {
  Call call = MakeCall("explicit-key", "fp-a");
  ASSERT_TRUE(ledger_.Run(call, [&] { return Ok("first"); }));
  Call drifted = MakeCall("explicit-key", "fp-b");
  drifted.policy.on_drift = OnDrift::kReplay;
  auto r = ledger_.Run(drifted, [&] { return Ok("second"); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->decision.kind, Kind::kReplay);
  EXPECT_TRUE(r->decision.drift);
  EXPECT_EQ(r->outcome->body, "first");
}

TEST_F(LedgerTest, DuplicateWaitsAndAttachesTheMomentOwnerCompletes) {
  Call call = MakeCall();
  auto owner = ledger_.Begin(call);
  ASSERT_TRUE(owner);
  ASSERT_EQ(owner->kind, Kind::kExecute);
  Result<Decision> dup = MakeError(ErrorCode::kInternal, "not run");
  std::thread t([&] { dup = ledger_.Begin(call); });
  clock_.AwaitWaiters(1);  // the duplicate is parked, waiting for the owner
  ASSERT_TRUE(ledger_.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "done"}));
  t.join();  // no clock advance: woken by the completion
  ASSERT_TRUE(dup) << dup.error().ToString();
  EXPECT_EQ(dup->kind, Kind::kReplay);
  EXPECT_TRUE(dup->attached);
  EXPECT_EQ(dup->record.outcome->body, "done");
}

TEST_F(LedgerTest, DuplicateGetsInProgressAfterWait) {
  Call call = MakeCall();
  auto owner = ledger_.Begin(call);
  ASSERT_TRUE(owner);
  Result<Decision> dup = MakeError(ErrorCode::kInternal, "not run");
  std::thread t([&] { dup = ledger_.Begin(call); });
  clock_.AwaitWaiters(1);
  clock_.Advance(call.policy.wait);  // 10 s: the owner's 30 s lease is still alive
  t.join();
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup->kind, Kind::kInProgress);
  EXPECT_GE(dup->retry_after, 1s);
  EXPECT_LE(dup->retry_after, call.policy.wait);
}

TEST_F(LedgerTest, DuplicateWakesWhenOwnerReleasesAndExecutesItself) {
  Call call = MakeCall();
  auto owner = ledger_.Begin(call);
  ASSERT_TRUE(owner);
  Result<Decision> dup = MakeError(ErrorCode::kInternal, "not run");
  std::thread t([&] { dup = ledger_.Begin(call); });
  clock_.AwaitWaiters(1);
  ASSERT_TRUE(ledger_.Release(call, *owner));
  t.join();
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup->kind, Kind::kExecute);
  EXPECT_GT(dup->fence, owner->fence);
}

TEST_F(LedgerTest, LeaseExpiryWithOnUnknownFailGivesExplicitUnknown) {
  Call call = MakeCall();
  auto owner = ledger_.Begin(call);
  ASSERT_TRUE(owner);
  clock_.Advance(call.policy.lease + 1s);  // the owner died without a heartbeat
  int runs = 0;
  auto r = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->decision.kind, Kind::kUnknown);
  EXPECT_EQ(r->decision.record.state, RecordState::kUnknown);
  EXPECT_EQ(runs, 0);
  auto again = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->decision.kind, Kind::kUnknown);
  EXPECT_EQ(runs, 0);
  // The slow original owner still holds the real outcome; it may resolve the record.
  ASSERT_TRUE(ledger_.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "late but true"}));
  auto resolved = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  EXPECT_EQ(resolved->decision.kind, Kind::kReplay);
  EXPECT_EQ(resolved->outcome->body, "late but true");
}

TEST_F(LedgerTest, LeaseExpiryWithOnUnknownRetryTakesOverAndFencesOldOwner) {
  Call call = MakeCall();
  call.policy.on_unknown = OnUnknown::kRetry;
  auto owner = ledger_.Begin(call);
  ASSERT_TRUE(owner);
  clock_.Advance(call.policy.lease + 1s);
  auto second = ledger_.Begin(call);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->kind, Kind::kExecute);
  EXPECT_TRUE(second->took_over);
  EXPECT_GT(second->fence, owner->fence);
  auto stale = ledger_.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "stale"});
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, ErrorCode::kAborted);
  ASSERT_TRUE(ledger_.Complete(call, *second, Outcome{OutcomeClass::kSuccess, "fresh"}));
  auto replay = ledger_.Begin(call);
  EXPECT_EQ(replay->record.outcome->body, "fresh");
}

TEST_F(LedgerTest, OnUnknownRetryAlsoTakesOverAnUnknownRecord) {
  Call call = MakeCall();
  auto owner = ledger_.Begin(call);
  clock_.Advance(call.policy.lease + 1s);
  ASSERT_EQ(ledger_.Begin(call)->kind, Kind::kUnknown);  // fail marks it unknown
  call.policy.on_unknown = OnUnknown::kRetry;
  auto r = ledger_.Begin(call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, Kind::kExecute);
  EXPECT_TRUE(r->took_over);
}

class ReconcileTest : public LedgerTest {
 protected:
  std::optional<Result<std::optional<Outcome>>> answer_;
  int lookups_ = 0;
  Ledger reconciling_{*store_, clock_,
                      LedgerOptions{"test",
                                    [this](const Call&) -> Result<std::optional<Outcome>> {
                                      ++lookups_;
                                      return *answer_;
                                    },
                                    true}};
  Call Dead() {
    Call call = MakeCall();
    call.policy.on_unknown = OnUnknown::kReconcile;
    EXPECT_EQ(reconciling_.Begin(call)->kind, Kind::kExecute);
    clock_.Advance(call.policy.lease + 1s);
    return call;
  }
};

TEST_F(ReconcileTest, FoundOutcomeIsStoredAndReplayed) {
  Call call = Dead();
  answer_ = std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, "found charge ch_1"});
  auto r = reconciling_.Begin(call);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->kind, Kind::kReplay);
  EXPECT_TRUE(r->reconciled);
  EXPECT_EQ(r->record.outcome->body, "found charge ch_1");
  EXPECT_EQ(lookups_, 1);
  auto again = reconciling_.Begin(call);
  EXPECT_EQ(again->kind, Kind::kReplay);
  EXPECT_EQ(lookups_, 1);
}

// An outcome the lookup found is a completion like any other (guarantees
// review H6): over max_result_bytes it is stored as a too-large marker, and
// the audit log gets its `executed` entry before the retry's `replayed`.
TEST_F(ReconcileTest, AFoundOutcomeIsSizeCheckedAndLoggedAsExecuted) {
  Call call = Dead();
  call.policy.max_result_bytes = 8;
  answer_ = std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, "a charge far over 8 bytes"});
  auto r = reconciling_.Begin(call);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->kind, Kind::kReplay);
  EXPECT_EQ(r->record.outcome->cls, OutcomeClass::kTooLarge);
  EXPECT_EQ((*store_->Get(call.id))->outcome->cls, OutcomeClass::kTooLarge);
  reconciling_.Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  // The claim, the found action's execution, the retry's replay (the last
  // two at the retry's instant, so in either order).
  std::multiset<AttemptOutcome> logged;
  for (const Attempt& a : *attempts) logged.insert(a.outcome);
  EXPECT_EQ(logged, (std::multiset<AttemptOutcome>{AttemptOutcome::kClaimed,
                                                   AttemptOutcome::kExecuted,
                                                   AttemptOutcome::kReplayed}));
}

TEST_F(ReconcileTest, NotFoundExecutes) {
  Call call = Dead();
  answer_ = std::optional<Outcome>();
  auto r = reconciling_.Begin(call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, Kind::kExecute);
  EXPECT_TRUE(r->took_over);
}

TEST_F(ReconcileTest, LookupFailureLeavesUnknown) {
  Call call = Dead();
  answer_ = Result<std::optional<Outcome>>(MakeError(ErrorCode::kUnavailable, "lookup down"));
  auto r = reconciling_.Begin(call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, Kind::kUnknown);
  EXPECT_EQ(r->record.state, RecordState::kUnknown);
}

// The owner's lease lapsed but the owner lives (cut off from the store while
// its upstream request was open). A lookup that cannot tell leaves the record
// unknown at the owner's fence, so the owner's late, true outcome is stored
// rather than refused (guarantees review F3).
TEST_F(ReconcileTest, CannotTellKeepsTheLiveOwnersLateOutcome) {
  Call call = MakeCall();
  call.policy.on_unknown = OnUnknown::kReconcile;
  auto owner = reconciling_.Begin(call);
  ASSERT_EQ(owner->kind, Kind::kExecute);
  clock_.Advance(call.policy.lease + 1s);
  answer_ = Result<std::optional<Outcome>>(MakeError(ErrorCode::kUnavailable, "lookup timed out"));
  auto retry = reconciling_.Begin(call);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->kind, Kind::kUnknown);
  auto late = reconciling_.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "late but true"});
  ASSERT_TRUE(late) << late.error().ToString();
  EXPECT_EQ(late->state, RecordState::kCompleted);
  auto after = reconciling_.Begin(call);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->kind, Kind::kReplay);
  EXPECT_EQ(after->record.outcome->body, "late but true");
}

// A front that knows what the upstream received gives each call its own
// lookup (the HTTP proxy: the key as forwarded, the caller's credentials);
// it is asked instead of LedgerOptions::reconcile.
TEST_F(LedgerTest, ACallsOwnReconcileLookupIsAskedWithoutALedgerHook) {
  Call call = MakeCall();
  call.policy.on_unknown = OnUnknown::kReconcile;
  int asked = 0;
  call.reconcile = [&asked](const Call&) -> Result<std::optional<Outcome>> {
    ++asked;
    return std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, "found at the vendor"});
  };
  ASSERT_EQ(ledger_.Begin(call)->kind, Kind::kExecute);
  clock_.Advance(call.policy.lease + 1s);
  auto r = ledger_.Begin(call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, Kind::kReplay);
  EXPECT_TRUE(r->reconciled);
  EXPECT_EQ(r->record.outcome->body, "found at the vendor");
  EXPECT_EQ(asked, 1);
}

TEST_F(LedgerTest, ReconcileWithoutHookIsUnknownNeverExecutes) {
  Call call = MakeCall();
  call.policy.on_unknown = OnUnknown::kReconcile;
  ASSERT_EQ(ledger_.Begin(call)->kind, Kind::kExecute);
  clock_.Advance(call.policy.lease + 1s);
  auto r = ledger_.Begin(call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, Kind::kUnknown);
}

TEST_F(LedgerTest, HeartbeatKeepsALongCallAlive) {
  testing::CountingStore counting(*store_);
  Ledger ledger(counting, clock_);
  Call call = MakeCall();
  Call probe = call;
  probe.policy.wait = 0ms;
  auto r = ledger.Run(call, [&] {
    // Run for 3 leases, one lease/3 step at a time; each step's heartbeat
    // lands before the next (AwaitHeartbeats), so nothing depends on timing.
    for (int i = 1; i <= 9; ++i) {
      clock_.Advance(call.policy.lease / 3);
      counting.AwaitHeartbeats(i);
      auto d = ledger.Begin(probe);
      EXPECT_TRUE(d);
      EXPECT_EQ(d->kind, Kind::kInProgress) << "at step " << i;
    }
    return Ok("long call");
  });
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->decision.kind, Kind::kExecute);
  EXPECT_EQ(ledger.Begin(call)->record.outcome->body, "long call");
}

// The keeper thread sleeps until the earliest renewal due; a lease due
// sooner, started while it sleeps, must wake it. On the system clock: if the
// keeper slept through it, the wait below would last the hour (and CTest's
// timeout would fail the test); it returns within milliseconds.
TEST(LeaseKeeperTest, AShorterLeaseStartedDuringALongWaitIsRenewedInTime) {
  Clock& clock = SystemClock::Default();
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  testing::CountingStore counting(*memory);
  Ledger ledger(counting, clock);
  Call slow;
  slow.id = RecordId{"default", "slow"};
  slow.policy.lease = 3h;  // renewed in an hour
  Ledger::LeaseGuard first = ledger.KeepAlive(slow, 1);
  Call quick = slow;
  quick.id.key = "quick";
  quick.policy.lease = 3ms;
  Ledger::LeaseGuard second = ledger.KeepAlive(quick, 1);
  // The keeper, asleep until the slow lease's renewal in an hour, woke for
  // the quick one: its first heartbeat is the quick lease's, the slow one's
  // is not due. (A keeper that slept on would never get here: the test
  // would time out.)
  counting.AwaitHeartbeats(1);
  EXPECT_GE(counting.HeartbeatsOf("quick"), 1);
  EXPECT_EQ(counting.HeartbeatsOf("slow"), 0);
}

// A heartbeat that hangs (a Cluster node that stopped answering until its
// command timeout) delays only its own lease: the others' renewals go out
// on time, round after round. The keeper once sent every heartbeat from one
// thread, one after another: the quick lease's renewal waited behind the
// stuck one and this test never finished.
TEST(LeaseKeeperTest, AStuckHeartbeatDelaysNoOtherLease) {
  class StuckHeartbeats final : public testing::CountingStore {
   public:
    using CountingStore::CountingStore;
    Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
      if (id.key == "stuck") {
        std::unique_lock g(mu_);
        ++stuck_waiting_;
        cv_.notify_all();
        cv_.wait(g, [&] { return released_; });
      }
      return CountingStore::Heartbeat(id, fence, lease);
    }
    void AwaitStuck() {
      std::unique_lock g(mu_);
      cv_.wait(g, [&] { return stuck_waiting_ > 0; });
    }
    void Release() {
      std::lock_guard g(mu_);
      released_ = true;
      cv_.notify_all();
    }

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    int stuck_waiting_ = 0;
    bool released_ = false;
  };
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  StuckHeartbeats store(*memory);
  Ledger ledger(store, clock);
  Call stuck;
  stuck.id = RecordId{"default", "stuck"};  // started first: first in every round
  stuck.policy.lease = 3s;
  Call quick = stuck;
  quick.id.key = "quick";
  auto stuck_claim = ledger.Begin(stuck);  // real claims: a heartbeat must find its record
  auto quick_claim = ledger.Begin(quick);
  ASSERT_TRUE(stuck_claim && quick_claim);
  Ledger::LeaseGuard a = ledger.KeepAlive(stuck, stuck_claim->fence);
  Ledger::LeaseGuard b = ledger.KeepAlive(quick, quick_claim->fence);
  clock.AwaitWaiters(1);
  clock.Advance(1s);  // both due
  store.AwaitStuck();
  store.AwaitHeartbeats(1);
  EXPECT_EQ(store.HeartbeatsOf("quick"), 1);
  for (int round = 2; round <= 4; ++round) {
    clock.AwaitWaiters(1);  // the keeper waits for the quick lease's next renewal
    clock.Advance(1s);
    store.AwaitHeartbeats(round);
    EXPECT_EQ(store.HeartbeatsOf("quick"), round) << "the stuck heartbeat was sent twice";
  }
  EXPECT_EQ(store.HeartbeatsOf("stuck"), 0);  // counted once it answers
  store.Release();
  store.AwaitHeartbeats(5);
  EXPECT_GE(store.HeartbeatsOf("stuck"), 1);
  EXPECT_FALSE(a.lost());
  EXPECT_FALSE(b.lost());
}

// The attempt that executes is in the audit log from the moment it claims,
// and its completion from the moment the outcome is stored: both go in the
// record's own write, not the next batch (which a crash can lose). Nothing
// is flushed here; the store is read directly.
TEST_F(LedgerTest, TheExecutingAttemptIsLoggedWithItsClaimAndItsCompletion) {
  Call call = MakeCall();
  auto logged = [&] {
    AttemptFilter f;
    f.key = call.id.key;
    auto attempts = store_->QueryAttempts(f);
    EXPECT_TRUE(attempts);
    std::vector<AttemptOutcome> outcomes;
    if (attempts) {
      for (const Attempt& a : *attempts) outcomes.push_back(a.outcome);
    }
    return outcomes;  // newest first
  };
  auto d = ledger_.Begin(call);
  ASSERT_TRUE(d && d->kind == Kind::kExecute);
  EXPECT_EQ(logged(), std::vector<AttemptOutcome>{AttemptOutcome::kClaimed});
  ASSERT_TRUE(ledger_.Complete(call, *d, Outcome{OutcomeClass::kSuccess, "done"}));
  EXPECT_EQ(logged(),
            (std::vector<AttemptOutcome>{AttemptOutcome::kExecuted, AttemptOutcome::kClaimed}));
}

TEST_F(LedgerTest, ToolErrorIsStoredAndReplayed) {
  Call call = MakeCall();
  ASSERT_TRUE(ledger_.Run(call, [] {
    return Execution{Execution::Kind::kToolError, "card declined"};
  }));
  int runs = 0;
  auto r = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  EXPECT_EQ(r->decision.kind, Kind::kReplay);
  EXPECT_EQ(r->outcome->cls, OutcomeClass::kToolError);
  EXPECT_EQ(r->outcome->body, "card declined");
  EXPECT_EQ(runs, 0);
}

TEST_F(LedgerTest, ToolErrorIsReleasedWhenConfigured) {
  Call call = MakeCall();
  call.policy.errors = ErrorPolicy::kRelease;
  auto first = ledger_.Run(call, [] { return Execution{Execution::Kind::kToolError, "busy"}; });
  ASSERT_TRUE(first);
  EXPECT_EQ(first->outcome->cls, OutcomeClass::kToolError);
  int runs = 0;
  auto r = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  EXPECT_EQ(r->decision.kind, Kind::kExecute);
  EXPECT_EQ(runs, 1);
}

TEST_F(LedgerTest, NotSentAndInterimAreReleased) {
  for (auto kind : {Execution::Kind::kNotSent, Execution::Kind::kInterim}) {
    Call call = MakeCall("k" + std::to_string(static_cast<int>(kind)));
    auto first = ledger_.Run(call, [&] { return Execution{kind, "connection refused"}; });
    ASSERT_TRUE(first);
    EXPECT_EQ(first->body, "connection refused");
    auto rec = store_->Get(call.id);
    ASSERT_TRUE(rec);
    EXPECT_FALSE(rec->has_value());
    int runs = 0;
    auto r = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
    EXPECT_EQ(r->decision.kind, Kind::kExecute);
    EXPECT_EQ(runs, 1);
  }
}

TEST_F(LedgerTest, MaybeSentIsMarkedUnknown) {
  Call call = MakeCall();
  auto first = ledger_.Run(call, [] { return Execution{Execution::Kind::kMaybeSent, "timeout"}; });
  ASSERT_TRUE(first);
  int runs = 0;
  auto r = ledger_.Run(call, [&] { ++runs; return Ok("x"); });
  EXPECT_EQ(r->decision.kind, Kind::kUnknown);
  EXPECT_EQ(runs, 0);
}

TEST_F(LedgerTest, OversizedOutcomeStoresTooLargeMarker) {
  Call call = MakeCall();
  call.policy.max_result_bytes = 10;
  auto first = ledger_.Run(call, [&] { return Ok(std::string(11, 'x')); });
  ASSERT_TRUE(first);
  EXPECT_EQ(first->outcome->body, std::string(11, 'x')) << "the executing caller gets it all";
  auto r = ledger_.Run(call, [&] { return Ok("x"); });
  EXPECT_EQ(r->decision.kind, Kind::kReplay);
  EXPECT_EQ(r->outcome->cls, OutcomeClass::kTooLarge);
  EXPECT_TRUE(r->outcome->body.empty());
}

TEST_F(LedgerTest, FailedPersistReturnsErrorNotOutcome) {
  // Calls: 1 claim, 2 complete.
  testing::FailingStore failing(*store_, 2);
  Ledger ledger(failing, clock_);
  Call call = MakeCall();
  int runs = 0;
  auto r = ledger.Run(call, [&] { ++runs; return Ok("charged"); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(runs, 1);
  auto rec = store_->Get(call.id);
  ASSERT_TRUE(rec && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress) << "follows the lease-expiry path";
}

TEST_F(LedgerTest, StoreDownAtClaimFailsClosed) {
  testing::FailingStore failing(*store_, 1);
  Ledger ledger(failing, clock_);
  int runs = 0;
  auto r = ledger.Run(MakeCall(), [&] { ++runs; return Ok("x"); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(r.error().retryable());
  EXPECT_EQ(runs, 0);
}

TEST_F(LedgerTest, StoreDownWithOnStoreDownPassRunsUnguarded) {
  testing::FailingStore failing(*store_, 1);
  Ledger ledger(failing, clock_);
  Call call = MakeCall();
  call.policy.on_store_down = OnStoreDown::kPass;
  int runs = 0;
  auto r = ledger.Run(call, [&] { ++runs; return Ok("x"); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->decision.kind, Kind::kPassThrough);
  EXPECT_EQ(runs, 1);
}

// Found by reading: on_store_down = "pass" also fired on a claim that was
// applied and whose reply was lost (and on contention: SQLite busy,
// PostgreSQL claim rounds, Redis WAIT short of replicas), so a call could run
// unguarded while its claim stood, and a retry ran it again. Only a store
// that was not reached passes.
TEST_F(LedgerTest, OnStoreDownPassRunsOnlyWhenTheStoreWasNotReached) {
  testing::LostReplyStore losing(*store_);
  losing.DieAfterNextClaim();
  Ledger ledger(losing, clock_);
  Call call = MakeCall();
  call.policy.on_store_down = OnStoreDown::kPass;
  int runs = 0;
  auto r = ledger.Run(call, [&] { ++runs; return Ok("x"); });
  ASSERT_FALSE(r) << "a claim that may have been applied is not an outage";
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_FALSE(r.error().unreached);
  EXPECT_EQ(runs, 0);
  losing.set_down(false);
}

// Regression (issue 4, the orphaned claim): the store applied a claim and
// died before answering. The caller was told "not executed, safe to retry";
// the claim is taken back (Store::Abandon with the attempt's owner token), so
// the retry executes instead of waiting out the lease and answering
// "outcome unknown" for a call that never ran.
TEST_F(LedgerTest, OrphanedClaimIsAbandonedSoTheRetryExecutesNotUnknown) {
  testing::LostReplyStore lossy(*store_);
  Ledger ledger(lossy, clock_);
  Call call = MakeCall();
  int runs = 0;
  auto charge = [&] {
    ++runs;
    return Ok("charged");
  };

  lossy.DieAfterNextClaim();
  auto first = ledger.Run(call, charge);
  ASSERT_FALSE(first);
  EXPECT_EQ(first.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(lossy.claims_applied(), 1) << "the claim was applied; only its reply was lost";
  auto orphan = store_->Get(call.id);
  ASSERT_TRUE(orphan && orphan->has_value());
  EXPECT_EQ((*orphan)->state, RecordState::kInProgress);
  EXPECT_FALSE((*orphan)->owner.empty());

  // The keeper tries at once; the store is still down.
  lossy.AwaitRefusedAbandons(1);
  // A retry while the store is down fails closed: nothing executes.
  auto down = ledger.Run(call, charge);
  ASSERT_FALSE(down);
  EXPECT_EQ(down.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(runs, 0);

  // The store is back: the keeper's next round (100 ms later) abandons.
  lossy.set_down(false);
  clock_.Advance(1s);
  lossy.AwaitAbandoned(1);
  auto gone = store_->Get(call.id);
  ASSERT_TRUE(gone);
  EXPECT_FALSE(gone->has_value()) << "the orphaned claim was deleted";

  // 1 s after the loss, far inside the orphan's 30 s lease: the retry runs.
  auto retry = ledger.Run(call, charge);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->decision.kind, Kind::kExecute);
  EXPECT_EQ(runs, 1);
  auto replay = ledger.Run(call, charge);
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->decision.kind, Kind::kReplay);
  EXPECT_EQ(runs, 1);
}

// The same, when the retry arrives before the keeper's next round: Begin
// takes back this process's orphaned claim itself before claiming.
TEST_F(LedgerTest, RetryAbandonsItsOwnOrphanedClaimBeforeClaiming) {
  testing::LostReplyStore lossy(*store_);
  Ledger ledger(lossy, clock_);
  Call call = MakeCall();
  lossy.DieAfterNextClaim();
  ASSERT_FALSE(ledger.Begin(call));
  lossy.AwaitRefusedAbandons(1);
  lossy.set_down(false);  // no Advance: the keeper is parked until its next round
  auto retry = ledger.Begin(call);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->kind, Kind::kExecute);
  EXPECT_EQ(lossy.abandoned(), 1);
  EXPECT_EQ(lossy.claims_applied(), 2);
}

// A duplicate in another instance waiting on the orphaned claim is woken by
// the abandon and executes, instead of waiting for the lease to run out.
TEST_F(LedgerTest, AbandonWakesAWaiterInAnotherInstance) {
  testing::LostReplyStore lossy(*store_);
  Ledger lost(lossy, clock_);
  Ledger other(*store_, clock_);
  Call call = MakeCall();
  lossy.DieAfterNextClaim();
  ASSERT_FALSE(lost.Begin(call));
  lossy.AwaitRefusedAbandons(1);
  Result<Decision> dup = MakeError(ErrorCode::kInternal, "not run");
  std::thread t([&] { dup = other.Begin(call); });
  clock_.AwaitWaiters(2);  // the duplicate, and the keeper parked until its next round
  lossy.set_down(false);
  clock_.Advance(100ms);
  t.join();
  ASSERT_TRUE(dup) << dup.error().ToString();
  EXPECT_EQ(dup->kind, Kind::kExecute);
  // The duplicate may wake (on the inner store's change) before the keeper's
  // Abandon call has returned through the wrapper that counts it.
  lossy.AwaitAbandoned(1);
  EXPECT_EQ(lossy.abandoned(), 1);
}

// A claim that failed without being applied leaves nothing to take back,
// and a claim whose reply arrived is never abandoned, whatever happens next.
TEST_F(LedgerTest, AbandonNeverTouchesAClaimWhoseReplyArrived) {
  testing::LostReplyStore lossy(*store_);
  Ledger ledger(lossy, clock_);
  Call call = MakeCall();
  auto owner = ledger.Begin(call);
  ASSERT_TRUE(owner);
  ASSERT_EQ(owner->kind, Kind::kExecute);
  lossy.set_down(true);
  EXPECT_FALSE(ledger.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "x"}));
  lossy.set_down(false);
  clock_.Advance(1s);
  auto rec = store_->Get(call.id);
  ASSERT_TRUE(rec && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress) << "follows the lease-expiry path";
  EXPECT_EQ(lossy.abandoned(), 0);
}

// Whatever store call fails, the ledger never executes without a granted
// claim, and never reports an execution whose outcome was not stored.
TEST_F(LedgerTest, FailingTheNthStoreCallNeverExecutesUnclaimed) {
  for (int n = 1; n <= 12; ++n) {
    SCOPED_TRACE("failing store call #" + std::to_string(n));
    FakeClock clock;
    auto base = NewMemoryStore(clock);
    testing::FailingStore failing(*base, n);
    Ledger ledger(failing, clock);
    Call call = MakeCall();
    call.policy.wait = 0ms;
    int runs = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto r = ledger.Run(call, [&] {
        ++runs;
        EXPECT_EQ(runs, failing.claims_granted()) << "executed without its own claim";
        return Ok("x");
      });
      if (r && r->decision.kind == Kind::kExecute) {
        auto rec = base->Get(call.id);
        ASSERT_TRUE(rec && rec->has_value());
        EXPECT_EQ((*rec)->state, RecordState::kCompleted);
      }
      if (!r) {
        EXPECT_EQ(r.error().code, ErrorCode::kUnavailable) << r.error().ToString();
      }
    }
    EXPECT_LE(runs, 1);
  }
}

TEST_F(LedgerTest, SixtyFourThreadsRacingOneKeyExecuteOnce) {
  constexpr int kThreads = 64;
  std::atomic<int> runs{0};
  std::vector<Result<RunResult>> results(kThreads, MakeError(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  Call call = MakeCall();
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      results[i] = ledger_.Run(call, [&] {
        runs.fetch_add(1);
        return Ok("charge ch_" + std::to_string(i));
      });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  std::set<std::string> bodies;
  int executed = 0;
  for (auto& r : results) {
    ASSERT_TRUE(r) << r.error().ToString();
    ASSERT_TRUE(r->outcome);
    bodies.insert(r->outcome->body);
    executed += r->decision.kind == Kind::kExecute;
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(bodies.size(), 1u) << "64 identical outcomes";
}

TEST_F(LedgerTest, EveryAttemptIsLogged) {
  Call call = MakeCall();
  ASSERT_TRUE(ledger_.Run(call, [&] { return Ok("x"); }));
  ASSERT_TRUE(ledger_.Run(call, [&] { return Ok("x"); }));
  ledger_.Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  ASSERT_EQ(attempts->size(), 3u);  // newest first; the claim's entry is the oldest
  EXPECT_EQ((*attempts)[0].outcome, AttemptOutcome::kReplayed);
  EXPECT_EQ((*attempts)[1].outcome, AttemptOutcome::kExecuted);
  EXPECT_EQ((*attempts)[1].key, call.id.key);
  EXPECT_EQ((*attempts)[1].tool, "charge");
  EXPECT_EQ((*attempts)[1].instance, "test");
  EXPECT_EQ((*attempts)[2].outcome, AttemptOutcome::kClaimed);
}

// SettledAsync answers from one read exactly what Begin would when no write
// or wait is needed, logs the attempt as Begin would, and otherwise defers.
class SettledTest : public LedgerTest {
 protected:
  // What SettledAsync called back with; fails the test if it refused.
  std::optional<Decision> Settled(const Call& call) {
    std::optional<Decision> answer;
    int calls = 0;
    EXPECT_TRUE(async_ledger_.SettledAsync(call, [&](std::optional<Decision> d) {
      ++calls;
      answer = std::move(d);
    }));
    EXPECT_EQ(calls, 1) << "called back exactly once (inline, with this store)";
    return answer;
  }

  testing::InlineAsyncReads reads_{*store_};
  Ledger async_ledger_{reads_, clock_, LedgerOptions{"test", nullptr, true}};
};

TEST_F(SettledTest, AnswersFinishedCallsFromOneReadAndDefersTheRest) {
  Call call = MakeCall();
  EXPECT_FALSE(Settled(call)) << "no record: only Begin can claim it";
  auto owner = async_ledger_.Begin(call);
  ASSERT_TRUE(owner);
  EXPECT_FALSE(Settled(call)) << "a running owner: only Begin may wait for it";
  ASSERT_TRUE(async_ledger_.Complete(call, *owner, Outcome{OutcomeClass::kSuccess, "charged"}));

  auto replay = Settled(call);
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->kind, Kind::kReplay);
  EXPECT_FALSE(replay->attached);
  ASSERT_TRUE(replay->record.outcome);
  EXPECT_EQ(replay->record.outcome->body, "charged");

  auto drift = Settled(MakeCall(call.id.key, "fp-other"));
  ASSERT_TRUE(drift);
  EXPECT_EQ(drift->kind, Kind::kDrift);
  Call lenient = MakeCall(call.id.key, "fp-other");
  lenient.policy.on_drift = OnDrift::kReplay;
  auto drift_replayed = Settled(lenient);
  ASSERT_TRUE(drift_replayed);
  EXPECT_EQ(drift_replayed->kind, Kind::kReplay);
  EXPECT_TRUE(drift_replayed->drift);

  async_ledger_.Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  ASSERT_EQ(attempts->size(), 5u) << "claimed, executed, replayed, drift, replayed";
  EXPECT_EQ((*attempts)[0].outcome, AttemptOutcome::kReplayed);
  EXPECT_EQ((*attempts)[1].outcome, AttemptOutcome::kDrift);
  EXPECT_EQ((*attempts)[2].outcome, AttemptOutcome::kReplayed);
}

TEST_F(SettledTest, GivesUnknownOnlyWhenThePolicyFailsOnIt) {
  Call call = MakeCall();
  ASSERT_TRUE(async_ledger_.Begin(call));
  clock_.Advance(call.policy.lease + 1s);
  auto unknown = async_ledger_.Run(call, [&] { return Ok("x"); });  // marks the dead owner's record
  ASSERT_TRUE(unknown);
  ASSERT_EQ(unknown->decision.kind, Kind::kUnknown);
  auto settled = Settled(call);
  ASSERT_TRUE(settled);
  EXPECT_EQ(settled->kind, Kind::kUnknown);
  Call retrying = call;
  retrying.policy.on_unknown = OnUnknown::kRetry;
  EXPECT_FALSE(Settled(retrying)) << "on_unknown = retry takes over: a write, for Begin";
}

// BeginAsync and CompleteAsync decide, log and refuse exactly as Begin and
// Complete, on a store that claims and completes without blocking.
class AsyncWritesTest : public LedgerTest {
 protected:
  // BeginAsync's answer; it must call back exactly once (inline, here).
  std::optional<Result<Decision>> BeginAsync(const Call& call) {
    std::optional<Result<Decision>> answer;
    int calls = 0;
    EXPECT_TRUE(ledger_async_.BeginAsync(call, [&](std::optional<Result<Decision>> d) {
      ++calls;
      answer = std::move(d);
    }));
    EXPECT_EQ(calls, 1);
    return answer;
  }
  Result<Record> CompleteAsync(const Call& call, const Decision& d, Outcome outcome) {
    std::optional<Result<Record>> answer;
    EXPECT_TRUE(ledger_async_.CompleteAsync(call, d, outcome,
                                            [&](Result<Record> r) { answer = std::move(r); }));
    EXPECT_TRUE(answer.has_value());
    return answer ? std::move(*answer) : std::unexpected(Error{ErrorCode::kInternal, "no answer"});
  }

  testing::InlineAsyncWrites writes_{*store_};
  Ledger ledger_async_{writes_, clock_, LedgerOptions{"test", nullptr, true}};
};

TEST_F(AsyncWritesTest, ClaimsCompletesAndLeavesAnExistingRecordToBegin) {
  Call call = MakeCall();
  auto first = BeginAsync(call);
  ASSERT_TRUE(first && *first) << "a fresh call is claimed";
  EXPECT_EQ((*first)->kind, Kind::kExecute);
  EXPECT_FALSE(BeginAsync(call)) << "a running owner: only Begin may wait for it";
  call.policy.max_result_bytes = 8;
  auto stored = CompleteAsync(call, **first, Outcome{OutcomeClass::kSuccess, "too long a body"});
  ASSERT_TRUE(stored) << stored.error().ToString();
  ASSERT_TRUE(stored->outcome);
  EXPECT_EQ(stored->outcome->cls, OutcomeClass::kTooLarge) << "as Complete: over max_result_bytes";
  auto replay = BeginAsync(call);
  ASSERT_TRUE(replay && *replay) << "the claim found a completed record: it settles the call";
  EXPECT_EQ((*replay)->kind, Kind::kReplay);
  ASSERT_TRUE((*replay)->record.outcome);
  EXPECT_EQ((*replay)->record.outcome->cls, OutcomeClass::kTooLarge);
  auto stale = CompleteAsync(call, **first, Outcome{OutcomeClass::kSuccess, "again"});
  EXPECT_FALSE(stale) << "the record is completed: the fence's write is refused";

  ledger_async_.Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  ASSERT_EQ(attempts->size(), 4u) << "claimed, executed, replayed; the refused second completion";
  EXPECT_EQ((*attempts)[3].outcome, AttemptOutcome::kClaimed);
  EXPECT_EQ((*attempts)[2].outcome, AttemptOutcome::kExecuted);
  EXPECT_EQ((*attempts)[1].outcome, AttemptOutcome::kReplayed);
  EXPECT_EQ((*attempts)[0].outcome, AttemptOutcome::kError);
}

TEST_F(AsyncWritesTest, AStoreThatIsDownFailsClosedOrPassesThroughByPolicy) {
  for (const OnStoreDown policy : {OnStoreDown::kFail, OnStoreDown::kPass}) {
    testing::FailingStore down(*store_, /*fail_at=*/1);
    testing::InlineAsyncWrites writes(down);
    Ledger ledger(writes, clock_);
    Call call = MakeCall();
    call.policy.on_store_down = policy;
    std::optional<Result<Decision>> answer;
    ASSERT_TRUE(ledger.BeginAsync(call, [&](auto d) { answer = std::move(d); }));
    ASSERT_TRUE(answer);
    if (policy == OnStoreDown::kFail) {
      ASSERT_FALSE(*answer) << "fail closed: nothing may execute";
      EXPECT_EQ(answer->error().code, ErrorCode::kUnavailable);
      continue;
    }
    ASSERT_TRUE(*answer);
    EXPECT_EQ((*answer)->kind, Kind::kPassThrough);
    EXPECT_FALSE(ledger.CompleteAsync(call, **answer, Outcome{}, [](Result<Record>) {
      ADD_FAILURE() << "an unguarded call has no record to complete";
    }));
  }
}

TEST_F(LedgerTest, BeginAsyncIsRefusedByAStoreWithoutAsynchronousWrites) {
  EXPECT_FALSE(ledger_.BeginAsync(MakeCall(), [](std::optional<Result<Decision>>) {
    ADD_FAILURE() << "called back after refusing";
  }));
}

TEST_F(LedgerTest, SettledAsyncIsRefusedByAStoreWithoutAsynchronousReads) {
  EXPECT_FALSE(ledger_.SettledAsync(
      MakeCall(), [](std::optional<Decision>) { ADD_FAILURE() << "called back after refusing"; }));
}

// BeginWithoutBlocking takes the cheapest way the store offers and hands
// only what may block to the worker: a read for a finished call, a claim for
// a fresh one, Begin for a record with a running owner or a store with
// neither. A front that cannot offload answers itself; done never runs.
TEST_F(LedgerTest, BeginWithoutBlockingOffloadsOnlyWhatMayBlock) {
  struct Both : testing::InlineAsyncWrites {
    using InlineAsyncWrites::InlineAsyncWrites;
    bool GetAsync(const RecordId& id, GetDone done) override {
      done(target_.Get(id));
      return true;
    }
  } both(*store_);
  Ledger async_ledger(both, clock_, LedgerOptions{"test", nullptr, true});
  struct Seen {
    int offloaded = 0;
    int done = 0;
    std::optional<Result<Decision>> last;
  };
  auto begin = [](Ledger& ledger, const Call& call, Seen& seen, bool pool_up = true) {
    ledger.BeginWithoutBlocking(
        call,
        [&seen, pool_up](std::function<void()> work) {
          ++seen.offloaded;
          if (pool_up) work();  // the worker, inline
        },
        [&seen](Result<Decision> d) {
          ++seen.done;
          seen.last = std::move(d);
        });
  };

  Call call = MakeCall();
  call.policy.wait = Duration(0);  // a running owner: answer at once, do not wait for it
  Seen fresh;
  begin(async_ledger, call, fresh);
  EXPECT_EQ(fresh.offloaded, 0) << "a fresh call is claimed without a worker";
  ASSERT_EQ(fresh.done, 1);
  ASSERT_TRUE(*fresh.last);
  EXPECT_EQ((**fresh.last).kind, Kind::kExecute);

  Seen running;  // the owner has not completed: Begin decides, on a worker
  begin(async_ledger, call, running);
  EXPECT_EQ(running.offloaded, 1);
  ASSERT_EQ(running.done, 1);
  ASSERT_TRUE(*running.last);
  EXPECT_EQ((**running.last).kind, Kind::kInProgress);

  ASSERT_TRUE(async_ledger.Complete(call, **fresh.last, Outcome{OutcomeClass::kSuccess, "ok"}));
  Seen replay;
  begin(async_ledger, call, replay);
  EXPECT_EQ(replay.offloaded, 0) << "a finished call is settled by one read";
  ASSERT_EQ(replay.done, 1);
  EXPECT_EQ((**replay.last).kind, Kind::kReplay);

  Seen plain;  // the memory store offers neither: everything on the worker
  begin(ledger_, MakeCall("other-key"), plain);
  EXPECT_EQ(plain.offloaded, 1);
  ASSERT_EQ(plain.done, 1);
  EXPECT_EQ((**plain.last).kind, Kind::kExecute);

  Seen stopping;
  begin(ledger_, MakeCall("third-key"), stopping, /*pool_up=*/false);
  EXPECT_EQ(stopping.offloaded, 1);
  EXPECT_EQ(stopping.done, 0) << "the front answered itself";
}

// Above a store whose claim answers as a read would (Redis), nothing is
// read first: a fresh call is one claim, and a finished one is settled by
// the claim that finds its record, both without a worker, or by the record
// held in memory (CachingStore) without a claim.
TEST_F(LedgerTest, BeginWithoutBlockingClaimsFirstWhereTheStoreSaysSo) {
  struct ClaimFirst : testing::InlineAsyncWrites {
    using InlineAsyncWrites::InlineAsyncWrites;
    bool ReadsBeforeClaim() const override { return false; }
    bool GetAsync(const RecordId&, GetDone) override {
      ++reads;
      return false;
    }
    bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override {
      ++claims;
      return InlineAsyncWrites::ClaimAsync(req, std::move(done));
    }
    // As a CachingStore would once it holds the completed record.
    std::optional<Record> Held(const RecordId& id) override {
      if (!cache) return std::nullopt;
      auto r = target_.Get(id);
      return r && *r && (*r)->state == RecordState::kCompleted ? **r : std::optional<Record>();
    }
    int reads = 0;
    int claims = 0;
    bool cache = false;
  } store(*store_);
  Ledger ledger(store, clock_, LedgerOptions{"test", nullptr, true});
  int offloaded = 0;
  auto begin = [&](const Call& call) {
    std::optional<Result<Decision>> answer;
    ledger.BeginWithoutBlocking(
        call,
        [&](std::function<void()> work) {
          ++offloaded;
          work();
        },
        [&](Result<Decision> d) { answer = std::move(d); });
    return answer;
  };

  Call call = MakeCall();
  auto fresh = begin(call);
  ASSERT_TRUE(fresh && *fresh);
  EXPECT_EQ((*fresh)->kind, Kind::kExecute);
  ASSERT_TRUE(ledger.Complete(call, **fresh, Outcome{OutcomeClass::kSuccess, "ok"}));
  auto replay = begin(call);
  ASSERT_TRUE(replay && *replay);
  EXPECT_EQ((*replay)->kind, Kind::kReplay);
  EXPECT_EQ(store.reads, 0) << "no read before the claim";
  EXPECT_EQ(offloaded, 0) << "neither needed a worker";
  EXPECT_EQ(store.claims, 2);

  store.cache = true;  // a record held in memory answers without a claim
  auto held = begin(call);
  ASSERT_TRUE(held && *held);
  EXPECT_EQ((*held)->kind, Kind::kReplay);
  EXPECT_EQ(store.claims, 2);

  Call drifted = call;  // the claim finds another call's record: refused as drift, no worker
  drifted.fingerprint = std::string(64, 'f');
  drifted.policy.on_drift = OnDrift::kReject;
  auto drift = begin(drifted);
  ASSERT_TRUE(drift && *drift);
  EXPECT_EQ((*drift)->kind, Kind::kDrift);
  EXPECT_EQ(offloaded, 0);
  EXPECT_EQ(store.claims, 2) << "the held record settled the drift too";
}

// Owner tokens come from a per-thread pool of CSPRNG bytes (ledger.cc): each
// claim's is new, 128 bits in hex, and a forked child does not draw from the
// pool its parent had filled.
TEST_F(LedgerTest, EveryClaimHasItsOwnOwnerToken) {
  std::set<std::string> owners;
  auto claim = [&](const std::string& key) {
    auto d = ledger_.Begin(MakeCall(key));
    EXPECT_TRUE(d && d->kind == Kind::kExecute);
    return d ? d->record.owner : std::string();
  };
  for (int i = 0; i < 100; ++i) {  // three refills of a 32-token pool
    const std::string owner = claim("k" + std::to_string(i));
    EXPECT_EQ(owner.size(), 32u);
    EXPECT_EQ(owner.find_first_not_of("0123456789abcdef"), std::string::npos);
    owners.insert(owner);
  }
  EXPECT_EQ(owners.size(), 100u);

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string owner = claim("in-child");
    const bool written = write(fds[1], owner.data(), owner.size()) == ssize_t(owner.size());
    _exit(written ? 0 : 1);
  }
  close(fds[1]);
  char buf[64];
  const ssize_t n = read(fds[0], buf, sizeof buf);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(n, 32);
  const std::string in_child(buf, static_cast<size_t>(n));
  EXPECT_NE(claim("in-parent"), in_child);  // the parent's next token
  EXPECT_FALSE(owners.contains(in_child));
}

TEST_F(LedgerTest, TurnFallbackUsesTheShorterWindow) {
  Call call = MakeCall();
  call.turn_fallback = true;
  ASSERT_TRUE(ledger_.Run(call, [&] { return Ok("x"); }));
  auto rec = store_->Get(call.id);
  ASSERT_TRUE(rec && rec->has_value());
  EXPECT_EQ((*rec)->expires_at, clock_.Now() + call.policy.window);
}

}  // namespace
}  // namespace idem
