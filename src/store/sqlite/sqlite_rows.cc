#include "sqlite_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "idem/attempt_chain.h"
#include "sqlite_schema.h"

namespace idem::sqlite {
namespace {

constexpr char kSelectRecord[] =
    "SELECT state, fingerprint, tool, turn, fence, created_at_ms, lease_expires_at_ms, "
    "completed_at_ms, expires_at_ms, outcome_class, outcome_body, owner, retention_ms "
    "FROM records WHERE tenant = ?1 AND key = ?2";

constexpr char kUpsertRecord[] =
    "INSERT INTO records (tenant, key, state, fingerprint, tool, turn, fence, created_at_ms, "
    "lease_expires_at_ms, completed_at_ms, expires_at_ms, outcome_class, outcome_body, owner, "
    "retention_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) "
    "ON CONFLICT (tenant, key) DO UPDATE SET state = excluded.state, "
    "fingerprint = excluded.fingerprint, tool = excluded.tool, turn = excluded.turn, "
    "fence = excluded.fence, created_at_ms = excluded.created_at_ms, "
    "lease_expires_at_ms = excluded.lease_expires_at_ms, "
    "completed_at_ms = excluded.completed_at_ms, expires_at_ms = excluded.expires_at_ms, "
    "outcome_class = excluded.outcome_class, outcome_body = excluded.outcome_body, "
    "owner = excluded.owner, retention_ms = excluded.retention_ms";

constexpr char kDeleteRecord[] =
    "DELETE FROM records WHERE tenant = ?1 AND key = ?2 RETURNING fence";

constexpr char kDeleteExpired[] =
    "DELETE FROM records WHERE rowid IN (SELECT rowid FROM records WHERE expires_at_ms <= ?1 "
    "ORDER BY expires_at_ms LIMIT ?2) RETURNING tenant, key, fence";

constexpr char kSelectFenceFloor[] = "SELECT value FROM meta WHERE name = 'fence_floor'";
constexpr char kRaiseFenceFloor[] =
    "UPDATE meta SET value = max(value, ?1) WHERE name = 'fence_floor'";

constexpr char kInsertAttempt[] =
    "INSERT INTO attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, detail, "
    "seq, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

constexpr char kSelectHead[] =
    "SELECT seq, hash, start_seq, start_prev FROM attempt_heads WHERE tenant = ?1";
constexpr char kUpsertHead[] =
    "INSERT INTO attempt_heads (tenant, seq, hash) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = excluded.hash";
constexpr char kMoveStart[] =
    "UPDATE attempt_heads SET start_seq = ?2, start_prev = ?3 WHERE tenant = ?1";
constexpr char kAttemptColumns[] =
    "at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, detail, seq, prev_hash, hash";

int64_t ToColumn(uint64_t v) { return static_cast<int64_t>(v); }
uint64_t FromColumn(int64_t v) { return static_cast<uint64_t>(v); }

int64_t ClampLimit(size_t limit) {
  return static_cast<int64_t>(
      std::min<size_t>(limit, static_cast<size_t>(std::numeric_limits<int64_t>::max())));
}

Error Undecodable(const Connection& conn, const RecordId& id, std::string_view column,
                  std::string_view value) {
  return Error{ErrorCode::kDataLoss,
               fmt::format("sqlite store {}: record \"{}\" of tenant \"{}\" has an unknown {} "
                           "\"{}\"; the file was written by an incompatible program or is "
                           "corrupt: evict the record or restore a backup",
                           conn.path(), id.key, id.tenant, column, value)};
}

Result<void> RaiseFenceFloor(Connection& conn, uint64_t fence) {
  auto st = conn.Prepare(kRaiseFenceFloor);
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindInt(1, ToColumn(fence));
  return st->Run();
}

// Appends " WHERE …" for the fields `filter` sets, with anonymous parameters
// that BindFilter binds in the same order.
void AppendWhere(std::string& sql, const AttemptFilter& filter) {
  const char* sep = " WHERE ";
  auto add = [&](const char* term) {
    sql += sep;
    sql += term;
    sep = " AND ";
  };
  if (filter.tenant) add("tenant = ?");
  if (filter.key) add("key = ?");
  if (filter.tool) add("tool = ?");
  if (filter.outcome) {
    add("outcome = ?");
    if (!IsFrequentOutcome(*filter.outcome)) add(kRareOutcomeTerm);
  }
  if (filter.since) add("at_ms >= ?");
}

// Returns the number of parameters bound.
int BindFilter(Statement& st, const AttemptFilter& filter) {
  int i = 0;
  if (filter.tenant) st.BindText(++i, *filter.tenant);
  if (filter.key) st.BindText(++i, *filter.key);
  if (filter.tool) st.BindText(++i, *filter.tool);
  if (filter.outcome) st.BindText(++i, AttemptOutcomeName(*filter.outcome));
  if (filter.since) st.BindInt(++i, ToUnixMillis(*filter.since));
  return i;
}

Result<AttemptOutcome> DecodeAttemptOutcome(const Connection& conn, std::string_view text) {
  auto outcome = ParseAttemptOutcome(text);
  if (!outcome) {
    return MakeError(ErrorCode::kDataLoss,
                     fmt::format("sqlite store {}: an attempt has an unknown outcome \"{}\"; the "
                                 "file was written by an incompatible program or is corrupt",
                                 conn.path(), text));
  }
  return *outcome;
}

}  // namespace

Result<std::optional<Record>> ReadRecord(Connection& conn, const RecordId& id) {
  auto st = conn.Prepare(kSelectRecord);
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindText(1, id.tenant);
  st->BindText(2, id.key);
  auto row = st->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return std::nullopt;

  Record r;
  r.id = id;
  auto state = ParseRecordState(st->ColumnText(0));
  if (!state) return std::unexpected(Undecodable(conn, id, "state", st->ColumnText(0)));
  r.state = *state;
  r.fingerprint = st->ColumnText(1);
  r.tool = st->ColumnText(2);
  r.turn = st->ColumnText(3);
  r.fence = FromColumn(st->ColumnInt(4));
  r.created_at = FromUnixMillis(st->ColumnInt(5));
  r.lease_expires_at = FromUnixMillis(st->ColumnInt(6));
  r.completed_at = FromUnixMillis(st->ColumnInt(7));
  r.expires_at = FromUnixMillis(st->ColumnInt(8));
  if (!st->ColumnIsNull(9)) {
    auto cls = ParseOutcomeClass(st->ColumnText(9));
    if (!cls) return std::unexpected(Undecodable(conn, id, "outcome class", st->ColumnText(9)));
    r.outcome = Outcome{*cls, std::string(st->ColumnBlob(10))};
  }
  r.owner = st->ColumnText(11);
  r.retention = Duration(std::max<int64_t>(0, st->ColumnInt(12)));
  return r;
}

Result<void> WriteRecord(Connection& conn, const Record& r) {
  auto st = conn.Prepare(kUpsertRecord);
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindText(1, r.id.tenant);
  st->BindText(2, r.id.key);
  st->BindText(3, RecordStateName(r.state));
  st->BindText(4, r.fingerprint);
  st->BindText(5, r.tool);
  st->BindText(6, r.turn);
  st->BindInt(7, ToColumn(r.fence));
  st->BindInt(8, ToUnixMillis(r.created_at));
  st->BindInt(9, ToUnixMillis(r.lease_expires_at));
  st->BindInt(10, ToUnixMillis(r.completed_at));
  st->BindInt(11, ToUnixMillis(r.expires_at));
  if (r.outcome) {
    st->BindText(12, OutcomeClassName(r.outcome->cls));
    st->BindBlob(13, r.outcome->body);
  } else {
    st->BindNull(12);
    st->BindNull(13);
  }
  st->BindText(14, r.owner);
  st->BindInt(15, r.retention.count());
  return st->Run();
}

Result<bool> DeleteRecord(Connection& conn, const RecordId& id) {
  std::optional<uint64_t> fence;
  {
    auto st = conn.Prepare(kDeleteRecord);
    if (!st) return std::unexpected(std::move(st.error()));
    st->BindText(1, id.tenant);
    st->BindText(2, id.key);
    for (;;) {
      auto row = st->Step();
      if (!row) return std::unexpected(std::move(row.error()));
      if (!*row) break;
      fence = FromColumn(st->ColumnInt(0));
    }
  }
  if (!fence) return false;
  if (auto r = RaiseFenceFloor(conn, *fence); !r) return std::unexpected(r.error());
  return true;
}

Result<std::vector<RecordId>> DeleteExpiredRecords(Connection& conn, TimePoint now, size_t limit) {
  std::vector<RecordId> ids;
  uint64_t max_fence = 0;
  {
    auto st = conn.Prepare(kDeleteExpired);
    if (!st) return std::unexpected(std::move(st.error()));
    st->BindInt(1, ToUnixMillis(now));
    st->BindInt(2, ClampLimit(limit));
    for (;;) {
      auto row = st->Step();
      if (!row) return std::unexpected(std::move(row.error()));
      if (!*row) break;
      ids.push_back(RecordId{std::string(st->ColumnText(0)), std::string(st->ColumnText(1))});
      max_fence = std::max(max_fence, FromColumn(st->ColumnInt(2)));
    }
  }
  if (!ids.empty()) {
    if (auto r = RaiseFenceFloor(conn, max_fence); !r) return std::unexpected(r.error());
  }
  return ids;
}

Result<uint64_t> FenceFloor(Connection& conn) {
  auto floor = conn.QueryInt(kSelectFenceFloor, "reading the fence floor");
  if (!floor) return std::unexpected(std::move(floor.error()));
  return FromColumn(*floor);
}

Result<uint64_t> CountRecordRows(Connection& conn) {
  auto n = conn.QueryInt("SELECT count(*) FROM records", "counting records");
  if (!n) return std::unexpected(std::move(n.error()));
  return static_cast<uint64_t>(*n);
}

static Result<ChainHead> ReadHead(Connection& conn, const std::string& tenant) {
  auto st = conn.Prepare(kSelectHead);
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindText(1, tenant);
  auto row = st->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  ChainHead head;
  head.tenant = tenant;
  if (*row) {
    head.seq = FromColumn(st->ColumnInt(0));
    head.hash = std::string(st->ColumnText(1));
    head.start_seq = FromColumn(st->ColumnInt(2));
    head.start_prev = std::string(st->ColumnText(3));
  }
  return head;
}

Result<void> InsertAttempt(Connection& conn, const Attempt& logged,
                           std::map<std::string, ChainHead>& heads) {
  // Inside the writer's transaction: the head read here is the tenant's
  // last entry, and no other writer can append before this one commits.
  auto known = heads.find(logged.tenant);
  ChainHead head;
  if (known != heads.end()) {
    head = known->second;
  } else {
    auto read = ReadHead(conn, logged.tenant);
    if (!read) return std::unexpected(std::move(read.error()));
    head = std::move(*read);
  }
  Attempt a = logged;
  ChainAppend(head, a);
  auto st = conn.Prepare(kInsertAttempt);
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindInt(10, ToColumn(a.seq));
  st->BindText(11, a.prev_hash);
  st->BindText(12, a.hash);
  st->BindInt(1, ToUnixMillis(a.at));
  st->BindText(2, a.tenant);
  st->BindText(3, a.key);
  st->BindText(4, a.tool);
  st->BindText(5, a.turn);
  st->BindText(6, AttemptOutcomeName(a.outcome));
  st->BindInt(7, a.latency.count());
  st->BindText(8, a.instance);
  st->BindText(9, a.detail);
  if (auto ok = st->Run(); !ok) return ok;
  heads.insert_or_assign(a.tenant, std::move(head));
  return {};
}

Result<void> WriteHeads(Connection& conn, const std::map<std::string, ChainHead>& heads) {
  for (const auto& [tenant, head] : heads) {
    auto up = conn.Prepare(kUpsertHead);
    if (!up) return std::unexpected(std::move(up.error()));
    up->BindText(1, tenant);
    up->BindInt(2, ToColumn(head.seq));
    up->BindText(3, head.hash);
    if (auto ok = up->Run(); !ok) return ok;
  }
  return {};
}

// The attempt in the current row of a statement selecting kAttemptColumns.
static Result<Attempt> AttemptRow(const Connection& conn, const Statement& st) {
  auto outcome = DecodeAttemptOutcome(conn, st.ColumnText(5));
  if (!outcome) return std::unexpected(std::move(outcome.error()));
  return Attempt{
      .at = FromUnixMillis(st.ColumnInt(0)),
      .tenant = std::string(st.ColumnText(1)),
      .key = std::string(st.ColumnText(2)),
      .tool = std::string(st.ColumnText(3)),
      .turn = std::string(st.ColumnText(4)),
      .outcome = *outcome,
      .latency = Duration(st.ColumnInt(6)),
      .instance = std::string(st.ColumnText(7)),
      .detail = std::string(st.ColumnText(8)),
      .seq = FromColumn(st.ColumnInt(9)),
      .prev_hash = std::string(st.ColumnText(10)),
      .hash = std::string(st.ColumnText(11)),
  };
}

// Steps `st` (selecting kAttemptColumns) to its end, appending each row to
// `out`; with `last_id`, the id column after them goes there.
static Result<void> CollectAttempts(const Connection& conn, Statement& st,
                                    std::vector<Attempt>& out, int64_t* last_id = nullptr) {
  for (;;) {
    auto row = st.Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) return {};
    auto a = AttemptRow(conn, st);
    if (!a) return std::unexpected(std::move(a.error()));
    if (last_id) *last_id = st.ColumnInt(12);
    out.push_back(std::move(*a));
  }
}

