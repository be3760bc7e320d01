#include "core/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>

namespace idem {
namespace {

using namespace std::chrono_literals;

constexpr auto kBound = 30s;  // a bound on what is awaited, never a timing assumption

// Holds every task that waits on it until Open().
class Gate {
 public:
  void Wait() {
    std::unique_lock g(mu_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait_for(g, kBound, [&] { return open_; });
  }
  bool WaitForWaiting(int n) {
    std::unique_lock g(mu_);
    return changed_.wait_for(g, kBound, [&] { return waiting_ >= n; });
  }
  void Open() {
    std::lock_guard g(mu_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool open_ = false;
};

// Security review F16: the pool grew a thread per concurrent task and never
// let one go, so a burst of /readyz probes while the store was slow left up
// to max_connections threads for the life of the process.
TEST(WorkerPoolTest, ThreadsAreCappedAndTasksQueueBeyondTheCap) {
  WorkerPool pool(WorkerPool::Options{.max_threads = 2, .idle_timeout = 60s});
  Gate gate;
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
      gate.Wait();
      ++ran;
    }));
  }
  ASSERT_TRUE(gate.WaitForWaiting(2));
  EXPECT_EQ(pool.Threads(), 2u);
  EXPECT_EQ(ran.load(), 0) << "queued behind the two running tasks";
  gate.Open();
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 5) << "every queued task ran";
}

TEST(WorkerPoolTest, IdleThreadsRetire) {
  WorkerPool pool(WorkerPool::Options{.max_threads = 8, .idle_timeout = 0ms});
  Gate gate;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.Submit([&] { gate.Wait(); }));
  ASSERT_TRUE(gate.WaitForWaiting(4));
  EXPECT_EQ(pool.Threads(), 4u);
  gate.Open();
  EXPECT_TRUE(pool.WaitForThreadsAtMost(0, kBound)) << pool.Threads() << " threads stayed";
  // A retired pool starts threads again (and joins the retired ones).
  std::atomic<bool> ran{false};
  ASSERT_TRUE(pool.Submit([&] { ran = true; }));
  pool.Shutdown();
  EXPECT_TRUE(ran);
}

// F16: a failed thread creation (TasksMax) threw out of Submit, which some
// callers run on I/O threads outside any try, and std::terminate ended the
// process. Now the task waits for a running thread, or is refused.
TEST(WorkerPoolTest, AThreadThatCannotStartIsARefusalNotACrash) {
  std::atomic<int> starts{0};
  WorkerPool::Options options{.max_threads = 8, .idle_timeout = 60s};
  options.spawn = [&](std::function<void()> loop) {
    if (starts++ >= 1) {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    }
    return std::thread(std::move(loop));
  };
  Gate gate;
  std::atomic<int> ran{0};
  {
    WorkerPool pool(options);
    ASSERT_TRUE(pool.Submit([&] {
      gate.Wait();
      ++ran;
    }));
    ASSERT_TRUE(gate.WaitForWaiting(1));
    EXPECT_TRUE(pool.Submit([&] { ++ran; })) << "queued for the running thread";
    EXPECT_EQ(pool.Threads(), 1u);
    gate.Open();
  }
  EXPECT_EQ(ran.load(), 2);
  starts = 1;
  WorkerPool none(options);
  EXPECT_FALSE(none.Submit([&] { ++ran; })) << "no thread to run it";
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace idem
