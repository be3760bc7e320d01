#include "pg_schema.h"

#include <fmt/format.h>

#include <span>

namespace idem::postgres {
namespace {

struct Migration {
  int64_t to_version;
  // Fixed DDL, run with search_path at the store's schema. The runner
  // records `to_version` in idemgate_meta in the same transaction.
  const char* sql;
};

// Append only: a released migration is never edited.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE idemgate_meta (
  name text PRIMARY KEY,
  value bigint NOT NULL
);

-- Every fence is drawn from this sequence, so no two records of this schema
-- ever share a fence, even across eviction and purge: a stale owner can
-- never match a record created after its own was deleted. It starts at the
-- wall clock in microseconds so that a schema dropped and created again
-- still hands out larger fences than before.
CREATE SEQUENCE idemgate_fences AS bigint;
SELECT setval('idemgate_fences', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

CREATE TABLE idemgate_records (
  tenant text NOT NULL,
  key text NOT NULL,
  state text NOT NULL,
  fingerprint text NOT NULL,
  tool text NOT NULL,
  turn text NOT NULL,
  fence bigint NOT NULL,
  created_at_ms bigint NOT NULL,
  lease_expires_at_ms bigint NOT NULL,
  completed_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL,
  outcome_class text,
  outcome_body bytea,
  PRIMARY KEY (tenant, key)
) WITH (fillfactor = 80);
CREATE INDEX idemgate_records_by_expiry ON idemgate_records (expires_at_ms);

CREATE TABLE idemgate_attempts (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at_ms bigint NOT NULL,
  tenant text NOT NULL,
  key text NOT NULL,
  tool text NOT NULL,
  turn text NOT NULL,
  outcome text NOT NULL,
  latency_ms bigint NOT NULL,
  instance text NOT NULL,
  detail text NOT NULL
);
CREATE INDEX idemgate_attempts_by_at ON idemgate_attempts (at_ms, id);
CREATE INDEX idemgate_attempts_by_key ON idemgate_attempts (key, at_ms, id);
CREATE INDEX idemgate_attempts_by_tool ON idemgate_attempts (tool, at_ms, id);
CREATE INDEX idemgate_attempts_by_outcome ON idemgate_attempts (outcome, at_ms, id);
)sql"},
    {2, R"sql(
-- The token of the attempt whose claim made the record (ClaimRequest::owner),
-- for Abandon. Rows written before it have none and cannot be abandoned. A
-- constant default: no table rewrite.
ALTER TABLE idemgate_records ADD COLUMN owner text NOT NULL DEFAULT '';
)sql"},
    {3, R"sql(
-- Set by an instance that waits for the record to change (WaitForChange), so
-- that a completion is announced to the other instances (NOTIFY) only when
-- one of them may be waiting for it. A constant default: no table rewrite.
ALTER TABLE idemgate_records ADD COLUMN watched boolean NOT NULL DEFAULT false;
)sql"},
    {4, R"sql(
-- The retention the claim decided (Record::retention), kept by completion.
-- Rows written before it have 0: their completion's own retention. A
-- constant default: no table rewrite.
ALTER TABLE idemgate_records ADD COLUMN retention_ms bigint NOT NULL DEFAULT 0;
)sql"},
    {5, R"sql(
-- The audit log's hash chain (docs/DESIGN.md §7, include/idem/attempt_chain.h).
-- Rows written before it have seq 0 and no hashes: verify reports them as
-- before the chain. Constant defaults: no table rewrite.
ALTER TABLE idemgate_attempts ADD COLUMN seq bigint NOT NULL DEFAULT 0,
  ADD COLUMN prev_hash text NOT NULL DEFAULT '', ADD COLUMN hash text NOT NULL DEFAULT '';
-- Not unique: a duplicated seq is for verify to name.
CREATE INDEX idemgate_attempts_by_chain ON idemgate_attempts (tenant, seq, id);
-- Each tenant's head, locked (FOR UPDATE) and moved by the statement that
-- appends an entry; start_seq/start_prev: where the chain restarts after a purge.
CREATE TABLE idemgate_attempt_heads (
  tenant text PRIMARY KEY,
  seq bigint NOT NULL,
  hash text NOT NULL,
  start_seq bigint NOT NULL DEFAULT 1,
  start_prev text NOT NULL DEFAULT ''
);
-- ChainHash (src/core/attempt_chain.cc), byte for byte: strings as their
-- length (8 bytes, big-endian) and UTF-8 bytes, integers as 8 bytes.
CREATE FUNCTION idemgate_chain_text(t text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS
  $f$ SELECT int8send(octet_length(convert_to(t, 'UTF8'))::bigint) || convert_to(t, 'UTF8') $f$;
CREATE FUNCTION idemgate_chain_hash(seq bigint, prev text, at_ms bigint, tenant text, key text,
    tool text, turn text, outcome text, latency_ms bigint, instance text, detail text)
  RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $f$
  SELECT encode(sha256(idemgate_chain_text('idemgate-attempt-v1') || int8send(seq) ||
    idemgate_chain_text(prev) || int8send(at_ms) || idemgate_chain_text(tenant) ||
    idemgate_chain_text(key) || idemgate_chain_text(tool) || idemgate_chain_text(turn) ||
    idemgate_chain_text(outcome) || int8send(latency_ms) || idemgate_chain_text(instance) ||
    idemgate_chain_text(detail)), 'hex') $f$;
-- Appends the entries (the nine arrays of BindAttempts), each as the next of
-- its tenant's chain. The heads of the batch's tenants are locked first, in
-- tenant order (no deadlock between batches), and stay locked until the
-- caller's transaction ends. Returns how many were appended.
CREATE FUNCTION idemgate_log_attempts(a_at bigint[], a_tenant text[], a_key text[],
    a_tool text[], a_turn text[], a_outcome text[], a_latency bigint[], a_instance text[],
    a_detail text[]) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
  t text;
  i int;
  s bigint;
  p text;
  h text;
  n int := coalesce(array_length(a_at, 1), 0);
BEGIN
  FOR t IN SELECT DISTINCT u FROM unnest(a_tenant) u ORDER BY u LOOP
    INSERT INTO idemgate_attempt_heads (tenant, seq, hash) VALUES (t, 0, '')
      ON CONFLICT (tenant) DO NOTHING;
    PERFORM 1 FROM idemgate_attempt_heads WHERE tenant = t FOR UPDATE;
  END LOOP;
  FOR i IN 1 .. n LOOP
    SELECT x.seq + 1, x.hash INTO s, p FROM idemgate_attempt_heads x WHERE x.tenant = a_tenant[i];
    h := idemgate_chain_hash(s, p, a_at[i], a_tenant[i], a_key[i], a_tool[i], a_turn[i],
                             a_outcome[i], a_latency[i], a_instance[i], a_detail[i]);
    INSERT INTO idemgate_attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms,
        instance, detail, seq, prev_hash, hash)
      VALUES (a_at[i], a_tenant[i], a_key[i], a_tool[i], a_turn[i], a_outcome[i], a_latency[i],
              a_instance[i], a_detail[i], s, p, h);
    UPDATE idemgate_attempt_heads x SET seq = s, hash = h WHERE x.tenant = a_tenant[i];
  END LOOP;
  RETURN n;
END $f$;
)sql"},
    {6, R"sql(
-- The same entries and heads as version 5, for less work per entry. Each tenant's head is read
-- and locked once (SELECT ... FOR UPDATE), its entries are chained from variables, and the head
-- is written once at the end: version 5 read and rewrote the head row for every entry, so the
-- i-th entry of a batch walked i row versions of it. Entries still get their ids in array
-- order.
--
-- The hash functions are STABLE, as convert_to in them is: declared IMMUTABLE, the planner could
-- not inline them, and every entry ran idemgate_chain_text eleven times as SQL functions of
-- their own, each with an executor started for it.
ALTER FUNCTION idemgate_chain_text(text) STABLE;
ALTER FUNCTION idemgate_chain_hash(bigint, text, bigint, text, text, text, text, text, bigint,
    text, text) STABLE;
CREATE OR REPLACE FUNCTION idemgate_log_attempts(a_at bigint[], a_tenant text[], a_key text[],
    a_tool text[], a_turn text[], a_outcome text[], a_latency bigint[], a_instance text[],
    a_detail text[]) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
  n int := coalesce(array_length(a_at, 1), 0);
  tenants text[];
  seqs bigint[] := '{}';
  hashes text[] := '{}';
  i int;
  j int;
  s bigint;
  h text;
BEGIN
  IF n = 0 THEN
    RETURN 0;
  END IF;
  IF a_tenant[1] = ALL(a_tenant) THEN
    tenants := ARRAY[a_tenant[1]];  -- the common case: no query for the distinct tenants
  ELSE
    tenants := ARRAY(SELECT DISTINCT u FROM unnest(a_tenant) u ORDER BY u);
  END IF;
  -- Locked in tenant order: two batches never deadlock.
  FOR j IN 1 .. array_length(tenants, 1) LOOP
    SELECT x.seq, x.hash INTO s, h FROM idemgate_attempt_heads x
      WHERE x.tenant = tenants[j] FOR UPDATE;
    IF NOT FOUND THEN
      INSERT INTO idemgate_attempt_heads (tenant, seq, hash) VALUES (tenants[j], 0, '')
        ON CONFLICT (tenant) DO NOTHING;
      SELECT x.seq, x.hash INTO s, h FROM idemgate_attempt_heads x
        WHERE x.tenant = tenants[j] FOR UPDATE;
    END IF;
    seqs[j] := s;
    hashes[j] := h;
  END LOOP;
  FOR i IN 1 .. n LOOP
    j := array_position(tenants, a_tenant[i]);
    s := seqs[j] + 1;
    h := idemgate_chain_hash(s, hashes[j], a_at[i], a_tenant[i], a_key[i], a_tool[i], a_turn[i],
                             a_outcome[i], a_latency[i], a_instance[i], a_detail[i]);
    INSERT INTO idemgate_attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms,
        instance, detail, seq, prev_hash, hash)
      VALUES (a_at[i], a_tenant[i], a_key[i], a_tool[i], a_turn[i], a_outcome[i], a_latency[i],
              a_instance[i], a_detail[i], s, hashes[j], h);
    seqs[j] := s;
    hashes[j] := h;
  END LOOP;
  FOR j IN 1 .. array_length(tenants, 1) LOOP
    UPDATE idemgate_attempt_heads x SET seq = seqs[j], hash = hashes[j]
      WHERE x.tenant = tenants[j];
  END LOOP;
  RETURN n;
END $f$;
)sql"},
    {7, R"sql(
-- The outcome index leaves out the three outcomes nearly every entry has
-- (IsFrequentOutcome): each indexed entry costs its insert an index
-- insertion and WAL, and a query for one of these finds its newest entries
-- at once in idemgate_attempts_by_at. A query for another outcome names this
-- WHERE clause (kRareOutcomeTerm) so a generic plan may use the index.
DROP INDEX idemgate_attempts_by_outcome;
CREATE INDEX idemgate_attempts_by_rare_outcome ON idemgate_attempts (outcome, at_ms, id)
  WHERE outcome <> 'claimed' AND outcome <> 'executed' AND outcome <> 'replayed';
)sql"},
};

