#include "core/worker_pool.h"

#include <algorithm>
#include <system_error>

namespace idem {
namespace {

std::mutex& DefaultsMutex() {
  static std::mutex mu;
  return mu;
}

WorkerPool::Options& Defaults() {
  static WorkerPool::Options options;
  return options;
}

}  // namespace

void WorkerPool::SetDefaultOptions(Options options) {
  std::lock_guard g(DefaultsMutex());
  Defaults() = std::move(options);
}

WorkerPool::Options WorkerPool::DefaultOptions() {
  std::lock_guard g(DefaultsMutex());
  return Defaults();
}

WorkerPool::WorkerPool() : WorkerPool(DefaultOptions()) {}

WorkerPool::WorkerPool(Options options) : options_(std::move(options)) {}

WorkerPool::~WorkerPool() { Shutdown(); }

bool WorkerPool::Submit(std::function<void()> task) {
  std::vector<std::thread> retired;
  {
    std::lock_guard g(mu_);
    if (stop_) return false;
    // Threads that exited are joined here, off the lock, so that their
    // handles do not pile up.
    for (std::thread::id id : retired_ids_) {
      auto it = std::find_if(threads_.begin(), threads_.end(),
                             [id](const std::thread& t) { return t.get_id() == id; });
      if (it != threads_.end()) {
        retired.push_back(std::move(*it));
        threads_.erase(it);
      }
    }
    retired_ids_.clear();
    tasks_.push_back(std::move(task));
    // Idle threads that were notified but have not taken a task yet are
    // still counted in idle_, so compare against every queued task.
    if (tasks_.size() > idle_ && alive_ < std::max<size_t>(options_.max_threads, 1)) {
      try {
        threads_.push_back(options_.spawn ? options_.spawn([this] { Loop(); })
                                          : std::thread([this] { Loop(); }));
        ++alive_;
      } catch (const std::system_error&) {
        // Out of threads (TasksMax, RLIMIT_NPROC): the task waits for a
        // running thread, or is refused when none runs to take it.
        if (alive_ == 0) {
          tasks_.pop_back();
          JoinRetired(std::move(retired));
          return false;
        }
      }
    }
  }
  JoinRetired(std::move(retired));
  // After the unlock: a thread woken under the lock would wake only to
  // sleep on it again, one context switch more per task.
  cv_.notify_one();
  return true;
}

void WorkerPool::JoinRetired(std::vector<std::thread> retired) {
  for (std::thread& t : retired) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard g(mu_);
    stop_ = true;
    threads.swap(threads_);
    retired_ids_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

size_t WorkerPool::Threads() const {
  std::lock_guard g(mu_);
  return alive_;
}

bool WorkerPool::WaitForThreadsAtMost(size_t n, std::chrono::milliseconds bound) {
  std::unique_lock g(mu_);
  return retired_cv_.wait_for(g, bound, [&] { return alive_ <= n; });
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
    if (stop_) break;
    ++idle_;
    const bool woken = cv_.wait_for(g, options_.idle_timeout,
                                    [&] { return stop_ || !tasks_.empty(); });
    --idle_;
    if (!woken) break;  // idle for idle_timeout: retire
  }
  --alive_;
  if (!stop_) retired_ids_.push_back(std::this_thread::get_id());
  retired_cv_.notify_all();
}

}  // namespace idem
