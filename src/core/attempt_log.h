// Buffers audit-log attempts and writes them to the store in batches, off the
// request path. The audit log is not on the correctness path: a crash loses
// at most the attempts of the last flush interval, never a record.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "idem/record.h"
#include "idem/store.h"

namespace idem {

class AttemptLog {
 public:
  // Flushes when `batch` attempts are buffered or every `interval` of real
  // time, whichever is first.
  explicit AttemptLog(Store& store, size_t batch = 256, Duration interval = Duration(200));
  ~AttemptLog();  // flushes what is buffered

  void Append(Attempt attempt);
  // Writes everything buffered so far before returning.
  void Flush();

 private:
  void Loop();

  Store& store_;
  const size_t batch_;
  const Duration interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Attempt> buffer_;
  bool stop_ = false;
  std::mutex write_mu_;  // keeps batches in order
  std::thread thread_;
};

}  // namespace idem
