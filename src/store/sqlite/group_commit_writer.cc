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
                                     BeforeCommit before_commit, CommitHook on_commit)
    : conn_(std::move(conn)),
      lock_(std::move(lock)),
      max_batch_(std::max<size_t>(max_batch, 1)),
      before_commit_(std::move(before_commit)),
      on_commit_(std::move(on_commit)),
      thread_([this] { Loop(); }) {
  batch_.reserve(max_batch_);
}

GroupCommitWriter::~GroupCommitWriter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

GroupCommitWriter::Queued GroupCommitWriter::Enqueue(WriteOp& op, bool may_run) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      op.Fail(Error{ErrorCode::kUnavailable,
                    "sqlite store " + conn_->path() + ": the store is closing; retry"});
      return Queued::kRefused;
    }
    queue_.push_back(&op);
    pending_.fetch_add(1, std::memory_order_relaxed);
    if (!running_) {
      if (may_run) {
        running_ = true;
        return Queued::kRunIt;
      }
      wake = true;
    }
    // Otherwise whoever runs the turn now takes it next, or hands it on.
  }
  if (wake) wake_.notify_one();
  return Queued::kQueued;
}

void GroupCommitWriter::Execute(WriteOp& op) {
  switch (Enqueue(op, /*may_run=*/true)) {
    case Queued::kRefused:
      return;
    case Queued::kRunIt:
      RunTurn();
      EndTurn(/*hand_on=*/true);
      break;
    case Queued::kQueued:
      break;
  }
  op.waiter_.Await();
  pending_.fetch_sub(1, std::memory_order_relaxed);
}

void GroupCommitWriter::Submit(WriteOp& op) {
  op.submitted_ = true;
  if (Enqueue(op, /*may_run=*/false) == Queued::kRefused) op.Done();
}

bool GroupCommitWriter::AwaitWork() {
  std::unique_lock lock(mu_);
  wake_.wait(lock, [this] { return !running_ && (stopping_ || !queue_.empty()); });
  if (queue_.empty()) return false;  // stopping, and everything queued is done
  running_ = true;
  return true;
}

void GroupCommitWriter::EndTurn(bool hand_on) {
  {
    std::lock_guard lock(mu_);
    running_ = false;
    hand_on = hand_on && (stopping_ || !queue_.empty());
  }
  if (hand_on) wake_.notify_one();
}

void GroupCommitWriter::RunTurn() {
  if (lock_) {
    if (auto held = lock_->Acquire(); !held) {
      TakeBatch(batch_);
      for (WriteOp* op : batch_) op->Fail(held.error());
      FinishAll(batch_);
      return;
    }
  }
  TakeBatch(batch_);
  RunBatch(batch_);
  if (lock_) lock_->Release();
}

void GroupCommitWriter::TakeBatch(std::vector<WriteOp*>& batch) {
  std::lock_guard lock(mu_);
  const size_t n = std::min(queue_.size(), max_batch_);
  batch.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
}

void GroupCommitWriter::Loop() {
  while (AwaitWork()) {
    RunTurn();
    EndTurn(/*hand_on=*/false);  // this thread looks at the queue next
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
    ctx.heads.clear();
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
    if (before_commit_) {
      if (auto ended = before_commit_(ctx); !ended) {
        Rollback();
        fail_all(ended.error());
        return;
      }
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
