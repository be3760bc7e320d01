// A Store decorator that measures every operation of the store it wraps
// (docs/DESIGN.md §7), so no backend knows about metrics:
//
//   idemgate_store_operation_duration_seconds{op}  histogram
//   idemgate_store_errors_total{op,code}           counter, code = ErrorCodeName
//
// op is the Store method in snake_case (claim, heartbeat, complete, release,
// abandon, mark_unknown, take_over, get, evict, wait_for_change, purge_expired,
// count_records, append_attempts, query_attempts, summarize_attempts).
// wait_for_change blocks by design (up to a call's wait), so its duration is
// how long callers waited, not how slow the store is. aborted,
// failed_precondition and not_found include the ordinary outcomes of racing
// claims, not only faults.
//
// Durations are measured with std::chrono::steady_clock, not the injected
// Clock: they are latencies of real I/O, and a FakeClock would report zero.
//
// Thread-safe as the wrapped store is. `target` and `registry` must outlive it.
#pragma once

#include <array>
#include <chrono>

#include "observe/metrics.h"
#include "idem/store.h"

namespace idem {

class InstrumentedStore final : public Store {
 public:
  InstrumentedStore(Store& target, MetricsRegistry& registry);

  // Store:
  Result<ClaimResult> Claim(const ClaimRequest& req) override;
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override;
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override;
  Result<void> Release(const RecordId& id, uint64_t fence) override;
  Result<void> Abandon(const RecordId& id, std::string_view owner) override;
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override;
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override;
  Result<std::optional<Record>> Get(const RecordId& id) override;
  bool GetAsync(const RecordId& id, GetDone done) override;  // timed as "get"
  std::optional<Record> Held(const RecordId& id) override { return target_.Held(id); }
  bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override;  // timed as "claim"
  bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome, Duration retention,
                     CompleteDone done, const Attempt* logged = nullptr) override;  // timed as "complete"
  Result<std::optional<TimePoint>> ReadServerClock() override;  // not timed
  bool LogsWithRecords() const override { return target_.LogsWithRecords(); }
  bool ReadsBeforeClaim() const override { return target_.ReadsBeforeClaim(); }
  Result<bool> Evict(const RecordId& id) override;
  bool WatchEvictions(EvictionFeed on_change) override;  // not timed
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override;
  Result<size_t> PurgeExpired(size_t limit) override;
  Result<uint64_t> CountRecords() override;
  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override;
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override;
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter) override;
  // Operator calls (idemgate audit --verify, purge), not measured.
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

  enum Op {
    kClaim,
    kHeartbeat,
    kComplete,
    kRelease,
    kAbandon,
    kMarkUnknown,
    kTakeOver,
    kGet,
    kEvict,
    kWaitForChange,
    kPurgeExpired,
    kCountRecords,
    kAppendAttempts,
    kQueryAttempts,
    kSummarizeAttempts,
    kOpCount,
  };

 private:
  // Runs `fn` (the wrapped call), records its duration and any error.
  template <typename Fn>
  auto Measure(Op op, Fn&& fn) -> decltype(fn());
  // Records an operation that began at `start` and ended now.
  void Observe(Op op, std::chrono::steady_clock::time_point start, const Error* error);
  template <typename T>
  std::function<void(Result<T>)> Timed(Op op, std::function<void(Result<T>)> done);

  Store& target_;
  CounterFamily& errors_;
  std::array<Histogram*, kOpCount> durations_;
};

}  // namespace idem
