// Attempts and replays of one tool over a sliding window of time, for the
// replay ratio and its alert (docs/DESIGN.md §7).
//
// A ring of kSlots time buckets, each window/kSlots wide, judged by the
// injected clock's time passed in by the caller. Sum() counts the buckets
// that overlap (now - window, now], so the window slides in steps of one
// bucket (5 s for the default 5 min window).
//
// Thread-safe. Record is lock-free except when it opens a new bucket (once
// per bucket width per tool).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "idem/clock.h"

namespace idem {

class ReplayWindow {
 public:
  static constexpr int kSlots = 60;

  // `window` is clamped to at least kSlots ms.
  explicit ReplayWindow(Duration window);

  // Counts one attempt at `now`; `replay` for replayed and attached ones.
  void Record(TimePoint now, bool replay);

  struct Totals {
    uint64_t attempts = 0;
    uint64_t replays = 0;
    // replays / attempts; 0 with no attempts.
    double ratio() const { return attempts == 0 ? 0.0 : double(replays) / double(attempts); }
  };
  Totals Sum(TimePoint now) const;

  Duration window() const { return width_ * kSlots; }

 private:
  struct Slot {
    std::atomic<int64_t> epoch{-1};  // bucket number (time / width) it counts, -1: never used
    std::atomic<uint64_t> attempts{0};
    std::atomic<uint64_t> replays{0};
  };
  int64_t EpochOf(TimePoint t) const { return ToUnixMillis(t) / width_.count(); }

  const Duration width_;
  std::mutex rotate_mu_;  // serialises reopening a slot for a new bucket
  std::array<Slot, kSlots> slots_;
};

}  // namespace idem
