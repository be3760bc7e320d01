// Renews the leases of running calls: a heartbeat for each lease every
// lease/3 by the injected clock. One thread schedules; the heartbeats run
// concurrently on a worker pool, at most one in flight per lease, so a slow
// answer (one Cluster node, one slow connection) delays only its own lease,
// never the others'. Each heartbeat is bounded by the store's own command
// timeout; one that is still in flight when its next is due is not sent
// twice. The pool also abandons claims whose reply was lost
// (Store::Abandon), one round at a time, retrying while the store is
// unreachable.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/record.h"
#include "idem/store.h"
#include "core/worker_pool.h"

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
  // Leases being renewed now: executions in flight (for metrics).
  size_t running();
  // Heartbeats sent so far (for tests: wait for a count, never sleep).
  uint64_t heartbeats();
  void AwaitHeartbeats(uint64_t n);

  // Abandons the claim of `id` made with `owner` in the background: its
  // caller got an error, so it may or may not have been applied. Tries at
  // once, then again (100 ms doubling to 1 s) while the
  // store fails, until it is deleted, the store answers that it is not (or
  // no longer) ours or absent, or `give_up_at` (the claim's retention end:
  // by then the record is gone anyway). While the store is down, one
  // pending abandon per round probes it, so heartbeats never queue behind
  // a backlog.
  void Abandon(const RecordId& id, std::string owner, TimePoint give_up_at);
  // Runs the pending abandons of `id` now, in the caller's thread, so that
  // a new attempt on `id` never meets this process's own orphaned claim.
  // Returns the first store error that leaves one pending (it stays
  // scheduled), or OK when none is left.
  Result<void> AbandonNow(const RecordId& id);
  // Abandons still pending (for tests and metrics).
  size_t pending_abandons();
  // Whether any abandon is pending (AbandonNow may then write), without the lock.
  bool AbandonsPending() const { return abandons_pending_.load() > 0; }

 private:
  struct Lease {
    RecordId id;
    uint64_t fence;
    Duration lease;
    TimePoint next_due;
    bool in_flight = false;  // its heartbeat was sent and has not answered
  };
  struct PendingAbandon {
    RecordId id;
    std::string owner;
    TimePoint give_up_at;
    TimePoint next_due;
    Duration backoff;
  };
  void Loop();
  // Sends one lease's heartbeat (on a pool thread) and applies its answer.
  void Renew(uint64_t ticket, Lease lease, TimePoint round);
  // Runs the due abandons of one round (mu_ not held).
  void RunAbandons(std::vector<std::pair<uint64_t, PendingAbandon>> work, TimePoint now);
  // Whether an Abandon result settles the pending abandon.
  static bool Settled(const Result<void>& r);

  Store& store_;
  Clock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Lease> leases_;
  std::map<uint64_t, bool> lost_;
  std::map<uint64_t, PendingAbandon> abandons_;  // by ticket: oldest first
  // abandons_.size(), readable without mu_: AbandonNow runs before every
  // claim and must not take the keeper's lock when nothing is pending.
  std::atomic<size_t> abandons_pending_{0};
  uint64_t next_ticket_ = 1;
  uint64_t heartbeats_ = 0;
  // When the keeper thread, waiting, wakes on its own; TimePoint::min()
  // while it runs (it looks at every lease before it waits again). A new
  // lease due later needs no wake-up: the common case, one per gated call.
  TimePoint wakes_at_ = TimePoint::min();
  bool abandons_running_ = false;  // a round of abandons is on the pool
  bool stop_ = false;
  WorkerPool pool_;  // heartbeats and abandon rounds; shut down before the thread's state goes
  std::thread thread_;
};

}  // namespace idem