Result<std::vector<ChainHead>> SelectChainHeads(Connection& conn,
                                                const std::optional<std::string>& tenant) {
  std::string sql = "SELECT tenant, seq, hash, start_seq, start_prev FROM attempt_heads";
  if (tenant) sql += " WHERE tenant = ?1";
  sql += " ORDER BY tenant";
  auto st = conn.Prepare(sql);
  if (!st) return std::unexpected(std::move(st.error()));
  if (tenant) st->BindText(1, *tenant);
  std::vector<ChainHead> heads;
  for (;;) {
    auto row = st->Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) break;
    heads.push_back(ChainHead{std::string(st->ColumnText(0)), FromColumn(st->ColumnInt(1)),
                              std::string(st->ColumnText(2)), FromColumn(st->ColumnInt(3)),
                              std::string(st->ColumnText(4))});
  }
  return heads;
}

namespace {

// ReadChain's cursor: the last row's "seq:id:tenant".
struct ChainCursor {
  int64_t seq = 0;
  int64_t id = 0;
  std::string tenant;
};

std::optional<ChainCursor> ParseCursor(std::string_view text) {
  const size_t a = text.find(':');
  const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  ChainCursor c;
  try {
    c.seq = std::stoll(std::string(text.substr(0, a)));
    c.id = std::stoll(std::string(text.substr(a + 1, b - a - 1)));
  } catch (...) {
    return std::nullopt;
  }
  c.tenant = std::string(text.substr(b + 1));
  return c;
}

}  // namespace

