#include "database_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace idem::sqlite {

Error ErrorFromErrno(int err, const std::string& path, std::string_view doing) {
  std::string_view advice;
  ErrorCode code = ErrorCode::kUnavailable;
  switch (err) {
    case EACCES:
    case EPERM:
      advice = "this process may not write there: fix the permissions or choose another store path";
      break;
    case EROFS:
      advice = "the file system is read-only: choose a store path on a writable file system";
      break;
    case ENOSPC:
    case EDQUOT:
      advice = "the disk is full: free space and retry";
      break;
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
      code = ErrorCode::kInvalidArgument;
      advice = "the store path must name a file in a directory: choose another store path";
      break;
    default:
      advice = "check the path and the file system, then retry";
  }
  return Error{code,
               fmt::format("sqlite store {}: {}: {}; {}", path, doing, std::strerror(err), advice)};
}

namespace {

Result<void> MakeParentDirectories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::filesystem::path prefix;
  for (const auto& part : parent) {
    prefix /= part;
    if (part == "/" || part.empty()) continue;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("sqlite store {}: {} is not a directory; choose another "
                                     "store path",
                                     path, prefix.string()));
      }
      continue;
    }
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return std::unexpected(
          ErrorFromErrno(errno, path, fmt::format("creating the directory {}", prefix.string())));
    }
  }
  return {};
}

}  // namespace

Result<void> PrepareDatabaseFile(const std::string& path) {
  if (path.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite store: the path is empty; give a file path, e.g. sqlite:idemgate.db");
  }
  if (auto made = MakeParentDirectories(path); !made) return made;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(ErrorFromErrno(errno, path, "opening the file for writing"));
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  ::close(fd);
  if (stat_rc == 0 && !S_ISREG(st.st_mode)) {
    return MakeError(
        ErrorCode::kInvalidArgument,
        fmt::format("sqlite store {}: not a regular file; choose another store path", path));
  }
  return {};
}

}  // namespace idem::sqlite
