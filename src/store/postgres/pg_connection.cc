#include "pg_connection.h"

#include <endian.h>
#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>

#include <charconv>
#include <cstring>

namespace idem::postgres {
namespace {

// Built-in type OIDs (catalog/pg_type.dat); stable across releases.
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;
constexpr Oid kTextArrayOid = 1009;
constexpr Oid kInt8ArrayOid = 1016;

constexpr int kTextFormat = 0;
constexpr int kBinaryFormat = 1;

// libpq messages end in a newline and may continue on tab-indented lines.
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

struct Classified {
  ErrorCode code;
  Failure failure;
};

// What a caller should do about an SQLSTATE (Appendix A of the PostgreSQL
// manual). An error without one comes from libpq itself: the connection is
// unusable.
Classified Classify(std::string_view state) {
  const std::string_view cls = state.substr(0, 2);
  if (state.empty()) return {ErrorCode::kUnavailable, Failure::kConnectionLost};
  if (state == "40001" || state == "40P01") return {ErrorCode::kUnavailable, Failure::kTransient};
  if (cls == "08" || state == "57P01" || state == "57P02" || state == "57P03") {
    return {ErrorCode::kUnavailable, Failure::kConnectionLost};
  }
  // Out of disk, memory or connections; a lock or statement timeout; a
  // read-only standby after a fail-over: all pass, none is the caller's fault.
  if (cls == "53" || state == "55P03" || state == "57014" || state == "25006") {
    return {ErrorCode::kUnavailable, Failure::kOther};
  }
  if (cls == "22") return {ErrorCode::kInvalidArgument, Failure::kOther};
  if (state == "XX001" || state == "XX002") return {ErrorCode::kDataLoss, Failure::kOther};
  // Tables or privileges not as the schema migration left them.
  if (cls == "42" || cls == "3F") return {ErrorCode::kFailedPrecondition, Failure::kOther};
  return {ErrorCode::kInternal, Failure::kOther};
}

}  // namespace

Params& Params::Add(unsigned type_oid, std::string value, int format, bool is_null) {
  values_.push_back(std::move(value));
  types_.push_back(type_oid);
  formats_.push_back(format);
  nulls_.push_back(is_null);
  return *this;
}

Params& Params::Text(std::string_view v) { return Add(kTextOid, std::string(v), kBinaryFormat); }

Params& Params::Int(int64_t v) {
  const uint64_t be = htobe64(static_cast<uint64_t>(v));
  std::string bytes(sizeof be, '\0');
  std::memcpy(bytes.data(), &be, sizeof be);
  return Add(kInt8Oid, std::move(bytes), kBinaryFormat);
}

Params& Params::Bytes(std::string_view v) { return Add(kByteaOid, std::string(v), kBinaryFormat); }

Params& Params::Null(unsigned type_oid) { return Add(type_oid, "", kBinaryFormat, true); }

Params& Params::IntArray(std::string literal) {
  return Add(kInt8ArrayOid, std::move(literal), kTextFormat);
}

Params& Params::TextArray(std::string literal) {
  return Add(kTextArrayOid, std::move(literal), kTextFormat);
}

std::string TextArrayLiteral(const std::vector<std::string_view>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

std::string IntArrayLiteral(const std::vector<int64_t>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(items[i]);
  }
  out += '}';
  return out;
}

Rows::Rows(PGresult* result) : result_(result) {}
Rows::~Rows() {
  if (result_) PQclear(result_);
}
Rows::Rows(Rows&& other) noexcept : result_(other.result_) { other.result_ = nullptr; }

int Rows::size() const { return PQntuples(result_); }

uint64_t Rows::affected() const {
  const char* text = PQcmdTuples(result_);
  uint64_t n = 0;
  std::from_chars(text, text + std::strlen(text), n);
  return n;
}

bool Rows::IsNull(int row, int col) const { return PQgetisnull(result_, row, col) != 0; }

std::string_view Rows::Bytes(int row, int col) const {
  return std::string_view(PQgetvalue(result_, row, col),
                          static_cast<size_t>(PQgetlength(result_, row, col)));
}

std::optional<int64_t> Rows::Int(int row, int col) const {
  if (IsNull(row, col) || PQgetlength(result_, row, col) != 8) return std::nullopt;
  uint64_t be;
  std::memcpy(&be, PQgetvalue(result_, row, col), sizeof be);
  return static_cast<int64_t>(be64toh(be));
}

std::optional<bool> Rows::Bool(int row, int col) const {
  if (IsNull(row, col) || PQgetlength(result_, row, col) != 1) return std::nullopt;
  return *PQgetvalue(result_, row, col) != 0;
}

Connection::Connection(PGconn* conn, std::string where) : conn_(conn), where_(std::move(where)) {}

Connection::~Connection() { PQfinish(conn_); }

Result<std::unique_ptr<Connection>> Connection::Open(const PostgresUrl& url) {
  std::vector<const char*> keywords, values;
  for (const auto& [k, v] : url.conninfo) {
    keywords.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keywords.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* raw = PQconnectdbParams(keywords.data(), values.data(), /*expand_dbname=*/0);
  if (raw == nullptr) {
    return MakeError(
        ErrorCode::kUnavailable,
        fmt::format("postgres store {}: connecting failed: out of memory; retryable", url.where));
  }
  std::unique_ptr<Connection> conn(new Connection(raw, url.where));
  if (PQstatus(raw) != CONNECTION_OK) {
    return std::unexpected(conn->Unavailable("connecting", PQerrorMessage(raw)));
  }
  // Notices ("schema already exists, skipping") are not errors; libpq's
  // default receiver would print them on stderr, which belongs to the fronts.
  PQsetNoticeReceiver(
      raw, [](void*, const PGresult*) {}, nullptr);

  auto quoted = conn->QuoteIdentifier(url.schema);
  if (!quoted) return std::unexpected(std::move(quoted.error()));
  Params p;
  p.Text(*quoted);
  auto set = conn->ExecuteOnce("SELECT pg_catalog.set_config('search_path', $1, false)", p,
                               "setting the search path");
  if (!set) return std::unexpected(std::move(set.error()));
  return conn;
}

Error Connection::Unavailable(std::string_view what, std::string_view why) const {
  return Error{ErrorCode::kUnavailable,
               fmt::format("postgres store {}: {} failed: {}; retryable: the server may be down "
                           "or restarting, idemgate reconnects with backoff",
                           where_, what, OneLine(why))};
}

Result<Rows> Connection::Check(PGresult* result, std::string_view what) {
  const ExecStatusType status = result ? PQresultStatus(result) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) {
    last_failure_ = Failure::kNone;
    return Rows(result);
  }
  Rows owned(result);  // frees it on every path below
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  const char* primary = result ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  const std::string why = primary ? primary : PQerrorMessage(conn_);
  Classified c = Classify(state ? state : "");
  if (PQstatus(conn_) != CONNECTION_OK) c = {ErrorCode::kUnavailable, Failure::kConnectionLost};
  last_failure_ = c.failure;
  if (c.code == ErrorCode::kUnavailable) return std::unexpected(Unavailable(what, why));
  return std::unexpected(
      Error{c.code, fmt::format("postgres store {}: {} failed: {} (SQLSTATE {})", where_, what,
                                OneLine(why), state ? state : "none")});
}

Connection::Values Connection::ValuesOf(const Params& params) {
  Values v;
  v.values.resize(params.values_.size());
  v.lengths.resize(params.values_.size());
  for (size_t i = 0; i < v.values.size(); ++i) {
    v.values[i] = params.nulls_[i] ? nullptr : params.values_[i].data();
    v.lengths[i] = static_cast<int>(params.values_[i].size());
  }
  return v;
}

Result<void> Connection::Prepare(const Statement& st, const Params& params,
                                 std::string_view what) {
  if (prepared_.contains(st.name)) return {};
  auto prepared =
      Check(PQprepare(conn_, st.name.c_str(), st.sql.c_str(), params.size(), params.types_.data()),
            what);
  if (!prepared) return std::unexpected(std::move(prepared.error()));
  prepared_.insert(st.name);
  return {};
}

std::optional<Result<Rows>> Connection::TakePrefetched(const Statement& st, const Params& params) {
  for (auto it = prefetched_.begin(); it != prefetched_.end(); ++it) {
    if (it->call.statement != &st || it->call.params != &params) continue;
    Result<Rows> rows = std::move(it->rows);
    last_failure_ = it->failure;
    prefetched_.erase(it);
    return rows;
  }
  return std::nullopt;
}

Result<Rows> Connection::Execute(const Statement& st, const Params& params, std::string_view what) {
  if (!prefetched_.empty()) {
    if (auto kept = TakePrefetched(st, params)) return std::move(*kept);
  }
  if (auto ok = Prepare(st, params, what); !ok) return std::unexpected(std::move(ok.error()));
  const Values v = ValuesOf(params);
  return Check(PQexecPrepared(conn_, st.name.c_str(), params.size(), v.values.data(),
                              v.lengths.data(), params.formats_.data(), kBinaryFormat),
               what);
}

Result<std::optional<size_t>> Connection::Prefetch(std::span<const Call> calls,
                                                   std::string_view what) {
  prefetched_.clear();
  size_t n = 0, bytes = 0;
  for (; n < calls.size(); ++n) {
    for (const std::string& value : calls[n].params->values_) bytes += value.size();
    if (n > 0 && bytes > kMaxPrefetchBytes) break;
    if (auto ok = Prepare(*calls[n].statement, *calls[n].params, what); !ok) {
      return std::unexpected(std::move(ok.error()));
    }
  }
  auto broken = [&]() -> Result<std::optional<size_t>> {
    prefetched_.clear();
    last_failure_ = Failure::kConnectionLost;
    return std::unexpected(Unavailable(what, PQerrorMessage(conn_)));
  };
  if (PQenterPipelineMode(conn_) != 1) return broken();
  for (size_t i = 0; i < n; ++i) {
    const Params& p = *calls[i].params;
    const Values v = ValuesOf(p);
    if (PQsendQueryPrepared(conn_, calls[i].statement->name.c_str(), p.size(), v.values.data(),
                            v.lengths.data(), p.formats_.data(), kBinaryFormat) != 1) {
      return broken();
    }
  }
  if (PQpipelineSync(conn_) != 1) return broken();
  std::optional<size_t> failed;
  for (size_t i = 0; i < n; ++i) {
    PGresult* r = PQgetResult(conn_);
    if (r == nullptr) return broken();
    if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
      PQclear(r);  // skipped after a failure: runs when asked for, in the aborted transaction
    } else {
      Result<Rows> rows = Check(r, what);
      if (!rows && !failed) failed = i;
      prefetched_.push_back(Prefetched{calls[i], std::move(rows), last_failure_});
    }
    while ((r = PQgetResult(conn_)) != nullptr) PQclear(r);  // the end of this call's results
  }
  PGresult* sync = PQgetResult(conn_);
  const bool synced = sync != nullptr && PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
  PQclear(sync);
  if (!synced || PQexitPipelineMode(conn_) != 1 || PQstatus(conn_) != CONNECTION_OK) {
    return broken();
  }
  last_failure_ = Failure::kNone;
  return failed;
}

