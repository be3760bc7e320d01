#include "wal_coalescing_vfs.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <vector>

#include "sqlite_connection.h"

namespace idem::sqlite {
namespace {

constexpr char kName[] = "idemgate-wal-coalescing";

// The most one write of the unix VFS takes: it masks a write's length with
// 0x1ffff (seekAndWriteFd), so a longer one would be cut short, and a rest
// of exactly 128 KiB would be written as nothing and reported as a full
// disk.
constexpr size_t kMaxWrite = (size_t{1} << 17) - 4096;

std::atomic<uint64_t> asked{0};
std::atomic<uint64_t> made{0};
std::atomic<void (*)()> sync_hook{nullptr};

sqlite3_vfs* Real(sqlite3_vfs* vfs) { return static_cast<sqlite3_vfs*>(vfs->pAppData); }

// A WAL file: the real one's sqlite3_file follows this struct in the memory
// SQLite gives xOpen (szOsFile is the sum of both).
struct WalFile {
  sqlite3_file base;  // pMethods = &kWalMethods
  sqlite3_file* real;
  // Writes kept since the last one made: `pending` belongs at `pending_at`.
  std::vector<char> pending;
  sqlite3_int64 pending_at = 0;

  const sqlite3_io_methods& methods() const { return *real->pMethods; }

