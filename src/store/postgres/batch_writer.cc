#include "batch_writer.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "attempt_rows.h"

namespace idem::postgres {
namespace {

// Passes of one batch after deadlocks or serialization failures (as
// PostgresStore runs a single statement again).
constexpr int kMaxTransientPasses = 4;

bool InKeyOrder(const BatchOp* a, const BatchOp* b) {
  return std::tie(a->id().tenant, a->id().key) < std::tie(b->id().tenant, b->id().key);
}

}  // namespace

// A bare futex rather than std::atomic::wait: libstdc++'s wait spins with
// sched_yield first, which with many callers steals the CPU from the writer.
void BatchOp::Finish() {
  done_.store(1, std::memory_order_release);
  // The owner may already have returned and destroyed this op: FUTEX_WAKE
  // only hashes the address and never touches the memory.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

void BatchOp::Await() {
  while (done_.load(std::memory_order_acquire) == 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done_), FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr,
            0);
  }
  for (BatchOp* op : wakes_) {
    if (op != nullptr) op->Finish();
  }
}

void BatchWriter::FinishAll(const std::vector<BatchOp*>& batch) {
  if (batch.empty()) return;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->wakes_[0] = 2 * i + 1 < batch.size() ? batch[2 * i + 1] : nullptr;
    batch[i]->wakes_[1] = 2 * i + 2 < batch.size() ? batch[2 * i + 2] : nullptr;
  }
  batch[0]->Finish();
}

void BatchWriter::FailAll(const std::vector<BatchOp*>& batch, const Error& error) {
  for (BatchOp* op : batch) op->Fail(error);
  FinishAll(batch);
}

BatchWriter::BatchWriter(ConnectionPool& pool, size_t max_batch, size_t writers)
    : pool_(pool), max_batch_(std::max<size_t>(max_batch, 1)) {
  for (size_t i = 0; i < std::max<size_t>(writers, 1); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

BatchWriter::~BatchWriter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void BatchWriter::Execute(BatchOp& op) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      op.Fail(Error{ErrorCode::kUnavailable, "postgres store: the store is closing; retry"});
      return;
    }
    queue_.push_back(&op);
  }
  wake_.notify_one();
  op.Await();
}

size_t BatchWriter::queued() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void BatchWriter::Loop() {
  std::vector<BatchOp*> batch;
  batch.reserve(max_batch_);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      const size_t n = std::min(queue_.size(), max_batch_);
      batch.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    RunBatch(batch);
  }
}

void BatchWriter::RunBatch(std::vector<BatchOp*>& batch) {
  std::stable_sort(batch.begin(), batch.end(), InKeyOrder);
  int transient_passes = 0;
  bool reconnected = false;
  bool log_inline = false;
  while (!batch.empty()) {
    auto conn = pool_.Acquire();
    if (!conn) return FailAll(batch, conn.error());
    auto culprit = batch.cend();
    Error error{};
    const Pass pass = RunPass(**conn, log_inline, batch, &culprit, &error);
    if ((*conn)->last_failure() == Failure::kConnectionLost) conn->Discard();
    switch (pass) {
      case Pass::kCommitted:
        commits_.fetch_add(1, std::memory_order_relaxed);
        writes_.fetch_add(batch.size(), std::memory_order_relaxed);
        return FinishAll(batch);
      case Pass::kOneFailed: {
        BatchOp* failed = *culprit;
        batch.erase(culprit);
        failed->Fail(error);
        failed->Finish();
        continue;
      }
      case Pass::kLogFailed:
        if (log_inline) return FailAll(batch, error);  // cannot happen: nothing was deferred
        log_inline = true;
        continue;
      case Pass::kTransient:
        if (++transient_passes < kMaxTransientPasses) continue;
        return FailAll(batch, error);
      case Pass::kConnectionLost:
        conn->Discard();
        if (!reconnected) {
          reconnected = true;
          continue;
        }
        return FailAll(batch, error);
      case Pass::kFailed:
        return FailAll(batch, error);
    }
  }
}

void BatchWriter::Rollback(Connection& conn) {
  if (conn.last_failure() == Failure::kConnectionLost) return;
  (void)conn.ExecuteScript("ROLLBACK", "rolling back a batch of writes");
}

BatchWriter::Pass BatchWriter::RunPass(Connection& conn, bool log_inline,
                                       const std::vector<BatchOp*>& batch,
                                       std::vector<BatchOp*>::const_iterator* culprit,
                                       Error* error) {
  if (auto begun = conn.ExecuteScript("BEGIN", "starting a batch of writes"); !begun) {
    *error = std::move(begun.error());
    const Failure failure = conn.last_failure();
    Rollback(conn);
    if (failure == Failure::kConnectionLost) return Pass::kConnectionLost;
    return failure == Failure::kTransient ? Pass::kTransient : Pass::kFailed;
  }
  BatchContext ctx{conn, log_inline, {}};
  for (auto it = batch.cbegin(); it != batch.cend(); ++it) {
    auto ran = (*it)->Run(ctx);
    if (ran) continue;
    *culprit = it;
    *error = std::move(ran.error());
    const Failure failure = conn.last_failure();
    Rollback(conn);
    if (failure == Failure::kOther) return Pass::kOneFailed;
    // Nothing was committed: the whole batch may run again.
    return failure == Failure::kTransient ? Pass::kTransient : Pass::kConnectionLost;
  }
  if (!ctx.log.empty()) {
    if (auto logged = InsertAttempts(conn, ctx.log); !logged) {
      *error = std::move(logged.error());
      const Failure failure = conn.last_failure();
      Rollback(conn);
      if (failure == Failure::kOther || failure == Failure::kNone) return Pass::kLogFailed;
      return failure == Failure::kTransient ? Pass::kTransient : Pass::kConnectionLost;
    }
  }
  if (auto committed = conn.ExecuteScript("COMMIT", "committing a batch of writes"); !committed) {
    *error = std::move(committed.error());
    // A serialization failure at COMMIT rolled everything back: run again. A
    // connection lost during COMMIT leaves the outcome unknown: never again.
    const Failure failure = conn.last_failure();
    Rollback(conn);
    return failure == Failure::kTransient ? Pass::kTransient : Pass::kFailed;
  }
  return Pass::kCommitted;
}

}  // namespace idem::postgres
