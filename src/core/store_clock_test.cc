#include "idem/store_clock.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "idem/forwarding_store.h"
#include "memory_store.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

// A memory store that answers ReadServerClock with a server clock of its
// own, `server_ahead` ahead of `host`; the i-th read takes round_trips[i] of
// the host's time (0 past the end), the server reading its clock in the
// middle of it.
class ServerClockStore final : public ForwardingStore {
 public:
  ServerClockStore(FakeClock& host, Duration server_ahead)
      : ServerClockStore(NewMemoryStore(host), host, server_ahead) {}

  Result<std::optional<TimePoint>> ReadServerClock() override {
    std::lock_guard g(mu_);
    const size_t i = reads_++;
    cv_.notify_all();
    if (fail_ || i < failing_reads_) return MakeError(ErrorCode::kUnavailable, "server down");
    const Duration trip = i < round_trips_.size() ? round_trips_[i] : Duration(0);
    host_.Advance(trip / 2);
    const TimePoint server = host_.Now() + ahead_;
    host_.Advance(trip - trip / 2);
    return server;
  }

  void set_round_trips(std::vector<Duration> trips) { round_trips_ = std::move(trips); }
  void set_ahead(Duration d) {
    std::lock_guard g(mu_);
    ahead_ = d;
  }
  void set_failing(bool f) {
    std::lock_guard g(mu_);
    fail_ = f;
  }
  // The first `n` reads fail, as a store failing over answers nothing at first.
  void set_failing_reads(size_t n) {
    std::lock_guard g(mu_);
    failing_reads_ = n;
  }
  void AwaitReads(size_t n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return reads_ >= n; });
  }

 private:
  ServerClockStore(std::unique_ptr<Store> inner, FakeClock& host, Duration ahead)
      : ForwardingStore(*inner), inner_(std::move(inner)), host_(host), ahead_(ahead) {}

  std::unique_ptr<Store> inner_;
  FakeClock& host_;
  std::mutex mu_;
  std::condition_variable cv_;
  Duration ahead_;
  std::vector<Duration> round_trips_;
  size_t reads_ = 0;
  size_t failing_reads_ = 0;
  bool fail_ = false;
};

TEST(StoreClockTest, FollowsTheServersClock) {
  FakeClock host;
  ServerClockStore store(host, 25s);
  StoreClock clock(host);
  EXPECT_EQ(clock.Now(), host.Now());  // uncorrected until synced
  auto offset = clock.Sync(store);
  ASSERT_TRUE(offset) << offset.error().ToString();
  EXPECT_EQ(*offset, Duration(25s));
  EXPECT_EQ(clock.Now(), host.Now() + 25s);
  host.Advance(1s);
  EXPECT_EQ(clock.Now(), host.Now() + 25s);
}

// The server read its clock somewhere in the round trip: the shortest trip
// bounds the error best, and its midpoint is the estimate.
TEST(StoreClockTest, TrustsTheShortestRoundTripAndItsMidpoint) {
  FakeClock host;
  ServerClockStore store(host, -3s);
  store.set_round_trips({Duration(800), Duration(40), Duration(400)});
  StoreClock clock(host);
  auto offset = clock.Sync(store, 3);
  ASSERT_TRUE(offset);
  EXPECT_EQ(*offset, Duration(-3s));
}

TEST(StoreClockTest, AStoreWithoutAServerClockLeavesTheHostsClock) {
  FakeClock host;
  auto store = NewMemoryStore(host);
  StoreClock clock(host);
  auto offset = clock.Sync(*store);
  ASSERT_TRUE(offset);
  EXPECT_EQ(*offset, Duration(0));
  EXPECT_EQ(clock.Now(), host.Now());
}

TEST(StoreClockTest, AFailedSyncKeepsTheLastOffset) {
  FakeClock host;
  ServerClockStore store(host, 10s);
  StoreClock clock(host);
  ASSERT_TRUE(clock.Sync(store));
  store.set_failing(true);
  auto failed = clock.Sync(store);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(clock.offset(), Duration(10s));
}

// The first sync decides whether leases may be judged at all (guarantees
// review F2): a store that does not answer its first clock read is asked
// again, after a pause that doubles, until it answers.
TEST(StoreClockTest, TheFirstSyncIsRetriedUntilTheStoreAnswers) {
  FakeClock host;
  ServerClockStore store(host, 25s);
  store.set_failing_reads(2);
  StoreClock clock(host);
  Result<Duration> synced = MakeError(ErrorCode::kInternal, "not run");
  std::thread first([&] { synced = clock.SyncFirst(store, 4, 250ms); });
  host.AwaitWaiters(1);
  host.Advance(250ms);
  store.AwaitReads(2);
  host.AwaitWaiters(1);
  host.Advance(500ms);  // the pause doubled
  first.join();
  ASSERT_TRUE(synced) << synced.error().ToString();
  EXPECT_EQ(*synced, Duration(25s));
  EXPECT_EQ(clock.offset(), Duration(25s));
}

// A store whose clock never answers: the error comes back after the last
// attempt, and the offset is still this machine's guess, never trusted.
TEST(StoreClockTest, TheFirstSyncGivesUpAfterItsAttempts) {
  FakeClock host;
  ServerClockStore store(host, 25s);
  store.set_failing(true);
  StoreClock clock(host);
  const TimePoint start = host.Now();
  Result<Duration> synced = Duration(0);
  std::thread first([&] { synced = clock.SyncFirst(store, 3, 100ms); });
  for (size_t reads = 1; reads < 3; ++reads) {
    store.AwaitReads(reads);
    host.AwaitWaiters(1);
    host.Advance(100ms * (1 << (reads - 1)));
  }
  first.join();
  ASSERT_FALSE(synced);
  EXPECT_EQ(synced.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(host.Now() - start, Duration(300ms));
  EXPECT_EQ(clock.offset(), Duration(0));
}

// A server clock stepped while the front runs is followed at the next sync.
TEST(StoreClockTest, KeepInSyncFollowsAStepOfTheServersClock) {
  FakeClock host;
  ServerClockStore store(host, 10s);
  StoreClock clock(host);
  ASSERT_TRUE(clock.Sync(store, 1));  // read 1
  clock.KeepInSync(store, 60s);
  store.set_ahead(-5s);
  host.AwaitWaiters(1);  // the sync thread waits for its next round
  host.Advance(60s);
  store.AwaitReads(1 + 3);  // one round: three samples
  clock.Stop();
  EXPECT_EQ(clock.offset(), Duration(-5s));
}

// A waiter's deadline is in the store's time: it wakes when the store's
// clock reaches it, not the host's.
TEST(StoreClockTest, WaitUntilMeansTheStoresTime) {
  FakeClock host;
  ServerClockStore store(host, 30s);
  StoreClock clock(host);
  ASSERT_TRUE(clock.Sync(store));
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lock(mu);
  const TimePoint deadline = clock.Now() + 5s;
  std::thread advancer([&] {
    host.AwaitWaiters(1);
    host.Advance(5s);
  });
  while (clock.Now() < deadline) clock.WaitUntil(cv, lock, deadline);
  advancer.join();
  EXPECT_EQ(host.Now() + 30s, deadline);
}

}  // namespace
}  // namespace idem
