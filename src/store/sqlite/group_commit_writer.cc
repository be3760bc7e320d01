#include "group_commit_writer.h"

#include <algorithm>
#include <utility>

namespace idem::sqlite {

void GroupCommitWriter::FinishAll(const std::vector<WriteOp*>& batch) {
  // Sorted before any owner is woken: a woken owner returns and destroys
  // its op.
  waiting_ops_.clear();
  submitted_ops_.clear();
  for (WriteOp* op : batch) (op->submitted_ ? submitted_ops_ : waiting_ops_).push_back(op);
  TreeWaiter::FinishTree(waiting_ops_.size(),
                         [this](size_t i) -> TreeWaiter& { return waiting_ops_[i]->waiter_; });
  // After the wake-up above: Done may be a send to another process, and the
  // waiting owners go on meanwhile.
  for (WriteOp* op : submitted_ops_) FinishOne(*op);
}

void GroupCommitWriter::FinishOne(WriteOp& op) {
  if (!op.submitted_) {
    op.waiter_.Finish();
    return;
  }
  pending_.fetch_sub(1, std::memory_order_relaxed);
  op.Done();
}

GroupCommitWriter::GroupCommitWriter(std::unique_ptr<Connection> conn,
                                     std::unique_ptr<WriteLock> lock, size_t max_batch,
                                     CommitHook on_commit)
    : conn_(std::move(conn)),
      lock_(std::move(lock)),
      max_batch_(std::max<size_t>(max_batch, 1)),
      on_commit_(std::move(on_commit)),
      thread_([this] { Loop(); }) {}

GroupCommitWriter::~GroupCommitWriter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

bool GroupCommitWriter::Enqueue(WriteOp& op) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      op.Fail(Error{ErrorCode::kUnavailable,
                    "sqlite store " + conn_->path() + ": the store is closing; retry"});
      return false;
    }
    queue_.push_back(&op);
    pending_.fetch_add(1, std::memory_order_relaxed);
  }
  wake_.notify_one();
  return true;
}

void GroupCommitWriter::Execute(WriteOp& op) {
  if (!Enqueue(op)) return;
  op.waiter_.Await();
  pending_.fetch_sub(1, std::memory_order_relaxed);
}

void GroupCommitWriter::Submit(WriteOp& op) {
  op.submitted_ = true;
  if (!Enqueue(op)) op.Done();
}

bool GroupCommitWriter::AwaitWork() {
  std::unique_lock lock(mu_);
  wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
  return !queue_.empty();  // stopping, and everything queued is done, if empty
}

void GroupCommitWriter::TakeBatch(std::vector<WriteOp*>& batch) {
  std::lock_guard lock(mu_);
  const size_t n = std::min(queue_.size(), max_batch_);
  batch.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
}

void GroupCommitWriter::Loop() {
  std::vector<WriteOp*> batch;
  batch.reserve(max_batch_);
  // Only this thread takes writes off the queue, so the queue is not empty
  // between AwaitWork and TakeBatch, however long the write lock took.
  while (AwaitWork()) {
    if (lock_) {
      if (auto held = lock_->Acquire(); !held) {
        TakeBatch(batch);
        for (WriteOp* op : batch) op->Fail(held.error());
        FinishAll(batch);
        continue;
      }
    }
    TakeBatch(batch);
    RunBatch(batch);
    if (lock_) lock_->Release();
  }
}

void GroupCommitWriter::Rollback() {
  if (conn_->InTransaction()) (void)conn_->Exec("ROLLBACK", "rolling back a failed batch");
}

void GroupCommitWriter::RunBatch(std::vector<WriteOp*>& batch) {
  auto fail_all = [&](const Error& error) {
    for (WriteOp* op : batch) op->Fail(error);
    FinishAll(batch);
  };
  WriteContext ctx{*conn_, {}};
  // Each pass either commits the whole batch or drops the write whose
  // database failure spoiled the transaction and runs the others again.
  while (!batch.empty()) {
    ctx.changed.clear();
    if (auto begun = conn_->Exec("BEGIN IMMEDIATE", "starting a write transaction"); !begun) {
      Rollback();
      fail_all(begun.error());
      return;
    }
    auto failed = batch.end();
    Error error{};
    for (auto it = batch.begin(); it != batch.end(); ++it) {
      if (auto ran = (*it)->Run(ctx); !ran) {
        failed = it;
        error = std::move(ran.error());
        break;
      }
    }
    if (failed != batch.end()) {
      Rollback();
      WriteOp* dropped = *failed;
      batch.erase(failed);
      dropped->Fail(error);
      FinishOne(*dropped);
      continue;
    }
    if (auto committed = conn_->Exec("COMMIT", "committing a write transaction"); !committed) {
      Rollback();
      fail_all(committed.error());
      return;
    }
    commits_.fetch_add(1, std::memory_order_relaxed);
    writes_.fetch_add(batch.size(), std::memory_order_relaxed);
    if (on_commit_ && !ctx.changed.empty()) on_commit_(ctx.changed);
    FinishAll(batch);
    return;
  }
}

}  // namespace idem::sqlite
