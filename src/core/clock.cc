#include "idem/clock.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

namespace idem {

namespace {

// Writes `v` as `width` decimal digits (v < 10^width) ending before `end`.
char* PutDigits(char* end, unsigned v, int width) {
  for (int i = 0; i < width; ++i) {
    *--end = static_cast<char>('0' + v % 10);
    v /= 10;
  }
  return end;
}

// FormatIsoTime of a year outside 0000–9999, by the C library.
std::string FormatFarIsoTime(TimePoint t, bool with_millis) {
  const int64_t ms = ToUnixMillis(t);
  int64_t seconds = ms / 1000, millis = ms % 1000;
  if (millis < 0) {
    millis += 1000;
    seconds -= 1;
  }
  const std::time_t tt = static_cast<std::time_t>(seconds);
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

}  // namespace

std::string FormatIsoTime(TimePoint t, bool with_millis) {
  // By civil-calendar arithmetic (std::chrono's year_month_day), not
  // gmtime_r and snprintf: a replay formats its first attempt's time, and
  // those two cost it some 3 800 instructions, this under 200.
  using namespace std::chrono;
  const sys_time<milliseconds> at{milliseconds(ToUnixMillis(t))};
  const sys_days day = floor<days>(at);
  const year_month_day date(day);
  const int year = static_cast<int>(date.year());
  if (year < 0 || year > 9999) return FormatFarIsoTime(t, with_millis);
  const hh_mm_ss<milliseconds> time(at - day);
  char buf[] = "0000-00-00T00:00:00.000Z";
  PutDigits(buf + 4, static_cast<unsigned>(year), 4);
  PutDigits(buf + 7, static_cast<unsigned>(date.month()), 2);
  PutDigits(buf + 10, static_cast<unsigned>(date.day()), 2);
  PutDigits(buf + 13, static_cast<unsigned>(time.hours().count()), 2);
  PutDigits(buf + 16, static_cast<unsigned>(time.minutes().count()), 2);
  PutDigits(buf + 19, static_cast<unsigned>(time.seconds().count()), 2);
  if (!with_millis) {
    buf[19] = 'Z';
    return std::string(buf, 20);
  }
  PutDigits(buf + 23, static_cast<unsigned>(time.subseconds().count()), 3);
  return std::string(buf, 24);
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
