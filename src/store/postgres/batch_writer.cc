#include "batch_writer.h"

#include <algorithm>
#include <tuple>

#include "attempt_rows.h"

namespace idem::postgres {
namespace {

// Passes of one batch after deadlocks or serialization failures (as
// PostgresStore runs a single statement again).
constexpr int kMaxTransientPasses = 4;

// Transaction control as prepared statements, so that they travel in one
// pipeline with the writes (the extended protocol accepts them).
const Statement kBegin{"idem_batch_begin", "BEGIN"};
const Statement kCommit{"idem_batch_commit", "COMMIT"};
const Params kNoParams;

bool InKeyOrder(const BatchOp* a, const BatchOp* b) {
  return std::tie(a->id().tenant, a->id().key) < std::tie(b->id().tenant, b->id().key);
}

}  // namespace

void BatchWriter::FinishAll(const std::vector<BatchOp*>& batch) {
  TreeWaiter::FinishTree(batch.size(),
                         [&batch](size_t i) -> TreeWaiter& { return batch[i]->waiter_; });
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
  op.waiter_.Await();
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
    (*conn)->DropPrefetched();
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
        failed->waiter_.Finish();
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

BatchWriter::Pass BatchWriter::Abandoned(Connection& conn, Failure failure) {
  Rollback(conn);
  if (failure == Failure::kConnectionLost) return Pass::kConnectionLost;
  return failure == Failure::kTransient ? Pass::kTransient : Pass::kFailed;
}

BatchWriter::Pass BatchWriter::RunPass(Connection& conn, bool log_inline,
                                       const std::vector<BatchOp*>& batch,
                                       std::vector<BatchOp*>::const_iterator* culprit,
                                       Error* error) {
  std::vector<Call> calls{{&kBegin, &kNoParams}};
  std::vector<size_t> op_of_call{batch.size()};  // BEGIN is no write's
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->first(log_inline).statement == nullptr) continue;
    calls.push_back(batch[i]->first(log_inline));
    op_of_call.push_back(i);
  }
  auto sent = conn.Prefetch(calls, "sending a batch of writes");
  if (!sent) {
    *error = std::move(sent.error());
    return Abandoned(conn, conn.last_failure());
  }
  if (auto begun = conn.Execute(kBegin, kNoParams, "starting a batch of writes"); !begun) {
    *error = std::move(begun.error());
    return Abandoned(conn, conn.last_failure());
  }
  BatchContext ctx{conn, log_inline, {}};
  // A first statement that failed aborted the transaction: the writes before
  // it must not run their next statements in it; that write is the culprit.
  auto from = batch.cbegin();
  if (*sent) from += static_cast<std::ptrdiff_t>(op_of_call[**sent]);
  for (auto it = from; it != batch.cend(); ++it) {
    auto ran = (*it)->Run(ctx);
    if (ran) continue;
    *culprit = it;
    *error = std::move(ran.error());
    const Failure failure = conn.last_failure();
    if (failure != Failure::kOther) return Abandoned(conn, failure);
    Rollback(conn);
    return Pass::kOneFailed;
  }
  return Commit(ctx, error);
}

BatchWriter::Pass BatchWriter::Commit(BatchContext& ctx, Error* error) {
  Connection& conn = ctx.conn;
  Params log;
  if (!ctx.log.empty()) {
    if (auto bound = BindAttempts(log, ctx.log, conn.where()); !bound) {
      *error = std::move(bound.error());
      Rollback(conn);
      return Pass::kLogFailed;
    }
  }
  std::vector<Call> calls;
  if (!ctx.log.empty()) calls.push_back({&kInsertAttempts, &log});
  calls.push_back({&kCommit, &kNoParams});
  // COMMIT may have reached the server before the connection broke: the
  // outcome is unknown, so the batch is not run again.
  if (auto sent = conn.Prefetch(calls, "committing a batch of writes"); !sent) {
    *error = std::move(sent.error());
    return Pass::kFailed;
  }
  if (!ctx.log.empty()) {
    if (auto logged = conn.Execute(kInsertAttempts, log, "appending a batch's audit entries");
        !logged) {
      *error = std::move(logged.error());
      const Failure failure = conn.last_failure();
      if (failure == Failure::kOther) {
        Rollback(conn);
        return Pass::kLogFailed;
      }
      return Abandoned(conn, failure);
    }
  }
  if (auto committed = conn.Execute(kCommit, kNoParams, "committing a batch of writes");
      !committed) {
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
