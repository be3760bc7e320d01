// Evictions announced to every process on one SQLite file, so that each may
// keep a replay cache above its store (Store::WatchEvictions, CachingStore;
// docs/DESIGN.md §5).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "idem/error.h"

namespace idem::sqlite {

// Where the bell of the database at `database_path` lives: PATH-evictions,
// beside PATH-lock, PATH-wal and PATH-shm, PATH with symbolic links and a
// relative path resolved (realpath(3); as given if the file is not there).
std::string EvictionBellPath(const std::string& database_path);

// A file beside the database that every eviction writes to once it has
// committed, and that every process keeping a replay cache watches with
// inotify(7). The kernel wakes a watcher only when the file is written, so
// an idle process is never woken and a replay checks nothing: the same
// shape as Redis pub/sub or PostgreSQL NOTIFY, on one host (which SQLite's
// WAL mode needs anyway: its readers share memory through PATH-shm).
//
// What is promised: an eviction through any SqliteStore, in any process on
// this host, reaches every watcher once Ring has returned and the
// watcher's thread has woken. Not announced, and documented: a record
// deleted by hand (the sqlite3 shell), and an eviction whose process died
// between its COMMIT and its Ring (one write(2) apart).
class EvictionBell {
 public:
  // Writes to the bell file (creating it with mode 0600), which wakes every
  // watcher. kUnavailable (kInvalidArgument for a path that cannot name a
  // file) if the file cannot be opened or written, naming it.
  static Result<void> Ring(const std::string& database_path);

  // Watches the bell file (creating it if needed) and calls `on_change`,
  // which must not block:
  //  - with true once here, before returning, and after every ring;
  //  - with false when the watch is lost (the file was removed or renamed),
  //    after which the file at that path is watched again once it is there
  //    (tried every `retry`; the next Ring makes it) and true follows.
  // Errors, naming the file: kUnavailable when inotify has no instance or
  // watch left for this user (fs.inotify.max_user_instances,
  // max_user_watches) or the file cannot be created.
  static Result<std::unique_ptr<EvictionBell>> Watch(const std::string& database_path,
                                                     std::function<void(bool heard)> on_change,
                                                     std::chrono::milliseconds retry);

  // Stops the watch; returns once no call of on_change is running.
  ~EvictionBell();
  EvictionBell(const EvictionBell&) = delete;
  EvictionBell& operator=(const EvictionBell&) = delete;

 private:
  EvictionBell(std::string path, int inotify_fd, int stop_fd,
               std::function<void(bool heard)> on_change, std::chrono::milliseconds retry);

  // Watches the file at path_, making it first if `create`.
  Result<void> AddWatch(bool create);
  void Run();

  const std::string path_;
  const int inotify_fd_;
  const int stop_fd_;  // an eventfd: written to stop Run
  const std::function<void(bool heard)> on_change_;
  const std::chrono::milliseconds retry_;
  int watch_ = -1;  // Run's, after construction
  std::thread thread_;
};

}  // namespace idem::sqlite
