#include "observe/replay_window.h"

#include <algorithm>

namespace idem {

ReplayWindow::ReplayWindow(Duration window)
    : width_(std::max<Duration>(Duration(1), window / kSlots)) {}

void ReplayWindow::Record(TimePoint now, bool replay) {
  const int64_t epoch = EpochOf(now);
  Slot& slot = slots_[static_cast<size_t>(epoch % kSlots)];
  if (slot.epoch.load(std::memory_order_acquire) != epoch) {
    std::lock_guard lock(rotate_mu_);
    const int64_t seen = slot.epoch.load(std::memory_order_relaxed);
    // A caller with an older time than the slot's bucket (clocks are read
    // before this call) counts in the newer bucket rather than erase it.
    if (seen < epoch) {
      slot.attempts.store(0, std::memory_order_relaxed);
      slot.replays.store(0, std::memory_order_relaxed);
      slot.epoch.store(epoch, std::memory_order_release);
    }
  }
  slot.attempts.fetch_add(1, std::memory_order_relaxed);
  if (replay) slot.replays.fetch_add(1, std::memory_order_relaxed);
}

ReplayWindow::Totals ReplayWindow::Sum(TimePoint now) const {
  const int64_t newest = EpochOf(now);
  Totals t;
  for (const Slot& slot : slots_) {
    const int64_t epoch = slot.epoch.load(std::memory_order_acquire);
    if (epoch > newest - kSlots && epoch <= newest) {
      t.attempts += slot.attempts.load(std::memory_order_relaxed);
      t.replays += slot.replays.load(std::memory_order_relaxed);
    }
  }
  // Counted without a lock: never report more replays than attempts.
  t.replays = std::min(t.replays, t.attempts);
  return t;
}

}  // namespace idem