  int Flush() {
    int rc = SQLITE_OK;
    for (size_t done = 0; done < pending.size() && rc == SQLITE_OK; done += kMaxWrite) {
      const size_t n = std::min(kMaxWrite, pending.size() - done);
      made.fetch_add(1, std::memory_order_relaxed);
      rc = methods().xWrite(real, pending.data() + done, static_cast<int>(n),
                            pending_at + static_cast<sqlite3_int64>(done));
    }
    pending.clear();
    return rc;
  }
};

WalFile& Wal(sqlite3_file* file) { return *reinterpret_cast<WalFile*>(file); }

// The real file's `Method`.
template <auto Method, typename... Args>
auto Forward(sqlite3_file* file, Args... args) {
  WalFile& wal = Wal(file);
  return (wal.methods().*Method)(wal.real, args...);
}

// Every method that reads or changes the file, except xWrite and xClose,
// writes what is kept first, then asks the real file; most of them SQLite
// never calls on a WAL.
template <auto Method, typename... Args>
int FlushThen(sqlite3_file* file, Args... args) {
  if (const int rc = Wal(file).Flush(); rc != SQLITE_OK) return rc;
  return Forward<Method>(file, args...);
}

int WalClose(sqlite3_file* file) {
  WalFile& wal = Wal(file);
  const int flushed = wal.Flush();
  const int closed = wal.methods().xClose(wal.real);
  wal.~WalFile();
  return flushed != SQLITE_OK ? flushed : closed;
}

int WalWrite(sqlite3_file* file, const void* data, int amount, sqlite3_int64 offset) {
  WalFile& wal = Wal(file);
  asked.fetch_add(1, std::memory_order_relaxed);
  if (!wal.pending.empty() &&
      offset != wal.pending_at + static_cast<sqlite3_int64>(wal.pending.size())) {
    if (const int rc = wal.Flush(); rc != SQLITE_OK) return rc;
  }
  if (wal.pending.empty()) wal.pending_at = offset;
  const auto* bytes = static_cast<const char*>(data);
  try {
    wal.pending.insert(wal.pending.end(), bytes, bytes + amount);
  } catch (const std::bad_alloc&) {
    // Written now instead: what is kept first, then this.
    if (const int rc = wal.Flush(); rc != SQLITE_OK) return rc;
    made.fetch_add(1, std::memory_order_relaxed);
    return wal.methods().xWrite(wal.real, data, amount, offset);
  }
  return wal.pending.size() >= kMaxPending ? wal.Flush() : SQLITE_OK;
}

int WalSync(sqlite3_file* file, int flags) {
  if (auto* hook = sync_hook.load(std::memory_order_acquire)) hook();
  return FlushThen<&sqlite3_io_methods::xSync>(file, flags);
}

const sqlite3_io_methods kWalMethods = {
    .iVersion = 3,
    .xClose = WalClose,
    .xRead = FlushThen<&sqlite3_io_methods::xRead, void*, int, sqlite3_int64>,
    .xWrite = WalWrite,
    .xTruncate = FlushThen<&sqlite3_io_methods::xTruncate, sqlite3_int64>,
    .xSync = WalSync,
    .xFileSize = FlushThen<&sqlite3_io_methods::xFileSize, sqlite3_int64*>,
    .xLock = FlushThen<&sqlite3_io_methods::xLock, int>,
    .xUnlock = FlushThen<&sqlite3_io_methods::xUnlock, int>,
    .xCheckReservedLock = FlushThen<&sqlite3_io_methods::xCheckReservedLock, int*>,
    .xFileControl = FlushThen<&sqlite3_io_methods::xFileControl, int, void*>,
    .xSectorSize = Forward<&sqlite3_io_methods::xSectorSize>,
    .xDeviceCharacteristics = Forward<&sqlite3_io_methods::xDeviceCharacteristics>,
    .xShmMap = FlushThen<&sqlite3_io_methods::xShmMap, int, int, int, void volatile**>,
    .xShmLock = FlushThen<&sqlite3_io_methods::xShmLock, int, int, int>,
    .xShmBarrier = Forward<&sqlite3_io_methods::xShmBarrier>,
    .xShmUnmap = Forward<&sqlite3_io_methods::xShmUnmap, int>,
    .xFetch = FlushThen<&sqlite3_io_methods::xFetch, sqlite3_int64, int, void**>,
    .xUnfetch = FlushThen<&sqlite3_io_methods::xUnfetch, sqlite3_int64, void*>,
};

int Open(sqlite3_vfs* vfs, const char* name, sqlite3_file* file, int flags, int* out_flags) {
  sqlite3_vfs* real = Real(vfs);
  // The memory is at least the real VFS's szOsFile: other files are its own.
  if ((flags & SQLITE_OPEN_WAL) == 0) return real->xOpen(real, name, file, flags, out_flags);
  auto* wal = new (file) WalFile{};
  wal->real = reinterpret_cast<sqlite3_file*>(wal + 1);
  const int rc = real->xOpen(real, name, wal->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    // SQLite closes nothing whose pMethods is null; the real file is closed
    // if its open set pMethods anyway.
    if (wal->real->pMethods != nullptr) wal->real->pMethods->xClose(wal->real);
    wal->~WalFile();
    file->pMethods = nullptr;
    return rc;
  }
  file->pMethods = &kWalMethods;
  return SQLITE_OK;
}

// Every other method of the VFS is the real one's.
template <auto Method, typename... Args>
auto ToReal(sqlite3_vfs* vfs, Args... args) {
  return (Real(vfs)->*Method)(Real(vfs), args...);
}

}  // namespace

const char* WalCoalescingVfs() {
  static sqlite3_vfs vfs;
  static const bool registered = [] {
    ConfigureSqlite();  // sqlite3_vfs_find initializes SQLite
    sqlite3_vfs* real = sqlite3_vfs_find(nullptr);
    // Version 3 is what every method above assumes (unix's is 3).
    if (real == nullptr || real->iVersion < 3) return false;
    vfs = sqlite3_vfs{
        .iVersion = 3,
        .szOsFile = static_cast<int>(sizeof(WalFile)) + real->szOsFile,
        .mxPathname = real->mxPathname,
        .pNext = nullptr,
        .zName = kName,
        .pAppData = real,
        .xOpen = Open,
        .xDelete = ToReal<&sqlite3_vfs::xDelete, const char*, int>,
        .xAccess = ToReal<&sqlite3_vfs::xAccess, const char*, int, int*>,
        .xFullPathname = ToReal<&sqlite3_vfs::xFullPathname, const char*, int, char*>,
        .xDlOpen = ToReal<&sqlite3_vfs::xDlOpen, const char*>,
        .xDlError = ToReal<&sqlite3_vfs::xDlError, int, char*>,
        .xDlSym = ToReal<&sqlite3_vfs::xDlSym, void*, const char*>,
        .xDlClose = ToReal<&sqlite3_vfs::xDlClose, void*>,
        .xRandomness = ToReal<&sqlite3_vfs::xRandomness, int, char*>,
        .xSleep = ToReal<&sqlite3_vfs::xSleep, int>,
        .xCurrentTime = ToReal<&sqlite3_vfs::xCurrentTime, double*>,
        .xGetLastError = ToReal<&sqlite3_vfs::xGetLastError, int, char*>,
        .xCurrentTimeInt64 = ToReal<&sqlite3_vfs::xCurrentTimeInt64, sqlite3_int64*>,
        .xSetSystemCall = ToReal<&sqlite3_vfs::xSetSystemCall, const char*, sqlite3_syscall_ptr>,
        .xGetSystemCall = ToReal<&sqlite3_vfs::xGetSystemCall, const char*>,
        .xNextSystemCall = ToReal<&sqlite3_vfs::xNextSystemCall, const char*>,
    };
    return sqlite3_vfs_register(&vfs, 0) == SQLITE_OK;
  }();
  return registered ? kName : nullptr;
}

WalWriteCounts WalWrites() {
  return {asked.load(std::memory_order_relaxed), made.load(std::memory_order_relaxed)};
}

void SetWalSyncHookForTesting(void (*hook)()) { sync_hook.store(hook, std::memory_order_release); }

}  // namespace idem::sqlite
