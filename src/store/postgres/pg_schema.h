// The PostgreSQL store's tables, and the migrations that create and evolve
// them. The version lives in idemgate_meta ('schema_version').
#pragma once

#include <cstdint>
#include <string>

#include "idem/error.h"
#include "pg_connection.h"

namespace idem::postgres {

// The schema version this build writes.
inline constexpr int64_t kSchemaVersion = 7;

// The WHERE clause of the partial index idemgate_attempts_by_rare_outcome,
// which holds the outcomes IsFrequentOutcome is false for. A query for one
// of them adds it: a prepared statement's generic plan cannot prove from
// `outcome = $n` that the index covers the row.
inline constexpr char kRareOutcomeTerm[] =
    "outcome <> 'claimed' AND outcome <> 'executed' AND outcome <> 'replayed'";

// Creates `schema` if it does not exist and brings its tables to
// kSchemaVersion, in one transaction, under an advisory lock so that
// instances starting together migrate once. kFailedPrecondition if the
// schema was written by a newer idemgate (left untouched) or holds an
// idemgate_meta table without a version; the errors of `conn` otherwise.
Result<void> MigrateSchema(Connection& conn, const std::string& schema);

}  // namespace idem::postgres
