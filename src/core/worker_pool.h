// Threads for work that may block: a gated call waits in Ledger::Begin (up
// to policy.wait) and then for the upstream's answer, which must never happen
// on a channel's reader thread or an HTTP listener's I/O thread. Shared by
// the fronts (MCP, the HTTP proxy, the ledger API).
//
// The pool grows on demand, one thread per task that finds no idle thread, so
// a task never queues behind a long-running one; idle threads are reused. The
// caller bounds the number of concurrent tasks (CallBudget in mcp_session.h;
// the HTTP fronts by max_connections, one request at a time per connection).
// Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace idem {

class WorkerPool {
 public:
  WorkerPool() = default;
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `task` on a pool thread, soon. False (task dropped) after Shutdown.
  bool Submit(std::function<void()> task);
  // Runs every task already submitted to completion, then joins the threads.
  // Idempotent. Must not be called from a pool thread.
  void Shutdown();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace idem
