// CachingStore on the memory store and a FakeClock: what it answers from
// memory, and every way a cached record must stop being answered.
#include "idem/caching_store.h"

#include <gtest/gtest.h>

#include <set>

#include "idem/ledger.h"
#include "memory_store.h"
#include "store_wrapper.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

// Counts the calls that reach the store below the cache, and lets a test
// drive the eviction feed by hand (feed()) or hide it (no_feed).
class BackendProbe : public testing::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    ++claims;
    if (during_read) during_read();
    return StoreWrapper::Claim(req);
  }
  Result<std::optional<Record>> Get(const RecordId& id) override {
    ++gets;
    if (during_read) during_read();
    return StoreWrapper::Get(id);
  }
  bool GetAsync(const RecordId& id, GetDone done) override {
    ++gets;
    done(target_.Get(id));
    return true;
  }
  // The memory store's own feed reaches the cache (as Redis pub/sub would
  // across processes); the test may call feed() by hand too.
  bool WatchEvictions(EvictionFeed on_change) override {
    if (no_feed) return false;
    feed = on_change;
    return target_.WatchEvictions(std::move(on_change));
  }
  int claims = 0;
  int gets = 0;
  bool no_feed = false;
  EvictionFeed feed;
  std::function<void()> during_read;  // runs inside Claim/Get, before the store reads
};

class CachingStoreTest : public ::testing::Test {
 protected:
  ClaimRequest Request(std::string key = "k1", std::string tenant = "default") {
    ClaimRequest req;
    req.id = RecordId{std::move(tenant), std::move(key)};
    req.fingerprint = "fp";
    req.tool = "charge";
    req.lease = 30s;
    req.retention = 1h;
    return req;
  }
  // Claims and completes `req` through `store` with `body`.
  void Finish(Store& store, const ClaimRequest& req, std::string body = "charged 42") {
    auto claim = store.Claim(req);
    ASSERT_TRUE(claim && claim->claimed);
    ASSERT_TRUE(store.Complete(req.id, claim->record.fence,
                               Outcome{OutcomeClass::kSuccess, std::move(body)}, req.retention));
  }

  FakeClock clock_;
  std::unique_ptr<Store> memory_ = NewMemoryStore(clock_);
  BackendProbe backend_{*memory_};
  CachingStore cache_{backend_, clock_, 1 << 20};
};

TEST_F(CachingStoreTest, ARetryOfACompletedCallIsAnsweredWithoutTheStore) {
  ASSERT_TRUE(cache_.active());
  const ClaimRequest req = Request();
  Finish(cache_, req);
  const int claims = backend_.claims;

  auto retry = cache_.Claim(req);
  ASSERT_TRUE(retry);
  EXPECT_FALSE(retry->claimed);
  EXPECT_EQ(retry->record.state, RecordState::kCompleted);
  ASSERT_TRUE(retry->record.outcome);
  EXPECT_EQ(retry->record.outcome->body, "charged 42");
  auto got = cache_.Get(req.id);
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->outcome->body, "charged 42");
  bool answered = false;
  EXPECT_TRUE(cache_.GetAsync(req.id, [&](Result<std::optional<Record>> r) {
    answered = true;
    ASSERT_TRUE(r && *r);
    EXPECT_EQ((*r)->fence, retry->record.fence);
  }));
  EXPECT_TRUE(answered) << "a hit answers before GetAsync returns";
  answered = false;
  EXPECT_TRUE(cache_.ClaimAsync(req, [&](Result<ClaimResult> r) {
    answered = true;
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->claimed);
    EXPECT_EQ(r->record.fence, retry->record.fence);
  })) << "answered from memory although the backend has no asynchronous claim";
  EXPECT_TRUE(answered) << "a hit answers before ClaimAsync returns";
  auto held = cache_.Held(req.id);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->fence, retry->record.fence);

  EXPECT_EQ(backend_.claims, claims);
  EXPECT_EQ(backend_.gets, 0);
  EXPECT_EQ(cache_.stats().hits, 5u);
  // What the store itself holds is what the cache answered.
  auto stored = memory_->Get(req.id);
  ASSERT_TRUE(stored && *stored);
  EXPECT_EQ((*stored)->fence, retry->record.fence);
  EXPECT_EQ((*stored)->expires_at, retry->record.expires_at);
}

