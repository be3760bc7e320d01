// Buffers audit-log attempts and writes them to the store in batches, off the
// request path. The audit log is not on the correctness path: a crash loses
// at most the attempts of the last flush interval, never a record.
//
// The buffer is bounded: while the store writes more slowly than attempts
// arrive, at most `max_backlog` wait besides the batch being written, and
// further ones are dropped, counted and reported on stderr (as a batch the
// store refused is), so that a slow store cannot make a gateway grow
// without bound. Both kinds of loss are counted for the metrics (drops()).
// Thread-safe.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "idem/ledger.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem {

class AttemptLog {
 public:
  // Flushes when `batch` attempts are buffered or every `interval` of real
  // time, whichever is first. `max_backlog` as above (at least 1;
  // LedgerOptions::audit_backlog).
  AttemptLog(Store& store, size_t batch, Duration interval, size_t max_backlog);
  ~AttemptLog();  // flushes what is buffered

  // Buffers `attempt`, or drops it when max_backlog are already waiting.
  void Append(Attempt attempt);
  // Writes everything buffered so far before returning.
  void Flush();
  // Attempts lost since the start: dropped past max_backlog, and in batches
  // the store refused.
  AuditDrops drops() const;

 private:
  void Loop();

  Store& store_;
  const size_t batch_;
  const Duration interval_;
  const size_t max_backlog_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Attempt> buffer_;
  size_t dropped_ = 0;  // past max_backlog since the last report
  AuditDrops drops_;    // since the start
  bool stop_ = false;
  std::mutex write_mu_;  // keeps batches in order
  std::thread thread_;
};

}  // namespace idem