Result<ChainPage> SelectChain(Connection& conn, const std::optional<std::string>& tenant,
                              const std::string& cursor, size_t limit) {
  std::optional<ChainCursor> after;
  if (!cursor.empty()) {
    after = ParseCursor(cursor);
    if (!after) return MakeError(ErrorCode::kInvalidArgument, "bad chain cursor " + cursor);
  }
  std::string sql = fmt::format("SELECT {}, id FROM attempts WHERE 1", kAttemptColumns);
  if (tenant) sql += " AND tenant = ?1";
  if (after) sql += " AND (tenant, seq, id) > (?2, ?3, ?4)";
  sql += " ORDER BY tenant, seq, id LIMIT ?5";
  auto st = conn.Prepare(sql);
  if (!st) return std::unexpected(std::move(st.error()));
  if (tenant) st->BindText(1, *tenant);
  if (after) {
    st->BindText(2, after->tenant);
    st->BindInt(3, after->seq);
    st->BindInt(4, after->id);
  }
  st->BindInt(5, ClampLimit(limit));
  ChainPage page;
  int64_t last_id = 0;
  if (auto ok = CollectAttempts(conn, *st, page.entries, &last_id); !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  if (page.entries.size() == limit && limit > 0) {
    const Attempt& last = page.entries.back();
    page.next = fmt::format("{}:{}:{}", ToColumn(last.seq), last_id, last.tenant);
  }
  return page;
}

Result<size_t> DeleteOldAttempts(Connection& conn, TimePoint before, size_t limit) {
  // Each tenant's chain up to its first entry not older than `before`, in
  // chain order, so what goes is a prefix of every chain it touches.
  auto st = conn.Prepare(
      "WITH cut AS (SELECT tenant, coalesce(min(CASE WHEN at_ms >= ?1 THEN seq END), "
      "                                     max(seq) + 1) - 1 AS seq "
      "             FROM attempts WHERE seq > 0 GROUP BY tenant) "
      "SELECT a.id, a.tenant, a.seq, a.hash FROM attempts a LEFT JOIN cut USING (tenant) "
      "WHERE (a.seq = 0 AND a.at_ms < ?1) OR (a.seq > 0 AND a.seq <= cut.seq) "
      "ORDER BY a.tenant, a.seq, a.id LIMIT ?2");
  if (!st) return std::unexpected(std::move(st.error()));
  st->BindInt(1, ToUnixMillis(before));
  st->BindInt(2, ClampLimit(limit));
  std::vector<int64_t> ids;
  std::map<std::string, std::pair<uint64_t, std::string>> starts;  // tenant → last deleted
  for (;;) {
    auto row = st->Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) break;
    ids.push_back(st->ColumnInt(0));
    if (const uint64_t seq = FromColumn(st->ColumnInt(2)); seq > 0) {
      starts[std::string(st->ColumnText(1))] = {seq, std::string(st->ColumnText(3))};
    }
  }
  for (int64_t id : ids) {
    auto del = conn.Prepare("DELETE FROM attempts WHERE id = ?1");
    if (!del) return std::unexpected(std::move(del.error()));
    del->BindInt(1, id);
    if (auto ok = del->Run(); !ok) return std::unexpected(std::move(ok.error()));
  }
  for (const auto& [tenant, last] : starts) {
    auto mv = conn.Prepare(kMoveStart);
    if (!mv) return std::unexpected(std::move(mv.error()));
    mv->BindText(1, tenant);
    mv->BindInt(2, ToColumn(last.first + 1));
    mv->BindText(3, last.second);
    if (auto ok = mv->Run(); !ok) return std::unexpected(std::move(ok.error()));
  }
  return ids.size();
}