// A look into memory, a read, an asynchronous claim and a claim offered one
// after the other for one call (Ledger::BeginWithoutBlocking) count one miss:
// only the store's answer is one.
TEST_F(CachingStoreTest, AMissIsCountedOnlyWhenTheStoreIsAsked) {
  CachingStore cache(*memory_, clock_, 1 << 20);  // no asynchronous read or claim
  ASSERT_TRUE(cache.active());
  const ClaimRequest req = Request("fresh");
  EXPECT_FALSE(
      cache.GetAsync(req.id, [](Result<std::optional<Record>>) { ADD_FAILURE() << "refused"; }));
  EXPECT_FALSE(cache.ClaimAsync(req, [](Result<ClaimResult>) { ADD_FAILURE() << "refused"; }));
  EXPECT_FALSE(cache.Held(req.id));
  ASSERT_TRUE(cache.Claim(req));
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 0u);
}

TEST_F(CachingStoreTest, ARecordReadFromTheStoreIsCachedOnlyOnceCompleted) {
  const ClaimRequest req = Request();
  auto claim = memory_->Claim(req);  // another instance claimed it
  ASSERT_TRUE(claim && claim->claimed);

  ASSERT_TRUE(cache_.Get(req.id));
  ASSERT_TRUE(cache_.Get(req.id));
  EXPECT_EQ(backend_.gets, 2) << "an in-progress record is never cached";

  ASSERT_TRUE(memory_->MarkUnknown(req.id, claim->record.fence, 1h));
  ASSERT_TRUE(cache_.Get(req.id));
  ASSERT_TRUE(cache_.Get(req.id));
  EXPECT_EQ(backend_.gets, 4) << "nor an unknown one";

  ASSERT_TRUE(
      memory_->Complete(req.id, claim->record.fence, Outcome{OutcomeClass::kSuccess, "x"}, 1h));
  ASSERT_TRUE(cache_.Get(req.id));  // read from the store, cached
  auto again = cache_.Get(req.id);
  ASSERT_TRUE(again && *again);
  EXPECT_EQ((*again)->outcome->body, "x");
  EXPECT_EQ(backend_.gets, 5);
}

TEST_F(CachingStoreTest, ARecordPastItsRetentionIsNotAnswered) {
  const ClaimRequest req = Request();
  Finish(cache_, req);
  clock_.Advance(1h);  // expires_at is now: the store no longer has it either
  auto claim = cache_.Claim(req);
  ASSERT_TRUE(claim);
  EXPECT_TRUE(claim->claimed) << "the next attempt executes, as the store decides";
  EXPECT_EQ(cache_.stats().records, 0u);
}

TEST_F(CachingStoreTest, AnEvictionThroughAnotherInstanceDropsTheCache) {
  const ClaimRequest req = Request();
  Finish(cache_, req);
  ASSERT_EQ(cache_.stats().records, 1u);

  // Another process evicts it in the store; the store announces it.
  auto evicted = memory_->Evict(req.id);
  ASSERT_TRUE(evicted && *evicted);
  EXPECT_EQ(cache_.stats().records, 0u);

  auto claim = cache_.Claim(req);
  ASSERT_TRUE(claim);
  EXPECT_TRUE(claim->claimed) << "evicted: the next attempt executes";
}

TEST_F(CachingStoreTest, AnEvictionThroughThisInstanceDropsTheCacheAtOnce) {
  const ClaimRequest req = Request();
  Finish(cache_, req);
  ASSERT_TRUE(memory_->WatchEvictions(nullptr));  // no announcement comes back
  auto evicted = cache_.Evict(req.id);
  ASSERT_TRUE(evicted && *evicted);
  EXPECT_EQ(cache_.stats().records, 0u);
  auto claim = cache_.Claim(req);
  ASSERT_TRUE(claim);
  EXPECT_TRUE(claim->claimed);
}

TEST_F(CachingStoreTest, WhileTheFeedIsDownNothingIsCachedOrAnswered) {
  const ClaimRequest req = Request();
  Finish(cache_, req);
  backend_.feed(false);  // e.g. the subscriber connection dropped
  EXPECT_EQ(cache_.stats().records, 0u);
  ASSERT_TRUE(cache_.Get(req.id));
  ASSERT_TRUE(cache_.Get(req.id));
  EXPECT_EQ(backend_.gets, 2) << "no fill while evictions may go unheard";

  backend_.feed(true);  // subscribed again
  ASSERT_TRUE(cache_.Get(req.id));
  ASSERT_TRUE(cache_.Get(req.id));
  EXPECT_EQ(backend_.gets, 3);
}

