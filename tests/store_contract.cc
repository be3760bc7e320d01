#include "store_contract.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "idem/attempt_chain.h"
#include "idem/forwarding_store.h"
#include "idem/ledger.h"
#include "idem/resolve.h"
#include "idem/store_clock.h"

using namespace idem;
using namespace std::chrono_literals;

namespace {

const Duration kLease = 30s;
const Duration kTtl = 24h;

ClaimRequest Req(const std::string& key, const std::string& fp = "fp1",
                 const std::string& tenant = "default", const std::string& owner = "owner-1") {
  ClaimRequest r;
  r.owner = owner;
  r.id = RecordId{tenant, key};
  r.fingerprint = fp;
  r.tool = "charge";
  r.turn = "turn-1";
  r.lease = kLease;
  r.retention = kTtl;
  return r;
}

Outcome Ok(std::string body) { return Outcome{OutcomeClass::kSuccess, std::move(body)}; }

}  // namespace

void ExpectEntriesFoundByOutcome(Store& store) {
  for (const auto& [outcome, key] :
       {std::pair{AttemptOutcome::kUnknown, "b"}, std::pair{AttemptOutcome::kExecuted, "a"}}) {
    AttemptFilter f;
    f.outcome = outcome;
    auto found = store.QueryAttempts(f);
    ASSERT_TRUE(found) << found.error().ToString();
    ASSERT_EQ(found->size(), 1u) << AttemptOutcomeName(outcome);
    EXPECT_EQ(found->front().key, key);
  }
}

void ExpectOwnerlessRecordAndOwnedClaims(Store& store) {
  const RecordId old_id{"default", "old"};
  auto old = store.Get(old_id);
  ASSERT_TRUE(old && old->has_value()) << (old ? "" : old.error().ToString());
  EXPECT_EQ((*old)->state, RecordState::kInProgress);
  EXPECT_EQ((*old)->owner, "");
  EXPECT_EQ(store.Abandon(old_id, "anyone").error().code, ErrorCode::kAborted);
  const ClaimRequest fresh = Req("new", "fp1", "default", "owner-new");
  auto c = store.Claim(fresh);
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(c->record.owner, "owner-new");
  ASSERT_TRUE(store.Abandon(fresh.id, "owner-new"));
}

TEST_P(StoreContractTest, ClaimCreatesInProgressWithLease) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
  EXPECT_EQ(c->record.state, RecordState::kInProgress);
  EXPECT_EQ(c->record.fingerprint, "fp1");
  EXPECT_EQ(c->record.tool, "charge");
  EXPECT_EQ(c->record.turn, "turn-1");
  EXPECT_EQ(c->record.owner, "owner-1");
  EXPECT_GT(c->record.fence, 0u);
  EXPECT_EQ(c->record.created_at, clock_.Now());
  EXPECT_EQ(c->record.lease_expires_at, clock_.Now() + kLease);
}

TEST_P(StoreContractTest, SecondClaimReturnsExistingRecordUntouched) {
  auto first = store_->Claim(Req("k"));
  ASSERT_TRUE(first);
  clock_.Advance(1s);
  auto second = store_->Claim(Req("k", "other-fp"));
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->claimed);
  EXPECT_EQ(second->record.fence, first->record.fence);
  EXPECT_EQ(second->record.fingerprint, "fp1");
  EXPECT_EQ(second->record.lease_expires_at, first->record.lease_expires_at);
}

TEST_P(StoreContractTest, CompleteStoresOutcomeAndGetReturnsIt) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  std::string body("binary\0outcome\xff", 15);
  auto done = store_->Complete(c->record.id, c->record.fence, Ok(body), kTtl);
  ASSERT_TRUE(done) << done.error().ToString();
  EXPECT_EQ(done->state, RecordState::kCompleted);
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got);
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  ASSERT_TRUE((*got)->outcome.has_value());
  EXPECT_EQ((*got)->outcome->body, body);
  EXPECT_EQ((*got)->outcome->cls, OutcomeClass::kSuccess);
  EXPECT_EQ((*got)->completed_at, clock_.Now());
  EXPECT_EQ((*got)->expires_at, clock_.Now() + kTtl);
  auto again = store_->Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->claimed);
  EXPECT_EQ(again->record.state, RecordState::kCompleted);
}

// The value a store hands to an asynchronous operation's callback, after
// checking that it ran exactly once; nullopt if the store declined (false).
template <typename T, typename Start>
std::optional<Result<T>> AwaitAsync(Start start) {
  std::promise<Result<T>> answer;
  auto future = answer.get_future();
  std::atomic<int> calls{0};
  if (!start([&](Result<T> r) {
        ++calls;
        answer.set_value(std::move(r));
      })) {
    return std::nullopt;
  }
  auto r = future.get();
  EXPECT_EQ(calls.load(), 1);
  return r;
}

// A store that reads without blocking (GetAsync true) answers exactly what
// Get does: a completed record with its outcome, a running one, none at all,
// and none once past retention. Stores without such a read say so.
TEST_P(StoreContractTest, GetAsyncAgreesWithGet) {
  auto get_async = [&](const RecordId& id) {
    return AwaitAsync<std::optional<Record>>(
        [&](auto done) { return store_->GetAsync(id, done); });
  };
  auto done = store_->Claim(Req("done"));
  auto running = store_->Claim(Req("running"));
  ASSERT_TRUE(done && running);
  ASSERT_TRUE(store_->Complete(done->record.id, done->record.fence, Ok("out"), kTtl));
  const RecordId absent{"default", "absent"};
  if (!get_async(done->record.id)) {
    // A store without the read declines every one, leaving `done` uncalled
    // (AwaitAsync checks it ran at most once) and the records as they were.
    EXPECT_FALSE(get_async(absent).has_value());
    auto still = store_->Get(done->record.id);
    ASSERT_TRUE(still && still->has_value());
    EXPECT_EQ((*still)->state, RecordState::kCompleted);
    return;
  }
  for (const RecordId& id : {done->record.id, running->record.id, absent}) {
    auto sync = store_->Get(id);
    auto taken = get_async(id);
    if (!taken) {
      ASSERT_TRUE(GetParam().reads_some_async)
          << id.key << ": the store took one asynchronous read and refused another";
      continue;
    }
    auto async = *std::move(taken);
    ASSERT_TRUE(sync && async) << id.key;
    ASSERT_EQ(sync->has_value(), async->has_value()) << id.key;
    if (!sync->has_value()) continue;
    EXPECT_EQ((*async)->state, (*sync)->state) << id.key;
    EXPECT_EQ((*async)->fence, (*sync)->fence) << id.key;
    EXPECT_EQ((*async)->fingerprint, (*sync)->fingerprint) << id.key;
    EXPECT_EQ((*async)->expires_at, (*sync)->expires_at) << id.key;
    EXPECT_EQ((*async)->outcome.has_value(), (*sync)->outcome.has_value()) << id.key;
    if ((*sync)->outcome) {
      EXPECT_EQ((*async)->outcome->body, (*sync)->outcome->body);
    }
  }
  clock_.Advance(kTtl + 1s);
  auto taken = get_async(done->record.id);
  if (!taken && GetParam().reads_some_async) return;
  ASSERT_TRUE(taken);
  auto expired = *std::move(taken);
  ASSERT_TRUE(expired);
  EXPECT_FALSE(expired->has_value()) << "a record past retention is not live";
}

