// The caller loop the benchmarks share: `callers` threads that start together
// and repeat one call until a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <thread>
#include <vector>

struct CallerRun {
  uint64_t calls = 0;   // calls completed by all threads
  double seconds = 0;   // from the start until the last thread stopped
  bool failed = false;  // a call returned false (and said why)
};

// Runs `callers` threads that each repeat one_call(thread, i) (i counts the
// thread's calls) for `seconds`. at_start() runs once every thread is ready,
// right before the clock starts, so a caller can sample its own counters
// (CPU time, bytes written) around exactly the measured interval. A call that
// returns false stops its thread and marks the run failed.
template <typename OneCall, typename AtStart>
CallerRun RunCallers(int callers, double seconds, OneCall one_call, AtStart at_start) {
  using Clock = std::chrono::steady_clock;
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> failed{false};
  std::latch ready(callers);
  std::latch go(1);
  Clock::time_point end;
  std::vector<std::thread> threads;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      ready.count_down();
      go.wait();
      uint64_t mine = 0;
      while (Clock::now() < end) {
        if (!one_call(t, mine)) {
          failed = true;
          break;
        }
        ++mine;
      }
      calls.fetch_add(mine);
    });
  }
  ready.wait();
  at_start();
  const auto start = Clock::now();
  end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go.count_down();
  for (auto& t : threads) t.join();
  return CallerRun{calls.load(), std::chrono::duration<double>(Clock::now() - start).count(),
                   failed.load()};
}
