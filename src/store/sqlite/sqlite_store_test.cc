#include "sqlite_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/attempt_chain.h"
#include "sqlite_rows.h"
#include "sqlite_schema.h"
#include "store_contract.h"
#include "store_wrapper.h"
#include "test_support.h"
#include "wal_coalescing_vfs.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::Eventually;
using testing::kTtl;
using testing::Req;
using testing::TempDir;

// A SqliteStore on a file in its own temporary directory, for the contract
// suite: the directory goes when the store does.
class TempSqliteStore : public testing::StoreWrapper {
 public:
  TempSqliteStore(std::unique_ptr<TempDir> dir, std::unique_ptr<Store> store)
      : StoreWrapper(*store), dir_(std::move(dir)), store_(std::move(store)) {}

 private:
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Store> store_;  // declared last: closed before the directory goes
};

INSTANTIATE_TEST_SUITE_P(
    Sqlite, StoreContractTest,
    ::testing::Values(StoreContractParam{
        "sqlite",
        [](Clock& clock) -> std::unique_ptr<Store> {
          auto dir = std::make_unique<TempDir>();
          auto store = OpenSqliteStore(dir->File("contract.db"), clock, StoreOptions{});
          if (!store) {
            ADD_FAILURE() << store.error().ToString();
            return nullptr;
          }
          return std::make_unique<TempSqliteStore>(std::move(dir), std::move(*store));
        }}),
    [](const ::testing::TestParamInfo<StoreContractParam>& info) { return info.param.name; });

