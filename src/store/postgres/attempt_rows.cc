#include "attempt_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "pg_schema.h"

namespace idem::postgres {

// Each entry as the next of its tenant's chain (pg_schema.cc, schema 5).
const Statement kInsertAttempts{
    "idem_insert_attempts",
    "SELECT idemgate_log_attempts($1::bigint[], $2::text[], $3::text[], $4::text[], "
    "$5::text[], $6::text[], $7::bigint[], $8::text[], $9::text[])"};

namespace {

#define IDEM_ATTEMPT_COLUMNS \
  "at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, detail, seq, prev_hash, hash"

const Statement kSelectHeads{"idem_select_heads",
                             "SELECT tenant, seq, hash, start_seq, start_prev "
                             "FROM idemgate_attempt_heads ORDER BY tenant"};
const Statement kSelectHead{"idem_select_head",
                            "SELECT tenant, seq, hash, start_seq, start_prev "
                            "FROM idemgate_attempt_heads WHERE tenant = $1"};

// ReadChain: [tenant given][cursor given]; $1 the tenant, the cursor
// (tenant, seq, id) in $2..$4, the limit $5 (the parameters are typed:
// those a variant does not read are sent all the same).
Statement ChainStatement(bool tenant, bool cursor) {
  return Statement{
      fmt::format("idem_read_chain_{}{}", int(tenant), int(cursor)),
      fmt::format("SELECT " IDEM_ATTEMPT_COLUMNS ", id FROM idemgate_attempts WHERE {} AND {} "
                  "ORDER BY tenant, seq, id LIMIT $5",
                  tenant ? "tenant = $1" : "true",
                  cursor ? "(tenant, seq, id) > ($2, $3, $4)" : "true")};
}

// A prefix of each chain (up to its first entry not older than $1), at most
// $2 rows, and each head's restart point moved past the rows removed: one
// statement, so the rows and the heads change together.
const Statement kPurgeAttempts{
    "idem_purge_attempts",
    "WITH cut AS (SELECT tenant, coalesce(min(seq) FILTER (WHERE at_ms >= $1), "
    "max(seq) + 1) - 1 AS seq FROM idemgate_attempts WHERE seq > 0 GROUP BY tenant), "
    "victims AS (SELECT a.id, a.tenant, a.seq, a.hash FROM idemgate_attempts a "
    "LEFT JOIN cut USING (tenant) WHERE (a.seq = 0 AND a.at_ms < $1) "
    "OR (a.seq > 0 AND a.seq <= cut.seq) ORDER BY a.tenant, a.seq, a.id LIMIT $2), "
    "gone AS (DELETE FROM idemgate_attempts WHERE id IN (SELECT id FROM victims) RETURNING id), "
    "last AS (SELECT DISTINCT ON (tenant) tenant, seq, hash FROM victims WHERE seq > 0 "
    "ORDER BY tenant, seq DESC), "
    "moved AS (UPDATE idemgate_attempt_heads h SET start_seq = last.seq + 1, "
    "start_prev = last.hash FROM last WHERE h.tenant = last.tenant RETURNING 1) "
    "SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM moved)"};

// Which AttemptFilter fields are set, as bits; one prepared statement per
// combination, so each can use its index.
constexpr unsigned kTenant = 1;
constexpr unsigned kKey = 2;
constexpr unsigned kTool = 4;
constexpr unsigned kOutcome = 8;
constexpr unsigned kSince = 16;
constexpr unsigned kRareOutcome = 32;  // with kOutcome: kRareOutcomeTerm too

unsigned FilterMask(const AttemptFilter& f) {
  return (f.tenant ? kTenant : 0u) | (f.key ? kKey : 0u) | (f.tool ? kTool : 0u) |
         (f.outcome ? kOutcome : 0u) | (f.since ? kSince : 0u) |
         (f.outcome && !IsFrequentOutcome(*f.outcome) ? kRareOutcome : 0u);
}

// " WHERE …" with $1, $2, … for the fields set, in the order BindFilter adds
// them; returns the next parameter number through `next`.
std::string WhereClause(unsigned mask, int& next) {
  std::string sql;
  const char* sep = " WHERE ";
  auto add = [&](unsigned bit, const char* column, const char* op) {
    if (!(mask & bit)) return;
    sql += fmt::format("{}{} {} ${}", sep, column, op, next++);
    sep = " AND ";
  };
  add(kTenant, "tenant", "=");
  add(kKey, "key", "=");
  add(kTool, "tool", "=");
  add(kOutcome, "outcome", "=");
  add(kSince, "at_ms", ">=");
  if (mask & kRareOutcome) sql += fmt::format(" AND {}", kRareOutcomeTerm);
  return sql;
}

void BindFilter(Params& p, const AttemptFilter& f) {
  if (f.tenant) p.Text(*f.tenant);
  if (f.key) p.Text(*f.key);
  if (f.tool) p.Text(*f.tool);
  if (f.outcome) p.Text(AttemptOutcomeName(*f.outcome));
  if (f.since) p.Int(ToUnixMillis(*f.since));
}

Statement SelectStatement(unsigned mask) {
  int next = 1;
  std::string where = WhereClause(mask, next);
  return Statement{fmt::format("idem_select_attempts_{}", mask),
                   fmt::format("SELECT " IDEM_ATTEMPT_COLUMNS " FROM idemgate_attempts{} "
                               "ORDER BY at_ms DESC, id DESC LIMIT ${}",
                               where, next)};
}

Statement CountStatement(unsigned mask) {
  int next = 1;
  std::string where = WhereClause(mask, next);
  return Statement{fmt::format("idem_count_attempts_{}", mask),
                   fmt::format("SELECT tool, outcome, count(*) FROM idemgate_attempts{} "
                               "GROUP BY tool, outcome",
                               where)};
}

Result<AttemptOutcome> DecodeOutcome(const Connection& conn, std::string_view text) {
  auto outcome = ParseAttemptOutcome(text);
  if (!outcome) {
    return MakeError(ErrorCode::kDataLoss,
                     fmt::format("postgres store {}: an attempt has an unknown outcome \"{}\"; "
                                 "it was written by an incompatible program or is corrupt",
                                 conn.where(), text));
  }
  return *outcome;
}

Error Malformed(const Connection& conn) {
  return Error{
      ErrorCode::kDataLoss,
      fmt::format("postgres store {}: an attempt row has a malformed number", conn.where())};
}

// Row `i` of a statement selecting IDEM_ATTEMPT_COLUMNS.
Result<Attempt> DecodeAttempt(const Connection& conn, const Rows& rows, int i) {
  auto outcome = DecodeOutcome(conn, rows.Bytes(i, 5));
  if (!outcome) return std::unexpected(std::move(outcome.error()));
  const auto at = rows.Int(i, 0);
  const auto latency = rows.Int(i, 6);
  const auto seq = rows.Int(i, 9);
  if (!at || !latency || !seq || *seq < 0) return std::unexpected(Malformed(conn));
  return Attempt{
      .at = FromUnixMillis(*at),
      .tenant = std::string(rows.Bytes(i, 1)),
      .key = std::string(rows.Bytes(i, 2)),
      .tool = std::string(rows.Bytes(i, 3)),
      .turn = std::string(rows.Bytes(i, 4)),
      .outcome = *outcome,
      .latency = Duration(*latency),
      .instance = std::string(rows.Bytes(i, 7)),
      .detail = std::string(rows.Bytes(i, 8)),
      .seq = static_cast<uint64_t>(*seq),
      .prev_hash = std::string(rows.Bytes(i, 10)),
      .hash = std::string(rows.Bytes(i, 11)),
  };
}

int64_t Limit(size_t limit) {
  return static_cast<int64_t>(
      std::min<size_t>(limit, static_cast<size_t>(std::numeric_limits<int64_t>::max())));
}

}  // namespace

Result<void> BindAttempts(Params& p, std::span<const Attempt> attempts, std::string_view where) {
  // The arrays travel as text, which ends at a NUL; PostgreSQL text cannot
  // hold one anyway.
  for (const Attempt& a : attempts) {
    for (std::string_view s :
         {std::string_view(a.tenant), std::string_view(a.key), std::string_view(a.tool),
          std::string_view(a.turn), std::string_view(a.instance), std::string_view(a.detail)}) {
      if (s.find('\0') != std::string_view::npos) {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("postgres store {}: an attempt of key \"{}\" holds a NUL "
                                     "byte, which PostgreSQL text cannot store",
                                     where, a.key));
      }
    }
  }
  std::vector<int64_t> at, latency;
  std::vector<std::string_view> tenant, key, tool, turn, outcome, instance, detail;
  for (const Attempt& a : attempts) {
    at.push_back(ToUnixMillis(a.at));
    tenant.push_back(a.tenant);
    key.push_back(a.key);
    tool.push_back(a.tool);
    turn.push_back(a.turn);
    outcome.push_back(AttemptOutcomeName(a.outcome));
    latency.push_back(a.latency.count());
    instance.push_back(a.instance);
    detail.push_back(a.detail);
  }
  p.IntArray(IntArrayLiteral(at))
      .TextArray(TextArrayLiteral(tenant))
      .TextArray(TextArrayLiteral(key))
      .TextArray(TextArrayLiteral(tool))
      .TextArray(TextArrayLiteral(turn))
      .TextArray(TextArrayLiteral(outcome))
      .IntArray(IntArrayLiteral(latency))
      .TextArray(TextArrayLiteral(instance))
      .TextArray(TextArrayLiteral(detail));
  return {};
}

