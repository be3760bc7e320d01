// Store wrappers for tests, in the manner of LevelDB's EnvWrapper: forward
// everything to a real store and override only what a test needs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "idem/caching_store.h"
#include "idem/forwarding_store.h"
#include "idem/store.h"

namespace idem::testing {

// Forwards everything but the asynchronous writes and the eviction feed,
// which it does not offer (subclasses that need them say so), so that a
// wrapper that fails or counts Claim and Complete sees every one.
class StoreWrapper : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  bool ClaimAsync(const ClaimRequest&, ClaimDone) override { return false; }
  bool CompleteAsync(const RecordId&, uint64_t, const Outcome&, Duration, CompleteDone,
                     const Attempt*) override {
    return false;
  }
  bool WatchEvictions(EvictionFeed) override { return false; }
};

// `inner` under a CachingStore of 1 MiB, owned together: for running the
// store contract suite through the cache.
inline std::unique_ptr<Store> WithReplayCache(std::unique_ptr<Store> inner, Clock& clock) {
  class Cached final : public ForwardingStore {
   public:
    Cached(std::unique_ptr<Store> inner, Clock& clock)
        : ForwardingStore(static_cast<Store&>(cache_)),
          inner_(std::move(inner)),
          cache_(*inner_, clock, 1 << 20) {}

   private:
    std::unique_ptr<Store> inner_;
    CachingStore cache_;  // target_
  };
  return std::make_unique<Cached>(std::move(inner), clock);
}

// A store with GetAsync, answered with Get before GetAsync returns (a real
// store answers later, on a thread of its own): for the callers' logic.
class InlineAsyncReads : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  bool GetAsync(const RecordId& id, GetDone done) override {
    done(target_.Get(id));
    return true;
  }
};

// A store with ClaimAsync and CompleteAsync, answered with Claim and
// Complete before they return: for the callers' logic.
class InlineAsyncWrites : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override {
    done(target_.Claim(req));
    return true;
  }
  bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome, Duration retention,
                     CompleteDone done, const Attempt* logged = nullptr) override {
    done(target_.Complete(id, fence, outcome, retention, logged));
    return true;
  }
};

// Counts heartbeats, per key, and lets a test block until the n-th one (no
// sleeps).
class CountingStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    auto r = StoreWrapper::Heartbeat(id, fence, lease);
    std::lock_guard g(mu_);
    ++heartbeats_;
    ++by_key_[id.key];
    cv_.notify_all();
    return r;
  }
  void AwaitHeartbeats(int n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return heartbeats_ >= n; });
  }
  // Heartbeats sent for `key` so far.
  int HeartbeatsOf(const std::string& key) {
    std::lock_guard g(mu_);
    return by_key_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int heartbeats_ = 0;
  std::map<std::string, int> by_key_;
};

// Fails the n-th record operation (1-based; audit-log calls and abandons,
// which the ledger's keeper thread sends at its own pace, are not counted)
// with kUnavailable, as a store that went down would.
class FailingStore : public StoreWrapper {
 public:
  FailingStore(Store& target, int fail_at) : StoreWrapper(target), fail_at_(fail_at) {}

  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    if (Fail()) return Down<ClaimResult>();
    auto r = StoreWrapper::Claim(req);
    if (r && r->claimed) claims_granted_.fetch_add(1);
    return r;
  }
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    if (Fail()) return Down<TimePoint>();
    return StoreWrapper::Heartbeat(id, fence, lease);
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    if (Fail()) return Down<Record>();
    return StoreWrapper::Complete(id, fence, outcome, retention, logged);
  }
  Result<void> Release(const RecordId& id, uint64_t fence) override {
    if (Fail()) return Down<void>();
    return StoreWrapper::Release(id, fence);
  }
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    if (Fail()) return Down<Record>();
    return StoreWrapper::MarkUnknown(id, fence, retention);
  }
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    if (Fail()) return Down<Record>();
    auto r = StoreWrapper::TakeOver(id, fence, lease);
    if (r) claims_granted_.fetch_add(1);
    return r;
  }
  Result<std::optional<Record>> Get(const RecordId& id) override {
    if (Fail()) return Down<std::optional<Record>>();
    return StoreWrapper::Get(id);
  }
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    if (Fail()) return Down<void>();
    return StoreWrapper::WaitForChange(id, seen, deadline);
  }

  int calls() const { return calls_.load(); }
  // Claims (and take-overs) the store granted: an execution needs one.
  int claims_granted() const { return claims_granted_.load(); }

 private:
  bool Fail() { return calls_.fetch_add(1) + 1 == fail_at_; }
  template <typename T>
  Result<T> Down() {
    // Refused before it is applied: the store was not reached.
    return std::unexpected(
        Error{ErrorCode::kUnavailable, "injected failure: the store is down", /*unreached=*/true});
  }

  const int fail_at_;
  std::atomic<int> calls_{0};
  std::atomic<int> claims_granted_{0};
};

