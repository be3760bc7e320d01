// Readiness (/readyz, docs/DESIGN.md §6.4): does the store answer a cheap read
// within a timeout? For every HTTP listener's `ready` hook.
//
// The read runs on the probe's own thread, so a hung backend cannot hold a
// caller past the timeout; while one read is still hanging, later checks
// answer at once instead of piling up threads.
//
// Thread-safe. `store` and `clock` must outlive the probe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/store.h"

namespace idem {

class StoreProbe {
 public:
  // `timeout` by `clock`. Default 2 s.
  explicit StoreProbe(Store& store, Clock& clock, Duration timeout = Duration(2'000));
  ~StoreProbe();  // waits for a read in progress (bounded by the backend's own timeouts)
  StoreProbe(const StoreProbe&) = delete;
  StoreProbe& operator=(const StoreProbe&) = delete;

  // OK if the store answered a Get of an absent record within the timeout.
  // Otherwise the store's error, or kDeadlineExceeded when it did not answer
  // in time (or an earlier read is still waiting for it).
  Result<void> Check();

 private:
  void Loop();

  Store& store_;
  Clock& clock_;
  const Duration timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t requested_ = 0;  // reads asked for
  uint64_t answered_ = 0;   // reads finished
  Result<void> last_;       // the result of read number answered_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace idem