Result<void> InsertAttempts(Connection& conn, const std::vector<Attempt>& attempts) {
  Params p;
  if (auto bound = BindAttempts(p, attempts, conn.where()); !bound) return bound;
  auto done = conn.Execute(kInsertAttempts, p,
                           fmt::format("appending {} attempts to the audit log", attempts.size()));
  if (!done) return std::unexpected(std::move(done.error()));
  return {};
}

std::string SelectAttemptsSql(const AttemptFilter& filter) {
  return SelectStatement(FilterMask(filter)).sql;
}

Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter) {
  Params p;
  BindFilter(p, filter);
  p.Int(Limit(filter.limit));
  auto rows = conn.Execute(SelectStatement(FilterMask(filter)), p, "reading the audit log");
  if (!rows) return std::unexpected(std::move(rows.error()));

  std::vector<Attempt> attempts;
  attempts.reserve(static_cast<size_t>(rows->size()));
  for (int i = 0; i < rows->size(); ++i) {
    auto a = DecodeAttempt(conn, *rows, i);
    if (!a) return std::unexpected(std::move(a.error()));
    attempts.push_back(std::move(*a));
  }
  return attempts;
}

Result<std::map<std::string, ToolStats>> CountAttempts(Connection& conn,
                                                       const AttemptFilter& filter) {
  Params p;
  BindFilter(p, filter);
  auto rows = conn.Execute(CountStatement(FilterMask(filter)), p, "summarizing the audit log");
  if (!rows) return std::unexpected(std::move(rows.error()));

  std::map<std::string, ToolStats> stats;
  for (int i = 0; i < rows->size(); ++i) {
    auto outcome = DecodeOutcome(conn, rows->Bytes(i, 1));
    if (!outcome) return std::unexpected(std::move(outcome.error()));
    const auto count = rows->Int(i, 2);
    if (!count || *count < 0) return std::unexpected(Malformed(conn));
    ToolStats& tool = stats[std::string(rows->Bytes(i, 0))];
    tool.attempts += static_cast<uint64_t>(*count);
    tool.by_outcome[*outcome] += static_cast<uint64_t>(*count);
  }
  return stats;
}

