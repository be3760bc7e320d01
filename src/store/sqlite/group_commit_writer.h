// Group commit: the writes of a SqliteStore, one transaction at a time, run
// by its writer thread or by a lone caller. Concurrent writes queue up while
// the previous transaction is being made durable and then share the next
// transaction and its fsync.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tree_waiter.h"
#include "idem/error.h"
#include "idem/record.h"
#include "sqlite_connection.h"
#include "write_lock.h"

namespace idem::sqlite {

// What a write sees while it runs inside the batch's transaction.
struct WriteContext {
  Connection& conn;
  // Records whose rows the batch changed; their waiters are woken after COMMIT.
  std::vector<RecordId> changed;
  // The audit chain heads the transaction has moved, by tenant: read from
  // the table at a tenant's first entry, moved in memory by each next one,
  // and written back once, before COMMIT (the writer's BeforeCommit), rather
  // than read and rewritten for every entry.
  std::map<std::string, ChainHead> heads;
};

// One queued write. Through Execute, the submitting thread owns it
// (typically on its stack) and blocks until the writer has committed or
// failed the batch that holds it. The writer wakes only the first write of a
// batch; each woken owner wakes two more (a binary tree), so releasing a
// batch costs the writer one wake-up, not one per write. Through Submit,
// nobody waits: the writer calls Done() instead.
class WriteOp {
 public:
  virtual ~WriteOp() = default;

  // Runs the write inside the open transaction and keeps its result (which
  // may be an error such as kAborted: that is the write's answer, and the
  // batch goes on). Returns an error only for a failure of the database
  // itself (IsStorageFailure); the writer then rolls the transaction back,
  // fails this op with that error and runs the rest of the batch again.
  virtual Result<void> Run(WriteContext& ctx) = 0;

  // Replaces the kept result with `error`: the write did not commit.
  virtual void Fail(const Error& error) = 0;

  // A write queued with Submit: called once its batch committed or failed,
  // on the thread that ran the batch (the writer's, or that of a caller of
  // Execute; Submit's own, if the writer is stopping),
  // after every owner of the batch waiting in Execute was released. The
  // writer does not touch the op afterwards: Done may delete it. Must not
  // block for long: the next batch waits for it.
  virtual void Done() {}

 private:
  friend class GroupCommitWriter;
  bool submitted_ = false;  // queued with Submit: Done, not its waiter
  TreeWaiter waiter_;       // its owner's, in Execute
};

// Owns the write connection and a thread that drains the queue: up to
// max_batch writes per BEGIN IMMEDIATE … COMMIT, one batch (a turn) at a
// time, run by that thread or by a caller of Execute that found no turn
// running. A write's caller returns
// only after its transaction committed, so a write is durable (as the
// connection's synchronous setting promises) before it is acknowledged. If
// BEGIN or COMMIT fails, every write of the batch gets the error. With a
// WriteLock, the turn's thread holds it from before BEGIN until after COMMIT
// (or ROLLBACK), and takes the batch only once it holds it, so the writes that
// queued while it waited for another writer share the next transaction.
// Thread-safe; the destructor finishes the queued writes and stops the thread.
class GroupCommitWriter {
 public:
  using CommitHook = std::function<void(const std::vector<RecordId>& changed)>;
  // The batch's last statements, inside its transaction (writing back
  // WriteContext::heads). An error fails the whole batch, rolled back.
  using BeforeCommit = std::function<Result<void>(WriteContext& ctx)>;

  // `on_commit` runs on the turn's thread after each successful COMMIT,
  // before the batch's callers are released. `lock`, if not null, is taken
  // around every transaction.
  GroupCommitWriter(std::unique_ptr<Connection> conn, std::unique_ptr<WriteLock> lock,
                    size_t max_batch, BeforeCommit before_commit, CommitHook on_commit);
  ~GroupCommitWriter();
  GroupCommitWriter(const GroupCommitWriter&) = delete;
  GroupCommitWriter& operator=(const GroupCommitWriter&) = delete;

  // Queues `op` and blocks until its batch committed or failed; the outcome
  // is in `op`. After shutdown began, fails `op` with kUnavailable. When no
  // batch is being run, the calling thread runs the next one itself (with
  // `op` and whatever else is queued) rather than wake the writer's thread
  // and wait to be woken back: a lone caller's write costs no thread
  // hand-off. What queues meanwhile it leaves to the writer's thread.
  void Execute(WriteOp& op);
  // Queues `op` and returns; op.Done() runs once its batch committed or
  // failed (failed with kUnavailable at once after shutdown began). `op`
  // must live until then. For a caller with nothing to do until then but
  // hand the result on, this saves the wake-up of a waiting thread.
  void Submit(WriteOp& op);

  // Transactions committed so far.
  uint64_t commits() const { return commits_.load(std::memory_order_relaxed); }
  // Writes committed so far (each commit holds one or more).
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  // Writes submitted whose callers have not returned yet: the queue depth
  // plus the batch in flight.
  uint64_t pending() const { return pending_.load(std::memory_order_relaxed); }
  // Times the writer found the write lock taken and slept (0 without one).
  uint64_t lock_waits() const { return lock_ ? lock_->waits() : 0; }

 private:
  void Loop();
  // Blocks until a write is queued and no turn is being run, and takes the
  // turn; false once stopping and none is queued.
  bool AwaitWork();
  // One turn, by the thread that holds it (running_): takes the write lock,
  // then up to max_batch_ queued writes, and runs them as one transaction.
  // Only the turn's holder takes writes off the queue, so the queue is not
  // empty when it takes them, however long the write lock took.
  void RunTurn();
  // Gives the turn up; with `hand_on`, wakes the writer's thread for what
  // queued meanwhile.
  void EndTurn(bool hand_on);
  // Moves up to max_batch_ queued writes into `batch`.
  void TakeBatch(std::vector<WriteOp*>& batch);
  void RunBatch(std::vector<WriteOp*>& batch);
  void Rollback();
  // Releases the owners of every write in `batch`: wakes those waiting in
  // Execute, then runs Done() of the submitted ones.
  void FinishAll(const std::vector<WriteOp*>& batch);
  // Releases one write's owner.
  void FinishOne(WriteOp& op);
  enum class Queued { kRefused, kQueued, kRunIt };
  // Queues `op` for the next batch. kRefused (and `op` failed) once the
  // writer is stopping; kRunIt if `may_run` and no turn is being run: the
  // caller now holds the turn and must run it.
  Queued Enqueue(WriteOp& op, bool may_run);

  std::unique_ptr<Connection> conn_;
  std::unique_ptr<WriteLock> lock_;  // null: SQLite's own lock only
  const size_t max_batch_;
  BeforeCommit before_commit_;
  CommitHook on_commit_;

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<WriteOp*> queue_;
  bool stopping_ = false;
  // A thread runs a turn (the writer's, or a caller of Execute): the
  // connection, the lock and the vectors below are its own until it ends.
  bool running_ = false;

  std::atomic<uint64_t> commits_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> pending_{0};
  // The turn's batch and FinishAll's lists, reused (the turn's holder only).
  std::vector<WriteOp*> batch_;
  std::vector<WriteOp*> waiting_ops_;
  std::vector<WriteOp*> submitted_ops_;
  std::thread thread_;
};

}  // namespace idem::sqlite
