#include "observe/instrumented_store.h"

namespace idem {
namespace {

constexpr std::array<std::string_view, InstrumentedStore::kOpCount> kOpNames{
    "claim",           "heartbeat",       "complete",           "release",
    "abandon",         "mark_unknown",    "take_over",          "get",
    "evict",           "wait_for_change", "purge_expired",      "count_records",
    "append_attempts", "query_attempts",  "summarize_attempts",
};

}  // namespace

InstrumentedStore::InstrumentedStore(Store& target, MetricsRegistry& registry)
    : target_(target),
      errors_(registry.AddCounter("idemgate_store_errors_total",
                                  "Store operations that returned an error, by operation and "
                                  "error code.",
                                  {"op", "code"})) {
  HistogramFamily& durations = registry.AddHistogram(
      "idemgate_store_operation_duration_seconds",
      "Duration of store operations in seconds, by operation (wait_for_change includes the "
      "time spent waiting for another owner).",
      {"op"}, StoreLatencyBuckets());
  for (size_t i = 0; i < kOpCount; ++i) durations_[i] = &durations.With({kOpNames[i]});
}

template <typename Fn>
auto InstrumentedStore::Measure(Op op, Fn&& fn) -> decltype(fn()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = fn();
  Observe(op, start, result ? nullptr : &result.error());
  return result;
}

void InstrumentedStore::Observe(Op op, std::chrono::steady_clock::time_point start,
                                const Error* error) {
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  durations_[op]->Observe(took.count());
  if (error != nullptr) errors_.With({kOpNames[op], ErrorCodeName(error->code)}).Inc();
}

Result<ClaimResult> InstrumentedStore::Claim(const ClaimRequest& req) {
  return Measure(kClaim, [&] { return target_.Claim(req); });
}
Result<TimePoint> InstrumentedStore::Heartbeat(const RecordId& id, uint64_t fence, Duration lease) {
  return Measure(kHeartbeat, [&] { return target_.Heartbeat(id, fence, lease); });
}
Result<Record> InstrumentedStore::Complete(const RecordId& id, uint64_t fence,
                                           const Outcome& outcome, Duration retention, const Attempt* logged) {
  return Measure(kComplete, [&] { return target_.Complete(id, fence, outcome, retention, logged); });
}
Result<void> InstrumentedStore::Release(const RecordId& id, uint64_t fence) {
  return Measure(kRelease, [&] { return target_.Release(id, fence); });
}
Result<void> InstrumentedStore::Abandon(const RecordId& id, std::string_view owner) {
  return Measure(kAbandon, [&] { return target_.Abandon(id, owner); });
}
Result<Record> InstrumentedStore::MarkUnknown(const RecordId& id, uint64_t fence,
                                              Duration retention) {
  return Measure(kMarkUnknown, [&] { return target_.MarkUnknown(id, fence, retention); });
}
Result<Record> InstrumentedStore::TakeOver(const RecordId& id, uint64_t fence, Duration lease) {
  return Measure(kTakeOver, [&] { return target_.TakeOver(id, fence, lease); });
}
Result<std::optional<Record>> InstrumentedStore::Get(const RecordId& id) {
  return Measure(kGet, [&] { return target_.Get(id); });
}
// `done`, after observing the time from now until it runs.
template <typename T>
std::function<void(Result<T>)> InstrumentedStore::Timed(Op op,
                                                        std::function<void(Result<T>)> done) {
  return [this, op, start = std::chrono::steady_clock::now(), done = std::move(done)](Result<T> r) {
    Observe(op, start, r ? nullptr : &r.error());
    done(std::move(r));
  };
}
bool InstrumentedStore::GetAsync(const RecordId& id, GetDone done) {
  return target_.GetAsync(id, Timed(kGet, std::move(done)));
}
bool InstrumentedStore::ClaimAsync(const ClaimRequest& req, ClaimDone done) {
  return target_.ClaimAsync(req, Timed(kClaim, std::move(done)));
}
bool InstrumentedStore::CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                      Duration retention, CompleteDone done, const Attempt* logged) {
  return target_.CompleteAsync(id, fence, outcome, retention, Timed(kComplete, std::move(done)),
                               logged);
}
Result<std::optional<TimePoint>> InstrumentedStore::ReadServerClock() {
  return target_.ReadServerClock();  // not timed: a clock read, not a store operation
}
Result<bool> InstrumentedStore::Evict(const RecordId& id) {
  return Measure(kEvict, [&] { return target_.Evict(id); });
}
bool InstrumentedStore::WatchEvictions(EvictionFeed on_change) {
  return target_.WatchEvictions(std::move(on_change));
}
Result<void> InstrumentedStore::WaitForChange(const RecordId& id, const Record& seen,
                                              TimePoint deadline) {
  return Measure(kWaitForChange, [&] { return target_.WaitForChange(id, seen, deadline); });
}
Result<size_t> InstrumentedStore::PurgeExpired(size_t limit) {
  return Measure(kPurgeExpired, [&] { return target_.PurgeExpired(limit); });
}
Result<uint64_t> InstrumentedStore::CountRecords() {
  return Measure(kCountRecords, [&] { return target_.CountRecords(); });
}
Result<void> InstrumentedStore::AppendAttempts(const std::vector<Attempt>& attempts) {
  return Measure(kAppendAttempts, [&] { return target_.AppendAttempts(attempts); });
}
Result<std::vector<Attempt>> InstrumentedStore::QueryAttempts(const AttemptFilter& filter) {
  return Measure(kQueryAttempts, [&] { return target_.QueryAttempts(filter); });
}
Result<std::map<std::string, ToolStats>> InstrumentedStore::SummarizeAttempts(
    const AttemptFilter& filter) {
  return Measure(kSummarizeAttempts, [&] { return target_.SummarizeAttempts(filter); });
}

}  // namespace idem