Result<std::vector<ChainHead>> SelectChainHeads(Connection& conn,
                                                const std::optional<std::string>& tenant) {
  Params p;
  if (tenant) p.Text(*tenant);
  auto rows = conn.Execute(tenant ? kSelectHead : kSelectHeads, p, "reading the chain heads");
  if (!rows) return std::unexpected(std::move(rows.error()));
  std::vector<ChainHead> heads;
  for (int i = 0; i < rows->size(); ++i) {
    const auto seq = rows->Int(i, 1);
    const auto start = rows->Int(i, 3);
    if (!seq || !start || *seq < 0 || *start < 1) return std::unexpected(Malformed(conn));
    heads.push_back(ChainHead{std::string(rows->Bytes(i, 0)), static_cast<uint64_t>(*seq),
                              std::string(rows->Bytes(i, 2)), static_cast<uint64_t>(*start),
                              std::string(rows->Bytes(i, 4))});
  }
  return heads;
}

Result<ChainPage> SelectChain(Connection& conn, const std::optional<std::string>& tenant,
                              const std::string& cursor, size_t limit) {
  // The cursor: the last row's "seq:id:tenant".
  int64_t seq = 0, id = 0;
  std::string after_tenant;
  if (!cursor.empty()) {
    const size_t a = cursor.find(':');
    const size_t b = a == std::string::npos ? a : cursor.find(':', a + 1);
    if (b == std::string::npos) {
      return MakeError(ErrorCode::kInvalidArgument, "bad chain cursor " + cursor);
    }
    try {
      seq = std::stoll(cursor.substr(0, a));
      id = std::stoll(cursor.substr(a + 1, b - a - 1));
    } catch (...) {
      return MakeError(ErrorCode::kInvalidArgument, "bad chain cursor " + cursor);
    }
    after_tenant = cursor.substr(b + 1);
  }
  Params p;
  p.Text(tenant.value_or("")).Text(after_tenant).Int(seq).Int(id).Int(Limit(limit));
  auto rows =
      conn.Execute(ChainStatement(tenant.has_value(), !cursor.empty()), p, "reading the chain");
  if (!rows) return std::unexpected(std::move(rows.error()));
  ChainPage page;
  for (int i = 0; i < rows->size(); ++i) {
    auto a = DecodeAttempt(conn, *rows, i);
    if (!a) return std::unexpected(std::move(a.error()));
    page.entries.push_back(std::move(*a));
  }
  if (limit > 0 && page.entries.size() == limit) {
    const auto last_id = rows->Int(rows->size() - 1, 12);
    if (!last_id) return std::unexpected(Malformed(conn));
    page.next =
        fmt::format("{}:{}:{}", page.entries.back().seq, *last_id, page.entries.back().tenant);
  }
  return page;
}

Result<size_t> DeleteOldAttempts(Connection& conn, TimePoint before, size_t limit) {
  Params p;
  p.Int(ToUnixMillis(before)).Int(Limit(limit));
  auto rows = conn.Execute(kPurgeAttempts, p, "purging old attempts");
  if (!rows) return std::unexpected(std::move(rows.error()));
  const auto n = rows->size() == 1 ? rows->Int(0, 0) : std::nullopt;
  if (!n || *n < 0) return std::unexpected(Malformed(conn));
  return static_cast<size_t>(*n);
}

}  // namespace idem::postgres
