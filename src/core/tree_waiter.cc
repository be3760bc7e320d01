#include "tree_waiter.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace idem {

// A bare futex rather than std::atomic::wait: libstdc++'s wait spins with
// sched_yield first, which with many callers steals the CPU from the writer.
void TreeWaiter::Finish() {
  done_.store(1, std::memory_order_release);
  // The owner may already have returned and destroyed this waiter:
  // FUTEX_WAKE only hashes the address and never touches the memory.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

void TreeWaiter::Await() {
  while (done_.load(std::memory_order_acquire) == 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done_), FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr,
            0);
  }
  for (TreeWaiter* w : wakes_) {
    if (w != nullptr) w->Finish();
  }
}

}  // namespace idem