Outcome Ok(std::string body) { return Outcome{OutcomeClass::kSuccess, std::move(body)}; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

// A plain sqlite3 connection for setting up files behind the store's back.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) std::abort();
    sqlite3_busy_timeout(db_, 10'000);
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  // Returns the SQLite result code.
  int Exec(const std::string& sql) {
    return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  // The same, calling `row` with each row's columns.
  int Exec(const std::string& sql, std::function<void(char** columns)> row) {
    return sqlite3_exec(
        db_, sql.c_str(),
        [](void* fn, int, char** columns, char**) {
          (*static_cast<std::function<void(char**)>*>(fn))(columns);
          return 0;
        },
        &row, nullptr);
  }

  // The first column of the first row `sql` returns, as an integer.
  int64_t QueryInt(const std::string& sql) {
    int64_t value = -1;
    sqlite3_exec(
        db_, sql.c_str(),
        [](void* out, int, char** row, char**) {
          *static_cast<int64_t*>(out) = std::strtoll(row[0], nullptr, 10);
          return 0;
        },
        &value, nullptr);
    return value;
  }

 private:
  sqlite3* db_ = nullptr;
};

// Undoes schema version 5 (the partial outcome index) in `raw`.
void RestoreTheOutcomeIndex(RawDb& raw) {
  ASSERT_EQ(raw.Exec("DROP INDEX attempts_by_rare_outcome"), SQLITE_OK);
  ASSERT_EQ(raw.Exec("CREATE INDEX attempts_by_outcome ON attempts (outcome, at_ms)"), SQLITE_OK);
}

// Undoes schema version 4 (the audit log's hash chain) in `raw`.
void DropTheChain(RawDb& raw) {
  ASSERT_EQ(raw.Exec("DROP INDEX attempts_by_chain"), SQLITE_OK);
  ASSERT_EQ(raw.Exec("DROP TABLE attempt_heads"), SQLITE_OK);
  for (const char* column : {"seq", "prev_hash", "hash"}) {
    ASSERT_EQ(raw.Exec(std::string("ALTER TABLE attempts DROP COLUMN ") + column), SQLITE_OK);
  }
}

class SqliteStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<SqliteStore> Open(const StoreOptions& options = {}) {
    auto store = SqliteStore::Open(path_, clock_, options);
    EXPECT_TRUE(store) << store.error().ToString();
    return store ? std::move(*store) : nullptr;
  }

  TempDir dir_;
  std::string path_ = dir_.File("idem.db");
  FakeClock clock_;
};

TEST_F(SqliteStoreTest, FilesAndDirectoriesAreOwnerOnly) {
  const std::string nested = (dir_.path() / "state" / "idemgate" / "idem.db").string();
  auto store = SqliteStore::Open(nested, clock_, {});
  ASSERT_TRUE(store) << store.error().ToString();
  ASSERT_TRUE((*store)->Claim(Req("k")));
  EXPECT_EQ(ModeOf((dir_.path() / "state").string()), 0700u);
  EXPECT_EQ(ModeOf((dir_.path() / "state" / "idemgate").string()), 0700u);
  EXPECT_EQ(ModeOf(nested), 0600u);
  ASSERT_TRUE(fs::exists(nested + "-wal"));
  EXPECT_EQ(ModeOf(nested + "-wal"), 0600u);
  ASSERT_TRUE(fs::exists(nested + "-shm"));
  EXPECT_EQ(ModeOf(nested + "-shm"), 0600u);
  ASSERT_TRUE(fs::exists(nested + "-lock"));
  EXPECT_EQ(ModeOf(nested + "-lock"), 0600u);
}

TEST_F(SqliteStoreTest, JunkFileIsDataLossAndLeftUntouched) {
  std::mt19937 rng(42);
  std::string junk(8192, '\0');
  for (char& c : junk) c = static_cast<char>(rng());
  WriteAll(path_, junk);

  auto store = SqliteStore::Open(path_, clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kDataLoss) << store.error().ToString();
  EXPECT_NE(store.error().message.find(path_), std::string::npos) << store.error().message;
  EXPECT_NE(store.error().message.find("not a database"), std::string::npos)
      << store.error().message;
  EXPECT_NE(store.error().message.find("left untouched"), std::string::npos)
      << store.error().message;
  EXPECT_EQ(ReadAll(path_), junk);
}

TEST_F(SqliteStoreTest, ShortTextFileIsDataLossAndLeftUntouched) {
  const std::string text = "this is not a database\n";
  WriteAll(path_, text);
  auto store = SqliteStore::Open(path_, clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kDataLoss) << store.error().ToString();
  EXPECT_EQ(ReadAll(path_), text);
}

TEST_F(SqliteStoreTest, SqliteFileOfAnotherProgramIsRefused) {
  {
    RawDb raw(path_);
    ASSERT_EQ(raw.Exec("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"), SQLITE_OK);
  }
  auto store = SqliteStore::Open(path_, clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument) << store.error().ToString();
  EXPECT_NE(store.error().message.find("another program"), std::string::npos);
  RawDb raw(path_);
  EXPECT_EQ(raw.Exec("SELECT name FROM customers"), SQLITE_OK) << "the file must be left alone";
}

TEST_F(SqliteStoreTest, NewerSchemaVersionIsRefused) {
  Open().reset();
  {
    RawDb raw(path_);
    ASSERT_EQ(raw.Exec("PRAGMA user_version = 99"), SQLITE_OK);
  }
  auto store = SqliteStore::Open(path_, clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition) << store.error().ToString();
  EXPECT_NE(store.error().message.find("schema version 99"), std::string::npos)
      << store.error().message;
  EXPECT_NE(store.error().message.find("newer idemgate"), std::string::npos);
}

// A file written before claims carried owner tokens (schema version 1) is
// migrated in place: its records stay readable, with no owner, so no
// Abandon can delete them; new claims store their token.
TEST_F(SqliteStoreTest, VersionOneFileMigratesAndItsRecordsHaveNoOwner) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Claim(Req("old")));
  }
  {
    RawDb raw(path_);  // back to version 1's layout
    RestoreTheOutcomeIndex(raw);
    DropTheChain(raw);
    ASSERT_EQ(raw.Exec("ALTER TABLE records DROP COLUMN retention_ms"), SQLITE_OK);
    ASSERT_EQ(raw.Exec("ALTER TABLE records DROP COLUMN owner"), SQLITE_OK);
    ASSERT_EQ(raw.Exec("PRAGMA user_version = 1"), SQLITE_OK);
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ExpectOwnerlessRecordAndOwnedClaims(*store);
  RawDb raw(path_);
  EXPECT_EQ(raw.Exec("SELECT owner FROM records"), SQLITE_OK);
}

// A file written before records kept their claim's retention (schema version
// 2) is migrated in place: its records read with no retention of their own
// (the completing step's applies), new claims store theirs.
TEST_F(SqliteStoreTest, VersionTwoFileMigratesAndItsRecordsKeepNoRetention) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Claim(Req("old")));
  }
  {
    RawDb raw(path_);  // back to version 2's layout
    RestoreTheOutcomeIndex(raw);
    DropTheChain(raw);
    ASSERT_EQ(raw.Exec("ALTER TABLE records DROP COLUMN retention_ms"), SQLITE_OK);
    ASSERT_EQ(raw.Exec("PRAGMA user_version = 2"), SQLITE_OK);
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto old = store->Get({"default", "old"});
  ASSERT_TRUE(old && old->has_value());
  EXPECT_EQ((*old)->retention, Duration(0));
  auto fresh = store->Claim(Req("new"));
  ASSERT_TRUE(fresh && fresh->claimed);
  EXPECT_EQ(fresh->record.retention, Req("new").retention);
}

