// Time, injected. Leases, waits and retention are computed from a Clock so
// tests run on a FakeClock and never sleep.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace idem {

using Duration = std::chrono::milliseconds;
// Wall-clock milliseconds since the Unix epoch: stored in records and shared
// between instances, so it must be wall time, not a process-local steady clock.
using TimePoint = std::chrono::time_point<std::chrono::system_clock, Duration>;

inline int64_t ToUnixMillis(TimePoint t) { return t.time_since_epoch().count(); }
inline TimePoint FromUnixMillis(int64_t ms) { return TimePoint(Duration(ms)); }

// `t` in UTC as ISO 8601 / RFC 3339: "2026-01-01T00:00:00.000Z", or without
// the milliseconds ("2026-01-01T00:00:00Z"). The one formatter of instants
// every front, the CLI and the alert use.
std::string FormatIsoTime(TimePoint t, bool with_millis = true);

// Thread-safe. Implementations must be usable from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() = 0;

  // Blocks on `cv` (with `lock` held on entry and on return) until notified,
  // a spurious wake-up, or until Now() >= deadline. Callers loop on their own
  // predicate and on Now() < deadline.
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) = 0;
};

// The real wall clock. A process-wide instance: SystemClock::Default().
class SystemClock final : public Clock {
 public:
  static SystemClock& Default();
  TimePoint Now() override;
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override;
};

// A clock that moves only when a test calls Advance(). Waiters blocked in
// WaitUntil are woken on every Advance so they can re-check their deadline.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = FromUnixMillis(1'767'225'600'000));  // 2026-01-01
  TimePoint Now() override;
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override;
  void Advance(Duration d);
  // Number of threads currently blocked in WaitUntil; lets a test wait until a
  // waiter is parked before it advances time (no sleeps).
  int waiters();
  // Blocks until at least `n` threads are parked in WaitUntil.
  void AwaitWaiters(int n);

 private:
  struct Waiter {
    std::condition_variable* cv;
    std::mutex* mu;
  };
  std::atomic<int64_t> now_ms_;
  std::mutex mu_;       // guards waiters_ and notifying_
  int notifying_ = 0;   // Advance calls still waking the waiters they saw
  std::condition_variable changed_;
  std::vector<Waiter> waiters_;
};

}  // namespace idem
