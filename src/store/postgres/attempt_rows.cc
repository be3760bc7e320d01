#include "attempt_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace idem::postgres {
namespace {

const Statement kInsertAttempts{
    "idem_insert_attempts",
    "INSERT INTO idemgate_attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms, "
    "instance, detail) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], "
    "$5::text[], $6::text[], $7::bigint[], $8::text[], $9::text[])"};

// Which AttemptFilter fields are set, as bits; one prepared statement per
// combination, so each can use its index.
constexpr unsigned kTenant = 1;
constexpr unsigned kKey = 2;
constexpr unsigned kTool = 4;
constexpr unsigned kOutcome = 8;
constexpr unsigned kSince = 16;

unsigned FilterMask(const AttemptFilter& f) {
  return (f.tenant ? kTenant : 0u) | (f.key ? kKey : 0u) | (f.tool ? kTool : 0u) |
         (f.outcome ? kOutcome : 0u) | (f.since ? kSince : 0u);
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
                   fmt::format("SELECT at_ms, tenant, key, tool, turn, outcome, latency_ms, "
                               "instance, detail FROM idemgate_attempts{} "
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

Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter) {
  Params p;
  BindFilter(p, filter);
  p.Int(static_cast<int64_t>(
      std::min<size_t>(filter.limit, static_cast<size_t>(std::numeric_limits<int64_t>::max()))));
  auto rows = conn.Execute(SelectStatement(FilterMask(filter)), p, "reading the audit log");
  if (!rows) return std::unexpected(std::move(rows.error()));

  std::vector<Attempt> attempts;
  attempts.reserve(static_cast<size_t>(rows->size()));
  for (int i = 0; i < rows->size(); ++i) {
    auto outcome = DecodeOutcome(conn, rows->Bytes(i, 5));
    if (!outcome) return std::unexpected(std::move(outcome.error()));
    const auto at = rows->Int(i, 0);
    const auto latency = rows->Int(i, 6);
    if (!at || !latency) return std::unexpected(Malformed(conn));
    attempts.push_back(Attempt{
        .at = FromUnixMillis(*at),
        .tenant = std::string(rows->Bytes(i, 1)),
        .key = std::string(rows->Bytes(i, 2)),
        .tool = std::string(rows->Bytes(i, 3)),
        .turn = std::string(rows->Bytes(i, 4)),
        .outcome = *outcome,
        .latency = Duration(*latency),
        .instance = std::string(rows->Bytes(i, 7)),
        .detail = std::string(rows->Bytes(i, 8)),
    });
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

}  // namespace idem::postgres
