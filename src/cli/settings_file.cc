// Settings files: read whole, replaced by temp file + rename.
#include "settings_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace idem::cli {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Creates `dir` and its missing parents with `mode`.
Result<void> MakeDirs(const std::filesystem::path& dir, mode_t mode) {
  if (dir.empty()) return {};
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return {};
    return MakeError(ErrorCode::kInvalidArgument, dir.string() + " is not a directory");
  }
  if (Result<void> parent = MakeDirs(dir.parent_path(), mode); !parent) return parent;
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return MakeError(ErrorCode::kUnavailable, Errno("cannot create " + dir.string()));
  }
  return {};
}

}  // namespace

Result<SettingsFile> ReadSettingsFile(const std::string& path, size_t limit) {
  SettingsFile file;
  file.path = path;
  file.target = path;
  std::error_code ec;
  std::filesystem::path resolved = std::filesystem::canonical(path, ec);
  if (!ec) file.target = resolved.string();
  int fd = ::open(file.target.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return file;
    return MakeError(ErrorCode::kUnavailable, Errno("cannot read " + path));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return MakeError(ErrorCode::kInvalidArgument, path + " is not a regular file");
  }
  file.exists = true;
  file.mode = st.st_mode & 07777;
  std::vector<char> buffer(64 * 1024);
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string message = Errno("cannot read " + path);
      ::close(fd);
      return MakeError(ErrorCode::kUnavailable, message);
    }
    if (n == 0) break;
    file.bytes.append(buffer.data(), static_cast<size_t>(n));
    if (file.bytes.size() > limit) {
      ::close(fd);
      return MakeError(ErrorCode::kResourceExhausted,
                       path + " is larger than " + std::to_string(limit) +
                           " bytes, which is not a settings file idemgate edits");
    }
  }
  ::close(fd);
  return file;
}

Result<void> ReplaceSettingsFile(const SettingsFile& file, const std::string& bytes,
                                 mode_t new_mode, mode_t dir_mode) {
  std::filesystem::path target(file.target);
  if (Result<void> dirs = MakeDirs(target.parent_path(), dir_mode); !dirs) return dirs;
  std::string temp = target.string() + ".idemgate-XXXXXX";
  int fd = ::mkstemp(temp.data());
  if (fd < 0) return MakeError(ErrorCode::kUnavailable, Errno("cannot create " + temp));
  auto fail = [&](const std::string& what) {
    std::string message = Errno(what);
    ::close(fd);
    ::unlink(temp.c_str());
    return MakeError(ErrorCode::kUnavailable, message);
  };
  if (::fchmod(fd, file.exists ? file.mode : new_mode) != 0) return fail("cannot chmod " + temp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write " + temp);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot write " + temp);
  if (::close(fd) != 0) {
    std::string message = Errno("cannot write " + temp);
    ::unlink(temp.c_str());
    return MakeError(ErrorCode::kUnavailable, message);
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    std::string message = Errno("cannot replace " + file.path);
    ::unlink(temp.c_str());
    return MakeError(ErrorCode::kUnavailable, message);
  }
  return {};
}

}  // namespace idem::cli