// A store that claims and completes without blocking (ClaimAsync,
// CompleteAsync true) answers what Claim and Complete do: a claim, the
// existing record with its outcome, the fence's refusal.
TEST_P(StoreContractTest, ClaimAsyncAndCompleteAsyncAgreeWithClaimAndComplete) {
  auto claim = [&](const ClaimRequest& req) {
    return AwaitAsync<ClaimResult>([&](auto done) { return store_->ClaimAsync(req, done); });
  };
  auto complete = [&](const Record& r, uint64_t fence, const Outcome& o) {
    return AwaitAsync<Record>(
        [&](auto done) { return store_->CompleteAsync(r.id, fence, o, kTtl, done); });
  };
  auto first = claim(Req("k"));
  if (!first) {
    // A store without the writes declines them without writing: the key is
    // still free for a blocking claim, and a declined complete changes nothing.
    auto none = store_->Get(RecordId{"default", "k"});
    ASSERT_TRUE(none);
    EXPECT_FALSE(none->has_value()) << "a declined ClaimAsync wrote a record";
    auto blocking = store_->Claim(Req("k"));
    ASSERT_TRUE(blocking && blocking->claimed);
    EXPECT_FALSE(complete(blocking->record, blocking->record.fence, Ok("o")).has_value());
    auto after = store_->Get(RecordId{"default", "k"});
    ASSERT_TRUE(after && after->has_value());
    EXPECT_EQ((*after)->state, RecordState::kInProgress) << "a declined CompleteAsync wrote";
    return;
  }
  ASSERT_TRUE(*first) << first->error().ToString();
  EXPECT_TRUE((*first)->claimed);
  const Record claimed = (*first)->record;
  EXPECT_EQ(claimed.state, RecordState::kInProgress);
  EXPECT_EQ(claimed.owner, "owner-1");
  EXPECT_EQ(claimed.lease_expires_at, clock_.Now() + kLease);
  auto stale = complete(claimed, claimed.fence + 1, Ok("not mine"));
  ASSERT_TRUE(stale && !*stale);
  EXPECT_EQ(stale->error().code, ErrorCode::kAborted);
  const std::string body(300, 'b');  // split into fields by some stores
  auto done = complete(claimed, claimed.fence, Ok(body));
  ASSERT_TRUE(done && *done) << (done && !*done ? done->error().ToString() : "declined");
  EXPECT_EQ((*done)->state, RecordState::kCompleted);
  ASSERT_TRUE((*done)->outcome);
  EXPECT_EQ((*done)->outcome->body, body);
  auto again = claim(Req("k", "fp1", "default", "owner-2"));
  ASSERT_TRUE(again && *again);
  EXPECT_FALSE((*again)->claimed);
  ASSERT_TRUE((*again)->record.outcome);
  EXPECT_EQ((*again)->record.outcome->body, body);
  auto sync = store_->Claim(Req("k"));
  ASSERT_TRUE(sync);
  EXPECT_EQ(sync->record.fence, (*again)->record.fence);
  EXPECT_EQ(sync->record.expires_at, (*again)->record.expires_at);
}

TEST_P(StoreContractTest, OutcomeClassesRoundTrip) {
  for (OutcomeClass cls :
       {OutcomeClass::kSuccess, OutcomeClass::kToolError, OutcomeClass::kTooLarge}) {
    std::string key = "k" + std::string(OutcomeClassName(cls));
    auto c = store_->Claim(Req(key));
    ASSERT_TRUE(c);
    ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Outcome{cls, "b"}, kTtl));
    auto got = store_->Get(c->record.id);
    ASSERT_TRUE(got && got->has_value());
    EXPECT_EQ((*got)->outcome->cls, cls);
  }
}

TEST_P(StoreContractTest, StaleFenceIsRefusedEverywhere) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  const RecordId id = c->record.id;
  const uint64_t stale = c->record.fence + 7;
  EXPECT_EQ(store_->Heartbeat(id, stale, kLease).error().code, ErrorCode::kAborted);
  EXPECT_EQ(store_->Complete(id, stale, Ok("x"), kTtl).error().code, ErrorCode::kAborted);
  EXPECT_EQ(store_->Release(id, stale).error().code, ErrorCode::kAborted);
  EXPECT_EQ(store_->MarkUnknown(id, stale, kTtl).error().code, ErrorCode::kAborted);
  auto got = store_->Get(id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kInProgress);
  EXPECT_EQ((*got)->fence, c->record.fence);
}

TEST_P(StoreContractTest, OperationsOnMissingRecordAreNotFound) {
  RecordId id{"default", "missing"};
  EXPECT_EQ(store_->Heartbeat(id, 1, kLease).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->Complete(id, 1, Ok("x"), kTtl).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->Release(id, 1).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->MarkUnknown(id, 1, kTtl).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->TakeOver(id, 1, kLease).error().code, ErrorCode::kNotFound);
  auto got = store_->Get(id);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->has_value());
}

TEST_P(StoreContractTest, HeartbeatExtendsLease) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  clock_.Advance(20s);
  auto hb = store_->Heartbeat(c->record.id, c->record.fence, kLease);
  ASSERT_TRUE(hb) << hb.error().ToString();
  EXPECT_EQ(*hb, clock_.Now() + kLease);
  clock_.Advance(20s);  // 40 s after the claim: alive only thanks to the heartbeat
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_GT((*got)->lease_expires_at, clock_.Now());
}

TEST_P(StoreContractTest, HeartbeatOnCompletedRecordFails) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), kTtl));
  auto hb = store_->Heartbeat(c->record.id, c->record.fence, kLease);
  ASSERT_FALSE(hb);
  EXPECT_EQ(hb.error().code, ErrorCode::kFailedPrecondition);
}

