// How records are laid out in idemgate_records (schema in pg_schema.cc) and
// the prepared statements that read and write them. Each statement is one
// atomic SQL statement. Changes are announced to other instances after they
// commit, by kAnnounceChanges (PostgresStore::Changed).
#pragma once

#include <optional>
#include <string_view>

#include "idem/error.h"
#include "idem/record.h"
#include "pg_connection.h"

namespace idem::postgres {

// Parameters, in order, of kClaimInsert and kClaimReplace: tenant, key,
// fingerprint, tool, turn, now, lease end, expiry (all times in Unix ms),
// change payload, owner token. Both return the record's columns (DecodeRecord) if they
// claimed it, no row otherwise. kClaimReplace only replaces a row past its
// expiry (expires_at <= now): of two instances replacing one expired row at
// once exactly one gets the row back.
extern const Statement kClaimInsert;
extern const Statement kClaimReplace;

// tenant, key → the record's columns, live or expired, or no row.
extern const Statement kSelectRecord;

// tenant, key, fence, lease end, now → lease_expires_at_ms if the live
// in-progress record had `fence`.
extern const Statement kHeartbeat;
// tenant, key, fence, outcome class, outcome body, now, expiry, payload →
// the record's columns if the live record was in progress or unknown with
// `fence`, and in column kCompleteWatchedColumn (a bool) whether an instance
// waits for the record (kMarkWatched), so that the completion must be
// announced.
extern const Statement kComplete;
inline constexpr int kCompleteWatchedColumn = 14;
// tenant, key, fence, state → marks the record watched if it still has
// that fence and state; affected() is 0 if it had not, or was marked already.
extern const Statement kMarkWatched;
// tenant, key, fence, now, payload → one row if the live in-progress or
// unknown record with `fence` was deleted.
extern const Statement kRelease;
// tenant, key, owner, now, payload → one row if the live in-progress record
// claimed with the (non-empty) owner token was deleted.
extern const Statement kAbandon;
// tenant, key, fence, now, expiry, payload → the record's columns if the
// live in-progress record had `fence`.
extern const Statement kMarkUnknown;
// tenant, key, fence, now, lease end, payload → the record's columns, with a
// new fence and no owner token, if the live record with `fence` was unknown or in progress with
// an expired lease.
extern const Statement kTakeOver;
// tenant, key, payload → one row if a record was deleted.
extern const Statement kEvict;
// Parameter: a text[] of change payloads. Announces committed changes to
// every instance.
extern const Statement kAnnounceChanges;
// now, limit → deletes up to `limit` records with expires_at <= now,
// earliest first, skipping rows another transaction holds; affected() says
// how many.
extern const Statement kPurgeExpired;
// → count(*) of idemgate_records.
extern const Statement kCountRecords;
// The server's clock now, in Unix milliseconds (StoreClock).
extern const Statement kServerClock;

// The record in row `row` of `rows` (columns as the statements above return
// them). kDataLoss, naming the key and `where`, for a row that does not
// decode (an unknown state or outcome class, a malformed number).
Result<Record> DecodeRecord(const Rows& rows, int row, const RecordId& id, std::string_view where);

// The row of `id`, live or expired, or nullopt.
Result<std::optional<Record>> ReadRecord(Connection& conn, const RecordId& id);

}  // namespace idem::postgres
