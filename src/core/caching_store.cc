#include "idem/caching_store.h"

#include <utility>

namespace idem {
namespace {

// Unambiguous for any bytes in tenant and key.
std::string CacheKey(const RecordId& id) {
  std::string k = std::to_string(id.tenant.size());
  k.reserve(k.size() + 1 + id.tenant.size() + id.key.size());
  k.push_back(':');
  k.append(id.tenant);
  k.append(id.key);
  return k;
}

// What an entry costs, roughly: the strings it holds plus the bookkeeping
// (map node, list node, the key twice).
size_t FootprintOf(const Record& r, size_t key_bytes) {
  size_t n = sizeof(Record) + 2 * key_bytes + 96;
  n += r.id.tenant.size() + r.id.key.size() + r.fingerprint.size() + r.tool.size() + r.turn.size() +
       r.owner.size();
  if (r.outcome) n += r.outcome->body.size();
  return n;
}

}  // namespace

CachingStore::CachingStore(Store& target, Clock& clock, size_t max_bytes)
    : ForwardingStore(target), clock_(clock), max_bytes_(max_bytes) {
  if (max_bytes_ == 0) return;
  active_ = target_.WatchEvictions([this](bool heard) { Drop(heard); });
}

CachingStore::~CachingStore() {
  if (active_) target_.WatchEvictions(nullptr);
}

CachingStore::Stats CachingStore::stats() const {
  std::lock_guard g(mu_);
  return Stats{hits_, misses_, drops_, entries_.size(), bytes_};
}

void CachingStore::Drop(bool serve) {
  std::lock_guard g(mu_);
  DropLocked();
  serving_ = serve;
}

void CachingStore::DropLocked() {
  epoch_.fetch_add(1, std::memory_order_acq_rel);
  entries_.clear();
  lru_.clear();
  bytes_ = 0;
  ++drops_;
}

void CachingStore::EraseLocked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

std::optional<Record> CachingStore::Lookup(const RecordId& id, bool count_miss) {
  if (!active_) return std::nullopt;
  const std::string key = CacheKey(id);
  const TimePoint now = clock_.Now();
  std::lock_guard g(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (count_miss) ++misses_;
    return std::nullopt;
  }
  if (now >= it->second.record.expires_at) {  // retention ran out: the store forgets it too
    EraseLocked(it);
    if (count_miss) ++misses_;
    return std::nullopt;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++hits_;
  return it->second.record;
}

void CachingStore::CountMiss() {
  if (!active_) return;
  std::lock_guard g(mu_);
  ++misses_;
}

void CachingStore::Fill(uint64_t epoch, const Record& record) {
  if (!active_ || record.state != RecordState::kCompleted || !record.outcome) return;
  std::string key = CacheKey(record.id);
  const size_t bytes = FootprintOf(record, key.size());
  if (bytes > max_bytes_) return;
  std::lock_guard g(mu_);
  if (!serving_ || epoch_.load(std::memory_order_relaxed) != epoch) return;
  if (auto it = entries_.find(key); it != entries_.end()) EraseLocked(it);
  while (bytes_ + bytes > max_bytes_ && !lru_.empty()) EraseLocked(entries_.find(lru_.back()));
  lru_.push_front(key);
  entries_.emplace(std::move(key), Entry{record, bytes, lru_.begin()});
  bytes_ += bytes;
}

Result<ClaimResult> CachingStore::Claim(const ClaimRequest& req) {
  // A live completed record is what Claim would return untouched.
  if (auto cached = Lookup(req.id)) return ClaimResult{false, *std::move(cached)};
  const uint64_t epoch = Epoch();
  auto r = target_.Claim(req);
  if (r && !r->claimed) Fill(epoch, r->record);
  return r;
}

Result<std::optional<Record>> CachingStore::Get(const RecordId& id) {
  if (auto cached = Lookup(id)) return std::optional<Record>(*std::move(cached));
  const uint64_t epoch = Epoch();
  auto r = target_.Get(id);
  if (r && *r) Fill(epoch, **r);
  return r;
}

// The asynchronous reads count a miss only when the store took the read: a
// front that offers a read, then a claim, then Begin one after the other
// (Ledger::BeginWithoutBlocking) reaches the store once.
bool CachingStore::GetAsync(const RecordId& id, GetDone done) {
  if (auto cached = Lookup(id, /*count_miss=*/false)) {
    done(std::optional<Record>(*std::move(cached)));
    return true;
  }
  const uint64_t epoch = Epoch();
  const bool taken =
      target_.GetAsync(id, [this, epoch, done = std::move(done)](Result<std::optional<Record>> r) {
        if (r && *r) Fill(epoch, **r);
        done(std::move(r));
      });
  if (taken) CountMiss();
  return taken;
}

std::optional<Record> CachingStore::Held(const RecordId& id) {
  // The claim or read that follows a miss counts it.
  return Lookup(id, /*count_miss=*/false);
}

bool CachingStore::ClaimAsync(const ClaimRequest& req, ClaimDone done) {
  // As Claim: a live completed record is what the store would return.
  if (auto cached = Lookup(req.id, /*count_miss=*/false)) {
    done(ClaimResult{false, *std::move(cached)});
    return true;
  }
  const uint64_t epoch = Epoch();
  const bool taken =
      target_.ClaimAsync(req, [this, epoch, done = std::move(done)](Result<ClaimResult> r) {
        if (r && !r->claimed) Fill(epoch, r->record);
        done(std::move(r));
      });
  if (taken) CountMiss();
  return taken;
}

Result<Record> CachingStore::Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                      Duration retention, const Attempt* logged) {
  const uint64_t epoch = Epoch();
  auto r = target_.Complete(id, fence, outcome, retention, logged);
  if (r) Fill(epoch, *r);
  return r;
}

bool CachingStore::CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                 Duration retention, CompleteDone done, const Attempt* logged) {
  const uint64_t epoch = Epoch();
  return target_.CompleteAsync(id, fence, outcome, retention,
                               [this, epoch, done = std::move(done)](Result<Record> r) {
                                 if (r) Fill(epoch, *r);
                                 done(std::move(r));
                               },
                               logged);
}

Result<bool> CachingStore::Evict(const RecordId& id) {
  auto r = target_.Evict(id);
  // Also when it failed: the store may have applied it. The feed announces
  // it as well; dropping here makes this process's own eviction immediate.
  if (active_ && (!r || *r)) {
    std::lock_guard g(mu_);
    DropLocked();
  }
  return r;
}

bool CachingStore::WatchEvictions(EvictionFeed on_change) {
  (void)on_change;
  return false;
}

}  // namespace idem
