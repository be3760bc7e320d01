#include "sqlite_schema.h"

#include <fmt/format.h>

#include <span>

namespace idem::sqlite {
namespace {

struct Migration {
  int64_t to_version;
  // Fixed DDL; its last statement sets PRAGMA user_version to `to_version`.
  const char* sql;
};

// Append only: a released migration is never edited.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE meta (
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
-- Above every fence ever given to a record that has since been deleted, so a
-- re-created record's fence is still greater than any earlier one.
INSERT INTO meta (name, value) VALUES ('fence_floor', 0);

CREATE TABLE records (
  tenant TEXT NOT NULL,
  key TEXT NOT NULL,
  state TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  tool TEXT NOT NULL,
  turn TEXT NOT NULL,
  fence INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  lease_expires_at_ms INTEGER NOT NULL,
  completed_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  outcome_class TEXT,
  outcome_body BLOB,
  PRIMARY KEY (tenant, key)
) STRICT;
CREATE INDEX records_by_expiry ON records (expires_at_ms);

CREATE TABLE attempts (
  id INTEGER PRIMARY KEY,
  at_ms INTEGER NOT NULL,
  tenant TEXT NOT NULL,
  key TEXT NOT NULL,
  tool TEXT NOT NULL,
  turn TEXT NOT NULL,
  outcome TEXT NOT NULL,
  latency_ms INTEGER NOT NULL,
  instance TEXT NOT NULL,
  detail TEXT NOT NULL
) STRICT;
CREATE INDEX attempts_by_at ON attempts (at_ms);
CREATE INDEX attempts_by_key ON attempts (key, at_ms);
CREATE INDEX attempts_by_tool ON attempts (tool, at_ms);
CREATE INDEX attempts_by_outcome ON attempts (outcome, at_ms);

PRAGMA application_id = 1768187245;
PRAGMA user_version = 1;
)sql"},
    {2, R"sql(
-- The token of the attempt whose claim made the record (ClaimRequest::owner),
-- for Abandon. Records written before it have none: they cannot be abandoned.
ALTER TABLE records ADD COLUMN owner TEXT NOT NULL DEFAULT '';
PRAGMA user_version = 2;
)sql"},
    {3, R"sql(
-- The retention the claim decided (Record::retention), kept by completion.
-- Records written before it have 0: their completion's own retention.
ALTER TABLE records ADD COLUMN retention_ms INTEGER NOT NULL DEFAULT 0;
PRAGMA user_version = 3;
)sql"},
    {4, R"sql(
-- The audit log's hash chain (docs/DESIGN.md §7). Entries written before it
-- have seq 0 and no hashes: verify reports them as before the chain.
ALTER TABLE attempts ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN prev_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN hash TEXT NOT NULL DEFAULT '';
-- Not unique: a duplicated seq is for verify to name, not for an insert to fail on.
CREATE INDEX attempts_by_chain ON attempts (tenant, seq, id);
-- Each tenant's chain head, moved in the transaction that appends an entry;
-- start_seq/start_prev: where the chain restarts after a purge.
CREATE TABLE attempt_heads (
  tenant TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  hash TEXT NOT NULL,
  start_seq INTEGER NOT NULL DEFAULT 1,
  start_prev TEXT NOT NULL DEFAULT ''
) STRICT, WITHOUT ROWID;
PRAGMA user_version = 4;
)sql"},
    {5, R"sql(
-- The outcome index leaves out the three outcomes nearly every entry has:
-- each indexed entry costs its insert a B-tree descent and its commit a
-- page, and a query for one of these finds its newest entries at once in
-- attempts_by_at. A query for another outcome names this WHERE clause
-- (kRareOutcomeTerm) so SQLite may use the index.
DROP INDEX attempts_by_outcome;
CREATE INDEX attempts_by_rare_outcome ON attempts (outcome, at_ms)
  WHERE outcome <> 'claimed' AND outcome <> 'executed' AND outcome <> 'replayed';
PRAGMA user_version = 5;
)sql"},
};

static_assert(std::size(kMigrations) == kSchemaVersion);

Result<void> CheckOwnership(Connection& conn, int64_t version) {
  auto app = conn.QueryInt("PRAGMA application_id", "reading the application id");
  if (!app) return std::unexpected(std::move(app.error()));
  if (version == 0) {
    auto tables = conn.QueryInt("SELECT count(*) FROM sqlite_schema", "reading the schema");
    if (!tables) return std::unexpected(std::move(tables.error()));
    if (*tables == 0 && *app == 0) return {};
  } else if (*app == kApplicationId) {
    return {};
  }
  return MakeError(ErrorCode::kInvalidArgument,
                   fmt::format("sqlite store {}: the file is an SQLite database of another "
                               "program (application_id {}, user_version {}), not an idemgate "
                               "store; it was left untouched: choose another store path",
                               conn.path(), *app, version));
}

Result<void> Migrate(Connection& conn) {
  auto version = conn.QueryInt("PRAGMA user_version", "reading the schema version");
  if (!version) return std::unexpected(std::move(version.error()));
  if (*version > kSchemaVersion) {
    return MakeError(
        ErrorCode::kFailedPrecondition,
        fmt::format("sqlite store {}: the file has schema version {}, written by a newer "
                    "idemgate; this build knows versions up to {}. Upgrade idemgate, or point "
                    "the store at another file (the file was left untouched)",
                    conn.path(), *version, kSchemaVersion));
  }
  if (auto owned = CheckOwnership(conn, *version); !owned) return owned;
  for (const Migration& m : std::span(kMigrations).subspan(static_cast<size_t>(*version))) {
    if (auto r = conn.Exec(m.sql, fmt::format("migrating the schema to version {}", m.to_version));
        !r) {
      return r;
    }
  }
  return {};
}

}  // namespace

Result<void> MigrateSchema(Connection& conn) {
  if (auto r = conn.Exec("BEGIN IMMEDIATE", "locking the file to check its schema"); !r) return r;
  auto migrated = Migrate(conn);
  if (!migrated) {
    if (conn.InTransaction()) conn.Exec("ROLLBACK", "rolling back the migration");
    return migrated;
  }
  return conn.Exec("COMMIT", "committing the schema migration");
}

}  // namespace idem::sqlite
