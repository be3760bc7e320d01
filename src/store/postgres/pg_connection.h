// One libpq connection: prepared statements with binary parameters and
// results, and the translation of libpq and SQLSTATE errors into idem::Error
// codes. Not thread-safe: one thread uses a Connection at a time (the pool
// hands each to one request).
#pragma once

#include <cstdint>
#include <memory>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "idem/error.h"
#include "postgres_url.h"

typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;

namespace idem::postgres {

// Parameters of one statement, all sent in binary format (text as its bytes,
// bigint in network order, bytea as is) except the array literals. Their
// types are fixed at PQprepare from the first call, so a statement must
// always be given the same kinds in the same order.
class Params {
 public:
  Params& Text(std::string_view v);
  Params& Int(int64_t v);
  Params& Bytes(std::string_view v);
  Params& Null(unsigned type_oid);
  // A bigint[] or text[] in PostgreSQL's text array syntax (ArrayLiteral).
  Params& IntArray(std::string literal);
  Params& TextArray(std::string literal);

  int size() const { return static_cast<int>(values_.size()); }

 private:
  friend class Connection;
  Params& Add(unsigned type_oid, std::string value, int format, bool is_null = false);

  std::vector<std::string> values_;
  std::vector<unsigned> types_;
  std::vector<int> formats_;
  std::vector<bool> nulls_;
};

// Builds `{"a","b"}` for a text[] parameter: every element quoted, with `"`
// and `\` escaped.
std::string TextArrayLiteral(const std::vector<std::string_view>& items);
std::string IntArrayLiteral(const std::vector<int64_t>& items);

// A statement prepared once per connection under `name`, on first use.
struct Statement {
  std::string name;
  std::string sql;
};

// A statement and its parameters, for Connection::Prefetch.
struct Call {
  const Statement* statement;
  const Params* params;
};

// The rows of a statement, in binary format. Owns its PGresult.
class Rows {
 public:
  explicit Rows(PGresult* result);
  ~Rows();
  Rows(Rows&& other) noexcept;
  Rows& operator=(Rows&&) = delete;
  Rows(const Rows&) = delete;

  int size() const;
  // Rows a DELETE or UPDATE without RETURNING touched.
  uint64_t affected() const;
  bool IsNull(int row, int col) const;
  std::string_view Bytes(int row, int col) const;
  // A bigint column; nullopt if the value is not 8 bytes (not a bigint).
  std::optional<int64_t> Int(int row, int col) const;
  // A boolean column; nullopt if the value is not 1 byte (not a boolean).
  std::optional<bool> Bool(int row, int col) const;

 private:
  PGresult* result_;
};

// What went wrong with the last call, beyond its Error.
enum class Failure {
  kNone,
  kConnectionLost,  // the connection is dead: discard it
  kTransient,       // serialization failure or deadlock: nothing was applied, run it again
  kOther,
};

class Connection {
 public:
  // Connects with `url.conninfo` and points search_path at `url.schema`.
  // kUnavailable, naming url.where, if the server cannot be reached or
  // refuses the login.
  static Result<std::unique_ptr<Connection>> Open(const PostgresUrl& url);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs `st` (prepared on this connection the first time) with `params`.
  // `what` names the operation for error messages ("completing record k").
  Result<Rows> Execute(const Statement& st, const Params& params, std::string_view what);
  // Sends a prefix of `calls` to the server in one go (pipeline mode: one
  // round trip instead of one each) and keeps their results: the next
  // Execute of the same Statement with the same Params object returns its
  // kept result instead of running it again. The prefix ends where the
  // parameters reach kMaxPrefetchBytes (so neither side's socket buffer
  // fills while the other waits); the rest, and calls the server skipped
  // after one that failed, run when their Execute asks. For statements inside
  // an open transaction, each of which will be asked for. Returns the index
  // of the call that failed, if one did (the transaction is then aborted:
  // ask for that call's result next); kUnavailable if the connection broke
  // (nothing kept).
  Result<std::optional<size_t>> Prefetch(std::span<const Call> calls, std::string_view what);
  // Forgets the results Prefetch kept that no Execute asked for.
  void DropPrefetched() { prefetched_.clear(); }
  static constexpr size_t kMaxPrefetchBytes = 32 * 1024;

  // Runs one parameterised statement without keeping it prepared (schema
  // migration, administration).
  Result<Rows> ExecuteOnce(std::string_view sql, const Params& params, std::string_view what);
  // Runs fixed SQL text (may hold several statements; no parameters).
  Result<void> ExecuteScript(std::string_view sql, std::string_view what);

  // Quotes `name` as an SQL identifier.
  Result<std::string> QuoteIdentifier(std::string_view name);

  // Cheap check before use: no round trip, but notices a server that closed
  // the connection (restart, shutdown) while it sat idle in the pool.
  bool LooksAlive();
  // Why the last Execute failed.
  Failure last_failure() const { return last_failure_; }
  // The socket to poll for notifications; -1 if closed.
  int socket() const;
  PGconn* raw() { return conn_; }
  const std::string& where() const { return where_; }

  // The connection-level error: kUnavailable, "retryable", naming where().
  Error Unavailable(std::string_view what, std::string_view why) const;

 private:
  Connection(PGconn* conn, std::string where);
  Result<Rows> Check(PGresult* result, std::string_view what);
  // Prepares `st` on this connection unless it already is.
  Result<void> Prepare(const Statement& st, const Params& params, std::string_view what);
  // The kept result of (st, params), if Prefetch kept one.
  std::optional<Result<Rows>> TakePrefetched(const Statement& st, const Params& params);

  // Pointers into the values of `params`, as libpq takes them.
  struct Values {
    std::vector<const char*> values;
    std::vector<int> lengths;
  };
  static Values ValuesOf(const Params& params);

  struct Prefetched {
    Call call;
    Result<Rows> rows;
    Failure failure;
  };

  PGconn* conn_;
  const std::string where_;
  std::unordered_set<std::string> prepared_;
  std::list<Prefetched> prefetched_;  // Rows cannot be move-assigned: no deque
  Failure last_failure_ = Failure::kNone;
};

}  // namespace idem::postgres
