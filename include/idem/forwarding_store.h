// A Store that forwards every call to another one: the base of decorators
// that change a few calls and pass the rest through (CachingStore), in the
// manner of LevelDB's EnvWrapper. `target` must outlive it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "idem/store.h"

namespace idem {

class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store& target) : target_(target) {}
  // Not copyable: a decorator built on another ForwardingStore must forward
  // to it, never copy its target (pass it as Store&).
  ForwardingStore(const ForwardingStore&) = delete;
  ForwardingStore& operator=(const ForwardingStore&) = delete;

  // Store:
  Result<ClaimResult> Claim(const ClaimRequest& req) override { return target_.Claim(req); }
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    return target_.Heartbeat(id, fence, lease);
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    return target_.Complete(id, fence, outcome, retention, logged);
  }
  Result<void> Release(const RecordId& id, uint64_t fence) override {
    return target_.Release(id, fence);
  }
  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    return target_.Abandon(id, owner);
  }
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    return target_.MarkUnknown(id, fence, retention);
  }
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    return target_.TakeOver(id, fence, lease);
  }
  Result<std::optional<Record>> Get(const RecordId& id) override { return target_.Get(id); }
  bool GetAsync(const RecordId& id, GetDone done) override {
    return target_.GetAsync(id, std::move(done));
  }
  std::optional<Record> Held(const RecordId& id) override { return target_.Held(id); }
  bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override {
    return target_.ClaimAsync(req, std::move(done));
  }
  bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome, Duration retention,
                     CompleteDone done, const Attempt* logged = nullptr) override {
    return target_.CompleteAsync(id, fence, outcome, retention, std::move(done), logged);
  }
  bool LogsWithRecords() const override { return target_.LogsWithRecords(); }
  bool ReadsBeforeClaim() const override { return target_.ReadsBeforeClaim(); }
  Result<std::optional<TimePoint>> ReadServerClock() override {
    return target_.ReadServerClock();
  }
  Result<bool> Evict(const RecordId& id) override { return target_.Evict(id); }
  bool WatchEvictions(EvictionFeed on_change) override {
    return target_.WatchEvictions(std::move(on_change));
  }
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    return target_.WaitForChange(id, seen, deadline);
  }
  Result<size_t> PurgeExpired(size_t limit) override { return target_.PurgeExpired(limit); }
  Result<uint64_t> CountRecords() override { return target_.CountRecords(); }
  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override {
    return target_.AppendAttempts(attempts);
  }
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override {
    return target_.QueryAttempts(filter);
  }
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& f) override {
    return target_.SummarizeAttempts(f);
  }
  Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) override {
    return target_.ChainHeads(tenant);
  }
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override {
    return target_.ReadChain(tenant, cursor, limit);
  }
  Result<size_t> PurgeAttempts(TimePoint before, size_t limit) override {
    return target_.PurgeAttempts(before, limit);
  }

 protected:
  Store& target_;
};

}  // namespace idem