TEST_F(CachingStoreTest, AReadThatStartedBeforeAnEvictionDoesNotRefillIt) {
  const ClaimRequest req = Request();
  Finish(*memory_, req);
  // The store answers this read with the record, but an eviction is
  // announced while the read is in flight: what it read may be gone.
  backend_.during_read = [&] {
    backend_.during_read = nullptr;
    backend_.feed(true);
  };
  ASSERT_TRUE(cache_.Get(req.id));
  EXPECT_EQ(cache_.stats().records, 0u);
  ASSERT_TRUE(cache_.Get(req.id));  // a read after the eviction fills it
  EXPECT_EQ(cache_.stats().records, 1u);
}

TEST_F(CachingStoreTest, TenantsDoNotShareEntries) {
  Finish(cache_, Request("k1", "acme"));
  auto other = cache_.Claim(Request("k1", "globex"));
  ASSERT_TRUE(other);
  EXPECT_TRUE(other->claimed) << "the same key in another tenant is another record";
}

TEST_F(CachingStoreTest, TheLeastRecentlyUsedRecordsLeaveFirstWithinTheBound) {
  CachingStore small(backend_, clock_, 3000);  // room for two records of ~1 KB
  const std::string body(1000, 'x');
  Finish(small, Request("a"), body);
  Finish(small, Request("b"), body);
  ASSERT_TRUE(small.Get(RecordId{"default", "a"}));  // a is now the most recent
  Finish(small, Request("c"), body);                 // b leaves
  const auto stats = small.stats();
  EXPECT_EQ(stats.records, 2u);
  EXPECT_LE(stats.bytes, 3000u);
  const int gets = backend_.gets;
  ASSERT_TRUE(small.Get(RecordId{"default", "a"}));
  ASSERT_TRUE(small.Get(RecordId{"default", "c"}));
  EXPECT_EQ(backend_.gets, gets);
  ASSERT_TRUE(small.Get(RecordId{"default", "b"}));
  EXPECT_EQ(backend_.gets, gets + 1);
}

TEST_F(CachingStoreTest, AStoreWithoutAnEvictionFeedGetsNoCache) {
  BackendProbe no_feed(*memory_);
  no_feed.no_feed = true;
  CachingStore cache(no_feed, clock_, 1 << 20);
  EXPECT_FALSE(cache.active());
  const ClaimRequest req = Request();
  Finish(cache, req);
  ASSERT_TRUE(cache.Claim(req));
  EXPECT_EQ(no_feed.claims, 2);
  EXPECT_EQ(cache.stats().records, 0u);

  CachingStore off(backend_, clock_, 0);
  EXPECT_FALSE(off.active()) << "max_bytes 0 turns it off";
}

TEST_F(CachingStoreTest, TheLedgerReplaysFromTheCacheAndStillLogsTheAttempt) {
  Ledger ledger(cache_, clock_, LedgerOptions{"test", nullptr, true});
  Call call;
  call.id = RecordId{"default", "v1t.turn.charge.fp"};
  call.fingerprint = "fp-a";
  call.tool = "charge";
  int runs = 0;
  auto run = [&] {
    ++runs;
    return Execution{Execution::Kind::kSuccess, "charged"};
  };
  ASSERT_TRUE(ledger.Run(call, run));
  const int claims = backend_.claims;
  auto retry = ledger.Run(call, run);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->decision.kind, Decision::Kind::kReplay);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(backend_.claims, claims);

  Call drifted = call;
  drifted.fingerprint = "fp-b";
  auto drift = ledger.Run(drifted, run);
  ASSERT_TRUE(drift);
  EXPECT_EQ(drift->decision.kind, Decision::Kind::kDrift) << "drift is judged on the cached record";

  ledger.Flush();
  AttemptFilter all;
  auto attempts = memory_->QueryAttempts(all);
  ASSERT_TRUE(attempts);
  ASSERT_EQ(attempts->size(), 4u);
  std::multiset<AttemptOutcome> outcomes;
  for (const Attempt& a : *attempts) outcomes.insert(a.outcome);
  EXPECT_EQ(outcomes,
            (std::multiset<AttemptOutcome>{AttemptOutcome::kClaimed, AttemptOutcome::kExecuted,
                                           AttemptOutcome::kReplayed, AttemptOutcome::kDrift}));
}

}  // namespace
}  // namespace idem
