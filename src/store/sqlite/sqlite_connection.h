// A thin RAII layer over one sqlite3 connection: cached prepared statements
// and the translation of SQLite result codes into idem::Error at the edge.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "idem/clock.h"
#include "idem/error.h"

namespace idem::sqlite {

// Translates a SQLite result code into an Error that names the file, what was
// being done and what the operator can do about it:
// BUSY/LOCKED/IOERR/FULL/CANTOPEN/READONLY/NOMEM → kUnavailable,
// CORRUPT/NOTADB → kDataLoss, TOOBIG → kResourceExhausted, anything else →
// kInternal. `detail` is sqlite3_errmsg() of the connection, if any.
Error ErrorFromSqlite(int rc, std::string_view detail, const std::string& path,
                      std::string_view doing);

// True for the codes ErrorFromSqlite gives to a failure of the database itself
// (as opposed to a record in the wrong state).
bool IsStorageFailure(ErrorCode code);

// Settings SQLite takes only before it initializes: call it before anything
// else of SQLite's (Connection::Open does; so does whatever calls SQLite
// before a connection is opened, such as a VFS's registration). Idempotent.
void ConfigureSqlite();

class Connection;

// A prepared statement borrowed from a Connection's cache for one execution.
// Binds values (never concatenated into SQL), steps, reads columns; resets the
// statement when it goes out of scope so no read transaction stays open.
// Parameters and columns are numbered as in SQLite: binds from 1, columns
// from 0. Not thread-safe, like its connection.
class Statement {
 public:
  Statement(Connection* conn, sqlite3_stmt* stmt) : conn_(conn), stmt_(stmt) {}
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  ~Statement();

  // Binding failures are remembered and returned by the next Step().
  void BindInt(int index, int64_t value);
  void BindText(int index, std::string_view value);
  void BindBlob(int index, std::string_view value);
  void BindNull(int index);

  // Returns true when a row is available, false when the statement is done.
  Result<bool> Step();
  // Steps until done, ignoring rows. For INSERT/UPDATE/DELETE.
  Result<void> Run();

  int64_t ColumnInt(int index) const;
  // Valid until the next Step() or the end of this Statement.
  std::string_view ColumnText(int index) const;
  std::string_view ColumnBlob(int index) const;
  bool ColumnIsNull(int index) const;

 private:
  friend class Connection;

  Connection* conn_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;
};

// One sqlite3 connection opened in multi-thread mode: it must be used by one
// thread at a time (the group-commit writer owns one; readers borrow one each
// from a pool). Prepared statements are compiled once with
// SQLITE_PREPARE_PERSISTENT and reused.
class Connection {
 public:
  // Opens the existing file at `path` read-write (it is never created here)
  // with extended result codes and the busy timeout set, through the VFS
  // named `vfs` (nullptr: SQLite's default). kUnavailable / kDataLoss as
  // ErrorFromSqlite.
  static Result<std::unique_ptr<Connection>> Open(const std::string& path, Duration busy_timeout,
                                                  const char* vfs = nullptr);

  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs fixed SQL without parameters or rows of interest: BEGIN, COMMIT,
  // DDL, pragmas whose arguments come from code. Never for values.
  Result<void> Exec(const char* sql, std::string_view doing);

  // Returns the cached statement for `sql`, compiling it on first use.
  Result<Statement> Prepare(std::string_view sql);

  // Runs fixed SQL that returns one value in one row (PRAGMA user_version
  // and similar) and returns it. Errors name `doing`.
  Result<int64_t> QueryInt(const char* sql, std::string_view doing);
  Result<std::string> QueryText(const char* sql, std::string_view doing);

  // Builds the Error for `rc` with this connection's message and path.
  Error ErrorFor(int rc, std::string_view doing) const;

  bool InTransaction() const { return sqlite3_get_autocommit(db_) == 0; }
  const std::string& path() const { return path_; }
  sqlite3* handle() const { return db_; }

 private:
  Connection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  // Prepares and steps `sql` to its first row, naming `doing` on errors.
  Result<Statement> QueryRow(const char* sql, std::string_view doing);

  // SQLite's default busy handler sleeps 1, 2, 5 … 100 ms between tries,
  // which puts 100 ms into the tail latency of every process waiting for
  // another's short write transaction. This one retries every 100 µs,
  // backing off to 2 ms, until busy_timeout_ has passed.
  static int OnBusy(void* self, int tries);

  sqlite3* db_;
  std::string path_;
  std::chrono::milliseconds busy_timeout_{0};
  std::chrono::steady_clock::time_point busy_since_{};
  // Heterogeneous lookup: finding a statement does not copy its SQL. The hash
  // reads the length and the first and last 32 bytes only: statements are
  // hundreds of bytes, a call looks up about ten, and hashing every byte was
  // 1% of a gated MCP call's instructions. Statements that share both ends
  // and the length only cost the map a comparison.
  struct SqlHash {
    using is_transparent = void;
    size_t operator()(std::string_view sql) const {
      constexpr size_t kEnd = 32;
      if (sql.size() <= 2 * kEnd) return std::hash<std::string_view>()(sql);
      const std::hash<std::string_view> h;
      return h(sql.substr(0, kEnd)) ^ (h(sql.substr(sql.size() - kEnd)) * 31) ^ sql.size();
    }
  };
  std::unordered_map<std::string, sqlite3_stmt*, SqlHash, std::equal_to<>> statements_;
};

}  // namespace idem::sqlite
