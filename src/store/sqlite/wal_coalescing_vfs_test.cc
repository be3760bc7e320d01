#include "wal_coalescing_vfs.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "idem/clock.h"
#include "sqlite_store.h"
#include "test_support.h"

namespace idem {
namespace {

using testing::Req;
using testing::TempDir;

// A connection to `path` (created if missing) in WAL mode with
// synchronous=FULL, through the coalescing VFS or SQLite's default; it aborts
// the test process on any failure, as there is nothing to test without it.
sqlite3* OpenWal(const std::string& path, bool coalescing) {
  sqlite3* db = nullptr;
  const char* vfs = coalescing ? sqlite::WalCoalescingVfs() : nullptr;
  if (coalescing && vfs == nullptr) std::abort();
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs) !=
          SQLITE_OK ||
      sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL", nullptr, nullptr,
                   nullptr) != SQLITE_OK) {
    std::abort();
  }
  return db;
}

int Exec(sqlite3* db, const std::string& sql) {
  return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
}

// The first column of the first row of `sql`, as text.
std::string Query(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  std::string out = "(error)";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    const auto* text = sqlite3_column_text(st, 0);
    out = text != nullptr ? reinterpret_cast<const char*>(text) : "(null)";
  }
  sqlite3_finalize(st);
  return out;
}

// One transaction of `rows` rows of 3 000 bytes each (about one page a row),
// numbered from `first`; each row's bytes are derived from its number.
int InsertRows(sqlite3* db, int first, int rows) {
  return Exec(db, "BEGIN; WITH RECURSIVE n(i) AS (SELECT " + std::to_string(first) +
                      " UNION ALL SELECT i + 1 FROM n WHERE i < " +
                      std::to_string(first + rows - 1) +
                      ") INSERT INTO t SELECT i, substr(replace(hex(zeroblob(1500)), '00', "
                      "printf('%02x', i % 256)), 1, 3000) FROM n; COMMIT");
}

// What a reader must find after rows 1..n: their count, and every row's
// bytes as InsertRows made them.
std::string Expected(int n) { return std::to_string(n) + " 0"; }
std::string Found(sqlite3* db) {
  return Query(db,
               "SELECT count(*) || ' ' || sum(v != substr(replace(hex(zeroblob(1500)), '00', "
               "printf('%02x', i % 256)), 1, 3000)) FROM t");
}

// The table t of a new file in `dir`, through the coalescing VFS, with row 1
// committed (the first commit after the WAL starts also writes and syncs
// its header, apart from the frames).
sqlite3* NewTable(const TempDir& dir) {
  sqlite3* db = OpenWal(dir.File("t.db"), true);
  if (Exec(db, "CREATE TABLE t (i INTEGER PRIMARY KEY, v TEXT)") != SQLITE_OK ||
      InsertRows(db, 1, 1) != SQLITE_OK) {
    std::abort();
  }
  return db;
}

// Rows 1..n, whole, as a connection of SQLite's own VFS reads them.
void ExpectReadBack(const TempDir& dir, int n) {
  sqlite3* reader = OpenWal(dir.File("t.db"), false);
  EXPECT_EQ(Found(reader), Expected(n));
  EXPECT_EQ(Query(reader, "PRAGMA integrity_check"), "ok");
  sqlite3_close(reader);
}

TEST(WalCoalescingVfsTest, ACommitReachesTheWalAsOneWrite) {
  TempDir dir;
  sqlite3* db = NewTable(dir);
  const sqlite::WalWriteCounts before = sqlite::WalWrites();
  ASSERT_EQ(InsertRows(db, 2, 20), SQLITE_OK);  // ~21 pages: 85 KB, within one write
  const sqlite::WalWriteCounts after = sqlite::WalWrites();
  EXPECT_GE(after.asked - before.asked, 40u);  // a header and a page per frame
  EXPECT_EQ(after.made - before.made, 1u);
  ExpectReadBack(dir, 21);
  sqlite3_close(db);
}

