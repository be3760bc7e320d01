#include "core/worker_pool.h"

namespace idem {

WorkerPool::~WorkerPool() { Shutdown(); }

bool WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard g(mu_);
    if (stop_) return false;
    tasks_.push_back(std::move(task));
    // Idle threads that were notified but have not taken a task yet are
    // still counted in idle_, so compare against every queued task.
    if (tasks_.size() > idle_) {
      threads_.emplace_back([this] { Loop(); });
      return true;
    }
  }
  // After the unlock: a thread woken under the lock would wake only to
  // sleep on it again, one context switch more per task.
  cv_.notify_one();
  return true;
}

void WorkerPool::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard g(mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

void WorkerPool::Loop() {
  std::unique_lock g(mu_);
  while (true) {
    if (!tasks_.empty()) {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      g.unlock();
      task();
      task = nullptr;  // destroy captures outside the lock
      g.lock();
      continue;
    }
    if (stop_) return;
    ++idle_;
    cv_.wait(g);
    --idle_;
  }
}

}  // namespace idem