TEST_P(StoreContractTest, ReleaseDeletesSoNextClaimWins) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->Release(c->record.id, c->record.fence));
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->has_value());
  auto again = store_->Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->claimed);
  EXPECT_GT(again->record.fence, c->record.fence);
}

TEST_P(StoreContractTest, ExpiredLeaseIsReturnedNotReclaimed) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  clock_.Advance(kLease + 1s);
  auto again = store_->Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->claimed);
  EXPECT_EQ(again->record.state, RecordState::kInProgress);
  EXPECT_LE(again->record.lease_expires_at, clock_.Now());
}

TEST_P(StoreContractTest, MarkUnknownKeepsRecordUntilRetention) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  clock_.Advance(kLease + 1s);
  auto u = store_->MarkUnknown(c->record.id, c->record.fence, 1h);
  ASSERT_TRUE(u) << u.error().ToString();
  EXPECT_EQ(u->state, RecordState::kUnknown);
  auto again = store_->Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->claimed);
  EXPECT_EQ(again->record.state, RecordState::kUnknown);
  clock_.Advance(1h);
  auto fresh = store_->Claim(Req("k"));
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->claimed) << "an unknown record ends with its retention window";
  EXPECT_GT(fresh->record.fence, c->record.fence);
}

TEST_P(StoreContractTest, UnknownCanBeCompletedOrReleasedWithItsFence) {
  auto c = store_->Claim(Req("a"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->MarkUnknown(c->record.id, c->record.fence, kTtl));
  auto done = store_->Complete(c->record.id, c->record.fence, Ok("resolved"), kTtl);
  ASSERT_TRUE(done) << done.error().ToString();
  EXPECT_EQ(done->state, RecordState::kCompleted);

  auto d = store_->Claim(Req("b"));
  ASSERT_TRUE(d);
  ASSERT_TRUE(store_->MarkUnknown(d->record.id, d->record.fence, kTtl));
  ASSERT_TRUE(store_->Release(d->record.id, d->record.fence));
  auto got = store_->Get(d->record.id);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->has_value());
}

TEST_P(StoreContractTest, TakeOverNeedsExpiredLeaseAndBumpsFence) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  auto early = store_->TakeOver(c->record.id, c->record.fence, kLease);
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, ErrorCode::kFailedPrecondition);
  clock_.Advance(kLease);
  auto t = store_->TakeOver(c->record.id, c->record.fence, kLease);
  ASSERT_TRUE(t) << t.error().ToString();
  EXPECT_EQ(t->state, RecordState::kInProgress);
  EXPECT_GT(t->fence, c->record.fence);
  EXPECT_EQ(t->lease_expires_at, clock_.Now() + kLease);
  // The superseded owner can no longer write.
  EXPECT_EQ(store_->Complete(c->record.id, c->record.fence, Ok("late"), kTtl).error().code,
            ErrorCode::kAborted);
  // Only one of two racing take-overs with the same old fence wins.
  EXPECT_EQ(store_->TakeOver(c->record.id, c->record.fence, kLease).error().code,
            ErrorCode::kAborted);
  ASSERT_TRUE(store_->Complete(c->record.id, t->fence, Ok("new owner"), kTtl));
}

// The claim's retention is part of the record: every later read and step
// sees it, so a step rebuilt from the record keeps it (Record::retention).
TEST_P(StoreContractTest, TheClaimsRetentionIsKeptByTheRecord) {
  ClaimRequest req = Req("k");
  req.retention = 7h;
  auto c = store_->Claim(req);
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(c->record.retention, Duration(7h));
  auto seen = store_->Claim(req);
  ASSERT_TRUE(seen && !seen->claimed);
  EXPECT_EQ(seen->record.retention, Duration(7h));
  clock_.Advance(kLease);
  auto t = store_->TakeOver(c->record.id, c->record.fence, kLease);
  ASSERT_TRUE(t) << t.error().ToString();
  EXPECT_EQ(t->retention, Duration(7h));
  auto done = store_->Complete(c->record.id, t->fence, Ok("x"), 7h);
  ASSERT_TRUE(done) << done.error().ToString();
  EXPECT_EQ(done->retention, Duration(7h));
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->retention, Duration(7h));
}

// A claim's and a completion's audit entries go in the record's own write
// where the store can (Store::LogsWithRecords), and only when the record is
// written; a store that cannot leaves them to the caller and writes none.
TEST_P(StoreContractTest, ClaimAndCompletionEntriesAreWrittenWithTheirRecord) {
  auto entry = [](idem::AttemptOutcome outcome, const std::string& detail) {
    idem::Attempt a;
    a.at = idem::FromUnixMillis(1'767'225'600'000);
    a.tenant = "default";
    a.key = "k";
    a.tool = "charge";
    a.turn = "turn-1";
    a.outcome = outcome;
    a.latency = idem::Duration(7);
    a.instance = "i-1";
    a.detail = detail;
    return a;
  };
  auto logged = [&]() -> std::vector<std::string> {
    idem::AttemptFilter f;
    f.key = "k";
    auto got = store_->QueryAttempts(f);
    EXPECT_TRUE(got) << got.error().ToString();
    std::vector<std::string> details;
    if (got) {
      for (const auto& a : *got) details.push_back(a.detail);
    }
    return details;  // newest first
  };
  ClaimRequest req = Req("k");
  req.logged = entry(idem::AttemptOutcome::kClaimed, "claim 1");
  auto c = store_->Claim(req);
  ASSERT_TRUE(c && c->claimed);
  req.logged = entry(idem::AttemptOutcome::kClaimed, "claim 2");
  ASSERT_TRUE(store_->Claim(req));  // finds the live record: writes nothing
  const idem::Attempt stale = entry(idem::AttemptOutcome::kExecuted, "stale");
  ASSERT_FALSE(store_->Complete(c->record.id, c->record.fence + 1, Ok("x"), kTtl, &stale));
  const idem::Attempt done = entry(idem::AttemptOutcome::kExecuted, "done");
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), kTtl, &done));
  if (!store_->LogsWithRecords()) {
    EXPECT_TRUE(logged().empty());
    return;
  }
  EXPECT_EQ(logged(), (std::vector<std::string>{"done", "claim 1"}));
  idem::AttemptFilter f;
  f.key = "k";
  auto got = store_->QueryAttempts(f);
  ASSERT_TRUE(got && got->size() == 2);
  const idem::Attempt& first = got->back();
  EXPECT_EQ(first.outcome, idem::AttemptOutcome::kClaimed);
  EXPECT_EQ(first.at, idem::FromUnixMillis(1'767'225'600'000));
  EXPECT_EQ(first.latency, idem::Duration(7));
  EXPECT_EQ(first.instance, "i-1");
  EXPECT_EQ(first.tool, "charge");
  EXPECT_EQ(got->front().outcome, idem::AttemptOutcome::kExecuted);
}