// A store that dies after applying a claim, before its reply is sent: after
// DieAfterNextClaim(), the next claim is applied, then the store goes down
// and the claim is answered kUnavailable. While down (until set_down(false)),
// every record operation fails with kUnavailable without being applied.
// Counts abandons (refused because down, and those that deleted a record)
// so that a test can wait for the ledger's keeper thread without sleeping.
class LostReplyStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  void DieAfterNextClaim() { die_after_claim_ = true; }
  void set_down(bool on) { down_ = on; }
  // Claims the store applied (whether or not their reply was lost).
  int claims_applied() const { return claims_applied_.load(); }

  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    if (down_) return Down<ClaimResult>();
    auto r = StoreWrapper::Claim(req);
    if (r && r->claimed) claims_applied_.fetch_add(1);
    if (die_after_claim_.exchange(false)) {
      down_ = true;
      return MakeError(ErrorCode::kUnavailable,
                       "injected: the store died before the claim's reply was sent");
    }
    return r;
  }
  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    if (down_) {
      Count(false, false);
      return Down<void>();
    }
    auto r = StoreWrapper::Abandon(id, owner);
    Count(true, r.has_value());
    return r;
  }
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    if (down_) return Down<TimePoint>();
    return StoreWrapper::Heartbeat(id, fence, lease);
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    if (down_) return Down<Record>();
    return StoreWrapper::Complete(id, fence, outcome, retention, logged);
  }
  Result<void> Release(const RecordId& id, uint64_t fence) override {
    if (down_) return Down<void>();
    return StoreWrapper::Release(id, fence);
  }
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    if (down_) return Down<Record>();
    return StoreWrapper::MarkUnknown(id, fence, retention);
  }
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    if (down_) return Down<Record>();
    return StoreWrapper::TakeOver(id, fence, lease);
  }
  Result<std::optional<Record>> Get(const RecordId& id) override {
    if (down_) return Down<std::optional<Record>>();
    return StoreWrapper::Get(id);
  }
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    if (down_) return Down<void>();
    return StoreWrapper::WaitForChange(id, seen, deadline);
  }

  // Blocks until `n` Abandon calls failed because the store was down.
  void AwaitRefusedAbandons(int n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return refused_ >= n; });
  }
  // Blocks until `n` Abandon calls deleted a record.
  void AwaitAbandoned(int n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return abandoned_ >= n; });
  }
  int abandoned() {
    std::lock_guard g(mu_);
    return abandoned_;
  }

 private:
  template <typename T>
  static Result<T> Down() {
    return std::unexpected(
        Error{ErrorCode::kUnavailable, "injected: the store is down", /*unreached=*/true});
  }
  void Count(bool reached, bool deleted) {
    std::lock_guard g(mu_);
    if (!reached) ++refused_;
    if (deleted) ++abandoned_;
    cv_.notify_all();
  }

  std::atomic<bool> die_after_claim_{false};
  std::atomic<bool> down_{false};
  std::atomic<int> claims_applied_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int refused_ = 0;
  int abandoned_ = 0;
};

}  // namespace idem::testing
