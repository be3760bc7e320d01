#include "idem/clock.h"

#include <gtest/gtest.h>

#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

using namespace std::chrono_literals;

// `v` in at least `width` characters, zero-padded after any sign (printf's
// %0*ld).
std::string Padded(long v, int width) {
  if (v < 0) return "-" + Padded(-v, width - 1);
  std::string digits = std::to_string(v);
  return std::string(digits.size() < size_t(width) ? width - digits.size() : 0, '0') + digits;
}

// FormatIsoTime by the C library's calendar (gmtime_r), what it used
// before it computed the date itself.
std::string ByTheCLibrary(int64_t ms, bool with_millis) {
  const int64_t millis = ((ms % 1000) + 1000) % 1000;
  const std::time_t tt = static_cast<std::time_t>((ms - millis) / 1000);
  std::tm tm{};
  if (::gmtime_r(&tt, &tm) == nullptr) return "gmtime_r failed";
  std::string out = Padded(tm.tm_year + 1900L, 4) + "-" + Padded(tm.tm_mon + 1, 2) + "-" +
                    Padded(tm.tm_mday, 2) + "T" + Padded(tm.tm_hour, 2) + ":" +
                    Padded(tm.tm_min, 2) + ":" + Padded(tm.tm_sec, 2);
  if (with_millis) out += "." + Padded(millis, 3);
  return out + "Z";
}

TEST(FormatIsoTimeTest, WritesWhatTheCLibraryWrites) {
  const int64_t day = 86'400'000;
  std::vector<int64_t> cases = {0,
                                -1,
                                999,
                                -86'400'001,
                                951'782'400'000,       // 2000-02-29, a leap day of a 400th year
                                4'107'542'400'000,     // 2100-03-01, after a 100th year's February
                                253'402'300'799'999,   // 9999-12-31T23:59:59.999Z
                                -62'167'219'200'000,   // 0000-01-01
                                253'402'300'800'000,   // 10000-01-01: past four digits
                                -62'167'219'200'001};  // before year 0
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20'000; ++i) {
    cases.push_back(static_cast<int64_t>(rng() % (9'900ull * 365 * day)) - 1'960ll * 365 * day);
  }
  for (const int64_t ms : cases) {
    const TimePoint t = FromUnixMillis(ms);
    EXPECT_EQ(FormatIsoTime(t), ByTheCLibrary(ms, true)) << ms;
    EXPECT_EQ(FormatIsoTime(t, /*with_millis=*/false), ByTheCLibrary(ms, false)) << ms;
  }
  EXPECT_EQ(FormatIsoTime(FromUnixMillis(1'767'225'600'123)), "2026-01-01T00:00:00.123Z");
}

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
