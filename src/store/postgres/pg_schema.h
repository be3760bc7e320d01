// The PostgreSQL store's tables, and the migrations that create and evolve
// them. The version lives in idemgate_meta ('schema_version').
#pragma once

#include <cstdint>
#include <string>

#include "idem/error.h"
#include "pg_connection.h"

namespace idem::postgres {

// The schema version this build writes.
inline constexpr int64_t kSchemaVersion = 6;

// Creates `schema` if it does not exist and brings its tables to
// kSchemaVersion, in one transaction, under an advisory lock so that
// instances starting together migrate once. kFailedPrecondition if the
// schema was written by a newer idemgate (left untouched) or holds an
// idemgate_meta table without a version; the errors of `conn` otherwise.
Result<void> MigrateSchema(Connection& conn, const std::string& schema);

}  // namespace idem::postgres