// The unix VFS cuts a write to its low 17 bits of length (a rest of exactly
// 128 KiB would be written as nothing and reported as a full disk), so a
// larger commit is written in pieces below that; every byte arrives.
TEST(WalCoalescingVfsTest, ALargeCommitArrivesWhole) {
  TempDir dir;
  sqlite3* db = NewTable(dir);
  int next = 2;
  // 4120-byte frames: commits of 1 to 140 pages cross the 128 KiB mark at
  // every offset the frames allow.
  for (int rows = 1; rows <= 140; rows += 7) {
    const sqlite::WalWriteCounts before = sqlite::WalWrites();
    ASSERT_EQ(InsertRows(db, next, rows), SQLITE_OK) << sqlite3_errmsg(db);
    next += rows;
    const sqlite::WalWriteCounts after = sqlite::WalWrites();
    // Each write below 124 KiB, 30 frames; and the tree's pages beside the rows'.
    EXPECT_LE(after.made - before.made, 2 + static_cast<uint64_t>(rows) / 29) << rows;
  }
  ExpectReadBack(dir, next - 1);
  sqlite3_close(db);
}

TEST(WalCoalescingVfsTest, EveryCommitIsSeenByAnotherConnectionAtOnce) {
  TempDir dir;
  sqlite3* db = NewTable(dir);
  sqlite3* reader = OpenWal(dir.File("t.db"), false);
  // Past SQLite's automatic checkpoint (1 000 pages), so the WAL restarts
  // and is written over from its start too.
  int rows = 1;
  for (int i = 1; i <= 150; ++i) {
    ASSERT_EQ(InsertRows(db, rows + 1, i % 13 + 1), SQLITE_OK);
    rows += i % 13 + 1;
    ASSERT_EQ(Found(reader), Expected(rows)) << "after commit " << i;
  }
  EXPECT_EQ(Query(reader, "PRAGMA integrity_check"), "ok");
  sqlite3_close(reader);
  sqlite3_close(db);
}

// A process that dies between its commit's writes and their sync (here the
// test's hook ends it, as a crash would) had not written that transaction's
// frames to the file, nor published them: a later opener finds every
// transaction before it, whole, and a file that goes on working.
TEST(WalCoalescingVfsTest, AProcessKilledBeforeItsSyncLosesOnlyThatTransaction) {
  TempDir dir;
  const std::string path = dir.File("t.db");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sqlite3* db = OpenWal(path, true);
    if (Exec(db, "CREATE TABLE t (i INTEGER PRIMARY KEY, v TEXT)") != SQLITE_OK) ::_exit(1);
    for (int i = 0; i < 5; ++i) {
      if (InsertRows(db, i * 10 + 1, 10) != SQLITE_OK) ::_exit(1);
    }
    sqlite::SetWalSyncHookForTesting([] { ::raise(SIGKILL); });
    (void)InsertRows(db, 51, 40);
    ::_exit(2);  // not reached: the sync above ends the process
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  sqlite3* db = OpenWal(path, true);
  EXPECT_EQ(Found(db), Expected(50));
  EXPECT_EQ(Query(db, "PRAGMA integrity_check"), "ok");
  ASSERT_EQ(InsertRows(db, 51, 40), SQLITE_OK);
  EXPECT_EQ(Found(db), Expected(90));
  sqlite3_close(db);
}

TEST(WalCoalescingVfsTest, TheStoreWritesThroughItOnlyWhereEveryCommitSyncs) {
  TempDir dir;
  FakeClock clock;
  struct Case {
    const char* params;
    const char* synchronous;
    bool coalesced;
  };
  int files = 0;
  for (const Case& c :
       {Case{"", "full", true}, Case{"", "extra", true}, Case{"?coalesce_wal=on", "normal", false},
        Case{"", "off", false}, Case{"?coalesce_wal=off", "full", false}}) {
    StoreOptions options;
    options.sqlite_synchronous = c.synchronous;
    const std::string path = dir.File(std::to_string(++files) + ".db");
    auto store = SqliteStore::Open(path + c.params, clock, options);
    ASSERT_TRUE(store) << store.error().ToString();
    const sqlite::WalWriteCounts before = sqlite::WalWrites();
    auto claimed = (*store)->Claim(Req("k"));
    ASSERT_TRUE(claimed && claimed->claimed);
    EXPECT_EQ(sqlite::WalWrites().asked > before.asked, c.coalesced)
        << c.params << " synchronous=" << c.synchronous;
  }
}

TEST(WalCoalescingVfsTest, ABadValueIsRefused) {
  TempDir dir;
  FakeClock clock;
  for (const char* params : {"?coalesce_wal=yes", "?coalesce_wal="}) {
    auto store = SqliteStore::Open(dir.File("t.db") + params, clock, StoreOptions{});
    ASSERT_FALSE(store) << params;
    EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(store.error().message.find("coalesce_wal=on|off"), std::string::npos)
        << store.error().message;
  }
}

}  // namespace
}  // namespace idem
