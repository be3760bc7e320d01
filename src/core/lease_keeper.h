// Renews the leases of running calls: one thread for the whole process, a
// heartbeat for each lease every lease/3 by the injected clock.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include "idem/clock.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem {

class LeaseKeeper {
 public:
  LeaseKeeper(Store& store, Clock& clock);
  ~LeaseKeeper();

  // Starts renewing (id, fence); returns a ticket for Stop / lost.
  uint64_t Start(const RecordId& id, uint64_t fence, Duration lease);
  void Stop(uint64_t ticket);
  // True once a heartbeat found the record gone or its fence moved on.
  bool lost(uint64_t ticket);
  // Heartbeats sent so far (for tests: wait for a count, never sleep).
  uint64_t heartbeats();
  void AwaitHeartbeats(uint64_t n);

 private:
  struct Lease {
    RecordId id;
    uint64_t fence;
    Duration lease;
    TimePoint next_due;
  };
  void Loop();

  Store& store_;
  Clock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Lease> leases_;
  std::map<uint64_t, bool> lost_;
  uint64_t next_ticket_ = 1;
  uint64_t heartbeats_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace idem