std::string SelectAttemptsSql(const AttemptFilter& filter) {
  std::string sql = fmt::format("SELECT {} FROM attempts", kAttemptColumns);
  AppendWhere(sql, filter);
  sql += " ORDER BY at_ms DESC, id DESC LIMIT ?";
  return sql;
}

Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter) {
  auto st = conn.Prepare(SelectAttemptsSql(filter));
  if (!st) return std::unexpected(std::move(st.error()));
  const int n = BindFilter(*st, filter);
  st->BindInt(n + 1, ClampLimit(filter.limit));

  std::vector<Attempt> attempts;
  if (auto ok = CollectAttempts(conn, *st, attempts); !ok) return std::unexpected(ok.error());
  return attempts;
}

Result<std::map<std::string, ToolStats>> CountAttempts(Connection& conn,
                                                       const AttemptFilter& filter) {
  std::string sql = "SELECT tool, outcome, count(*) FROM attempts";
  AppendWhere(sql, filter);
  sql += " GROUP BY tool, outcome";
  auto st = conn.Prepare(sql);
  if (!st) return std::unexpected(std::move(st.error()));
  BindFilter(*st, filter);

  std::map<std::string, ToolStats> stats;
  for (;;) {
    auto row = st->Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) break;
    auto outcome = DecodeAttemptOutcome(conn, st->ColumnText(1));
    if (!outcome) return std::unexpected(std::move(outcome.error()));
    const auto count = static_cast<uint64_t>(st->ColumnInt(2));
    ToolStats& tool = stats[std::string(st->ColumnText(0))];
    tool.attempts += count;
    tool.by_outcome[*outcome] += count;
  }
  return stats;
}

}  // namespace idem::sqlite