Result<Rows> Connection::ExecuteOnce(std::string_view sql, const Params& params,
                                     std::string_view what) {
  const Values v = ValuesOf(params);
  const std::string text(sql);
  return Check(PQexecParams(conn_, text.c_str(), params.size(), params.types_.data(),
                            v.values.data(), v.lengths.data(), params.formats_.data(),
                            kBinaryFormat),
               what);
}

Result<void> Connection::ExecuteScript(std::string_view sql, std::string_view what) {
  const std::string text(sql);
  auto done = Check(PQexec(conn_, text.c_str()), what);
  if (!done) return std::unexpected(std::move(done.error()));
  return {};
}

Result<std::string> Connection::QuoteIdentifier(std::string_view name) {
  char* quoted = PQescapeIdentifier(conn_, name.data(), name.size());
  if (quoted == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("postgres store {}: \"{}\" cannot be an SQL identifier: {}",
                                 where_, name, OneLine(PQerrorMessage(conn_))));
  }
  std::string out(quoted);
  PQfreemem(quoted);
  return out;
}

bool Connection::LooksAlive() {
  if (PQstatus(conn_) != CONNECTION_OK || PQtransactionStatus(conn_) != PQTRANS_IDLE) {
    return false;
  }
  // An idle connection has nothing to read unless the server said goodbye
  // (a shutdown or a terminated backend) or closed the socket.
  pollfd p{PQsocket(conn_), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0 && PQconsumeInput(conn_) == 0) return false;
  return PQstatus(conn_) == CONNECTION_OK;
}

int Connection::socket() const { return PQsocket(conn_); }

}  // namespace idem::postgres
