#include "sqlite_writes.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "sqlite_rows.h"

namespace idem::sqlite {
namespace {

int64_t Micros(TimePoint t) { return ToUnixMillis(t) * 1000; }

Error NotFound(const RecordId& id) {
  return Error{
      ErrorCode::kNotFound,
      DescribeRecord(id) + " does not exist (never claimed, released, evicted or expired)"};
}

Error StaleFence(const Record& r, uint64_t fence) {
  return Error{ErrorCode::kAborted,
               fmt::format("{} is now at fence {} ({}), not {}: this owner lost its claim and "
                           "must not write",
                           DescribeRecord(r.id), r.fence, RecordStateName(r.state), fence)};
}

Error WrongState(const Record& r, std::string_view action, std::string_view allowed) {
  return Error{ErrorCode::kFailedPrecondition,
               fmt::format("{} is {}; {} needs it {}", DescribeRecord(r.id),
                           RecordStateName(r.state), action, allowed)};
}

// The live row of `id` owned with `fence`: kNotFound if absent or past
// retention, kAborted if the fence moved on.
Result<Record> ReadOwned(Connection& conn, const RecordId& id, uint64_t fence, TimePoint now) {
  auto row = ReadRecord(conn, id);
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row || (*row)->expires_at <= now) return std::unexpected(NotFound(id));
  if ((*row)->fence != fence) return std::unexpected(StaleFence(**row, fence));
  return std::move(**row);
}

}  // namespace

std::string DescribeRecord(const RecordId& id) {
  return fmt::format("record \"{}\" of tenant \"{}\"", id.key, id.tenant);
}

Result<ClaimResult> ClaimInTx(WriteContext& ctx, const ClaimRequest& req, TimePoint now) {
  auto row = ReadRecord(ctx.conn, req.id);
  if (!row) return std::unexpected(std::move(row.error()));
  if (*row && (*row)->expires_at > now) return ClaimResult{false, std::move(**row)};

  auto floor = FenceFloor(ctx.conn);
  if (!floor) return std::unexpected(std::move(floor.error()));
  uint64_t fence = std::max(*floor + 1, static_cast<uint64_t>(Micros(now)));
  if (*row) fence = std::max(fence, (*row)->fence + 1);

  Record r;
  r.id = req.id;
  r.state = RecordState::kInProgress;
  r.fingerprint = req.fingerprint;
  r.tool = req.tool;
  r.turn = req.turn;
  r.owner = req.owner;
  r.fence = fence;
  r.created_at = now;
  r.lease_expires_at = now + req.lease;
  r.expires_at = now + std::max(req.retention, req.lease);
  r.retention = req.retention;
  if (auto ok = WriteRecord(ctx.conn, r); !ok) return std::unexpected(ok.error());
  if (req.logged) {
    if (auto ok = InsertAttempt(ctx.conn, *req.logged, ctx.heads); !ok)
      return std::unexpected(ok.error());
  }
  ctx.changed.push_back(req.id);
  return ClaimResult{true, std::move(r)};
}