// A file whose audit log predates the chain (schema version 3): its entries
// are reported as before the chain, never as tampering; new ones chain.
TEST_F(SqliteStoreTest, VersionThreeAttemptsAreBeforeTheChain) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendAttempts({AuditEntry("t", "old", 1000)}));
  }
  {
    RawDb raw(path_);  // back to version 3's layout, its entry still there
    RestoreTheOutcomeIndex(raw);
    DropTheChain(raw);
    ASSERT_EQ(raw.Exec("PRAGMA user_version = 3"), SQLITE_OK);
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(
      store->AppendAttempts({AuditEntry("t", "new", 2000), AuditEntry("t", "newer", 3000)}));
  auto report = VerifyChains(*store, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->before_chain, 1u);
  EXPECT_EQ(report->checked, 2u);
}

// The plan SQLite makes for `sql` (EXPLAIN QUERY PLAN), its steps joined.
std::string PlanOf(RawDb& raw, const std::string& sql) {
  std::string plan;
  EXPECT_EQ(raw.Exec("EXPLAIN QUERY PLAN " + sql,
                     [&](char** row) { plan += std::string(row[3] ? row[3] : "") + "; "; }),
            SQLITE_OK)
      << sql;
  return plan;
}

// Schema 5 indexes the outcomes an operator looks for, not the three every
// call writes: a query for one of those others uses the partial index, and
// one for `executed` reads the newest entries by time.
TEST_F(SqliteStoreTest, AQueryForAnOutcomeFewEntriesHaveUsesThePartialIndex) {
  ASSERT_NE(Open(), nullptr);
  RawDb raw(path_);
  AttemptFilter rare;
  rare.outcome = AttemptOutcome::kUnknown;
  EXPECT_NE(PlanOf(raw, sqlite::SelectAttemptsSql(rare)).find("attempts_by_rare_outcome"),
            std::string::npos);
  rare.tenant = "t";
  rare.since = FromUnixMillis(1000);
  EXPECT_NE(PlanOf(raw, sqlite::SelectAttemptsSql(rare)).find("attempts_by_rare_outcome"),
            std::string::npos);
  AttemptFilter common;
  common.outcome = AttemptOutcome::kExecuted;
  const std::string plan = PlanOf(raw, sqlite::SelectAttemptsSql(common));
  EXPECT_NE(plan.find("attempts_by_at"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
}

// A file of schema 4 trades its outcome index for the partial one, and its
// entries are found by outcome as before.
TEST_F(SqliteStoreTest, VersionFourFileMigratesToThePartialOutcomeIndex) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendAttempts({AuditEntry("t", "a", 1000, "", AttemptOutcome::kExecuted),
                                       AuditEntry("t", "b", 2000, "", AttemptOutcome::kUnknown)}));
  }
  {
    RawDb raw(path_);  // back to version 4's layout
    RestoreTheOutcomeIndex(raw);
    ASSERT_EQ(raw.Exec("PRAGMA user_version = 4"), SQLITE_OK);
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  {
    RawDb raw(path_);
    EXPECT_EQ(raw.QueryInt("PRAGMA user_version"), 5);
    EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = "
                           "'attempts_by_outcome'"),
              0);
    EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM attempts INDEXED BY attempts_by_rare_outcome "
                           "WHERE outcome = 'unknown' AND " +
                           std::string(sqlite::kRareOutcomeTerm)),
              1);
  }
  ExpectEntriesFoundByOutcome(*store);
}

// Tampering with the file behind the store's back, as someone with write
// access to it would: each is named by verify.
TEST_F(SqliteStoreTest, VerifyNamesEntriesEditedDeletedOrInsertedInTheFile) {
  auto fault_after = [&](const std::string& sql) -> std::optional<ChainFault> {
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + "-wal");
    std::filesystem::remove(path_ + "-shm");
    auto store = Open();
    EXPECT_NE(store, nullptr);
    std::vector<Attempt> batch;
    for (int i = 1; i <= 5; ++i)
      batch.push_back(AuditEntry("t", "k" + std::to_string(i), 1000 + i));
    EXPECT_TRUE(store->AppendAttempts(batch));
    {
      RawDb raw(path_);
      EXPECT_EQ(raw.Exec(sql), SQLITE_OK) << sql;
    }
    auto report = VerifyChains(*store, std::nullopt, 2);
    EXPECT_TRUE(report) << report.error().ToString();
    return report ? report->fault : std::nullopt;
  };
  auto edited = fault_after("UPDATE attempts SET outcome = 'executed' WHERE key = 'k3'");
  ASSERT_TRUE(edited);
  EXPECT_EQ(edited->kind, ChainFault::Kind::kEdited);
  EXPECT_EQ(edited->entry.key, "k3");
  EXPECT_NE(edited->message.find("tenant \"t\" seq 3 (key \"k3\", "), std::string::npos)
      << edited->message;
  auto deleted = fault_after("DELETE FROM attempts WHERE key = 'k2'");
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->kind, ChainFault::Kind::kDeleted);
  EXPECT_EQ(deleted->entry.seq, 3u) << deleted->message;
  auto last = fault_after("DELETE FROM attempts WHERE key = 'k5'");
  ASSERT_TRUE(last);
  EXPECT_EQ(last->kind, ChainFault::Kind::kDeleted) << last->message;
  auto inserted = fault_after(
      "INSERT INTO attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, "
      "detail, seq, prev_hash, hash) SELECT at_ms, tenant, 'forged', tool, turn, outcome, "
      "latency_ms, instance, detail, seq, prev_hash, hash FROM attempts WHERE key = 'k4'");
  ASSERT_TRUE(inserted);
  EXPECT_EQ(inserted->kind, ChainFault::Kind::kEdited) << inserted->message;  // its hash
  EXPECT_EQ(inserted->entry.key, "forged");
  auto rehashed = fault_after("UPDATE attempts SET seq = 9 WHERE key = 'k4'");
  ASSERT_TRUE(rehashed);
  EXPECT_NE(rehashed->kind, ChainFault::Kind::kInserted) << rehashed->message;
  EXPECT_FALSE(fault_after("SELECT 1"));
}

