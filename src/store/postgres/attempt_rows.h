// The audit log in idemgate_attempts (docs/DESIGN.md §7): batched inserts and
// filtered reads, as prepared statements.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"
#include "pg_connection.h"

namespace idem::postgres {

// Inserts `attempts` with one statement (arrays unnested into rows), in
// order. kInvalidArgument for text the database refuses (not UTF-8, NUL).
Result<void> InsertAttempts(Connection& conn, const std::vector<Attempt>& attempts);

// Attempts matching `filter`, newest first, at most filter.limit. kDataLoss
// for a row with an unknown outcome.
Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter);

// Counts per tool and outcome of the attempts matching `filter`.
Result<std::map<std::string, ToolStats>> CountAttempts(Connection& conn,
                                                       const AttemptFilter& filter);

}  // namespace idem::postgres
