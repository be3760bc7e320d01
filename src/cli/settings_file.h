// Reading and replacing a host's settings file for `idemgate install`.
#pragma once

#include <sys/types.h>

#include <string>

#include "idem/error.h"

namespace idem::cli {

// A settings file as read: its bytes, whether it existed, and its mode.
struct SettingsFile {
  std::string path;    // as the host names it
  std::string target;  // where the bytes live: `path` with symbolic links resolved
  std::string bytes;   // empty when missing
  bool exists = false;
  mode_t mode = 0;  // permission bits of the existing file
};

// Reads `path` (at most `limit` bytes: larger is kResourceExhausted). A
// missing file is not an error: `exists` is false. kUnavailable if it cannot
// be read, kInvalidArgument if it is not a regular file.
Result<SettingsFile> ReadSettingsFile(const std::string& path, size_t limit);

// Replaces the file's bytes atomically: a temporary file in the same
// directory, given the old file's mode (or `new_mode` for a new file), then
// renamed over it, so a host reading it sees the old or the new text, never
// part of one. Missing directories are created with `dir_mode`.
Result<void> ReplaceSettingsFile(const SettingsFile& file, const std::string& bytes,
                                 mode_t new_mode, mode_t dir_mode);

}  // namespace idem::cli