// Two stores on one file (two processes): one chain per tenant.
TEST_F(SqliteStoreTest, TwoInstancesOnOneFileAppendOneChain) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  std::vector<std::thread> threads;
  for (Store* s : {static_cast<Store*>(a.get()), static_cast<Store*>(b.get())}) {
    threads.emplace_back([s] {
      for (int i = 0; i < 40; ++i)
        ASSERT_TRUE(s->AppendAttempts({AuditEntry("t", "k", i), AuditEntry("u", "k", i)}));
    });
  }
  for (auto& t : threads) t.join();
  auto report = VerifyChains(*a, std::nullopt, 7);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 160u);
}

TEST_F(SqliteStoreTest, ReopeningKeepsSchemaAndData) {
  Open().reset();
  auto again = Open();
  ASSERT_NE(again, nullptr);
  auto n = again->CountRecords();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u);
}

// A new file is made of pages of 1 KiB, or of page_size; a file that
// already exists keeps the size it was made with, and its records.
TEST_F(SqliteStoreTest, ANewFileTakesThePageSizeAndAnOldFileKeepsItsOwn) {
  Open().reset();
  EXPECT_EQ(RawDb(path_).QueryInt("PRAGMA page_size"), 1024);

  const std::string big = dir_.File("big.db");
  {
    auto store = SqliteStore::Open(big + "?page_size=4096", clock_, StoreOptions{});
    ASSERT_TRUE(store) << store.error().ToString();
    ASSERT_TRUE((*store)->Claim(Req("k")));
  }
  EXPECT_EQ(RawDb(big).QueryInt("PRAGMA page_size"), 4096);
  auto again = SqliteStore::Open(big + "?page_size=512", clock_, StoreOptions{});
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(RawDb(big).QueryInt("PRAGMA page_size"), 4096);
  auto n = (*again)->CountRecords();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1u);
}

TEST_F(SqliteStoreTest, PageSizesSQLiteCannotUseAreRefused) {
  for (const char* params :
       {"?page_size=1000", "?page_size=256", "?page_size=131072", "?page_size=", "?page_size=4k"}) {
    auto store = SqliteStore::Open(path_ + params, clock_, StoreOptions{});
    ASSERT_FALSE(store) << params;
    EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(store.error().message.find("power of two from 512 to 65536"), std::string::npos)
        << store.error().message;
  }
  EXPECT_FALSE(std::filesystem::exists(path_));
}

// Eight processes started at once on a new file (eight agent hosts, or a
// benchmark): whichever switches the file to WAL mode, the others wait for it
// instead of failing "database is locked" (SQLite answers a lock upgrade that
// could deadlock with SQLITE_BUSY at once, without its busy handler).
TEST_F(SqliteStoreTest, ManyOpenersOfANewFileAllSucceed) {
  for (int round = 0; round < 20; ++round) {
    const std::string path = dir_.File("race-" + std::to_string(round) + ".db");
    std::atomic<int> ready{0};
    std::vector<std::string> failures(8);
    std::vector<std::thread> openers;
    for (size_t i = 0; i < failures.size(); ++i) {
      openers.emplace_back([&, i] {
        ++ready;
        while (ready < static_cast<int>(failures.size())) std::this_thread::yield();
        auto store = SqliteStore::Open(path, clock_, StoreOptions{});
        if (!store) failures[i] = store.error().ToString();
      });
    }
    for (std::thread& t : openers) t.join();
    for (const std::string& f : failures) ASSERT_EQ(f, "") << "round " << round;
  }
}

