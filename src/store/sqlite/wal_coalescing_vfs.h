// The writer connection's SQLite VFS (docs/DESIGN.md §5): the default unix
// VFS, except that a transaction's writes to the WAL reach the file as one
// write at its commit instead of two per page.
//
// SQLite writes each WAL frame as two calls, its 24-byte header and then the
// page, so a commit of 12 pages is 24 pwrite()s before its fsync, each
// paying a system call and the file system's locking (bench/README.md, run
// II: idemgate's CPU per gated fresh call 0.92-0.93x without them). Here
// the writes of the WAL that follow one another are kept in memory and
// written as one at the next sync, read, truncate, size query or file
// control of the WAL, at a write elsewhere in the file, or when
// `kMaxPending` bytes are kept.
//
// Why this is safe: with synchronous=FULL or EXTRA, SQLite syncs the WAL at
// every commit before it publishes the commit in the wal-index, and no reader
// (of this process or another) reads a frame the wal-index does not name. So
// every byte a reader can look for is on the file before it looks, and a
// crash before the sync loses only a transaction that was not committed,
// as a power cut could. With synchronous=NORMAL or OFF a commit is published
// without a sync, so those connections must not use this VFS
// (sqlite_store.cc opens the writer with it only for FULL and EXTRA). Other
// files (the database, the journal of a rollback) pass through untouched.
#pragma once

#include <cstddef>
#include <cstdint>

namespace idem::sqlite {

// Registers the VFS (once; not as the default) and returns its name, for
// sqlite3_open_v2. nullptr if SQLite has no default VFS to wrap.
const char* WalCoalescingVfs();

// Bytes of WAL writes kept before they are written anyway.
inline constexpr size_t kMaxPending = size_t{4} << 20;

// Process-wide counts, for tests and benchmarks: write calls SQLite made to
// WAL files opened through the VFS, and write calls the VFS made for them.
struct WalWriteCounts {
  uint64_t asked = 0;
  uint64_t made = 0;
};
WalWriteCounts WalWrites();

// For tests: `hook` runs at the start of every sync of a WAL file opened
// through the VFS, before its kept writes are written (a test's child
// process ends itself there, as a crash would). nullptr removes it. Set it
// while no other thread syncs through the VFS.
void SetWalSyncHookForTesting(void (*hook)());

}  // namespace idem::sqlite
