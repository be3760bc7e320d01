// How records and attempts are laid out in the SQLite tables (schema in
// sqlite_schema.cc), and the prepared statements that read and write them.
// Every function runs on the connection it is given, inside whatever
// transaction is open there; none is thread-safe beyond its connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"
#include "sqlite_connection.h"

namespace idem::sqlite {

// The row of `id`, live or expired, or nullopt if there is none. kDataLoss
// for a row that does not decode (an unknown state or outcome class).
Result<std::optional<Record>> ReadRecord(Connection& conn, const RecordId& id);

// Inserts the row of record.id or overwrites every column of it.
Result<void> WriteRecord(Connection& conn, const Record& record);

// Deletes the row of `id` and raises the fence floor to its fence. Returns
// whether there was a row.
Result<bool> DeleteRecord(Connection& conn, const RecordId& id);

// Deletes up to `limit` rows with expires_at <= now, earliest first, raises
// the fence floor above their fences, and returns their ids.
Result<std::vector<RecordId>> DeleteExpiredRecords(Connection& conn, TimePoint now, size_t limit);

// The fence floor: greater than or equal to every fence of a deleted row.
Result<uint64_t> FenceFloor(Connection& conn);

// Rows in the records table.
Result<uint64_t> CountRecordRows(Connection& conn);

// Appends `attempt` to the log as the next entry of its tenant's chain,
// inside the caller's transaction. `heads` holds the chain heads this
// transaction has moved, by tenant: a tenant's is read from attempt_heads
// at its first entry, and moved here only once the entry is in. WriteHeads
// puts them back in attempt_heads; it must run before the transaction
// commits.
Result<void> InsertAttempt(Connection& conn, const Attempt& attempt,
                           std::map<std::string, ChainHead>& heads);
Result<void> WriteHeads(Connection& conn, const std::map<std::string, ChainHead>& heads);

// Store::ChainHeads, ReadChain (ordered by tenant, seq, id) and
// PurgeAttempts (inside the caller's transaction).
Result<std::vector<ChainHead>> SelectChainHeads(Connection& conn,
                                                const std::optional<std::string>& tenant);
Result<ChainPage> SelectChain(Connection& conn, const std::optional<std::string>& tenant,
                              const std::string& cursor, size_t limit);
Result<size_t> DeleteOldAttempts(Connection& conn, TimePoint before, size_t limit);

// Attempts matching `filter`, newest first, at most filter.limit.
// kDataLoss for a row with an unknown outcome.
Result<std::vector<Attempt>> SelectAttempts(Connection& conn, const AttemptFilter& filter);
// The statement SelectAttempts runs for `filter` (its parameters unbound).
std::string SelectAttemptsSql(const AttemptFilter& filter);

// Counts per tool and outcome of the attempts matching `filter`.
Result<std::map<std::string, ToolStats>> CountAttempts(Connection& conn,
                                                       const AttemptFilter& filter);

}  // namespace idem::sqlite