TEST_F(SqliteStoreTest, PathThatIsADirectoryIsInvalid) {
  auto store = SqliteStore::Open(dir_.path().string(), clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument) << store.error().ToString();
}

TEST_F(SqliteStoreTest, ParentThatIsAFileIsInvalid) {
  WriteAll(dir_.File("plain"), "x");
  auto store = SqliteStore::Open(dir_.File("plain") + "/sub/idem.db", clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument) << store.error().ToString();
  EXPECT_NE(store.error().message.find("not a directory"), std::string::npos);
}

TEST_F(SqliteStoreTest, UnknownSynchronousModeIsInvalid) {
  StoreOptions options;
  options.sqlite_synchronous = "fast";
  auto store = SqliteStore::Open(path_, clock_, options);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
}

// Permission bits do not stop root, so as root these tests run the open under
// an unprivileged effective uid/gid (nobody); as any other user they use the
// bits directly.
class Unprivileged {
 public:
  static constexpr uid_t kNobody = 65534;

  // Hands `paths` to the unprivileged user when running as root.
  static void Give(const std::vector<std::string>& paths) {
    if (::geteuid() != 0) return;
    for (const auto& p : paths) {
      if (::chown(p.c_str(), kNobody, kNobody) != 0) std::abort();
    }
  }

  Unprivileged() {
    if (::geteuid() != 0) return;
    if (::setegid(kNobody) != 0) return;
    if (::seteuid(kNobody) != 0) {
      (void)::setegid(0);
      return;
    }
    switched_ = true;
  }
  ~Unprivileged() {
    if (!switched_) return;
    if (::seteuid(0) != 0 || ::setegid(0) != 0) std::abort();
  }
  // False when running as root but the uid could not be dropped.
  bool ok() const { return switched_ || ::geteuid() != 0; }

 private:
  bool switched_ = false;
};

TEST_F(SqliteStoreTest, ReadOnlyFileIsUnavailable) {
  Open().reset();
  Unprivileged::Give({dir_.path().string(), path_});
  ASSERT_EQ(::chmod(path_.c_str(), 0400), 0);
  Result<std::unique_ptr<SqliteStore>> store = MakeError(ErrorCode::kInternal, "not run");
  {
    Unprivileged as_user;
    if (!as_user.ok()) GTEST_SKIP() << "running as root and cannot drop to uid 65534";
    store = SqliteStore::Open(path_, clock_, {});
  }
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable) << store.error().ToString();
  EXPECT_NE(store.error().message.find(path_), std::string::npos);
  EXPECT_NE(store.error().message.find("Permission denied"), std::string::npos)
      << store.error().message;
}

TEST_F(SqliteStoreTest, ReadOnlyDirectoryIsUnavailable) {
  Open().reset();
  ASSERT_FALSE(fs::exists(path_ + "-wal")) << "a clean close removes the WAL";
  Unprivileged::Give({dir_.path().string(), path_});
  if (fs::exists(path_ + "-shm")) Unprivileged::Give({path_ + "-shm"});
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0500), 0);
  Result<std::unique_ptr<SqliteStore>> store = MakeError(ErrorCode::kInternal, "not run");
  {
    Unprivileged as_user;
    if (!as_user.ok()) GTEST_SKIP() << "running as root and cannot drop to uid 65534";
    store = SqliteStore::Open(path_, clock_, {});
    if (store) store->reset();  // close as the same user, before switching back
  }
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0700), 0);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable) << store.error().ToString();
  EXPECT_NE(store.error().message.find(path_), std::string::npos);
}

TEST_F(SqliteStoreTest, MissingParentThatCannotBeCreatedIsUnavailable) {
  Unprivileged::Give({dir_.path().string()});
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0500), 0);
  const std::string nested = dir_.File("sub") + "/idem.db";
  Result<std::unique_ptr<SqliteStore>> store = MakeError(ErrorCode::kInternal, "not run");
  {
    Unprivileged as_user;
    if (!as_user.ok()) GTEST_SKIP() << "running as root and cannot drop to uid 65534";
    store = SqliteStore::Open(nested, clock_, {});
  }
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0700), 0);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable) << store.error().ToString();
  EXPECT_NE(store.error().message.find("creating the directory"), std::string::npos)
      << store.error().message;
}

TEST_F(SqliteStoreTest, FileLockedByAnotherConnectionIsUnavailable) {
  StoreOptions options;
  options.sqlite_busy_timeout = 1ms;
  auto store = Open(options);
  ASSERT_NE(store, nullptr);
  RawDb other(path_);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), SQLITE_OK);

  auto claim = store->Claim(Req("k"));
  ASSERT_FALSE(claim);
  EXPECT_EQ(claim.error().code, ErrorCode::kUnavailable) << claim.error().ToString();
  EXPECT_NE(claim.error().message.find("locked by another process"), std::string::npos)
      << claim.error().message;
  EXPECT_TRUE(claim.error().retryable());
  auto read = store->Get(RecordId{"default", "k"});
  EXPECT_TRUE(read) << "readers never wait for a writer in WAL mode";

  ASSERT_EQ(other.Exec("ROLLBACK"), SQLITE_OK);
  auto retry = store->Claim(Req("k"));
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_TRUE(retry->claimed);
}