TEST_P(StoreContractTest, TakeOverOfUnknownRecord) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->MarkUnknown(c->record.id, c->record.fence, kTtl));
  auto t = store_->TakeOver(c->record.id, c->record.fence, kLease);
  ASSERT_TRUE(t) << t.error().ToString();
  EXPECT_EQ(t->state, RecordState::kInProgress);
  EXPECT_GT(t->fence, c->record.fence);
}

TEST_P(StoreContractTest, CompletedRecordExpiresAfterRetention) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), 1h));
  clock_.Advance(1h - 1ms);
  auto alive = store_->Get(c->record.id);
  ASSERT_TRUE(alive && alive->has_value());
  clock_.Advance(1ms);
  auto gone = store_->Get(c->record.id);
  ASSERT_TRUE(gone);
  EXPECT_FALSE(gone->has_value());
  auto fresh = store_->Claim(Req("k"));
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->claimed);
  EXPECT_GT(fresh->record.fence, c->record.fence);
}

TEST_P(StoreContractTest, FencesGrowAcrossEviction) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  auto ev = store_->Evict(c->record.id);
  ASSERT_TRUE(ev);
  EXPECT_TRUE(*ev);
  auto again = store_->Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->claimed);
  EXPECT_NE(again->record.fence, c->record.fence)
      << "a stale owner of an evicted record must not own the new one";
  EXPECT_EQ(store_->Complete(c->record.id, c->record.fence, Ok("stale"), kTtl).error().code,
            ErrorCode::kAborted);
  auto none = store_->Evict(RecordId{"default", "never"});
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
}

TEST_P(StoreContractTest, TenantsAreSeparate) {
  auto a = store_->Claim(Req("k", "fp", "tenant-a"));
  auto b = store_->Claim(Req("k", "fp", "tenant-b"));
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->claimed);
  EXPECT_TRUE(b->claimed);
  ASSERT_TRUE(store_->Complete(a->record.id, a->record.fence, Ok("a's"), kTtl));
  auto gb = store_->Get(RecordId{"tenant-b", "k"});
  ASSERT_TRUE(gb && gb->has_value());
  EXPECT_EQ((*gb)->state, RecordState::kInProgress);
  ASSERT_TRUE(store_->Evict(RecordId{"tenant-a", "k"}));
  auto still = store_->Get(RecordId{"tenant-b", "k"});
  ASSERT_TRUE(still && still->has_value());
}

TEST_P(StoreContractTest, PurgeRemovesOnlyExpiredInBatches) {
  for (int i = 0; i < 10; ++i) {
    auto c = store_->Claim(Req("old" + std::to_string(i)));
    ASSERT_TRUE(c);
    ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), 1h));
  }
  auto keep = store_->Claim(Req("live"));
  ASSERT_TRUE(keep);
  ASSERT_TRUE(store_->Complete(keep->record.id, keep->record.fence, Ok("x"), 48h));
  clock_.Advance(2h);
  auto p1 = store_->PurgeExpired(4);
  ASSERT_TRUE(p1);
  EXPECT_EQ(*p1, 4u);
  auto p2 = store_->PurgeExpired(100);
  ASSERT_TRUE(p2);
  EXPECT_EQ(*p2, 6u);
  auto p3 = store_->PurgeExpired(100);
  ASSERT_TRUE(p3);
  EXPECT_EQ(*p3, 0u);
  auto n = store_->CountRecords();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1u);
  auto live = store_->Get(keep->record.id);
  ASSERT_TRUE(live && live->has_value());
}

TEST_P(StoreContractTest, ConcurrentClaimsHaveExactlyOneWinner) {
  constexpr int kThreads = 32;
  std::atomic<int> winners{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto c = store_->Claim(Req("race"));
      if (!c) {
        ++errors;
      } else if (c->claimed) {
        ++winners;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(winners.load(), 1);
}

TEST_P(StoreContractTest, WaitForChangeWakesOnComplete) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    auto w = store_->WaitForChange(c->record.id, c->record, clock_.Now() + 10s);
    EXPECT_TRUE(w) << w.error().ToString();
    woke = true;
  });
  clock_.AwaitWaiters(1);
  EXPECT_FALSE(woke.load());
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), kTtl));
  waiter.join();  // returns without any Advance: woken by the completion itself
  EXPECT_TRUE(woke.load());
}

TEST_P(StoreContractTest, WaitForChangeReturnsAtDeadline) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  std::thread waiter([&] {
    auto w = store_->WaitForChange(c->record.id, c->record, clock_.Now() + 5s);
    EXPECT_TRUE(w);
  });
  clock_.AwaitWaiters(1);
  clock_.Advance(5s);
  waiter.join();
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kInProgress);
}

TEST_P(StoreContractTest, WaitForChangeReturnsAtOnceIfAlreadyChanged) {
  auto c = store_->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->Release(c->record.id, c->record.fence));
  auto w = store_->WaitForChange(c->record.id, c->record, clock_.Now() + 10s);
  EXPECT_TRUE(w);
}

