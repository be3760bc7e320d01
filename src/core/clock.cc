#include "idem/clock.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <thread>

namespace idem {

std::string FormatIsoTime(TimePoint t, bool with_millis) {
  int64_t ms = ToUnixMillis(t);
  int64_t seconds = ms / 1000, millis = ms % 1000;
  if (millis < 0) {
    millis += 1000;
    seconds -= 1;
  }
  std::time_t tt = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (::gmtime_r(&tt, &tm) == nullptr) return std::to_string(ms) + "ms";
  char buf[96];
  if (with_millis) {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(millis));
  } else {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  }
  return buf;
}

SystemClock& SystemClock::Default() {
  static SystemClock clock;
  return clock;
}

TimePoint SystemClock::Now() {
  return std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
}

void SystemClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                            TimePoint deadline) {
  // Waits on the steady clock so a wall-clock jump cannot stretch a wait;
  // callers re-check Now() against their deadline anyway.
  auto remaining = deadline - Now();
  if (remaining <= Duration::zero()) return;
  cv.wait_for(lock, remaining);
}

FakeClock::FakeClock(TimePoint start) : now_ms_(ToUnixMillis(start)) {}

TimePoint FakeClock::Now() { return FromUnixMillis(now_ms_.load()); }

// Lock order: a waiter registers while holding its own mutex (so a change
// its caller is waiting for cannot slip in before cv.wait) and takes mu_
// inside it; Advance never holds mu_ while taking a waiter's mutex. Advance
// notifies under the waiter's mutex, so a waiter between registering and
// cv.wait cannot miss it, and a waiter unregisters only once no Advance is
// still notifying, so the cv and mutex it registered outlive every use.
// Now() is lock-free so code holding any mutex may call it.
void FakeClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) {
  if (Now() >= deadline) return;
  {
    std::lock_guard g(mu_);
    waiters_.push_back(Waiter{&cv, lock.mutex()});
    changed_.notify_all();
  }
  // An Advance that ran before we registered has already moved now_.
  if (Now() < deadline) cv.wait(lock);
  lock.unlock();
  {
    std::unique_lock g(mu_);
    changed_.wait(g, [&] { return notifying_ == 0; });
    auto it = std::find_if(waiters_.begin(), waiters_.end(), [&](const Waiter& w) {
      return w.cv == &cv && w.mu == lock.mutex();
    });
    if (it != waiters_.end()) waiters_.erase(it);
    changed_.notify_all();
  }
  lock.lock();
}

void FakeClock::Advance(Duration d) {
  std::vector<Waiter> to_wake;
  {
    std::lock_guard g(mu_);
    now_ms_.fetch_add(d.count());
    to_wake = waiters_;
    ++notifying_;
  }
  for (const Waiter& w : to_wake) {
    std::lock_guard wl(*w.mu);
    w.cv->notify_all();
  }
  std::lock_guard g(mu_);
  --notifying_;
  changed_.notify_all();
}

int FakeClock::waiters() {
  std::lock_guard g(mu_);
  return static_cast<int>(waiters_.size());
}

void FakeClock::AwaitWaiters(int n) {
  std::unique_lock g(mu_);
  changed_.wait(g, [&] { return static_cast<int>(waiters_.size()) >= n; });
}

}  // namespace idem