TEST_F(SqliteStoreTest, OpeningAFileLockedExclusivelyIsUnavailable) {
  RawDb other(path_);
  ASSERT_EQ(other.Exec("CREATE TABLE t (x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1)"), SQLITE_OK);
  StoreOptions options;
  options.sqlite_busy_timeout = 1ms;
  auto store = SqliteStore::Open(path_, clock_, options);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable) << store.error().ToString();
  EXPECT_NE(store.error().message.find("locked"), std::string::npos) << store.error().message;
}

TEST_F(SqliteStoreTest, CompletedRecordIsSeenByAFreshStore) {
  std::string body(1 << 20, 'x');
  body[7] = '\0';
  auto writer = Open();
  auto c = writer->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(writer->Complete(c->record.id, c->record.fence, Ok(body), kTtl));

  auto reader = Open();  // while the first is still open
  auto got = reader->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  EXPECT_EQ((*got)->outcome->body, body);

  writer.reset();
  reader.reset();
  auto fresh = Open();
  auto again = fresh->Get(c->record.id);
  ASSERT_TRUE(again && again->has_value());
  EXPECT_EQ((*again)->state, RecordState::kCompleted);
  EXPECT_EQ((*again)->fence, c->record.fence);
  EXPECT_EQ((*again)->outcome->body, body);
  EXPECT_EQ((*again)->created_at, c->record.created_at);
}

TEST_F(SqliteStoreTest, ConcurrentClaimCompleteShareCommits) {
  constexpr int kThreads = 16;
  auto store = Open();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto c = store->Claim(Req("key-" + std::to_string(i)));
      if (!c || !c->claimed) {
        ++failures;
        return;
      }
      if (!store->Complete(c->record.id, c->record.fence, Ok("ok"), kTtl)) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->writes(), 2u * kThreads);
  auto n = store->CountRecords();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, static_cast<uint64_t>(kThreads));
}

// Deterministic group commit: another connection holds the write lock while
// 16 claims queue up, so they cannot each get their own transaction.
TEST_F(SqliteStoreTest, WritesQueuedBehindALockShareOneTransaction) {
  constexpr int kThreads = 16;
  StoreOptions options;
  options.sqlite_busy_timeout = 120s;
  auto store = Open(options);
  RawDb other(path_);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), SQLITE_OK);

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto c = store->Claim(Req("key-" + std::to_string(i)));
      if (!c || !c->claimed) {
        ++failures;
        return;
      }
      if (!store->Complete(c->record.id, c->record.fence, Ok("ok"), kTtl)) ++failures;
    });
  }
  ASSERT_TRUE(Eventually([&] { return store->pending_writes() == kThreads; }));
  EXPECT_EQ(store->commits(), 0u);
  ASSERT_EQ(other.Exec("ROLLBACK"), SQLITE_OK);
  for (auto& t : threads) t.join();

  EXPECT_EQ(failures.load(), 0);
  const uint64_t writes = 2 * kThreads;
  EXPECT_EQ(store->writes(), writes);
  // At most 2 transactions for the 16 queued claims (the writer had taken
  // the first arrivals before it blocked), at most one per complete.
  EXPECT_LE(store->commits(), 2u + kThreads);
  EXPECT_LT(store->commits(), writes);
}

// Concurrent completions share one commit: 16 claimed records complete
// while another connection holds the write lock, so the writer takes them
// all into one transaction once the lock goes. (Replaces an assertion that
// commits <= writes, which held whatever the writer did.)
TEST_F(SqliteStoreTest, ConcurrentCompletionsShareOneCommit) {
  constexpr int kThreads = 16;
  StoreOptions options;
  options.sqlite_busy_timeout = 120s;
  auto store = Open(options);
  std::vector<Record> claimed;
  for (int i = 0; i < kThreads; ++i) {
    auto c = store->Claim(Req("done-" + std::to_string(i)));
    ASSERT_TRUE(c && c->claimed);
    claimed.push_back(c->record);
  }
  const uint64_t commits_before = store->commits();
  RawDb other(path_);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), SQLITE_OK);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (const Record& r : claimed) {
    threads.emplace_back([&, r] {
      if (!store->Complete(r.id, r.fence, Ok("ok"), kTtl)) ++failures;
    });
  }
  ASSERT_TRUE(Eventually([&] { return store->pending_writes() == kThreads; }));
  ASSERT_EQ(other.Exec("ROLLBACK"), SQLITE_OK);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // The writer may have taken the first arrival on its own before it blocked.
  EXPECT_LE(store->commits() - commits_before, 2u);
}

