// Bare SQLite doing the row writes of claim→complete calls, without SqliteStore: the
// baselines the group-commit targets are stated against (docs/DESIGN.md §5). Shared by
// sqlite_baseline_bench and ledger_bench so that both compare against the same thing.
//
// A claim→complete call is two row writes: an INSERT of the in-progress row, then an UPDATE of
// that row with the outcome. The baselines do them in a fresh file with the records table laid
// out as SqliteStore lays it out (src/store/sqlite/sqlite_schema.cc), WAL, the given
// synchronous mode and prepared statements, either (a) with one commit per write — what a
// store without group commit pays — or (b) with 100 writes per commit — the throughput a
// single writer reaches when it never waits for anyone.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

namespace idem_bench {

// Exits the benchmark with SQLite's message unless `rc` is a success code.
inline void CheckSqlite(int rc, sqlite3* db, const char* what) {
  if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return;
  std::fprintf(stderr, "bench: %s: %s\n", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  std::exit(1);
}

inline void ExecSqlite(sqlite3* db, const char* sql) {
  CheckSqlite(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), db, sql);
}

// "full" (the default and anything unrecognised), "normal" or "off", as fixed SQL.
inline const char* SynchronousPragma(const std::string& mode) {
  if (mode == "normal") return "PRAGMA synchronous = NORMAL";
  if (mode == "off") return "PRAGMA synchronous = OFF";
  return "PRAGMA synchronous = FULL";
}

inline int64_t WallMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One connection to a fresh file holding the records table, with the two writes of a call
// prepared. Not thread-safe.
class BareSqlite {
 public:
  BareSqlite(const std::string& path, const std::string& synchronous) {
    CheckSqlite(sqlite3_open(path.c_str(), &db_), db_, "open");
    ExecSqlite(db_, "PRAGMA journal_mode = WAL");
    ExecSqlite(db_, SynchronousPragma(synchronous));
    ExecSqlite(db_,
               "CREATE TABLE records (tenant TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT "
               "NULL, fingerprint TEXT NOT NULL, tool TEXT NOT NULL, turn TEXT NOT NULL, fence "
               "INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, lease_expires_at_ms INTEGER "
               "NOT NULL, completed_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, "
               "outcome_class TEXT, outcome_body BLOB, PRIMARY KEY (tenant, key)) STRICT;"
               "CREATE INDEX records_by_expiry ON records (expires_at_ms);");
    Prepare(
        "INSERT INTO records VALUES ('default', ?1, 'in_progress', ?4, 'charge', 'turn', ?2, "
        "?3, ?3 + 30000, 0, ?3 + 86400000, NULL, NULL)",
        &insert_);
    Prepare(
        "UPDATE records SET state = 'completed', outcome_class = 'success', outcome_body = ?2, "
        "completed_at_ms = ?3, expires_at_ms = ?3 + 86400000 WHERE tenant = 'default' AND key = ?1",
        &update_);
    Prepare("BEGIN IMMEDIATE", &begin_);
    Prepare("COMMIT", &commit_);
  }
  ~BareSqlite() {
    for (sqlite3_stmt* s : {insert_, update_, begin_, commit_}) sqlite3_finalize(s);
    sqlite3_close(db_);
  }
  BareSqlite(const BareSqlite&) = delete;
  BareSqlite& operator=(const BareSqlite&) = delete;

  void Begin() { Step(begin_); }
  void Commit() { Step(commit_); }

  // The claim: an in-progress row for `key`.
  void Insert(std::string_view key, std::string_view fingerprint, int64_t now_ms) {
    sqlite3_bind_text(insert_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_int64(insert_, 2, now_ms * 1000);
    sqlite3_bind_int64(insert_, 3, now_ms);
    sqlite3_bind_text(insert_, 4, fingerprint.data(), static_cast<int>(fingerprint.size()),
                      SQLITE_STATIC);
    Step(insert_);
  }

  // The completion: the outcome `body` stored in `key`'s row.
  void Update(std::string_view key, std::string_view body, int64_t now_ms) {
    sqlite3_bind_text(update_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_blob(update_, 2, body.data(), static_cast<int>(body.size()), SQLITE_STATIC);
    sqlite3_bind_int64(update_, 3, now_ms);
    Step(update_);
  }

 private:
  void Prepare(const char* sql, sqlite3_stmt** stmt) {
    CheckSqlite(sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, stmt, nullptr), db_,
                sql);
  }
  void Step(sqlite3_stmt* stmt) {
    CheckSqlite(sqlite3_step(stmt), db_, sqlite3_sql(stmt));
    sqlite3_reset(stmt);
  }

  sqlite3* db_ = nullptr;
  sqlite3_stmt* insert_ = nullptr;
  sqlite3_stmt* update_ = nullptr;
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
};

// What the baselines write for the n-th call (n counts from 0 within one run).
struct BareCalls {
  std::function<std::string(uint64_t n)> key;
  std::function<std::string(uint64_t n)> fingerprint;
  std::string body;  // the stored outcome
};

inline constexpr int kCallsPerBatchedCommit = 50;  // 100 writes per commit

// Calls per second for `seconds` with one commit (and one fsync) per row write.
inline double BareOneCommitPerWrite(const std::string& path, const std::string& synchronous,
                                    double seconds, const BareCalls& calls) {
  using Clock = std::chrono::steady_clock;
  BareSqlite db(path, synchronous);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  uint64_t n = 0;
  while (Clock::now() < end) {
    const std::string key = calls.key(n);
    db.Begin();
    db.Insert(key, calls.fingerprint(n), WallMillis());
    db.Commit();
    db.Begin();
    db.Update(key, calls.body, WallMillis());
    db.Commit();
    ++n;
  }
  return n / std::chrono::duration<double>(Clock::now() - start).count();
}

// Calls per second for `seconds` with 100 row writes (50 calls) per commit.
inline double BareBatched(const std::string& path, const std::string& synchronous, double seconds,
                          const BareCalls& calls) {
  using Clock = std::chrono::steady_clock;
  BareSqlite db(path, synchronous);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  uint64_t n = 0;
  while (Clock::now() < end) {
    db.Begin();
    for (int i = 0; i < kCallsPerBatchedCommit; ++i, ++n) {
      const std::string key = calls.key(n);
      db.Insert(key, calls.fingerprint(n), WallMillis());
      db.Update(key, calls.body, WallMillis());
    }
    db.Commit();
  }
  return n / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace idem_bench
