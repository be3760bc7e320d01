#include "core/attempt_log.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace idem {

AttemptLog::AttemptLog(Store& store, size_t batch, Duration interval, size_t max_backlog)
    : store_(store),
      batch_(batch),
      interval_(interval),
      max_backlog_(std::max<size_t>(max_backlog, 1)),
      thread_([this] { Loop(); }) {}

AttemptLog::~AttemptLog() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  Flush();
}

void AttemptLog::Append(Attempt attempt) {
  bool full;
  {
    std::lock_guard g(mu_);
    if (buffer_.size() >= max_backlog_) {
      ++dropped_;
      ++drops_.backlog;
      return;  // the flusher is already busy with the store
    }
    buffer_.push_back(std::move(attempt));
    full = buffer_.size() >= batch_;
  }
  if (full) cv_.notify_all();
}

void AttemptLog::Flush() {
  std::lock_guard w(write_mu_);
  std::vector<Attempt> batch;
  size_t dropped;
  {
    std::lock_guard g(mu_);
    batch.swap(buffer_);
    dropped = std::exchange(dropped_, 0);
  }
  if (dropped > 0) {
    std::fprintf(stderr,
                 "idemgate: audit log: dropped %zu attempts: %zu were already waiting for a store "
                 "that writes more slowly than calls arrive ([limits] max_audit_backlog)\n",
                 dropped, max_backlog_);
  }
  if (batch.empty()) return;
  if (auto ok = store_.AppendAttempts(batch); !ok) {
    // The audit log must never fail a call; say so where an operator looks.
    {
      std::lock_guard g(mu_);
      drops_.refused += batch.size();
    }
    std::fprintf(stderr, "idemgate: audit log: dropped %zu attempts: %s\n", batch.size(),
                 ok.error().ToString().c_str());
  }
}

AuditDrops AttemptLog::drops() const {
  std::lock_guard g(mu_);
  return drops_;
}

void AttemptLog::Loop() {
  std::unique_lock g(mu_);
  while (!stop_) {
    cv_.wait_for(g, interval_, [&] { return stop_ || buffer_.size() >= batch_; });
    if (buffer_.empty()) continue;
    g.unlock();
    Flush();
    g.lock();
  }
}

}  // namespace idem
