// The owners of a batch of writes, woken as a binary tree: the writer wakes
// the first, and each owner, once awake, wakes the next two on its own
// thread, so releasing a batch of n costs the writer one wake-up, not n
// (sqlite::GroupCommitWriter, postgres::BatchWriter).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace idem {

class TreeWaiter {
 public:
  // Marks it done and wakes the thread in Await. That thread may return and
  // destroy the waiter at once: nothing touches it afterwards.
  void Finish();
  // Blocks until Finish(), then finishes the waiters linked to this one.
  void Await();

  // Links `at(0)` … `at(n - 1)` (TreeWaiter&) as a binary tree, the children
  // of i being 2i + 1 and 2i + 2, then finishes the first. Every link is set
  // before anyone is woken: a woken owner destroys its waiter when it returns.
  template <typename At>
  static void FinishTree(size_t n, At at) {
    for (size_t i = 0; i < n; ++i) {
      TreeWaiter& w = at(i);
      w.wakes_[0] = 2 * i + 1 < n ? &at(2 * i + 1) : nullptr;
      w.wakes_[1] = 2 * i + 2 < n ? &at(2 * i + 2) : nullptr;
    }
    if (n > 0) at(0).Finish();
  }

 private:
  std::atomic<uint32_t> done_{0};
  TreeWaiter* wakes_[2] = {nullptr, nullptr};
};

}  // namespace idem