Result<TimePoint> HeartbeatInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                                Duration lease, TimePoint now) {
  auto r = ReadOwned(ctx.conn, id, fence, now);
  if (!r) return std::unexpected(std::move(r.error()));
  if (r->state != RecordState::kInProgress) {
    return std::unexpected(WrongState(*r, "a heartbeat", "in_progress"));
  }
  r->lease_expires_at = now + lease;
  r->expires_at = std::max(r->expires_at, r->lease_expires_at);
  if (auto ok = WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
  return r->lease_expires_at;
}

Result<Record> CompleteInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                            const Outcome& outcome, Duration retention, const Attempt* logged,
                            TimePoint now) {
  auto r = ReadOwned(ctx.conn, id, fence, now);
  if (!r) return r;
  if (r->state == RecordState::kCompleted) {
    return std::unexpected(WrongState(*r, "complete", "in_progress or unknown"));
  }
  r->state = RecordState::kCompleted;
  r->outcome = outcome;
  r->completed_at = now;
  r->expires_at = now + retention;
  if (auto ok = WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
  if (logged) {
    if (auto ok = InsertAttempt(ctx.conn, *logged, ctx.heads); !ok)
      return std::unexpected(ok.error());
  }
  ctx.changed.push_back(id);
  return r;
}

Result<void> ReleaseInTx(WriteContext& ctx, const RecordId& id, uint64_t fence, TimePoint now) {
  auto r = ReadOwned(ctx.conn, id, fence, now);
  if (!r) return std::unexpected(std::move(r.error()));
  if (r->state == RecordState::kCompleted) {
    return std::unexpected(WrongState(*r, "release", "in_progress or unknown"));
  }
  if (auto ok = DeleteRecord(ctx.conn, id); !ok) return std::unexpected(ok.error());
  ctx.changed.push_back(id);
  return {};
}

// Read, check, delete in one transaction: the single writer connection makes
// it atomic.
Result<void> AbandonInTx(WriteContext& ctx, const RecordId& id, std::string_view owner,
                         TimePoint now) {
  auto row = ReadRecord(ctx.conn, id);
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row || (*row)->expires_at <= now) return std::unexpected(NotFound(id));
  const Record& r = **row;
  if (r.owner != owner) {
    return MakeError(ErrorCode::kAborted,
                     fmt::format("{} was claimed by another attempt (fence {}); it is not "
                                 "this attempt's to abandon",
                                 DescribeRecord(id), r.fence));
  }
  if (r.state != RecordState::kInProgress) {
    return std::unexpected(WrongState(r, "abandon", "in_progress"));
  }
  if (auto ok = DeleteRecord(ctx.conn, id); !ok) return std::unexpected(ok.error());
  ctx.changed.push_back(id);
  return {};
}

Result<Record> MarkUnknownInTx(WriteContext& ctx, const RecordId& id, uint64_t fence,
                               Duration retention, TimePoint now) {
  auto r = ReadOwned(ctx.conn, id, fence, now);
  if (!r) return r;
  if (r->state != RecordState::kInProgress) {
    return std::unexpected(WrongState(*r, "mark unknown", "in_progress"));
  }
  r->state = RecordState::kUnknown;
  r->completed_at = now;
  r->expires_at = now + retention;
  if (auto ok = WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
  ctx.changed.push_back(id);
  return r;
}

Result<Record> TakeOverInTx(WriteContext& ctx, const RecordId& id, uint64_t fence, Duration lease,
                            TimePoint now) {
  auto r = ReadOwned(ctx.conn, id, fence, now);
  if (!r) return r;
  if (r->state == RecordState::kCompleted) {
    return std::unexpected(
        WrongState(*r, "take over", "in_progress with an expired lease, or unknown"));
  }
  if (r->state == RecordState::kInProgress && r->lease_expires_at > now) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("{} is in progress and its owner's lease is alive for {} ms; "
                                 "wait for it or for the lease to expire",
                                 DescribeRecord(id), (r->lease_expires_at - now).count()));
  }
  r->state = RecordState::kInProgress;
  r->owner.clear();
  r->fence = fence + 1;
  r->lease_expires_at = now + lease;
  r->expires_at = std::max(r->expires_at, r->lease_expires_at);
  r->completed_at = TimePoint{};
  r->outcome.reset();
  if (auto ok = WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
  ctx.changed.push_back(id);
  return r;
}

Result<bool> EvictInTx(WriteContext& ctx, const RecordId& id) {
  auto deleted = DeleteRecord(ctx.conn, id);
  if (deleted && *deleted) ctx.changed.push_back(id);
  return deleted;
}

Result<size_t> PurgeExpiredInTx(WriteContext& ctx, size_t limit, TimePoint now) {
  auto ids = DeleteExpiredRecords(ctx.conn, now, limit);
  if (!ids) return std::unexpected(std::move(ids.error()));
  ctx.changed.insert(ctx.changed.end(), ids->begin(), ids->end());
  return ids->size();
}

Result<void> AppendAttemptsInTx(WriteContext& ctx, const std::vector<Attempt>& attempts) {
  for (const Attempt& a : attempts) {
    if (auto ok = InsertAttempt(ctx.conn, a, ctx.heads); !ok) return ok;
  }
  return {};
}

}  // namespace idem::sqlite