TEST_P(StoreContractTest, AttemptsAreQueriedNewestFirstWithFilters) {
  std::vector<Attempt> batch;
  for (int i = 0; i < 6; ++i) {
    Attempt a;
    a.at = clock_.Now() + Duration(i * 1000);
    a.tenant = "default";
    a.key = i % 2 ? "k1" : "k2";
    a.tool = i < 3 ? "charge" : "deploy";
    a.turn = "t";
    a.outcome = i == 5   ? AttemptOutcome::kReplayed
                : i == 0 ? AttemptOutcome::kUnknown
                         : AttemptOutcome::kExecuted;
    a.latency = Duration(i);
    a.instance = "test";
    a.detail = "d" + std::to_string(i);
    batch.push_back(a);
  }
  ASSERT_TRUE(store_->AppendAttempts(batch));
  auto all = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 6u);
  EXPECT_EQ(all->front().detail, "d5");
  EXPECT_EQ(all->front().outcome, AttemptOutcome::kReplayed);
  EXPECT_EQ(all->front().latency, Duration(5));
  EXPECT_EQ(all->front().instance, "test");

  AttemptFilter by_key;
  by_key.key = "k1";
  EXPECT_EQ(store_->QueryAttempts(by_key)->size(), 3u);
  AttemptFilter by_tool;
  by_tool.tool = "deploy";
  EXPECT_EQ(store_->QueryAttempts(by_tool)->size(), 3u);
  AttemptFilter by_outcome;
  by_outcome.outcome = AttemptOutcome::kReplayed;
  EXPECT_EQ(store_->QueryAttempts(by_outcome)->size(), 1u);
  by_outcome.outcome = AttemptOutcome::kExecuted;
  EXPECT_EQ(store_->QueryAttempts(by_outcome)->size(), 4u);
  // An outcome few entries have (SQLite indexes only those, schema 5).
  by_outcome.outcome = AttemptOutcome::kUnknown;
  auto unknown = store_->QueryAttempts(by_outcome);
  ASSERT_TRUE(unknown && unknown->size() == 1u);
  EXPECT_EQ(unknown->front().detail, "d0");
  by_outcome.since = clock_.Now() + 1s;
  EXPECT_TRUE(store_->QueryAttempts(by_outcome)->empty());
  AttemptFilter since;
  since.since = clock_.Now() + 4s;
  EXPECT_EQ(store_->QueryAttempts(since)->size(), 2u);
  AttemptFilter limited;
  limited.limit = 2;
  EXPECT_EQ(store_->QueryAttempts(limited)->size(), 2u);

  auto stats = store_->SummarizeAttempts(AttemptFilter{});
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->size(), 2u);
  EXPECT_EQ(stats->at("charge").attempts, 3u);
  EXPECT_EQ(stats->at("deploy").attempts, 3u);
  EXPECT_EQ(stats->at("deploy").by_outcome.at(AttemptOutcome::kReplayed), 1u);
  EXPECT_EQ(stats->at("deploy").by_outcome.at(AttemptOutcome::kExecuted), 2u);
  EXPECT_EQ(stats->at("charge").by_outcome.at(AttemptOutcome::kUnknown), 1u);
  AttemptFilter unknown_only;
  unknown_only.outcome = AttemptOutcome::kUnknown;
  auto unknown_stats = store_->SummarizeAttempts(unknown_only);
  ASSERT_TRUE(unknown_stats);
  ASSERT_EQ(unknown_stats->size(), 1u);
  EXPECT_EQ(unknown_stats->at("charge").attempts, 1u);
}

// An operator's acts (idem/resolve.h) on every backend: fence-conditional,
// and each logged with who did it, under the audit-only outcomes.
TEST_P(StoreContractTest, OperatorResolveAndEvictAreFencedAndLogged) {
  auto policy_for = [](const std::string&) { return Policy{}; };
  const Operator ops{"ops", "console", "serve-1"};
  for (const std::string key : {"released", "stored"}) {
    auto c = store_->Claim(Req(key));
    ASSERT_TRUE(c && c->claimed);
    ASSERT_TRUE(store_->MarkUnknown(c->record.id, c->record.fence, kTtl));
  }
  ResolveRequest stale{RecordId{"default", "released"}};
  stale.expect_fence = 99;
  auto refused = ResolveRecord(*store_, clock_, policy_for, stale, ops);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->kind, Resolution::Kind::kChanged);

  ResolveRequest release{RecordId{"default", "released"}};
  auto released = ResolveRecord(*store_, clock_, policy_for, release, ops);
  ASSERT_TRUE(released) << released.error().ToString();
  EXPECT_EQ(released->kind, Resolution::Kind::kReleased);
  EXPECT_FALSE(*store_->Get(release.id));
  clock_.Advance(1s);  // the log lists newest first

  ResolveRequest set{RecordId{"default", "stored"}};
  set.outcome = Outcome{OutcomeClass::kSuccess, "{\"id\":1}"};
  auto stored = ResolveRecord(*store_, clock_, policy_for, set, ops);
  ASSERT_TRUE(stored) << stored.error().ToString();
  EXPECT_EQ(stored->kind, Resolution::Kind::kStored);
  EXPECT_EQ((*store_->Get(set.id))->outcome->body, "{\"id\":1}");
  // Completed now: nothing to resolve.
  EXPECT_EQ(ResolveRecord(*store_, clock_, policy_for, set, ops)->kind,
            Resolution::Kind::kCompleted);
  auto evicted = EvictRecord(*store_, clock_, set.id, ops);
  ASSERT_TRUE(evicted && *evicted);
  EXPECT_FALSE(*EvictRecord(*store_, clock_, set.id, ops));

  AttemptFilter resolved;
  resolved.outcome = AttemptOutcome::kResolved;
  auto log = store_->QueryAttempts(resolved);
  ASSERT_TRUE(log);
  ASSERT_EQ(log->size(), 2u);
  EXPECT_EQ(log->back().detail, "released by ops (console)");
  EXPECT_EQ(log->back().tool, "charge");
  EXPECT_EQ(log->front().detail, "outcome set (success, 8 bytes) by ops (console)");
  AttemptFilter gone;
  gone.outcome = AttemptOutcome::kEvicted;
  log = store_->QueryAttempts(gone);
  ASSERT_TRUE(log);
  ASSERT_EQ(log->size(), 1u);
  EXPECT_EQ(log->front().detail, "evicted (was completed, fence " +
                                     std::to_string(stored->record.fence) + ") by ops (console)");
  EXPECT_EQ(log->front().instance, "serve-1");
}

// Abandon: a claim whose reply was lost is taken back by the token of the
// attempt that made it, and by nothing else.

TEST_P(StoreContractTest, AbandonDeletesOwnInProgressClaim) {
  auto c = store_->Claim(Req("k", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->owner, "owner-a");
  auto a = store_->Abandon(c->record.id, "owner-a");
  ASSERT_TRUE(a) << a.error().ToString();
  auto gone = store_->Get(c->record.id);
  ASSERT_TRUE(gone);
  EXPECT_FALSE(gone->has_value());
  EXPECT_EQ(store_->Abandon(c->record.id, "owner-a").error().code, ErrorCode::kNotFound);
  // The next claim wins with a greater fence; the abandoned owner's fence is dead.
  auto again = store_->Claim(Req("k", "fp1", "default", "owner-b"));
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->claimed);
  EXPECT_GT(again->record.fence, c->record.fence);
  EXPECT_EQ(store_->Complete(c->record.id, c->record.fence, Ok("x"), kTtl).error().code,
            ErrorCode::kAborted);
}