// The thread whose write reached the WAL's sync last (the commit's thread).
std::atomic<std::thread::id> syncing_thread;

TEST_F(SqliteStoreTest, ALoneWriteCommitsOnItsCallersThread) {
  auto store = Open();
  sqlite::SetWalSyncHookForTesting([] { syncing_thread = std::this_thread::get_id(); });
  auto claimed = store->Claim(Req("k"));
  Result<Record> completed = MakeError(ErrorCode::kInternal, "not run");
  if (claimed && claimed->claimed) {
    completed = store->Complete(claimed->record.id, claimed->record.fence, Ok("ok"), kTtl);
  }
  sqlite::SetWalSyncHookForTesting(nullptr);
  ASSERT_TRUE(claimed && claimed->claimed);
  ASSERT_TRUE(completed) << completed.error().ToString();
  // No hand-off to the writer's thread and back: the caller ran its batch.
  EXPECT_EQ(syncing_thread.load(), std::this_thread::get_id());
  EXPECT_EQ(store->commits(), 2u);
}

TEST_F(SqliteStoreTest, TwoStoresOnOneFileHaveExactlyOneClaimWinner) {
  constexpr int kThreadsPerStore = 16;
  auto a = Open();
  auto b = Open();
  std::atomic<int> winners{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2 * kThreadsPerStore; ++i) {
    SqliteStore* store = i % 2 ? a.get() : b.get();
    threads.emplace_back([&, store] {
      auto c = store->Claim(Req("race"));
      if (!c) {
        ADD_FAILURE() << c.error().ToString();
        ++errors;
      } else if (c->claimed) {
        ++winners;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(winners.load(), 1);
}

TEST_F(SqliteStoreTest, WaitForChangeSeesAnotherStoresWriteByPolling) {
  StoreOptions options;
  options.poll_interval = 50ms;
  auto a = Open(options);
  auto b = Open(options);
  auto c = a->Claim(Req("k"));
  ASSERT_TRUE(c);
  const TimePoint deadline = clock_.Now() + 10s;
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    auto w = b->WaitForChange(c->record.id, c->record, deadline);
    EXPECT_TRUE(w) << w.error().ToString();
    returned = true;
  });
  clock_.AwaitWaiters(1);
  ASSERT_TRUE(a->Complete(c->record.id, c->record.fence, Ok("x"), kTtl));
  // b's waiter is not woken by a's write; its next poll sees it.
  clock_.Advance(options.poll_interval);
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_LT(clock_.Now(), deadline);
}

TEST_F(SqliteStoreTest, PurgeRemovesOnlyExpiredRowsInIncrementsOfLimit) {
  auto store = Open();
  for (int i = 0; i < 25; ++i) {
    auto c = store->Claim(Req("old-" + std::to_string(i)));
    ASSERT_TRUE(c);
    ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("x"), Duration(1h) + 1s * i));
  }
  for (int i = 0; i < 5; ++i) {
    auto c = store->Claim(Req("live-" + std::to_string(i)));
    ASSERT_TRUE(c);
    ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("x"), 48h));
  }
  clock_.Advance(1h + 20s);  // old-0 … old-20 expired, old-21 … old-24 not yet
  EXPECT_EQ(*store->PurgeExpired(10), 10u);
  EXPECT_EQ(*store->PurgeExpired(10), 10u);
  EXPECT_EQ(*store->PurgeExpired(10), 1u);
  EXPECT_EQ(*store->PurgeExpired(10), 0u);
  EXPECT_EQ(*store->CountRecords(), 9u);
  for (int i = 21; i < 25; ++i) {
    auto got = store->Get(RecordId{"default", "old-" + std::to_string(i)});
    ASSERT_TRUE(got && got->has_value()) << i;
  }
  clock_.Advance(10s);
  EXPECT_EQ(*store->PurgeExpired(100), 4u);
  EXPECT_EQ(*store->CountRecords(), 5u);
}

TEST_F(SqliteStoreTest, FencesGrowAcrossEvictionEvenWhenAnotherClockIsBehind) {
  uint64_t evicted_fence = 0;
  {
    FakeClock ahead(clock_.Now() + 10h);
    auto store = SqliteStore::Open(path_, ahead, {});
    ASSERT_TRUE(store);
    auto c = (*store)->Claim(Req("k"));
    ASSERT_TRUE(c);
    evicted_fence = c->record.fence;
    ASSERT_TRUE((*store)->Evict(c->record.id));
  }
  auto store = Open();  // an instance whose clock is 10 h behind
  auto c = store->Claim(Req("k"));
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->claimed);
  EXPECT_GT(c->record.fence, evicted_fence);
}

