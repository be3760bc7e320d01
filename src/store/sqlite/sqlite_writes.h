// The SQLite store's writes, each the body of one write transaction: run
// by the group-commit writer of the process that asked for it, or, through
// the shared writer (shared_writer.h), by the writer of another process on
// the same file. `now` is the asking caller's clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "group_commit_writer.h"
#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem::sqlite {

// The atomic claim of Store::Claim: creates the record of req.id, or
// re-creates it over an expired row, with its audit entry; a live row is
// returned unclaimed, unwritten.
Result<ClaimResult> ClaimInTx(WriteContext& ctx, const ClaimRequest& req, TimePoint now);

// Store::Complete, Heartbeat, Release, Abandon, MarkUnknown and TakeOver on
// the row of `id`, with the checks of their contracts in idem/store.h.
Result<Record> CompleteInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                            const Outcome& outcome, Duration retention, const Attempt* logged,
                            TimePoint now);
Result<TimePoint> HeartbeatInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                                Duration lease, TimePoint now);
Result<void> ReleaseInTx(WriteContext& ctx, const RecordId& id, uint64_t fence, TimePoint now);
Result<void> AbandonInTx(WriteContext& ctx, const RecordId& id, std::string_view owner,
                         TimePoint now);
Result<Record> MarkUnknownInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                               Duration retention, TimePoint now);
Result<Record> TakeOverInTx(WriteContext& ctx, const RecordId& id, uint64_t fence, Duration lease,
                            TimePoint now);

// Store::Evict, PurgeExpired and AppendAttempts.
Result<bool> EvictInTx(WriteContext& ctx, const RecordId& id);
Result<size_t> PurgeExpiredInTx(WriteContext& ctx, size_t limit, TimePoint now);
Result<void> AppendAttemptsInTx(WriteContext& ctx, const std::vector<Attempt>& attempts);

// "record "KEY" of tenant "TENANT"", for messages.
std::string DescribeRecord(const RecordId& id);

}  // namespace idem::sqlite
