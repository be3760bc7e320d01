#include "idem/clock.h"

#include <algorithm>
#include <thread>

namespace idem {

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

// Lock order: a waiter never holds its own mutex while taking mu_, so Advance
// may take mu_ and then each waiter's mutex. Holding the waiter's mutex while
// notifying means a waiter between its epoch check and cv.wait cannot miss
// the wake-up. Now() is lock-free so code holding any mutex may call it.
void FakeClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) {
  if (Now() >= deadline) return;
  const uint64_t epoch = epoch_.load();
  lock.unlock();
  {
    std::lock_guard g(mu_);
    waiters_.push_back(Waiter{&cv, lock.mutex()});
    changed_.notify_all();
  }
  lock.lock();
  if (epoch_.load() == epoch) cv.wait(lock);
  lock.unlock();
  {
    std::lock_guard g(mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(), [&](const Waiter& w) {
      return w.cv == &cv && w.mu == lock.mutex();
    });
    if (it != waiters_.end()) waiters_.erase(it);
    changed_.notify_all();
  }
  lock.lock();
}

void FakeClock::Advance(Duration d) {
  std::lock_guard g(mu_);
  now_ms_.fetch_add(d.count());
  epoch_.fetch_add(1);
  for (const Waiter& w : waiters_) {
    std::lock_guard wl(*w.mu);
    w.cv->notify_all();
  }
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
