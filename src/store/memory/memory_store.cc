#include "memory_store.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "idem/attempt_chain.h"

namespace idem {
namespace {

bool Differs(const Record& seen, const Record& now) {
  return now.fence != seen.fence || now.state != seen.state;
}

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(Clock& clock) : clock_(clock) {}

  // Store:
  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    std::lock_guard g(mu_);
    const TimePoint now = clock_.Now();
    uint64_t old_fence = 0;
    if (auto it = records_.find(req.id); it != records_.end()) {
      if (Live(it->second, now)) return ClaimResult{false, it->second};
      old_fence = it->second.fence;
    }
    Record r;
    r.id = req.id;
    r.state = RecordState::kInProgress;
    r.fingerprint = req.fingerprint;
    r.tool = req.tool;
    r.turn = req.turn;
    r.owner = req.owner;
    r.fence = NextFence(old_fence, now);
    r.created_at = now;
    r.lease_expires_at = now + req.lease;
    r.expires_at = now + std::max(req.retention, req.lease);
    r.retention = req.retention;
    records_[req.id] = r;
    if (req.logged) Log(*req.logged);
    Changed();
    return ClaimResult{true, std::move(r)};
  }

  bool LogsWithRecords() const override { return true; }

  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    std::lock_guard g(mu_);
    auto r = Owned(id, fence, {RecordState::kInProgress});
    if (!r) return std::unexpected(r.error());
    const TimePoint now = clock_.Now();
    (*r)->lease_expires_at = now + lease;
    (*r)->expires_at = std::max((*r)->expires_at, (*r)->lease_expires_at);
    return (*r)->lease_expires_at;
  }

  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    std::lock_guard g(mu_);
    auto r = Owned(id, fence, {RecordState::kInProgress, RecordState::kUnknown});
    if (!r) return std::unexpected(r.error());
    const TimePoint now = clock_.Now();
    (*r)->state = RecordState::kCompleted;
    (*r)->outcome = outcome;
    (*r)->completed_at = now;
    (*r)->expires_at = now + retention;
    if (logged) Log(*logged);
    Changed();
    return **r;
  }

  Result<void> Release(const RecordId& id, uint64_t fence) override {
    std::lock_guard g(mu_);
    auto r = Owned(id, fence, {RecordState::kInProgress, RecordState::kUnknown});
    if (!r) return std::unexpected(r.error());
    last_fence_ = std::max(last_fence_, fence);
    records_.erase(id);
    Changed();
    return {};
  }

  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    if (owner.empty()) {
      return MakeError(ErrorCode::kInvalidArgument, "abandon needs the claim's owner token");
    }
    std::lock_guard g(mu_);
    auto it = records_.find(id);
    if (it == records_.end() || !Live(it->second, clock_.Now())) {
      return MakeError(ErrorCode::kNotFound, "no record for key " + id.key);
    }
    const Record& r = it->second;
    if (r.owner != owner) {
      return MakeError(ErrorCode::kAborted,
                       "record " + id.key + " was claimed by another attempt; it is not ours");
    }
    if (r.state != RecordState::kInProgress) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "record " + id.key + " is " + std::string(RecordStateName(r.state)));
    }
    last_fence_ = std::max(last_fence_, r.fence);
    records_.erase(it);
    Changed();
    return {};
  }

  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    std::lock_guard g(mu_);
    auto r = Owned(id, fence, {RecordState::kInProgress});
    if (!r) return std::unexpected(r.error());
    const TimePoint now = clock_.Now();
    (*r)->state = RecordState::kUnknown;
    (*r)->completed_at = now;
    (*r)->expires_at = now + retention;
    Changed();
    return **r;
  }

  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    std::lock_guard g(mu_);
    auto r = Owned(id, fence, {RecordState::kInProgress, RecordState::kUnknown});
    if (!r) return std::unexpected(r.error());
    const TimePoint now = clock_.Now();
    Record& rec = **r;
    if (rec.state == RecordState::kInProgress && rec.lease_expires_at > now) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "record " + id.key + " has a live owner; it cannot be taken over");
    }
    rec.state = RecordState::kInProgress;
    rec.owner.clear();
    rec.fence = NextFence(rec.fence, now);
    rec.lease_expires_at = now + lease;
    rec.expires_at = std::max(rec.expires_at, rec.lease_expires_at);
    Changed();
    return rec;
  }

  Result<std::optional<Record>> Get(const RecordId& id) override {
    std::lock_guard g(mu_);
    auto it = records_.find(id);
    if (it == records_.end() || !Live(it->second, clock_.Now())) return std::optional<Record>();
    return std::optional<Record>(it->second);
  }

  Result<bool> Evict(const RecordId& id) override {
    {
      std::lock_guard g(mu_);
      auto it = records_.find(id);
      if (it == records_.end()) return false;
      last_fence_ = std::max(last_fence_, it->second.fence);
      records_.erase(it);
      Changed();
    }
    std::lock_guard feed(feed_mu_);
    if (on_evicted_) on_evicted_(true);
    return true;
  }

  // Every eviction goes through this object, in this process.
  bool WatchEvictions(EvictionFeed on_change) override {
    std::lock_guard feed(feed_mu_);
    on_evicted_ = std::move(on_change);
    if (on_evicted_) on_evicted_(true);
    return true;
  }

  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    std::unique_lock g(mu_);
    while (clock_.Now() < deadline) {
      auto it = records_.find(id);
      if (it == records_.end() || !Live(it->second, clock_.Now()) || Differs(seen, it->second)) {
        return {};
      }
      clock_.WaitUntil(changed_, g, deadline);
    }
    return {};
  }

  Result<size_t> PurgeExpired(size_t limit) override {
    std::lock_guard g(mu_);
    const TimePoint now = clock_.Now();
    size_t purged = 0;
    for (auto it = records_.begin(); it != records_.end() && purged < limit;) {
      if (it->second.expires_at <= now) {
        last_fence_ = std::max(last_fence_, it->second.fence);
        it = records_.erase(it);
        ++purged;
      } else {
        ++it;
      }
    }
    return purged;
  }

  Result<uint64_t> CountRecords() override {
    std::lock_guard g(mu_);
    return records_.size();
  }

  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override {
    std::lock_guard g(mu_);
    for (const Attempt& a : attempts) Log(a);
    return {};
  }

  Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) override {
    std::lock_guard g(mu_);
    std::vector<ChainHead> out;
    for (const auto& [name, head] : heads_) {
      if (!tenant || *tenant == name) out.push_back(head);
    }
    return out;
  }

  // In storage order, which is each tenant's chain order (one lock); the
  // cursor is the index of the next entry.
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override {
    std::lock_guard g(mu_);
    size_t i = cursor.empty() ? 0 : std::stoull(cursor);
    ChainPage page;
    for (; i < attempts_.size() && page.entries.size() < limit; ++i) {
      if (!tenant || attempts_[i].tenant == *tenant) page.entries.push_back(attempts_[i]);
    }
    if (i < attempts_.size()) page.next = std::to_string(i);
    return page;
  }

  Result<size_t> PurgeAttempts(TimePoint before, size_t limit) override {
    std::lock_guard g(mu_);
    // Per tenant: the last seq of the run of entries older than `before`
    // that its chain starts with (storage order is chain order).
    std::map<std::string, uint64_t> cut;
    std::map<std::string, bool> stopped;
    for (const Attempt& a : attempts_) {
      if (a.seq == 0 || stopped[a.tenant]) continue;
      if (a.at < before) {
        cut[a.tenant] = a.seq;
      } else {
        stopped[a.tenant] = true;
      }
    }
    size_t purged = 0;
    std::vector<Attempt> kept;
    for (Attempt& a : attempts_) {
      const bool old = a.seq == 0 ? a.at < before : a.seq <= cut[a.tenant];
      if (old && purged < limit) {
        ++purged;
        if (a.seq != 0) {
          ChainHead& h = heads_[a.tenant];
          h.start_seq = a.seq + 1;
          h.start_prev = a.hash;
        }
      } else {
        kept.push_back(std::move(a));
      }
    }
    attempts_ = std::move(kept);
    return purged;
  }

  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override {
    std::lock_guard g(mu_);
    std::vector<Attempt> out;
    for (auto it = attempts_.rbegin(); it != attempts_.rend() && out.size() < filter.limit; ++it) {
      if (Matches(filter, *it)) out.push_back(*it);
    }
    return out;
  }

  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter) override {
    std::lock_guard g(mu_);
    std::map<std::string, ToolStats> out;
    for (const Attempt& a : attempts_) {
      if (!Matches(filter, a)) continue;
      ToolStats& s = out[a.tool];
      ++s.attempts;
      ++s.by_outcome[a.outcome];
    }
    return out;
  }

 private:
  // Hashed, not ordered: lookups stay O(1) with 10^7 records (nothing
  // needs key order; purge scans everything anyway).
  struct IdHash {
    size_t operator()(const RecordId& id) const {
      size_t h = std::hash<std::string>{}(id.tenant);
      return h ^ (std::hash<std::string>{}(id.key) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    }
  };

  static bool Live(const Record& r, TimePoint now) { return r.expires_at > now; }

  static bool Matches(const AttemptFilter& f, const Attempt& a) {
    return (!f.tenant || *f.tenant == a.tenant) && (!f.key || *f.key == a.key) &&
           (!f.tool || *f.tool == a.tool) && (!f.outcome || *f.outcome == a.outcome) &&
           (!f.since || a.at >= *f.since);
  }

  // Fences grow across eviction and expiry too: never below the wall clock
  // in microseconds, nor below any fence this store issued.
  uint64_t NextFence(uint64_t old_fence, TimePoint now) {
    uint64_t micros = static_cast<uint64_t>(ToUnixMillis(now)) * 1000;
    last_fence_ = std::max({old_fence + 1, micros, last_fence_ + 1});
    return last_fence_;
  }

  // The live record `id` if it carries `fence` and is in one of `states`.
  Result<Record*> Owned(const RecordId& id, uint64_t fence,
                        std::initializer_list<RecordState> states) {
    auto it = records_.find(id);
    if (it == records_.end() || !Live(it->second, clock_.Now())) {
      return MakeError(ErrorCode::kNotFound, "no record for key " + id.key);
    }
    Record& r = it->second;
    if (r.fence != fence) {
      return MakeError(ErrorCode::kAborted, "record " + id.key + " is owned by fence " +
                                                std::to_string(r.fence) + ", not " +
                                                std::to_string(fence) + ": this owner lost it");
    }
    if (std::find(states.begin(), states.end(), r.state) == states.end()) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "record " + id.key + " is " + std::string(RecordStateName(r.state)));
    }
    return &r;
  }

  void Changed() { changed_.notify_all(); }

  // Appends `a` to its tenant's chain and the log (under mu_).
  void Log(Attempt a) {
    ChainHead& head = heads_[a.tenant];
    head.tenant = a.tenant;
    ChainAppend(head, a);
    attempts_.push_back(std::move(a));
  }

  Clock& clock_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<RecordId, Record, IdHash> records_;
  std::vector<Attempt> attempts_;
  std::map<std::string, ChainHead> heads_;
  uint64_t last_fence_ = 0;
  std::mutex feed_mu_;  // held while on_evicted_ runs
  EvictionFeed on_evicted_;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore(Clock& clock) { return std::make_unique<MemoryStore>(clock); }

}  // namespace idem
