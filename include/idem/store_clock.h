// The clock every instance on a shared store decides by (docs/DESIGN.md §4):
// this machine's clock corrected by its offset from the store server's own
// (Store::ReadServerClock). A lease, an expiry, a take-over is then judged
// by one clock, the store's, however far apart the machines' clocks are:
// with 25 s of skew between two hosts, the one ahead would otherwise take
// over a live owner's call under on_unknown = "retry" and run it twice.
//
// The offset is measured as NTP does with one server: of a few round trips,
// the shortest one's midpoint against the server's reading; the error is at
// most half that round trip. A store whose clock is this machine's (memory,
// SQLite: a local file) has none to read and the offset stays zero.
//
// Give the same StoreClock to the store and to everything that decides by
// it (ledger, lease keeper, replay cache): they must agree on "now".
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/store.h"

namespace idem {

class StoreClock final : public Clock {
 public:
  // `base` (this machine's clock, or a test's) must outlive this clock.
  explicit StoreClock(Clock& base) : base_(base) {}
  ~StoreClock() override;
  StoreClock(const StoreClock&) = delete;
  StoreClock& operator=(const StoreClock&) = delete;

  // Measures the offset of `store`'s clock from `base` with `samples` round
  // trips and applies it. Returns the offset (server minus base), or the
  // store's error (the offset is left as it was). A store without a server
  // clock gives zero.
  Result<Duration> Sync(Store& store, int samples = 3);

  // The first sync, before anything decides a lease by this clock: up to
  // `attempts` Syncs, the first pause `pause` and each next one twice the
  // last (a store failing over answers again within a few seconds). Returns
  // the last error if none succeeded; the caller must then not judge leases
  // by this clock, whose offset would be this machine's guess (zero).
  Result<Duration> SyncFirst(Store& store, int attempts, Duration pause);

  // Syncs again every `every` on a thread of its own until this clock is
  // destroyed or Stop() is called, so that a drifting or stepped clock on
  // either side is followed. A failed sync keeps the last offset. `store`
  // must outlive the thread; `every` must be positive.
  void KeepInSync(Store& store, Duration every);
  void Stop();

  Duration offset() const { return Duration(offset_ms_.load(std::memory_order_relaxed)); }

  // Clock:
  TimePoint Now() override { return base_.Now() + offset(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override {
    base_.WaitUntil(cv, lock, deadline - offset());
  }

 private:
  Clock& base_;
  std::atomic<int64_t> offset_ms_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace idem
