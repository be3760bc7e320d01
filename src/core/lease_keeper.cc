#include "core/lease_keeper.h"

#include <algorithm>
#include <vector>

namespace idem {

LeaseKeeper::LeaseKeeper(Store& store, Clock& clock)
    : store_(store), clock_(clock), thread_([this] { Loop(); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t LeaseKeeper::Start(const RecordId& id, uint64_t fence, Duration lease) {
  std::lock_guard g(mu_);
  uint64_t ticket = next_ticket_++;
  Duration period = std::max(Duration(1), lease / 3);
  leases_.emplace(ticket, Lease{id, fence, lease, clock_.Now() + period});
  lost_[ticket] = false;
  cv_.notify_all();
  return ticket;
}

void LeaseKeeper::Stop(uint64_t ticket) {
  std::lock_guard g(mu_);
  leases_.erase(ticket);
  lost_.erase(ticket);
}

bool LeaseKeeper::lost(uint64_t ticket) {
  std::lock_guard g(mu_);
  auto it = lost_.find(ticket);
  return it != lost_.end() && it->second;
}

uint64_t LeaseKeeper::heartbeats() {
  std::lock_guard g(mu_);
  return heartbeats_;
}

void LeaseKeeper::AwaitHeartbeats(uint64_t n) {
  std::unique_lock g(mu_);
  cv_.wait(g, [&] { return heartbeats_ >= n; });
}

void LeaseKeeper::Loop() {
  std::unique_lock g(mu_);
  while (!stop_) {
    if (leases_.empty()) {
      cv_.wait(g);
      continue;
    }
    TimePoint due = TimePoint::max();
    for (const auto& [ticket, l] : leases_) due = std::min(due, l.next_due);
    TimePoint now = clock_.Now();
    if (now < due) {
      clock_.WaitUntil(cv_, g, due);
      continue;
    }
    std::vector<std::pair<uint64_t, Lease>> work;
    for (const auto& [ticket, l] : leases_) {
      if (l.next_due <= now) work.emplace_back(ticket, l);
    }
    g.unlock();
    for (auto& [ticket, l] : work) {
      auto r = store_.Heartbeat(l.id, l.fence, l.lease);
      // kUnavailable: keep trying; if the store stays down the lease runs
      // out and the fence will refuse this owner's Complete.
      bool gone = !r && (r.error().code == ErrorCode::kAborted ||
                         r.error().code == ErrorCode::kNotFound);
      std::lock_guard lg(mu_);
      ++heartbeats_;
      auto it = leases_.find(ticket);
      if (it == leases_.end()) continue;
      if (gone) {
        lost_[ticket] = true;
        leases_.erase(it);
      } else {
        // From when this round started, not from now: the lease the store
        // granted runs from about then, and a slow store must not make the
        // schedule drift later.
        it->second.next_due = now + std::max(Duration(1), l.lease / 3);
      }
    }
    g.lock();
    cv_.notify_all();
  }
}

}  // namespace idem
