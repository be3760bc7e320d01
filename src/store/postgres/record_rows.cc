#include "record_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "change_listener.h"

#define IDEM_CHANGE_CHANNEL "idemgate_changes"
static_assert(std::string_view(IDEM_CHANGE_CHANNEL) == idem::postgres::kChangeChannel);
#define IDEM_EVICTION_CHANNEL "idemgate_evictions"
static_assert(std::string_view(IDEM_EVICTION_CHANNEL) == idem::postgres::kEvictionChannel);

#define IDEM_RECORD_COLUMNS                                                     \
  "state, fingerprint, tool, turn, fence, created_at_ms, lease_expires_at_ms, " \
  "completed_at_ms, expires_at_ms, outcome_class, outcome_body, owner, retention_ms"

// Wraps a data-modifying statement that RETURNs the record's columns. The
// change is announced by kAnnounceChanges in a transaction of its own after
// this one commits: PostgreSQL serialises the commits of notifying
// transactions (a database-wide lock held through the WAL flush), which
// would undo group commit for every write. The payload parameter is still
// returned (as the last column, unread) so every statement keeps its
// parameter list.
#define IDEM_ANNOUNCE(cte, payload_param) \
  " SELECT " IDEM_RECORD_COLUMNS ", " payload_param "::text FROM " cte
// IDEM_ANNOUNCE for a statement that logs its attempt (IDEM_LOG_ATTEMPTS).
#define IDEM_ANNOUNCE_LOGGED(cte, payload_param) \
  " SELECT " IDEM_RECORD_COLUMNS ", " payload_param "::text" IDEM_FROM_LOGGED(cte)

// Appends the attempts in `arrays` (BindAttempts' nine arrays) to the audit
// log, each as the next entry of its tenant's chain (idemgate_log_attempts,
// which locks the tenant's head until the transaction ends), in the same
// statement as the record write `cte`, and only if it wrote: a claim or a
// completion and its entry commit together or not at all. A CTE without a
// data-modifying statement runs only if read: the statement's final SELECT
// reads it with IDEM_FROM_LOGGED.
#define IDEM_LOG_ATTEMPTS(cte, arrays)                                \
  ", logged AS (SELECT idemgate_log_attempts(" arrays ") AS appended " \
  "WHERE EXISTS (SELECT 1 FROM " cte "))"
#define IDEM_FROM_LOGGED(cte) " FROM " cte " LEFT JOIN logged ON true"
#define IDEM_CLAIM_ATTEMPTS                                                             \
  "$12::bigint[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], " \
  "$18::bigint[], $19::text[], $20::text[]"

