// A Store decorator that keeps completed records in memory, so that a retry
// of a finished call is answered without a round trip to the backend.
//
// Why it is safe: a completed record never changes. It ends in one of two
// ways: its retention runs out, which the cache judges by expires_at on the
// store's clock, as the store does; or an operator evicts it, which the
// backend announces to every process (Store::WatchEvictions: Redis pub/sub,
// PostgreSQL NOTIFY, SQLite's eviction bell, a file beside the database
// that its processes watch with inotify). Any announced eviction drops the
// whole cache: evictions are rare operator actions, and dropping everything
// needs no record ids in the announcement. While the announcements may be
// missed (the backend's subscriber connection is down), the cache holds
// nothing and every call reaches the store. A store without such
// announcements gets no cache: active() is false and every call goes
// straight through.
//
// What is served from memory: Claim, Get and Held (and ClaimAsync and
// GetAsync, whose `done` then runs before they return) of a key whose
// completed record is cached. What
// fills it: completed records returned by Claim, Get, GetAsync, Complete and
// CompleteAsync. Everything else goes to the store unchanged.
//
// One window remains, and it is documented: an eviction through another
// process reaches this one after the announcement's delivery time (well
// under a millisecond on a LAN, or on one host); a retry answered here within
// that window replays the outcome being evicted, as it would have a moment
// earlier.
//
// Thread-safe. `target` and `clock` must outlive it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "idem/forwarding_store.h"

namespace idem {

class CachingStore final : public ForwardingStore {
 public:
  // Caches up to `max_bytes` of completed records (an estimate of their
  // memory: outcome, fingerprint, names), least recently used out first.
  // `max_bytes` 0, or a target without an eviction feed: nothing is cached.
  CachingStore(Store& target, Clock& clock, size_t max_bytes);
  ~CachingStore() override;  // stops the eviction feed
  CachingStore(const CachingStore&) = delete;
  CachingStore& operator=(const CachingStore&) = delete;

  // Whether this cache can hold anything (max_bytes > 0 and the target
  // announces evictions). It may still be empty while the feed is down.
  bool active() const { return active_; }

  struct Stats {
    uint64_t hits = 0;    // Claim/Get/Held and their Async answered from memory
    uint64_t misses = 0;  // ... that went to the store (only while active)
    uint64_t drops = 0;   // times the whole cache was dropped (evictions, feed changes)
    size_t records = 0;
    size_t bytes = 0;
  };
  Stats stats() const;

  // Store (everything else is forwarded unchanged):
  Result<ClaimResult> Claim(const ClaimRequest& req) override;
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override;
  Result<std::optional<Record>> Get(const RecordId& id) override;
  bool GetAsync(const RecordId& id, GetDone done) override;
  std::optional<Record> Held(const RecordId& id) override;  // a hit counts, a miss does not
  bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override;
  bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome, Duration retention,
                     CompleteDone done, const Attempt* logged = nullptr) override;
  Result<bool> Evict(const RecordId& id) override;
  // A cache above this one would gain nothing; not offered.
  bool WatchEvictions(EvictionFeed on_change) override;

 private:
  struct Entry {
    Record record;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };

  // The cached completed record of `id` if it is live by the clock; counts
  // a hit, or a miss if `count_miss`.
  std::optional<Record> Lookup(const RecordId& id, bool count_miss = true);
  void CountMiss();  // only while active
  // Keeps `record` if it is completed and no drop happened since `epoch`
  // was read (a read that began before an eviction must not refill it).
  void Fill(uint64_t epoch, const Record& record);
  // The epoch a fill must match; read before the store is asked.
  uint64_t Epoch() const { return epoch_.load(std::memory_order_acquire); }
  // Drops everything; `serve` says whether the cache may fill again.
  void Drop(bool serve);
  void DropLocked();
  void EraseLocked(std::unordered_map<std::string, Entry>::iterator it);

  Clock& clock_;
  const size_t max_bytes_;
  bool active_ = false;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // by CacheKey(id)
  std::list<std::string> lru_;                      // most recently used first
  size_t bytes_ = 0;
  bool serving_ = false;            // the feed is up
  std::atomic<uint64_t> epoch_{0};  // bumped (under mu_) by every Drop
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t drops_ = 0;
};

}  // namespace idem
