// The audit log in idemgate_attempts (docs/DESIGN.md §7): batched inserts and
// filtered reads, as prepared statements.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"
#include "pg_connection.h"

namespace idem::postgres {

// Appends `attempts` to `p` as the nine arrays (at_ms bigint[], tenant, key,
// tool, turn, outcome text[], latency_ms bigint[], instance, detail text[])
// that IDEM_LOG_ATTEMPTS unnests into rows: how a record's own statement
// writes its audit entry in the same statement. kInvalidArgument for text
// PostgreSQL refuses (NUL); `where` names the store in that error.
Result<void> BindAttempts(Params& p, std::span<const Attempt> attempts, std::string_view where);

// Parameters: BindAttempts' nine arrays. Appends them to the audit log, each
// as the next entry of its tenant's chain.
extern const Statement kInsertAttempts;

// Inserts `attempts` with one statement (arrays unnested into rows), in
// order. kInvalidArgument for text the database refuses (not UTF-8, NUL).
Result<void> InsertAttempts(Connection& conn, const std::vector<Attempt>& attempts);

// Attempts matching `filter`, newest first, at most filter.limit. kDataLoss
// for a row with an unknown outcome.
Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter);
// The statement SelectAttempts prepares for `filter`: $1, $2, … are the
// filter's fields in AttemptFilter's order, then the limit.
std::string SelectAttemptsSql(const AttemptFilter& filter);

// Counts per tool and outcome of the attempts matching `filter`.
Result<std::map<std::string, ToolStats>> CountAttempts(Connection& conn,
                                                       const AttemptFilter& filter);

// Store::ChainHeads, ReadChain (by tenant, seq, id; the cursor is the last
// row's "seq:id:tenant") and PurgeAttempts, one statement each.
Result<std::vector<ChainHead>> SelectChainHeads(Connection& conn,
                                                const std::optional<std::string>& tenant);
Result<ChainPage> SelectChain(Connection& conn, const std::optional<std::string>& tenant,
                              const std::string& cursor, size_t limit);
Result<size_t> DeleteOldAttempts(Connection& conn, TimePoint before, size_t limit);

}  // namespace idem::postgres