TEST_P(StoreContractTest, AbandonRefusesADifferentOwner) {
  auto c = store_->Claim(Req("k", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  EXPECT_EQ(store_->Abandon(c->record.id, "owner-b").error().code, ErrorCode::kAborted);
  EXPECT_EQ(store_->Abandon(c->record.id, "").error().code, ErrorCode::kInvalidArgument);
  // A claim made without a token can never be abandoned.
  auto anonymous = store_->Claim(Req("anon", "fp1", "default", ""));
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->record.owner, "");
  EXPECT_EQ(store_->Abandon(anonymous->record.id, "owner-a").error().code, ErrorCode::kAborted);
  for (const char* key : {"k", "anon"}) {
    auto got = store_->Get(RecordId{"default", key});
    ASSERT_TRUE(got && got->has_value()) << key;
    EXPECT_EQ((*got)->state, RecordState::kInProgress);
  }
}

TEST_P(StoreContractTest, AbandonRefusesACompletedOrUnknownRecord) {
  auto c = store_->Claim(Req("done", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("kept"), kTtl));
  EXPECT_EQ(store_->Abandon(c->record.id, "owner-a").error().code, ErrorCode::kFailedPrecondition);
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  EXPECT_EQ((*got)->outcome->body, "kept");

  auto u = store_->Claim(Req("unknown", "fp1", "default", "owner-a"));
  ASSERT_TRUE(u);
  ASSERT_TRUE(store_->MarkUnknown(u->record.id, u->record.fence, kTtl));
  EXPECT_EQ(store_->Abandon(u->record.id, "owner-a").error().code, ErrorCode::kFailedPrecondition);
  auto still = store_->Get(u->record.id);
  ASSERT_TRUE(still && still->has_value());
  EXPECT_EQ((*still)->state, RecordState::kUnknown);
}

TEST_P(StoreContractTest, AbandonRefusesAfterTakeOver) {
  auto c = store_->Claim(Req("k", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  clock_.Advance(kLease);
  auto t = store_->TakeOver(c->record.id, c->record.fence, kLease);
  ASSERT_TRUE(t) << t.error().ToString();
  EXPECT_EQ(t->owner, "") << "the new owner is not the attempt that claimed";
  EXPECT_EQ(store_->Abandon(c->record.id, "owner-a").error().code, ErrorCode::kAborted);
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kInProgress);
  EXPECT_EQ((*got)->fence, t->fence);
}

TEST_P(StoreContractTest, AbandonOfAnExpiredLeaseStillDeletes) {
  // The lease ran out while the store was unreachable: still ours, still
  // never executed, so still ours to take back.
  auto c = store_->Claim(Req("k", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  clock_.Advance(kLease + 1s);
  ASSERT_TRUE(store_->Abandon(c->record.id, "owner-a"));
  auto fresh = store_->Claim(Req("k", "fp1", "default", "owner-b"));
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->claimed);
}

TEST_P(StoreContractTest, WaitForChangeWakesOnAbandon) {
  auto c = store_->Claim(Req("k", "fp1", "default", "owner-a"));
  ASSERT_TRUE(c);
  std::thread waiter([&] {
    auto w = store_->WaitForChange(c->record.id, c->record, clock_.Now() + 10s);
    EXPECT_TRUE(w) << w.error().ToString();
  });
  clock_.AwaitWaiters(1);
  ASSERT_TRUE(store_->Abandon(c->record.id, "owner-a"));
  waiter.join();  // no Advance: woken by the abandon itself
  auto got = store_->Get(c->record.id);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->has_value());
}

namespace {

// Begin of `key` on `ledger` under on_unknown = retry with no wait: a live
// owner answers in progress at once, a dead one is taken over.
idem::Result<idem::Decision> BeginRetrying(idem::Ledger& ledger, const std::string& key) {
  idem::Call call;
  call.id = idem::RecordId{"default", key};
  call.fingerprint = "fp";
  call.tool = "charge";
  call.turn = "turn-1";
  call.policy.lease = kLease;
  call.policy.wait = idem::Duration(0);
  call.policy.on_unknown = idem::OnUnknown::kRetry;
  return ledger.Begin(call);
}

}  // namespace

void ExpectSkewedInstancesAgreeOnLeases(
    const std::function<std::unique_ptr<idem::Store>(idem::Clock&)>& open) {
  using idem::Decision;
  const std::string key = "skew";
  idem::FakeClock host_a;
  idem::FakeClock host_b(host_a.Now() + 25s);  // 25 s ahead of host a
  {
    SCOPED_TRACE("control: each instance decides by its own clock");
    auto store_a = open(host_a);
    auto store_b = open(host_b);
    ASSERT_TRUE(store_a && store_b);
    idem::Ledger a(*store_a, host_a, {"a", nullptr, false});
    idem::Ledger b(*store_b, host_b, {"b", nullptr, false});
    auto first = BeginRetrying(a, key + "-control");
    ASSERT_TRUE(first) << first.error().ToString();
    ASSERT_EQ(first->kind, Decision::Kind::kExecute);
    host_a.Advance(6s);  // a's lease has 24 s left; b's clock says it ran out 1 s ago
    host_b.Advance(6s);
    auto second = BeginRetrying(b, key + "-control");
    ASSERT_TRUE(second) << second.error().ToString();
    EXPECT_EQ(second->kind, Decision::Kind::kExecute) << "the hazard this test guards against";
    EXPECT_TRUE(second->took_over);
  }
  SCOPED_TRACE("each instance decides by the store's clock");
  idem::StoreClock clock_a(host_a);
  idem::StoreClock clock_b(host_b);
  auto store_a = open(clock_a);
  auto store_b = open(clock_b);
  ASSERT_TRUE(store_a && store_b);
  auto offset_a = clock_a.Sync(*store_a);
  auto offset_b = clock_b.Sync(*store_b);
  ASSERT_TRUE(offset_a && offset_b);
  // 25 s, less what the server's real clock ran between the two syncs (the
  // fake hosts' clocks stood still); the lease below has 24 s of margin.
  EXPECT_GT(*offset_a - *offset_b, idem::Duration(20s));
  EXPECT_LE(*offset_a - *offset_b, idem::Duration(25s));
  idem::Ledger a(*store_a, clock_a, {"a", nullptr, false});
  idem::Ledger b(*store_b, clock_b, {"b", nullptr, false});
  auto first = BeginRetrying(a, key);
  ASSERT_TRUE(first) << first.error().ToString();
  ASSERT_EQ(first->kind, Decision::Kind::kExecute);
  host_a.Advance(6s);
  host_b.Advance(6s);
  auto second = BeginRetrying(b, key);
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_EQ(second->kind, Decision::Kind::kInProgress) << "b took over a live owner's call";
  host_a.Advance(kLease);  // a died: its lease really runs out
  host_b.Advance(kLease);
  auto third = BeginRetrying(b, key);
  ASSERT_TRUE(third) << third.error().ToString();
  EXPECT_EQ(third->kind, Decision::Kind::kExecute);
  EXPECT_TRUE(third->took_over);
}

// ---------------------------------------------------------------------------
// The audit log's hash chain (docs/DESIGN.md §7).

Attempt AuditEntry(const std::string& tenant, const std::string& key, int64_t at_ms,
                   const std::string& detail, AttemptOutcome outcome) {
  Attempt a;
  a.at = FromUnixMillis(at_ms);
  a.tenant = tenant;
  a.key = key;
  a.tool = "charge";
  a.turn = "turn-1";
  a.outcome = outcome;
  a.latency = Duration(3);
  a.instance = "i-1";
  a.detail = detail;
  return a;
}

namespace {

Attempt Entry(const std::string& tenant, const std::string& key, int64_t at_ms,
              const std::string& detail = "", AttemptOutcome outcome = AttemptOutcome::kReplayed) {
  return AuditEntry(tenant, key, at_ms, detail, outcome);
}

// Every entry of `tenant`'s chain (all tenants if nullopt), in chain
// order, read `page` at a time.
std::vector<Attempt> WholeChain(Store& store, const std::optional<std::string>& tenant,
                                size_t page = 3) {
  std::vector<Attempt> out;
  std::string cursor;
  do {
    auto got = store.ReadChain(tenant, cursor, page);
    EXPECT_TRUE(got) << got.error().ToString();
    if (!got) break;
    EXPECT_LE(got->entries.size(), page);
    out.insert(out.end(), got->entries.begin(), got->entries.end());
    cursor = got->next;
  } while (!cursor.empty());
  return out;
}

std::vector<Attempt> Of(const std::vector<Attempt>& all, const std::string& tenant) {
  std::vector<Attempt> out;
  for (const Attempt& a : all) {
    if (a.tenant == tenant) out.push_back(a);
  }
  return out;
}

// A view of the store whose ReadChain answers what `edit` makes of the
// entries: tampering as the verifier would meet it, on every store.
class TamperedView final : public ForwardingStore {
 public:
  using Edit = std::function<void(std::vector<Attempt>&)>;
  TamperedView(Store& target, Edit edit) : ForwardingStore(target), edit_(std::move(edit)) {}
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override {
    (void)limit;  // one page, whatever was asked
    if (!cursor.empty()) return ChainPage{};
    ChainPage page{WholeChain(target_, tenant), ""};
    edit_(page.entries);
    return page;
  }

 private:
  Edit edit_;
};

}  // namespace

TEST_P(StoreContractTest, EveryEntryIsChainedPerTenant) {
  ASSERT_TRUE(store_->AppendAttempts(
      {Entry("a", "k1", 1000, "one"), Entry("b", "k1", 1001), Entry("a", "k2", 1002, "two")}));
  ClaimRequest req = Req("k3", "fp1", "a");
  req.logged = Entry("a", "k3", 1003, "claimed", AttemptOutcome::kClaimed);
  auto c = store_->Claim(req);
  ASSERT_TRUE(c && c->claimed);
  const Attempt done = Entry("a", "k3", 1004, "executed", AttemptOutcome::kExecuted);
  ASSERT_TRUE(store_->Complete(c->record.id, c->record.fence, Ok("x"), kTtl, &done));
  if (!store_->LogsWithRecords()) {
    ASSERT_TRUE(store_->AppendAttempts({*req.logged, done}));  // as the Ledger does
  }
  ASSERT_TRUE(store_->AppendAttempts({Entry("b", "k2", 1005)}));

  const std::vector<Attempt> all = WholeChain(*store_, std::nullopt);
  ASSERT_EQ(all.size(), 6u);
  const std::vector<Attempt> a = Of(all, "a");
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(WholeChain(*store_, std::string("a"), 2).size(), 4u);
  std::string prev;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].seq, i + 1);
    EXPECT_EQ(a[i].prev_hash, prev);
    EXPECT_EQ(a[i].hash, ChainHash(a[i], a[i].seq, a[i].prev_hash));
    EXPECT_EQ(a[i].hash.size(), 64u);
    prev = a[i].hash;
  }
  EXPECT_EQ(a[0].detail, "one");
  EXPECT_EQ(a[2].detail, "claimed");
  EXPECT_EQ(a[3].detail, "executed");
  const std::vector<Attempt> b = Of(all, "b");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].seq, 1u);
  EXPECT_EQ(b[1].prev_hash, b[0].hash);

  auto heads = store_->ChainHeads(std::nullopt);
  ASSERT_TRUE(heads) << heads.error().ToString();
  ASSERT_EQ(heads->size(), 2u);
  EXPECT_EQ((*heads)[0], (ChainHead{"a", 4, a[3].hash, 1, ""}));
  EXPECT_EQ((*heads)[1], (ChainHead{"b", 2, b[1].hash, 1, ""}));
  auto one = store_->ChainHeads(std::string("b"));
  ASSERT_TRUE(one && one->size() == 1 && (*one)[0].tenant == "b");

  auto report = VerifyChains(*store_, std::nullopt, 2);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 6u);
  EXPECT_EQ(report->tenants, 2u);
  auto only_b = VerifyChains(*store_, std::string("b"));
  ASSERT_TRUE(only_b && !only_b->fault);
  EXPECT_EQ(only_b->checked, 2u);
}

