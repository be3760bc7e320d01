#include "eviction_bell.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "database_file.h"

namespace idem::sqlite {
namespace {

// The Error for inotify_init1 or inotify_add_watch failing with `err`.
Error WatchError(int err, const std::string& path, std::string_view doing) {
  if (err == EMFILE || err == ENOSPC) {
    return Error{ErrorCode::kUnavailable,
                 fmt::format("sqlite store {}: {}: {}; this user has no inotify instance or "
                             "watch left: raise fs.inotify.max_user_instances or "
                             "max_user_watches (sysctl), or run fewer processes that watch files",
                             path, doing, std::strerror(err))};
  }
  return ErrorFromErrno(err, path, doing);
}

}  // namespace

std::string EvictionBellPath(const std::string& database_path) {
  // Beside the file itself, however a process names it (through a symbolic
  // link, or a relative path): processes that open one database by
  // different names must ring and watch one bell.
  char* real = ::realpath(database_path.c_str(), nullptr);
  std::string base = real != nullptr ? real : database_path;
  std::free(real);
  return base + "-evictions";
}

Result<void> EvictionBell::Ring(const std::string& database_path) {
  const std::string path = EvictionBellPath(database_path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(ErrorFromErrno(errno, path, "opening the eviction bell"));
  // Any write wakes the watchers (IN_MODIFY); the byte itself means nothing.
  const char byte = 1;
  ssize_t n;
  do {
    n = ::pwrite(fd, &byte, 1, 0);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n != 1) return std::unexpected(ErrorFromErrno(err, path, "ringing the eviction bell"));
  return {};
}

Result<std::unique_ptr<EvictionBell>> EvictionBell::Watch(const std::string& database_path,
                                                          std::function<void(bool heard)> on_change,
                                                          std::chrono::milliseconds retry) {
  std::string path = EvictionBellPath(database_path);
  const int inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd < 0) {
    return std::unexpected(WatchError(errno, path, "starting an inotify instance"));
  }
  const int stop_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) {
    const int err = errno;
    ::close(inotify_fd);
    return std::unexpected(ErrorFromErrno(err, path, "making the eviction watcher's eventfd"));
  }
  std::unique_ptr<EvictionBell> bell(
      new EvictionBell(std::move(path), inotify_fd, stop_fd, std::move(on_change), retry));
  if (auto ok = bell->AddWatch(/*create=*/true); !ok) return std::unexpected(std::move(ok.error()));
  // Every ring from here on is queued for Run, so the cache may fill.
  bell->on_change_(true);
  bell->thread_ = std::thread([b = bell.get()] { b->Run(); });
  return bell;
}

EvictionBell::EvictionBell(std::string path, int inotify_fd, int stop_fd,
                           std::function<void(bool heard)> on_change,
                           std::chrono::milliseconds retry)
    : path_(std::move(path)),
      inotify_fd_(inotify_fd),
      stop_fd_(stop_fd),
      on_change_(std::move(on_change)),
      retry_(retry) {}

EvictionBell::~EvictionBell() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  ::close(stop_fd_);
  ::close(inotify_fd_);  // removes the watch
}

Result<void> EvictionBell::AddWatch(bool create) {
  if (create) {
    // Made first, so that the processes that ring and the ones that watch
    // meet on one file whichever of them comes first.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return std::unexpected(ErrorFromErrno(errno, path_, "creating the eviction bell"));
    ::close(fd);
  }
  const int wd =
      ::inotify_add_watch(inotify_fd_, path_.c_str(), IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF);
  if (wd < 0) return std::unexpected(WatchError(errno, path_, "watching the eviction bell"));
  watch_ = wd;
  return {};
}

void EvictionBell::Run() {
  alignas(inotify_event) char buf[4096];
  bool watching = true;
  for (;;) {
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, watching ? -1 : static_cast<int>(retry_.count()));
    if (ready < 0 && errno != EINTR) {
      // Only a broken descriptor gets here: tell the cache it is deaf.
      on_change_(false);
      return;
    }
    if (fds[1].revents != 0) return;
    bool heard = false;
    bool lost = !watching;
    // Drained even while not watching: a late IN_IGNORED of the lost watch
    // left unread would make every poll return at once.
    if ((fds[0].revents & POLLIN) != 0) {
      ssize_t n;
      while ((n = ::read(inotify_fd_, buf, sizeof buf)) > 0) {
        for (ssize_t at = 0; at < n;) {
          const auto* event = reinterpret_cast<const inotify_event*>(buf + at);
          // The queue overflowed: what was lost may have been a ring.
          if ((event->mask & IN_Q_OVERFLOW) != 0) heard = true;
          if (watching && event->wd == watch_) {
            if ((event->mask & IN_MODIFY) != 0) heard = true;
            if ((event->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) != 0) lost = true;
          }
          at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        }
      }
    }
    if (lost) {
      // A ring on another file at this path could go unheard until the
      // watch is back: deaf until then.
      if (watching) {
        on_change_(false);
        ::inotify_rm_watch(inotify_fd_, watch_);  // still there after a rename
        watch_ = -1;
      }
      // Not made again here: whoever removed it may be removing the whole
      // directory. The next ring makes it.
      watching = AddWatch(/*create=*/false).has_value();
      if (watching) on_change_(true);
    } else if (heard) {
      on_change_(true);
    }
  }
}

}  // namespace idem::sqlite