TEST_F(SqliteStoreTest, UnknownStateInARowIsDataLossNamingTheKey) {
  auto store = Open();
  ASSERT_TRUE(store->Claim(Req("broken-key")));
  {
    RawDb raw(path_);
    ASSERT_EQ(raw.Exec("UPDATE records SET state = 'exploded'"), SQLITE_OK);
  }
  auto got = store->Get(RecordId{"default", "broken-key"});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, ErrorCode::kDataLoss);
  EXPECT_NE(got.error().message.find("broken-key"), std::string::npos) << got.error().message;
  EXPECT_NE(got.error().message.find("exploded"), std::string::npos);

  // A write that reads the broken row fails alone; the writer goes on.
  auto claim = store->Claim(Req("broken-key"));
  ASSERT_FALSE(claim);
  EXPECT_EQ(claim.error().code, ErrorCode::kDataLoss);
  auto other = store->Claim(Req("fine-key"));
  ASSERT_TRUE(other) << other.error().ToString();
  EXPECT_TRUE(other->claimed);
  auto evicted = store->Evict(RecordId{"default", "broken-key"});
  ASSERT_TRUE(evicted);
  EXPECT_TRUE(*evicted);
}

// The group commit writer rolls a batch back when one write hits a storage
// error, fails that write alone, and commits the others.
TEST_F(SqliteStoreTest, AWriteThatHitsACorruptRowFailsAloneInItsBatch) {
  StoreOptions options;
  options.sqlite_busy_timeout = 120s;
  auto store = Open(options);
  ASSERT_TRUE(store->Claim(Req("broken-key")));
  RawDb other(path_);
  ASSERT_EQ(other.Exec("UPDATE records SET state = 'exploded'"), SQLITE_OK);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), SQLITE_OK);
  const uint64_t commits_before = store->commits();

  // The writer takes the first claim and waits for the lock; the next two
  // queue behind it and so (almost always) share the next transaction.
  Result<ClaimResult> first = MakeError(ErrorCode::kInternal, "not run");
  Result<ClaimResult> broken = MakeError(ErrorCode::kInternal, "not run");
  Result<ClaimResult> fine = MakeError(ErrorCode::kInternal, "not run");
  std::thread blocked([&] { first = store->Claim(Req("first-key")); });
  ASSERT_TRUE(Eventually([&] { return store->pending_writes() == 1; }));
  std::thread a([&] { broken = store->Claim(Req("broken-key")); });
  std::thread b([&] { fine = store->Claim(Req("fine-key")); });
  ASSERT_TRUE(Eventually([&] { return store->pending_writes() == 3; }));
  ASSERT_EQ(other.Exec("ROLLBACK"), SQLITE_OK);
  blocked.join();
  a.join();
  b.join();

  ASSERT_FALSE(broken);
  EXPECT_EQ(broken.error().code, ErrorCode::kDataLoss);
  ASSERT_TRUE(first) << first.error().ToString();
  ASSERT_TRUE(fine) << fine.error().ToString();
  EXPECT_TRUE(fine->claimed);
  EXPECT_EQ(store->writes(), 3u);
  EXPECT_LE(store->commits() - commits_before, 2u);
  auto got = store->Get(RecordId{"default", "fine-key"});
  ASSERT_TRUE(got && got->has_value());
}

TEST_F(SqliteStoreTest, AttemptFiltersCombine) {
  auto store = Open();
  std::vector<Attempt> attempts;
  for (int i = 0; i < 8; ++i) {
    Attempt a;
    a.at = clock_.Now() + Duration(i);
    a.tenant = i % 2 ? "t1" : "t2";
    a.key = "k" + std::to_string(i % 4);
    a.tool = "charge";
    a.turn = "turn";
    a.outcome = i < 4 ? AttemptOutcome::kExecuted : AttemptOutcome::kReplayed;
    a.instance = "i";
    attempts.push_back(a);
  }
  ASSERT_TRUE(store->AppendAttempts(attempts));
  AttemptFilter f;
  f.tenant = "t1";
  f.outcome = AttemptOutcome::kReplayed;
  auto got = store->QueryAttempts(f);
  ASSERT_TRUE(got) << got.error().ToString();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].at, clock_.Now() + Duration(7));
  EXPECT_EQ((*got)[1].at, clock_.Now() + Duration(5));
  f.key = "k1";
  auto one = store->QueryAttempts(f);
  ASSERT_TRUE(one);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ(one->front().at, clock_.Now() + Duration(5));
  auto stats = store->SummarizeAttempts(f);
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->at("charge").attempts, 1u);
}

}  // namespace
}  // namespace idem