namespace idem::postgres {

const Statement kClaimInsert{
    "idem_claim_insert",
    "WITH claimed AS (INSERT INTO idemgate_records (tenant, key, state, fingerprint, tool, turn, "
    "fence, created_at_ms, lease_expires_at_ms, completed_at_ms, expires_at_ms, owner, "
    "retention_ms) VALUES ($1, $2, 'in_progress', $3, $4, $5, nextval('idemgate_fences'), $6, "
    "$7, 0, $8, $10, $11) "
    "ON CONFLICT (tenant, key) DO NOTHING RETURNING " IDEM_RECORD_COLUMNS
    ")" IDEM_LOG_ATTEMPTS("claimed", IDEM_CLAIM_ATTEMPTS) IDEM_ANNOUNCE_LOGGED("claimed", "$9")};

const Statement kClaimReplace{
    "idem_claim_replace",
    "WITH claimed AS (UPDATE idemgate_records SET state = 'in_progress', fingerprint = $3, "
    "tool = $4, turn = $5, fence = nextval('idemgate_fences'), created_at_ms = $6, "
    "lease_expires_at_ms = $7, completed_at_ms = 0, expires_at_ms = $8, outcome_class = NULL, "
    "outcome_body = NULL, owner = $10, retention_ms = $11, watched = false "
    "WHERE tenant = $1 AND key = $2 AND expires_at_ms <= $6 "
    "RETURNING " IDEM_RECORD_COLUMNS ")" IDEM_LOG_ATTEMPTS("claimed", IDEM_CLAIM_ATTEMPTS)
        IDEM_ANNOUNCE_LOGGED("claimed", "$9")};

const Statement kSelectRecord{"idem_select_record",
                              "SELECT " IDEM_RECORD_COLUMNS
                              " FROM idemgate_records WHERE tenant = $1 AND key = $2"};

// A heartbeat changes neither state nor fence, so it wakes nobody.
const Statement kHeartbeat{
    "idem_heartbeat",
    "UPDATE idemgate_records SET lease_expires_at_ms = $4, "
    "expires_at_ms = GREATEST(expires_at_ms, $4) "
    "WHERE tenant = $1 AND key = $2 AND fence = $3 AND state = 'in_progress' "
    "AND expires_at_ms > $5 RETURNING lease_expires_at_ms"};

const Statement kComplete{
    "idem_complete",
    "WITH done AS (UPDATE idemgate_records SET state = 'completed', outcome_class = $4, "
    "outcome_body = $5, completed_at_ms = $6, expires_at_ms = $7 "
    "WHERE tenant = $1 AND key = $2 AND fence = $3 AND state IN ('in_progress', 'unknown') "
    "AND expires_at_ms > $6 RETURNING " IDEM_RECORD_COLUMNS ", watched)" IDEM_LOG_ATTEMPTS(
        "done",
        "$9::bigint[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], "
        "$15::bigint[], $16::text[], $17::text[]") " SELECT " IDEM_RECORD_COLUMNS
    ", $8::text, watched" IDEM_FROM_LOGGED("done")};
static_assert(kCompleteWatchedColumn == 14);  // 13 record columns, the payload, watched

// Row locks order this against kComplete: either the completion sees the
// mark, or the mark finds the record no longer in the state the waiter saw.
const Statement kMarkWatched{
    "idem_mark_watched",
    "UPDATE idemgate_records SET watched = true WHERE tenant = $1 AND key = $2 AND fence = $3 "
    "AND state = $4 AND NOT watched"};

const Statement kRelease{
    "idem_release",
    "WITH released AS (DELETE FROM idemgate_records WHERE tenant = $1 AND key = $2 "
    "AND fence = $3 AND state IN ('in_progress', 'unknown') AND expires_at_ms > $4 "
    "RETURNING fence) SELECT $5::text FROM released"};

const Statement kAbandon{
    "idem_abandon",
    "WITH abandoned AS (DELETE FROM idemgate_records WHERE tenant = $1 AND key = $2 "
    "AND owner = $3 AND owner <> '' AND state = 'in_progress' AND expires_at_ms > $4 "
    "RETURNING fence) SELECT $5::text FROM abandoned"};

const Statement kMarkUnknown{
    "idem_mark_unknown",
    "WITH marked AS (UPDATE idemgate_records SET state = 'unknown', completed_at_ms = $4, "
    "expires_at_ms = $5 WHERE tenant = $1 AND key = $2 AND fence = $3 "
    "AND state = 'in_progress' AND expires_at_ms > $4 "
    "RETURNING " IDEM_RECORD_COLUMNS ")" IDEM_ANNOUNCE("marked", "$6")};

const Statement kTakeOver{
    "idem_take_over",
    "WITH taken AS (UPDATE idemgate_records SET state = 'in_progress', "
    "fence = nextval('idemgate_fences'), lease_expires_at_ms = $5, "
    "expires_at_ms = GREATEST(expires_at_ms, $5), completed_at_ms = 0, outcome_class = NULL, "
    "outcome_body = NULL, owner = '' WHERE tenant = $1 AND key = $2 AND fence = $3 "
    "AND expires_at_ms > $4 "
    "AND (state = 'unknown' OR (state = 'in_progress' AND lease_expires_at_ms <= $4)) "
    "RETURNING " IDEM_RECORD_COLUMNS ")" IDEM_ANNOUNCE("taken", "$6")};

// Announced in the same transaction, so that no instance's replay cache can
// miss it: $3 wakes the record's waiters (ChangeListener), $4 (the schema's
// EvictionPayload) empties every cache. Delivered on commit.
const Statement kEvict{
    "idem_evict",
    "WITH evicted AS (DELETE FROM idemgate_records WHERE tenant = $1 AND key = $2 "
    "RETURNING fence) SELECT $3::text, pg_notify('" IDEM_EVICTION_CHANNEL "', $4) FROM evicted"};

// Wakes the waiters of every instance, one notification per payload. Its
// own transaction, with an asynchronous commit: a lost wake-up only costs a
// poll, and a synchronous flush here would hold the notify lock through an
// fsync. Sent by ChangeAnnouncer, batched, off the request path.
const Statement kAnnounceChanges{
    "idem_announce_changes",
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify('" IDEM_CHANGE_CHANNEL
    "', payload) FROM unnest($1::text[]) AS payload"};

// ctid = ANY(ARRAY(...)) runs as a TID scan over the batch the index found.
// The outer expiry test keeps a row that was reclaimed meanwhile. Purged
// records are past retention, so no waiter needs to hear of them.
const Statement kPurgeExpired{
    "idem_purge_expired",
    "DELETE FROM idemgate_records WHERE ctid = ANY(ARRAY(SELECT ctid FROM idemgate_records "
    "WHERE expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)) "
    "AND expires_at_ms <= $1"};

const Statement kCountRecords{"idem_count_records", "SELECT count(*) FROM idemgate_records"};

const Statement kServerClock{
    "idem_server_clock", "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"};

namespace {

Error Undecodable(std::string_view where, const RecordId& id, std::string_view column,
                  std::string_view value) {
  return Error{ErrorCode::kDataLoss,
               fmt::format("postgres store {}: record \"{}\" of tenant \"{}\" has an unknown {} "
                           "\"{}\"; it was written by an incompatible program or is corrupt: "
                           "evict the record or restore a backup",
                           where, id.key, id.tenant, column, value)};
}

}  // namespace

Result<Record> DecodeRecord(const Rows& rows, int row, const RecordId& id, std::string_view where) {
  Record r;
  r.id = id;
  auto state = ParseRecordState(rows.Bytes(row, 0));
  if (!state) return std::unexpected(Undecodable(where, id, "state", rows.Bytes(row, 0)));
  r.state = *state;
  r.fingerprint = rows.Bytes(row, 1);
  r.tool = rows.Bytes(row, 2);
  r.turn = rows.Bytes(row, 3);
  const auto fence = rows.Int(row, 4);
  const auto created = rows.Int(row, 5);
  const auto lease = rows.Int(row, 6);
  const auto completed = rows.Int(row, 7);
  const auto expires = rows.Int(row, 8);
  if (!fence || !created || !lease || !completed || !expires || *fence < 0) {
    return std::unexpected(Undecodable(where, id, "number", "not a bigint"));
  }
  r.fence = static_cast<uint64_t>(*fence);
  r.created_at = FromUnixMillis(*created);
  r.lease_expires_at = FromUnixMillis(*lease);
  r.completed_at = FromUnixMillis(*completed);
  r.expires_at = FromUnixMillis(*expires);
  if (!rows.IsNull(row, 9)) {
    auto cls = ParseOutcomeClass(rows.Bytes(row, 9));
    if (!cls) return std::unexpected(Undecodable(where, id, "outcome class", rows.Bytes(row, 9)));
    r.outcome = Outcome{*cls, std::string(rows.Bytes(row, 10))};
  }
  r.owner = rows.Bytes(row, 11);
  r.retention = Duration(std::max<int64_t>(0, rows.Int(row, 12).value_or(0)));
  return r;
}

Result<std::optional<Record>> ReadRecord(Connection& conn, const RecordId& id) {
  Params p;
  p.Text(id.tenant).Text(id.key);
  auto rows = conn.Execute(kSelectRecord, p, "reading record " + id.key);
  if (!rows) return std::unexpected(std::move(rows.error()));
  if (rows->size() == 0) return std::nullopt;
  auto record = DecodeRecord(*rows, 0, id, conn.where());
  if (!record) return std::unexpected(std::move(record.error()));
  return std::move(*record);
}

}  // namespace idem::postgres
