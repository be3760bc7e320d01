#include "idem/store_clock.h"

#include <algorithm>
#include <optional>

namespace idem {

StoreClock::~StoreClock() { Stop(); }

Result<Duration> StoreClock::Sync(Store& store, int samples) {
  std::optional<Duration> best;
  Duration best_round_trip = Duration::max();
  for (int i = 0; i < std::max(1, samples); ++i) {
    const TimePoint sent = base_.Now();
    auto server = store.ReadServerClock();
    const TimePoint received = base_.Now();
    if (!server) return std::unexpected(server.error());
    if (!server->has_value()) {
      offset_ms_.store(0, std::memory_order_relaxed);
      return Duration(0);
    }
    // The server read its clock somewhere within the round trip: assume the
    // middle, and trust the shortest trip most (its error is the smallest).
    const Duration round_trip = std::max(Duration(0), received - sent);
    if (round_trip < best_round_trip) {
      best_round_trip = round_trip;
      best = **server - (sent + round_trip / 2);
    }
  }
  offset_ms_.store(best->count(), std::memory_order_relaxed);
  return *best;
}

Result<Duration> StoreClock::SyncFirst(Store& store, int attempts, Duration pause) {
  Result<Duration> synced = Sync(store);
  for (int i = 1; i < attempts && !synced; ++i) {
    std::mutex mu;
    std::condition_variable cv;
    std::unique_lock g(mu);
    const TimePoint until = base_.Now() + pause;
    while (base_.Now() < until) base_.WaitUntil(cv, g, until);
    pause *= 2;
    synced = Sync(store);
  }
  return synced;
}

void StoreClock::KeepInSync(Store& store, Duration every) {
  Stop();
  {
    std::lock_guard g(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this, &store, every] {
    std::unique_lock g(mu_);
    TimePoint next = base_.Now() + every;
    while (!stop_) {
      if (base_.Now() < next) {
        base_.WaitUntil(cv_, g, next);
        continue;
      }
      g.unlock();
      (void)Sync(store);  // a failed sync keeps the last offset
      g.lock();
      next = base_.Now() + every;
    }
  });
}

void StoreClock::Stop() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace idem
