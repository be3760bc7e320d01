#include "core/lease_keeper.h"

#include <algorithm>
#include <vector>

namespace idem {
namespace {

// Retry of an abandon that the store could not answer: 100 ms doubling to
// 1 s, so an orphaned claim is gone within a second of the store's return.
constexpr Duration kFirstAbandonRetry{100};
constexpr Duration kMaxAbandonRetry{1000};
// A store down for a long time under load leaves one pending abandon per
// refused call; past this many the oldest are dropped (their records then
// end as their lease runs out, as before owner tokens).
constexpr size_t kMaxPendingAbandons = 100'000;

}  // namespace

LeaseKeeper::LeaseKeeper(Store& store, Clock& clock)
    : store_(store), clock_(clock), thread_([this] { Loop(); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  pool_.Shutdown();  // the heartbeats in flight finish; they touch leases_
}

uint64_t LeaseKeeper::Start(const RecordId& id, uint64_t fence, Duration lease) {
  std::lock_guard g(mu_);
  uint64_t ticket = next_ticket_++;
  Duration period = std::max(Duration(1), lease / 3);
  const TimePoint due = clock_.Now() + period;
  leases_.emplace(ticket, Lease{id, fence, lease, due});
  lost_[ticket] = false;
  if (due < wakes_at_) cv_.notify_all();
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

size_t LeaseKeeper::running() {
  std::lock_guard g(mu_);
  return leases_.size();
}

uint64_t LeaseKeeper::heartbeats() {
  std::lock_guard g(mu_);
  return heartbeats_;
}

void LeaseKeeper::AwaitHeartbeats(uint64_t n) {
  std::unique_lock g(mu_);
  cv_.wait(g, [&] { return heartbeats_ >= n; });
}

void LeaseKeeper::Abandon(const RecordId& id, std::string owner, TimePoint give_up_at) {
  if (owner.empty()) return;
  std::lock_guard g(mu_);
  if (abandons_.size() >= kMaxPendingAbandons) abandons_.erase(abandons_.begin());
  abandons_.emplace(next_ticket_++, PendingAbandon{id, std::move(owner), give_up_at, clock_.Now(),
                                                   kFirstAbandonRetry});
  abandons_pending_ = abandons_.size();
  cv_.notify_all();
}

bool LeaseKeeper::Settled(const Result<void>& r) {
  // Deleted; or absent, someone else's, no longer in progress: nothing of
  // ours is left to take back.
  return r || r.error().code == ErrorCode::kNotFound || r.error().code == ErrorCode::kAborted ||
         r.error().code == ErrorCode::kFailedPrecondition ||
         r.error().code == ErrorCode::kInvalidArgument;
}

Result<void> LeaseKeeper::AbandonNow(const RecordId& id) {
  if (abandons_pending_ == 0) return {};  // the common case, on every claim
  std::vector<std::pair<uint64_t, PendingAbandon>> mine;
  {
    std::lock_guard g(mu_);
    for (const auto& [ticket, a] : abandons_) {
      if (a.id == id) mine.emplace_back(ticket, a);
    }
  }
  for (const auto& [ticket, a] : mine) {
    auto r = store_.Abandon(a.id, a.owner);
    if (!Settled(r)) return r;  // still pending: the keeper keeps trying
    std::lock_guard g(mu_);
    abandons_.erase(ticket);
    abandons_pending_ = abandons_.size();
  }
  return {};
}

size_t LeaseKeeper::pending_abandons() {
  std::lock_guard g(mu_);
  return abandons_.size();
}

void LeaseKeeper::RunAbandons(std::vector<std::pair<uint64_t, PendingAbandon>> work,
                              TimePoint now) {
  bool store_down = false;
  for (auto& [ticket, a] : work) {
    // Once one attempt found the store unreachable, the others of this round
    // would too: they wait for the next round instead of queueing timeouts.
    const bool settled = !store_down && Settled(store_.Abandon(a.id, a.owner));
    if (!settled) store_down = true;
    std::lock_guard g(mu_);
    auto it = abandons_.find(ticket);
    if (it == abandons_.end()) continue;  // AbandonNow settled it meanwhile
    if (settled || now >= it->second.give_up_at) {
      abandons_.erase(it);
      abandons_pending_ = abandons_.size();
    } else {
      it->second.next_due = now + it->second.backoff;
      it->second.backoff = std::min(it->second.backoff * 2, kMaxAbandonRetry);
    }
  }
}

void LeaseKeeper::Renew(uint64_t ticket, Lease l, TimePoint round) {
  auto r = store_.Heartbeat(l.id, l.fence, l.lease);
  // kUnavailable: keep trying; if the store stays down the lease runs out
  // and the fence will refuse this owner's Complete.
  const bool gone =
      !r && (r.error().code == ErrorCode::kAborted || r.error().code == ErrorCode::kNotFound);
  std::lock_guard g(mu_);
  ++heartbeats_;
  auto it = leases_.find(ticket);
  if (it != leases_.end()) {
    if (gone) {
      lost_[ticket] = true;
      leases_.erase(it);
    } else {
      // From when its round started, not from now: the lease the store
      // granted runs from about then, and a slow store must not make the
      // schedule drift later.
      it->second.in_flight = false;
      it->second.next_due = round + std::max(Duration(1), l.lease / 3);
    }
  }
  cv_.notify_all();  // the scheduler (a lease is due again) and AwaitHeartbeats
}

void LeaseKeeper::Loop() {
  std::unique_lock g(mu_);
  while (!stop_) {
    TimePoint due = TimePoint::max();
    for (const auto& [ticket, l] : leases_) {
      if (!l.in_flight) due = std::min(due, l.next_due);
    }
    if (!abandons_running_) {
      for (const auto& [ticket, a] : abandons_) due = std::min(due, a.next_due);
    }
    if (due == TimePoint::max()) {
      wakes_at_ = TimePoint::max();
      cv_.wait(g);
      wakes_at_ = TimePoint::min();
      continue;
    }
    const TimePoint now = clock_.Now();
    if (now < due) {
      wakes_at_ = due;
      clock_.WaitUntil(cv_, g, due);
      wakes_at_ = TimePoint::min();
      continue;
    }
    // A live call's lease comes first: its heartbeats go out before the
    // round's abandons.
    for (auto& [ticket, l] : leases_) {
      if (l.in_flight || l.next_due > now) continue;
      l.in_flight = true;
      pool_.Submit([this, ticket, l, now] { Renew(ticket, l, now); });
    }
    std::vector<std::pair<uint64_t, PendingAbandon>> abandons;
    if (!abandons_running_) {
      for (const auto& [ticket, a] : abandons_) {
        if (a.next_due <= now) abandons.emplace_back(ticket, a);
      }
    }
    if (!abandons.empty()) {
      abandons_running_ = true;
      pool_.Submit([this, work = std::move(abandons), now]() mutable {
        RunAbandons(std::move(work), now);
        std::lock_guard lg(mu_);
        abandons_running_ = false;
        cv_.notify_all();
      });
    }
  }
}

}  // namespace idem
