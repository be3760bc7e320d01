// Creating the SQLite file and its directories with owner-only permissions.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::sqlite {

// Makes sure `path` names a regular file this process can read and write:
// creates the missing parent directories (mode 0700) and the file itself
// (mode 0600, empty; SQLite then gives its -wal and -shm files the same
// mode). An existing file is opened, never truncated or rewritten.
// kInvalidArgument for an empty path, a path that is a directory or runs
// through a file; kUnavailable for a directory or file that cannot be
// created or written (permissions, read-only file system, disk full).
Result<void> PrepareDatabaseFile(const std::string& path);

// The Error for a failed system call with `err` (errno) on a file of the
// store at `path` while `doing`, with what the operator can do about it:
// kInvalidArgument for a path that cannot name a file (ENOTDIR, EISDIR,
// ELOOP, ENAMETOOLONG), else kUnavailable.
Error ErrorFromErrno(int err, const std::string& path, std::string_view doing);

}  // namespace idem::sqlite