static_assert(std::size(kMigrations) == kSchemaVersion);

// Reads the schema's version: 0 for a schema without idemgate's tables.
Result<int64_t> ReadVersion(Connection& conn, const std::string& schema) {
  Params where;
  where.Text(schema);
  auto tables = conn.ExecuteOnce(
      "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = "
      "'idemgate_meta'",
      where, "reading the schema");
  if (!tables) return std::unexpected(std::move(tables.error()));
  if (tables->Int(0, 0).value_or(0) == 0) return 0;

  auto version = conn.ExecuteOnce("SELECT value FROM idemgate_meta WHERE name = 'schema_version'",
                                  Params(), "reading the schema version");
  if (!version) return std::unexpected(std::move(version.error()));
  if (version->size() != 1 || !version->Int(0, 0)) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("postgres store {}: table idemgate_meta has no schema_version; "
                                 "the schema was not made by idemgate or was damaged: choose "
                                 "another schema (?schema=NAME) or restore it",
                                 conn.where()));
  }
  return *version->Int(0, 0);
}

Result<void> Migrate(Connection& conn, const std::string& schema) {
  Params lock;
  lock.Text("idemgate schema " + schema);
  if (auto ok = conn.ExecuteOnce("SELECT pg_advisory_xact_lock(hashtext($1))", lock,
                                 "locking the schema for migration");
      !ok) {
    return std::unexpected(std::move(ok.error()));
  }

  // CREATE SCHEMA IF NOT EXISTS would need the CREATE privilege on the
  // database even when the schema exists.
  Params name;
  name.Text(schema);
  auto exists = conn.ExecuteOnce("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", name,
                                 "looking for the schema");
  if (!exists) return std::unexpected(std::move(exists.error()));
  if (exists->size() == 0) {
    auto quoted = conn.QuoteIdentifier(schema);
    if (!quoted) return std::unexpected(std::move(quoted.error()));
    if (auto ok = conn.ExecuteScript("CREATE SCHEMA " + *quoted, "creating the schema"); !ok) {
      return ok;
    }
  }

  auto version = ReadVersion(conn, schema);
  if (!version) return std::unexpected(std::move(version.error()));
  if (*version > kSchemaVersion) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("postgres store {}: the schema has version {}, written by a "
                                 "newer idemgate; this build knows versions up to {}. Upgrade "
                                 "idemgate, or use another schema (the schema was left "
                                 "untouched)",
                                 conn.where(), *version, kSchemaVersion));
  }
  for (const Migration& m : std::span(kMigrations).subspan(static_cast<size_t>(*version))) {
    const std::string what = fmt::format("migrating the schema to version {}", m.to_version);
    if (auto ok = conn.ExecuteScript(m.sql, what); !ok) return ok;
    Params v;
    v.Int(m.to_version);
    if (auto ok = conn.ExecuteOnce(
            "INSERT INTO idemgate_meta (name, value) VALUES ('schema_version', $1) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            v, what);
        !ok) {
      return std::unexpected(std::move(ok.error()));
    }
  }
  return {};
}

}  // namespace

Result<void> MigrateSchema(Connection& conn, const std::string& schema) {
  if (auto ok = conn.ExecuteScript("BEGIN", "starting the schema migration"); !ok) return ok;
  auto migrated = Migrate(conn, schema);
  if (!migrated) {
    (void)conn.ExecuteScript("ROLLBACK", "rolling back the schema migration");
    return migrated;
  }
  return conn.ExecuteScript("COMMIT", "committing the schema migration");
}

}  // namespace idem::postgres
