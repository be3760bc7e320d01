#include "write_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "database_file.h"

namespace idem::sqlite {

std::string WriteLockPath(const std::string& database_path) { return database_path + "-lock"; }

Result<std::unique_ptr<WriteLock>> WriteLock::Open(const std::string& database_path) {
  std::string path = WriteLockPath(database_path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(ErrorFromErrno(errno, path, "opening the write lock file"));
  return std::unique_ptr<WriteLock>(new WriteLock(fd, std::move(path)));
}

WriteLock::~WriteLock() { ::close(fd_); }  // closing the file releases a held lock

Result<void> WriteLock::Acquire() {
  if (held_) return {};
  int rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  if (rc != 0 && errno == EWOULDBLOCK) {
    waits_.fetch_add(1, std::memory_order_relaxed);
    do {
      rc = ::flock(fd_, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
  }
  if (rc != 0) return std::unexpected(ErrorFromErrno(errno, path_, "taking the write lock"));
  held_ = true;
  return {};
}

void WriteLock::Release() {
  if (!held_) return;
  ::flock(fd_, LOCK_UN);
  held_ = false;
}

}  // namespace idem::sqlite
