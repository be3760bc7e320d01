// The write lock: an flock on a file beside the database that orders the
// write transactions of every store object and process on that database, so
// a writer that must wait sleeps in the kernel (docs/DESIGN.md §5).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "idem/error.h"

namespace idem::sqlite {

// Where the write lock of the database at `database_path` lives: PATH-lock,
// beside SQLite's own PATH-wal and PATH-shm.
std::string WriteLockPath(const std::string& database_path);

// An exclusive flock(2) on WriteLockPath, taken around each write
// transaction. SQLite's own write lock cannot be waited for: a connection
// that finds it taken polls through its busy handler, which with many
// processes on one file costs more CPU than the writes. This lock is waited
// for asleep in the kernel, which wakes the waiters when it is released (one
// gets it, the others sleep again: a wake-up per waiter and commit, not a
// poll every 100 µs to 2 ms), and releases it when its holder's process
// dies, however it dies: a dead holder never blocks the others. Every flock is its own holder (it belongs
// to the open file description), so two objects in one process exclude
// each other as two processes do.
//
// Processes that do not take it (an older idemgate, the sqlite3 shell, a
// store opened with write_lock=none) still write correctly: SQLite's lock
// still orders the transactions, and its busy timeout bounds the wait for
// theirs. A wait for this lock has no timeout of its own: its holder holds
// it for one write transaction, which is itself bounded by the busy timeout
// (and by the disk); a holder that is stopped (SIGSTOP, a debugger) stops
// the other writers until it goes on or dies.
//
// Thread-compatible: one thread at a time takes and releases it (the
// group-commit writer); waits() may be read from any thread.
class WriteLock {
 public:
  // Opens (creating it with mode 0600 if needed) the lock file of the
  // database at `database_path`, without taking the lock. kUnavailable for a
  // file that cannot be created or opened (permissions, read-only file
  // system), naming it.
  static Result<std::unique_ptr<WriteLock>> Open(const std::string& database_path);
  ~WriteLock();
  WriteLock(const WriteLock&) = delete;
  WriteLock& operator=(const WriteLock&) = delete;

  // Returns once this object holds the lock, asleep in the kernel while
  // another holds it. kUnavailable if the kernel refuses the lock (ENOLCK).
  Result<void> Acquire();
  // Lets the next waiter in. Idempotent.
  void Release();

  // How many times Acquire found the lock taken and went to sleep; counted
  // before it sleeps, so a test can see that a writer is waiting.
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }

 private:
  WriteLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  const int fd_;
  const std::string path_;
  bool held_ = false;
  std::atomic<uint64_t> waits_{0};
};

}  // namespace idem::sqlite