TEST_P(StoreContractTest, ConcurrentAppendsKeepOneChainPerTenant) {
  constexpr int kThreads = 6;
  constexpr int kRounds = 15;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const std::string key = "c" + std::to_string(t) + "-" + std::to_string(r);
        std::vector<Attempt> batch = {Entry("x", key, 2000 + r, "batch"),
                                      Entry("y", key, 2000 + r, "batch"),
                                      Entry("x", key, 2000 + r, "batch 2")};
        if (!store_->AppendAttempts(batch)) ++errors;
        ClaimRequest req = Req(key, "fp1", "x");
        req.logged = Entry("x", key, 2000 + r, "claimed", AttemptOutcome::kClaimed);
        auto c = store_->Claim(req);
        if (!c || !c->claimed) {
          ++errors;
          continue;
        }
        if (!store_->LogsWithRecords() && !store_->AppendAttempts({*req.logged})) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(errors.load(), 0);
  auto report = VerifyChains(*store_, std::nullopt, 50);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, static_cast<uint64_t>(kThreads * kRounds * 4));
  auto heads = store_->ChainHeads(std::nullopt);
  ASSERT_TRUE(heads && heads->size() == 2);
  EXPECT_EQ((*heads)[0].seq, static_cast<uint64_t>(kThreads * kRounds * 3));
  EXPECT_EQ((*heads)[1].seq, static_cast<uint64_t>(kThreads * kRounds));
}

