#include "sqlite_connection.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

namespace idem::sqlite {
namespace {

// What the operator can do, by primary result code.
std::string_view Advice(int primary) {
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return "the database file is locked by another process (or another store object) that "
             "holds a write transaction; retry later, find the process holding it (fuser/lsof), "
             "or raise the SQLite busy timeout";
    case SQLITE_READONLY:
      return "the database is read-only to this process: idemgate must be able to write the file, "
             "its -wal and -shm files and its directory; fix the permissions or mount, or choose "
             "another store path";
    case SQLITE_CANTOPEN:
      return "the file cannot be opened: check that the path is a regular file in a directory "
             "this process can write, or choose another store path";
    case SQLITE_FULL:
      return "the disk is full: free space and retry";
    case SQLITE_IOERR:
      return "an I/O error hit the file: check the disk and the file system, then retry";
    case SQLITE_NOMEM:
      return "SQLite ran out of memory; retry later";
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return "the file is not a usable SQLite database (corrupt, or not a database at all); it was "
             "left untouched: move it aside or restore a backup, and idemgate creates a new one";
    case SQLITE_TOOBIG:
      return "a value is larger than SQLite accepts; lower max_result_bytes";
    default:
      return "this is a bug in idemgate's SQLite store; please report it with this message";
  }
}

ErrorCode CodeFor(int primary) {
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_NOMEM:
    case SQLITE_PROTOCOL:
      return ErrorCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return ErrorCode::kDataLoss;
    case SQLITE_TOOBIG:
      return ErrorCode::kResourceExhausted;
    default:
      return ErrorCode::kInternal;
  }
}

}  // namespace

Error ErrorFromSqlite(int rc, std::string_view detail, const std::string& path,
                      std::string_view doing) {
  const int primary = rc & 0xff;
  std::string what(sqlite3_errstr(rc));
  if (!detail.empty() && detail != what) what = fmt::format("{} ({})", detail, what);
  return Error{CodeFor(primary),
               fmt::format("sqlite store {}: {}: {}; {}", path, doing, what, Advice(primary))};
}

bool IsStorageFailure(ErrorCode code) {
  return code == ErrorCode::kUnavailable || code == ErrorCode::kDataLoss ||
         code == ErrorCode::kInternal || code == ErrorCode::kResourceExhausted;
}

Statement::Statement(Statement&& other) noexcept
    : conn_(other.conn_), stmt_(std::exchange(other.stmt_, nullptr)), bind_rc_(other.bind_rc_) {}

Statement::~Statement() {
  if (stmt_ != nullptr) sqlite3_reset(stmt_);
}

void Statement::BindInt(int index, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void Statement::BindText(int index, std::string_view value) {
  const int rc =
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void Statement::BindBlob(int index, std::string_view value) {
  const int rc = sqlite3_bind_blob64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void Statement::BindNull(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

Result<bool> Statement::Step() {
  if (bind_rc_ != SQLITE_OK) {
    return std::unexpected(
        conn_->ErrorFor(bind_rc_, fmt::format("binding `{}`", sqlite3_sql(stmt_))));
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return std::unexpected(conn_->ErrorFor(rc, fmt::format("running `{}`", sqlite3_sql(stmt_))));
}

Result<void> Statement::Run() {
  for (;;) {
    auto row = Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) return {};
  }
}

int64_t Statement::ColumnInt(int index) const { return sqlite3_column_int64(stmt_, index); }

std::string_view Statement::ColumnText(int index) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index));
  const int n = sqlite3_column_bytes(stmt_, index);
  return p == nullptr ? std::string_view() : std::string_view(p, n);
}

std::string_view Statement::ColumnBlob(int index) const {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, index));
  const int n = sqlite3_column_bytes(stmt_, index);
  return p == nullptr ? std::string_view() : std::string_view(p, n);
}

bool Statement::ColumnIsNull(int index) const {
  return sqlite3_column_type(stmt_, index) == SQLITE_NULL;
}

// SQLite counts every allocation it makes (sqlite3_memory_used) under one
// process-wide mutex, unless told not to before it initializes; idemgate
// reads none of those counters. Off, binding a text value (a copy) and each
// statement's own allocations take no lock. A process that used SQLite
// before this (then the call fails with SQLITE_MISUSE) keeps the default.
void ConfigureSqlite() {
  static std::once_flag once;
  std::call_once(once, [] { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
}

Result<std::unique_ptr<Connection>> Connection::Open(const std::string& path, Duration busy_timeout,
                                                     const char* vfs) {
  ConfigureSqlite();
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, vfs);
  if (rc != SQLITE_OK) {
    Error error = ErrorFromSqlite(rc, db != nullptr ? sqlite3_errmsg(db) : "", path, "opening");
    sqlite3_close_v2(db);
    return std::unexpected(std::move(error));
  }
  std::unique_ptr<Connection> conn(new Connection(db, path));
  sqlite3_extended_result_codes(db, 1);
  conn->busy_timeout_ = busy_timeout;
  sqlite3_busy_handler(db, &Connection::OnBusy, conn.get());
  return conn;
}

int Connection::OnBusy(void* self, int tries) {
  auto* conn = static_cast<Connection*>(self);
  const auto now = std::chrono::steady_clock::now();
  if (tries == 0) conn->busy_since_ = now;
  if (now - conn->busy_since_ >= conn->busy_timeout_) return 0;  // give up: SQLITE_BUSY
  const auto pause = std::chrono::microseconds(std::min(100 << std::min(tries, 5), 2000));
  std::this_thread::sleep_for(pause);
  return 1;
}

Connection::~Connection() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

Result<void> Connection::Exec(const char* sql, std::string_view doing) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return std::unexpected(ErrorFor(rc, doing));
  return {};
}

Result<Statement> Connection::Prepare(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      return std::unexpected(ErrorFor(rc, fmt::format("preparing `{}`", sql)));
    }
    it = statements_.emplace(std::string(sql), stmt).first;
  }
  return Statement(this, it->second);
}

Result<Statement> Connection::QueryRow(const char* sql, std::string_view doing) {
  auto stmt = Prepare(sql);
  if (!stmt) return std::unexpected(ErrorFor(sqlite3_extended_errcode(db_), doing));
  const int rc = sqlite3_step(stmt->stmt_);
  if (rc == SQLITE_ROW) return stmt;
  if (rc == SQLITE_DONE) {
    return MakeError(ErrorCode::kInternal,
                     fmt::format("sqlite store {}: {}: no row", path_, doing));
  }
  return std::unexpected(ErrorFor(rc, doing));
}

Result<int64_t> Connection::QueryInt(const char* sql, std::string_view doing) {
  auto row = QueryRow(sql, doing);
  if (!row) return std::unexpected(std::move(row.error()));
  return row->ColumnInt(0);
}

Result<std::string> Connection::QueryText(const char* sql, std::string_view doing) {
  auto row = QueryRow(sql, doing);
  if (!row) return std::unexpected(std::move(row.error()));
  return std::string(row->ColumnText(0));
}

Error Connection::ErrorFor(int rc, std::string_view doing) const {
  const int current = sqlite3_extended_errcode(db_);
  // sqlite3_errmsg describes the most recent failure; only use it when it is this one.
  std::string_view detail = current == rc ? sqlite3_errmsg(db_) : "";
  return ErrorFromSqlite(rc, detail, path_, doing);
}

}  // namespace idem::sqlite
