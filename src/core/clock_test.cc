#include "idem/clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace idem {
namespace {

using namespace std::chrono_literals;

TEST(FakeClockTest, AdvanceMovesTimeAndWakesWaiters) {
  FakeClock clock;
  const TimePoint start = clock.Now();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread t([&] {
    std::unique_lock lock(mu);
    const TimePoint deadline = start + 5s;
    while (clock.Now() < deadline) clock.WaitUntil(cv, lock, deadline);
    done = true;
  });
  clock.AwaitWaiters(1);
  clock.Advance(2s);
  clock.AwaitWaiters(1);  // woke, saw 2 s < 5 s, parked again
  {
    std::lock_guard g(mu);
    EXPECT_FALSE(done);
  }
  clock.Advance(3s);
  t.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(clock.Now(), start + 5s);
}

TEST(FakeClockTest, WaitUntilPastDeadlineReturnsAtOnce) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lock(mu);
  clock.WaitUntil(cv, lock, clock.Now());
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(SystemClockTest, NowIsWallTimeInMillis) {
  const auto before = std::chrono::system_clock::now();
  const TimePoint now = SystemClock::Default().Now();
  EXPECT_LE(std::chrono::abs(now - std::chrono::time_point_cast<Duration>(before)), 1s);
}

}  // namespace
}  // namespace idem