TEST_P(StoreContractTest, VerifyNamesTheFirstEditedDeletedOrInsertedEntry) {
  std::vector<Attempt> batch;
  for (int i = 0; i < 6; ++i) batch.push_back(Entry("t", "k" + std::to_string(i), 3000 + i));
  batch.push_back(Entry("u", "other", 3100));
  ASSERT_TRUE(store_->AppendAttempts(batch));
  auto expect_fault = [&](TamperedView::Edit edit, ChainFault::Kind kind, uint64_t seq,
                          const std::string& words) {
    TamperedView view(*store_, std::move(edit));
    auto report = VerifyChains(view, std::nullopt);
    ASSERT_TRUE(report) << report.error().ToString();
    ASSERT_TRUE(report->fault) << words;
    EXPECT_EQ(report->fault->kind, kind) << report->fault->message;
    EXPECT_EQ(report->fault->entry.seq, seq) << report->fault->message;
    EXPECT_NE(report->fault->message.find(words), std::string::npos) << report->fault->message;
    EXPECT_NE(report->fault->message.find("tenant \"t\""), std::string::npos);
  };
  auto at = [](std::vector<Attempt>& v, uint64_t seq) {
    return std::find_if(v.begin(), v.end(),
                        [&](const Attempt& a) { return a.tenant == "t" && a.seq == seq; });
  };
  expect_fault([&](auto& v) { at(v, 3)->detail = "forged"; }, ChainFault::Kind::kEdited, 3,
               "edited");
  expect_fault([&](auto& v) { v.erase(at(v, 2)); }, ChainFault::Kind::kDeleted, 3,
               "entry 2 before it are missing");
  expect_fault([&](auto& v) { v.erase(at(v, 6)); }, ChainFault::Kind::kDeleted, 5,
               "entry 6 after it are missing");
  expect_fault([&](auto& v) { v.erase(at(v, 1)); }, ChainFault::Kind::kDeleted, 2, "deleted");
  expect_fault([&](auto& v) { std::iter_swap(at(v, 2), at(v, 4)); }, ChainFault::Kind::kDeleted, 4,
               "deleted");
  expect_fault([&](auto& v) { v.insert(at(v, 4), *at(v, 3)); }, ChainFault::Kind::kInserted, 3,
               "a second entry with this seq");
  expect_fault(
      [&](auto& v) {  // rewritten and re-hashed: the next entry no longer follows it
        auto e = at(v, 4);
        e->detail = "forged";
        e->hash = ChainHash(*e, e->seq, e->prev_hash);
      },
      ChainFault::Kind::kInserted, 5, "inserted out of order");
  {
    TamperedView untouched(*store_, [](auto&) {});
    auto report = VerifyChains(untouched, std::nullopt);
    ASSERT_TRUE(report && !report->fault);
    EXPECT_EQ(report->checked, 7u);
  }
}

// One append of several tenants' entries, interleaved, one tenant with a
// head and two without: each tenant's entries chain in the batch's order from
// its head, and the ids follow the batch's order across tenants. (A store
// that keeps each transaction's heads in memory writes them back once.)
TEST_P(StoreContractTest, OneAppendOfInterleavedTenantsChainsEachInItsOrder) {
  Store* store = store_.get();
  ASSERT_TRUE(store->AppendAttempts({Entry("u", "first", 1000, "détail ✓")}));
  const std::vector<std::string> tenants = {"v", "t", "u", "t", "v", "u", "t"};
  std::vector<Attempt> batch;
  for (size_t i = 0; i < tenants.size(); ++i) {
    batch.push_back(Entry(tenants[i], "k" + std::to_string(i), 2000, "détail ✓"));
  }
  ASSERT_TRUE(store->AppendAttempts(batch));

  auto report = VerifyChains(*store, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 8u);
  auto entries = store->QueryAttempts(AttemptFilter{});  // newest first: by time, then id
  ASSERT_TRUE(entries) << entries.error().ToString();
  std::vector<std::string> order;
  for (const Attempt& a : *entries)
    order.push_back(a.tenant + "/" + a.key + "#" + std::to_string(a.seq));
  EXPECT_EQ(order, (std::vector<std::string>{"t/k6#3", "u/k5#3", "v/k4#2", "t/k3#2", "u/k2#2",
                                             "t/k1#1", "v/k0#1", "u/first#1"}));
}

TEST_P(StoreContractTest, PurgedAttemptsLeaveAVerifiableChain) {
  std::vector<Attempt> batch;
  for (int i = 0; i < 8; ++i) {
    batch.push_back(Entry("p", "k" + std::to_string(i), 5000 + i));
    if (i % 2 == 0) batch.push_back(Entry("q", "k" + std::to_string(i), 5000 + i));
  }
  ASSERT_TRUE(store_->AppendAttempts(batch));
  auto purged = store_->PurgeAttempts(FromUnixMillis(5005), 3);  // p 1..3
  ASSERT_TRUE(purged) << purged.error().ToString();
  EXPECT_EQ(*purged, 3u);
  purged = store_->PurgeAttempts(FromUnixMillis(5005), 100);  // p 4..5 and q 1..3 (5000..5004)
  ASSERT_TRUE(purged);
  EXPECT_EQ(*purged, 5u);
  ASSERT_TRUE(store_->AppendAttempts({Entry("p", "late", 6000), Entry("q", "late", 6000)}));

  auto heads = store_->ChainHeads(std::nullopt);
  ASSERT_TRUE(heads && heads->size() == 2);
  const std::vector<Attempt> p = Of(WholeChain(*store_, std::nullopt), "p");
  ASSERT_EQ(p.size(), 4u);  // 6, 7, 8 and the late one
  EXPECT_EQ((*heads)[0].start_seq, 6u);
  EXPECT_EQ((*heads)[0].start_prev, p[0].prev_hash);
  EXPECT_EQ((*heads)[0].seq, 9u);
  EXPECT_EQ((*heads)[1].start_seq, 4u);

  auto report = VerifyChains(*store_, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 6u);
  EXPECT_EQ(report->restarted, 2u);
  // A deletion past the restart point is still named.
  TamperedView view(*store_, [](std::vector<Attempt>& v) {
    v.erase(std::find_if(v.begin(), v.end(), [](const Attempt& a) { return a.tenant == "p"; }));
  });
  auto broken = VerifyChains(view, std::nullopt);
  ASSERT_TRUE(broken && broken->fault);
  EXPECT_EQ(broken->fault->kind, ChainFault::Kind::kDeleted) << broken->fault->message;
  EXPECT_NE(broken->fault->message.find("the chain restarts at 6"), std::string::npos)
      << broken->fault->message;
}
