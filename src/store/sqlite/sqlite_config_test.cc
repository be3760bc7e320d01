// Alone in its executable: it needs a process in which SQLite has not
// started yet, as in idemgate itself.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "sqlite_store.h"
#include "test_support.h"

namespace idem {
namespace {

using testing::Req;
using testing::TempDir;

// SQLite counts allocations under a process-wide mutex unless it is told not
// to before it starts. Opening a store starts it (the WAL VFS's
// registration, before any connection), so the setting must come first:
// with it, SQLite counted nothing.
TEST(SqliteConfigTest, TheStoreTurnsAllocationCountingOffBeforeSqliteStarts) {
  TempDir dir;
  FakeClock clock;
  auto store = SqliteStore::Open(dir.File("idem.db"), clock, StoreOptions{});
  ASSERT_TRUE(store) << store.error().ToString();
  ASSERT_TRUE((*store)->Claim(Req("k")));
  sqlite3_int64 current = -1;
  sqlite3_int64 highest = -1;
  ASSERT_EQ(sqlite3_status64(SQLITE_STATUS_MALLOC_COUNT, &current, &highest, 0), SQLITE_OK);
  EXPECT_EQ(current, 0);
  EXPECT_EQ(highest, 0);
}

}  // namespace
}  // namespace idem
