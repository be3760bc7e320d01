// The SQLite file's schema and its migrations.
#pragma once

#include <cstdint>

#include "idem/error.h"
#include "sqlite_connection.h"

namespace idem::sqlite {

// The schema this build writes; kept in PRAGMA user_version.
inline constexpr int64_t kSchemaVersion = 5;
// PRAGMA application_id of an idemgate file: "idem" in ASCII.
inline constexpr int64_t kApplicationId = 0x6964656d;

// The WHERE clause of the partial index attempts_by_rare_outcome, word for
// word: SQLite uses a partial index only for a query whose WHERE contains
// the index's terms. It holds the outcomes IsFrequentOutcome is false for.
inline constexpr char kRareOutcomeTerm[] =
    "outcome <> 'claimed' AND outcome <> 'executed' AND outcome <> 'replayed'";

// Brings the file behind `conn` to kSchemaVersion, applying the missing
// migrations in one IMMEDIATE transaction (so concurrent openers migrate
// once). Errors: kFailedPrecondition for a file written by a newer idemgate,
// kInvalidArgument for an SQLite database that belongs to another program,
// and the storage errors of ErrorFromSqlite.
Result<void> MigrateSchema(Connection& conn);

}  // namespace idem::sqlite
