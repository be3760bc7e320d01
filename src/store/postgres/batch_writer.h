// Shared commits for the PostgreSQL store (docs/DESIGN.md §5): concurrent
// claims and completions run as one transaction, so that they pay for one
// commit (one WAL flush, one round of transaction overhead) between them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "connection_pool.h"
#include "core/tree_waiter.h"
#include "idem/error.h"
#include "idem/record.h"
#include "pg_connection.h"

namespace idem::postgres {

// What a write sees of the batch it runs in.
struct BatchContext {
  Connection& conn;
  // Whether the write appends its audit entry in its own statement (true),
  // or adds it to `log` (false), which the batch appends in one statement
  // right before COMMIT: the tenants' chain heads are then locked only for
  // that statement and the commit (docs/DESIGN.md §7), so that the next
  // batch can run its record statements meanwhile. Either way the entry
  // commits with its record or not at all.
  bool log_inline = false;
  std::vector<Attempt> log;

  // Adds `logged` (may be null) to `log` unless the write logs inline.
  void Defer(const Attempt* logged) {
    if (!log_inline && logged != nullptr) log.push_back(*logged);
  }
};

// One queued write. The submitting thread owns it (on its stack) and blocks
// in BatchWriter::Execute until the batch holding it committed or failed.
class BatchOp {
 public:
  // `first` (with the write's own audit entry, and without): the statement
  // the write runs first, which the batch sends together with the others'
  // (Connection::Prefetch); null statements if there is none.
  BatchOp(const RecordId& id, Call first_logged, Call first_unlogged)
      : id_(id), first_{first_logged, first_unlogged} {}
  virtual ~BatchOp() = default;

  // Runs the write's statements inside the batch's open transaction and
  // keeps its answer, which may be an error value (kAborted for a stale
  // fence: the write's own answer; the batch goes on). Returns the error of
  // a statement that failed on the server (conn.last_failure() says how):
  // the transaction is then aborted, and the writer decides the answer. May
  // run more than once (the batch's transaction is run again after another
  // write's failure); each run replaces the answer.
  virtual Result<void> Run(BatchContext& ctx) = 0;
  // Replaces the kept answer with `error`: the write did not commit.
  virtual void Fail(const Error& error) = 0;

  const RecordId& id() const { return id_; }
  const Call& first(bool log_inline) const { return first_[log_inline ? 0 : 1]; }

 private:
  friend class BatchWriter;
  const RecordId& id_;
  const Call first_[2];
  TreeWaiter waiter_;  // its owner's, in Execute
};

// A BatchOp running `fn(ctx) -> Result<T>`, for BatchWriter::Run.
template <typename T, typename Fn>
class FnOp final : public BatchOp {
 public:
  FnOp(const RecordId& id, Call first_logged, Call first_unlogged, Fn& fn)
      : BatchOp(id, first_logged, first_unlogged), fn_(fn) {}
  Result<void> Run(BatchContext& ctx) override {
    result.emplace(fn_(ctx));
    if (ctx.conn.last_failure() == Failure::kNone) return {};
    if (!*result) return std::unexpected(result->error());
    return std::unexpected(Error{ErrorCode::kInternal, "postgres store: a statement failed"});
  }
  void Fail(const Error& error) override { result.emplace(std::unexpected(error)); }

  std::optional<Result<T>> result;

 private:
  Fn& fn_;
};

// Runs queued writes in shared transactions: `writers` threads each take up
// to `max_batch` queued writes (all there are, never waiting for more, so a
// lone write is not delayed) and run them as BEGIN; write; …; COMMIT on one
// pooled connection, BEGIN and every write's first statement sent together
// (one round trip), then the audit entries and COMMIT together, in (tenant, key) order so that two batches lock records
// in the same order, with their audit entries appended in one statement
// before COMMIT (BatchContext::log). A write's caller returns only after its transaction
// committed (durable, as the server's synchronous_commit promises) or
// failed. One write's failure never fails the others:
//  - a statement that fails on the server (bad text, a constraint): the
//    transaction is rolled back, that write gets the error, the others run
//    again in a new transaction — nothing is half-applied;
//  - an audit entry the server refuses: the batch runs again with each
//    write appending its own entry, which finds the write to fail;
//  - a deadlock or serialization failure: the whole batch runs again, up to
//    four times, then every write gets the (retryable) error;
//  - a lost connection before COMMIT (nothing was committed): the batch runs
//    again once on a fresh connection; a lost connection during COMMIT, or a
//    server that cannot be reached: every write gets kUnavailable.
// Thread-safe; the destructor finishes the queued writes and stops the
// threads. `pool` must outlive the writer.
class BatchWriter {
 public:
  BatchWriter(ConnectionPool& pool, size_t max_batch, size_t writers);
  ~BatchWriter();
  BatchWriter(const BatchWriter&) = delete;
  BatchWriter& operator=(const BatchWriter&) = delete;

  // Runs fn(BatchContext&) -> Result<T> for record `id` in the next batch
  // and returns its answer once that batch committed, or the error that
  // failed it. fn's first statement is `first_logged` if it logs inline,
  // else `first_unlogged` (see BatchOp).
  template <typename T, typename Fn>
  Result<T> Run(const RecordId& id, Call first_logged, Call first_unlogged, Fn fn) {
    FnOp<T, Fn> op(id, first_logged, first_unlogged, fn);
    Execute(op);
    return std::move(*op.result);
  }

  // Queues `op` and blocks until its batch committed or failed; the answer
  // is in `op`. After shutdown began, fails `op` with kUnavailable.
  void Execute(BatchOp& op);

  // Transactions committed so far, and the writes they held.
  uint64_t commits() const { return commits_.load(std::memory_order_relaxed); }
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  // Writes waiting for a writer to take them into a batch.
  size_t queued();

 private:
  // How one pass of a batch's transaction ended.
  enum class Pass { kCommitted, kOneFailed, kLogFailed, kTransient, kConnectionLost, kFailed };

  void Loop();
  // Rolls back the open transaction unless the connection is gone.
  static void Rollback(Connection& conn);
  // The pass's answer when `failure` ended it before anything could commit.
  static Pass Abandoned(Connection& conn, Failure failure);
  // Appends ctx.log and commits: the end of a pass.
  static Pass Commit(BatchContext& ctx, Error* error);
  void RunBatch(std::vector<BatchOp*>& batch);
  // Runs `batch` once in a transaction on `conn`. kOneFailed: *culprit is
  // the write whose statement failed. kLogFailed: the statement appending
  // the deferred audit entries failed.
  Pass RunPass(Connection& conn, bool log_inline, const std::vector<BatchOp*>& batch,
               std::vector<BatchOp*>::const_iterator* culprit, Error* error);
  // Releases the owners of every write in `batch` (a binary tree of wake-ups:
  // the writer wakes one, each woken owner two more).
  static void FinishAll(const std::vector<BatchOp*>& batch);
  static void FailAll(const std::vector<BatchOp*>& batch, const Error& error);

  ConnectionPool& pool_;
  const size_t max_batch_;

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<BatchOp*> queue_;
  bool stopping_ = false;

  std::atomic<uint64_t> commits_{0};
  std::atomic<uint64_t> writes_{0};
  std::vector<std::thread> threads_;  // last: started once the rest is ready
};

}  // namespace idem::postgres
