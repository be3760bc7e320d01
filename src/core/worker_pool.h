// Threads for work that may block: a gated call waits in Ledger::Begin (up
// to policy.wait) and then for the upstream's answer, which must never happen
// on a channel's reader thread or an HTTP listener's I/O thread. Shared by
// the fronts (MCP, the HTTP proxy, the ledger API).
//
// The pool grows on demand, one thread per task that finds no idle thread, up
// to max_threads ([limits] max_worker_threads); past it tasks queue until a
// thread is free. A thread idle for idle_timeout exits ([limits]
// worker_idle_timeout), so a burst (concurrent /readyz probes while the store
// is slow, security review F16) does not leave its threads behind for the life
// of the process. The caller bounds the number of concurrent tasks (CallBudget
// in mcp_session.h; the HTTP fronts by max_connections, one request at a time
// per connection). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace idem {

class WorkerPool {
 public:
  struct Options {
    // Most threads at once; at least 1. Default 256.
    size_t max_threads = 256;
    // An idle thread exits after this. Default 60 s.
    std::chrono::milliseconds idle_timeout{60'000};
    // Starts a thread running its argument (tests: one that fails like
    // std::thread does at TasksMax). Unset: std::thread.
    std::function<std::thread(std::function<void()>)> spawn;
  };

  // With DefaultOptions().
  WorkerPool();
  explicit WorkerPool(Options options);
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // What pools made without options get: [limits] max_worker_threads and
  // worker_idle_timeout. Set once by a command before it makes any pool.
  static void SetDefaultOptions(Options options);
  static Options DefaultOptions();

  // Runs `task` on a pool thread, soon, or once a thread is free when
  // max_threads are busy. False (task dropped) after Shutdown, or when no
  // thread runs and a new one cannot be started (std::system_error: the
  // process is out of threads); a front answers that like a stopping one.
  bool Submit(std::function<void()> task);
  // Runs every task already submitted to completion, then joins the threads.
  // Idempotent. Must not be called from a pool thread.
  void Shutdown();

  // Threads now alive (for tests and metrics).
  size_t Threads() const;
  // Waits up to `bound` until at most `n` threads are alive; whether they are.
  bool WaitForThreadsAtMost(size_t n, std::chrono::milliseconds bound);

 private:
  void Loop();
  // Joins the threads that retired; called without mu_ held.
  void JoinRetired(std::vector<std::thread> retired);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable retired_cv_;  // a thread retired (WaitForThreadsAtMost)
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;  // alive or retired and not yet joined
  std::vector<std::thread::id> retired_ids_;  // exited Loop, to be joined
  size_t alive_ = 0;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace idem
