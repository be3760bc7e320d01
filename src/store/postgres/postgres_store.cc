#include "postgres_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "attempt_rows.h"
#include "batch_writer.h"
#include "change_announcer.h"
#include "change_listener.h"
#include "connection_pool.h"
#include "core/change_hub.h"
#include "pg_connection.h"
#include "pg_schema.h"
#include "postgres_url.h"
#include "record_rows.h"

namespace idem {

namespace postgres {
// The records a fence-conditional write accepts, for explaining a refusal.
struct WriteRule {
  std::string_view action;
  std::vector<RecordState> states;
  bool needs_dead_owner = false;  // in progress only with an expired lease
};
}  // namespace postgres

namespace {

using postgres::ChangePayload;
using postgres::Connection;
using postgres::Failure;
using postgres::Params;

// Runs of one operation after deadlocks or serialization failures.
constexpr int kMaxRuns = 4;
// Rounds of insert / read / replace one claim makes while other writers keep
// changing the same record under it. Each lost round means another claim,
// release or eviction of that very record committed in between.
constexpr int kMaxClaimRounds = 16;

// WaitForChange's re-read interval while notifications flow.
constexpr Duration kPollWhileListening{1000};

std::string Describe(const RecordId& id) {
  return fmt::format("record \"{}\" of tenant \"{}\"", id.key, id.tenant);
}

Error NotFound(std::string_view where, const RecordId& id) {
  return Error{ErrorCode::kNotFound,
               fmt::format("postgres store {}: {} does not exist (never claimed, released, "
                           "evicted or expired)",
                           where, Describe(id))};
}

// Which live records each fence-conditional write accepts (as its SQL does).
const postgres::WriteRule kHeartbeatRule{"a heartbeat", {RecordState::kInProgress}};
const postgres::WriteRule kCompleteRule{"complete",
                                        {RecordState::kInProgress, RecordState::kUnknown}};
const postgres::WriteRule kReleaseRule{"release",
                                       {RecordState::kInProgress, RecordState::kUnknown}};
const postgres::WriteRule kMarkUnknownRule{"mark unknown", {RecordState::kInProgress}};
const postgres::WriteRule kTakeOverRule{
    "take over", {RecordState::kInProgress, RecordState::kUnknown}, /*needs_dead_owner=*/true};

Result<void> CheckOptions(const StoreOptions& options) {
  if (options.poll_interval <= Duration(0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "postgres store: the poll interval must be positive");
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Store>> OpenPostgresStore(std::string_view url, Clock& clock,
                                                 const StoreOptions& options) {
  auto store = PostgresStore::Open(url, clock, options);
  if (!store) return std::unexpected(std::move(store.error()));
  return std::unique_ptr<Store>(std::move(*store));
}

PostgresStore::PostgresStore(std::unique_ptr<postgres::PostgresUrl> url, Clock& clock,
                             const StoreOptions& options)
    : url_(std::move(url)), clock_(clock), options_(options) {}

PostgresStore::~PostgresStore() = default;

Result<std::unique_ptr<PostgresStore>> PostgresStore::Open(std::string_view url, Clock& clock,
                                                           const StoreOptions& options) {
  if (auto ok = CheckOptions(options); !ok) return std::unexpected(std::move(ok.error()));
  auto parsed = postgres::ParsePostgresUrl(url);
  if (!parsed) return std::unexpected(std::move(parsed.error()));

  std::unique_ptr<PostgresStore> store(new PostgresStore(
      std::make_unique<postgres::PostgresUrl>(std::move(*parsed)), clock, options));
  store->hub_ = std::make_unique<ChangeHub>();
  store->pool_ = std::make_unique<postgres::ConnectionPool>(*store->url_);
  store->announcer_ = std::make_unique<postgres::ChangeAnnouncer>(*store->pool_);
  if (store->url_->batch_size > 1) {
    store->batch_ = std::make_unique<postgres::BatchWriter>(
        *store->pool_, store->url_->batch_size, store->url_->batch_writers);
  }
  {
    auto conn = store->pool_->Acquire();
    if (!conn) return std::unexpected(std::move(conn.error()));
    if (auto ok = postgres::MigrateSchema(**conn, store->url_->schema); !ok) {
      conn->Discard();  // a failed migration may leave the session mid-transaction
      return std::unexpected(std::move(ok.error()));
    }
  }
  auto listener = postgres::ChangeListener::Start(*store->url_, *store->hub_);
  if (!listener) return std::unexpected(std::move(listener.error()));
  store->listener_ = std::move(*listener);
  return store;
}

bool PostgresStore::listening() const { return listener_->listening(); }

PostgresStore::BatchCounts PostgresStore::batch_counts() const {
  if (!batch_) return {};
  return BatchCounts{batch_->commits(), batch_->writes(), batch_->queued()};
}

bool PostgresStore::WatchEvictions(EvictionFeed on_change) {
  listener_->WatchEvictions(std::move(on_change));
  return true;
}

template <typename T, typename Fn>
Result<T> PostgresStore::Run(Retry retry, Fn fn) {
  for (int run = 1;; ++run) {
    auto conn = pool_->Acquire();
    if (!conn) return std::unexpected(std::move(conn.error()));
    Result<T> result = fn(**conn);
    if (result) return result;
    const Failure failure = (*conn)->last_failure();
    if (failure == Failure::kConnectionLost) conn->Discard();
    const bool again = run < kMaxRuns &&
                       (failure == Failure::kTransient ||
                        (failure == Failure::kConnectionLost && retry == Retry::kSafe && run == 1));
    if (!again) return result;
  }
}

template <typename T, typename Fn>
Result<T> PostgresStore::RunShared(const RecordId& id, const postgres::Statement& first,
                                   const std::pair<Params, Params>& params, Fn fn) {
  if (!batch_) {
    return Run<T>(Retry::kUnsafe, [&](Connection& conn) {
      postgres::BatchContext ctx{conn, /*log_inline=*/true, {}};
      return fn(ctx);
    });
  }
  return batch_->Run<T>(id, {&first, &params.first}, {&first, &params.second}, std::move(fn));
}

Result<std::pair<Params, Params>> PostgresStore::BindLogged(const Params& p,
                                                            const Attempt* logged) const {
  std::pair<Params, Params> out{p, p};
  auto bound = postgres::BindAttempts(
      out.first, logged ? std::span<const Attempt>(logged, 1) : std::span<const Attempt>(),
      url_->where);
  if (!bound) return std::unexpected(std::move(bound.error()));
  (void)postgres::BindAttempts(out.second, std::span<const Attempt>(), url_->where);
  return out;
}

void PostgresStore::Changed(const RecordId& id, bool announce) {
  hub_->Notify(ChangeHub::KeyOf(id));
  // Other instances hear of it through the announcer, batched and off this
  // request's path: the change has committed; waking them is best effort
  // (their waiters also re-read on their poll).
  if (announce) announcer_->Announce(ChangePayload(url_->schema, id));
}

Result<void> PostgresStore::MarkWatched(const RecordId& id, const Record& seen) {
  // Marking twice is harmless: safe to re-run.
  return Run<void>(Retry::kSafe, [&](Connection& conn) -> Result<void> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Int(static_cast<int64_t>(seen.fence))
        .Text(RecordStateName(seen.state));
    auto rows = conn.Execute(postgres::kMarkWatched, p, "watching " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    return {};
  });
}

Error PostgresStore::WhyNotWritten(Connection& conn, const RecordId& id, uint64_t fence,
                                   TimePoint now, const postgres::WriteRule& rule) {
  auto row = postgres::ReadRecord(conn, id);
  if (!row) return std::move(row.error());
  if (!*row || (*row)->expires_at <= now) return NotFound(url_->where, id);
  const Record& r = **row;
  if (r.fence != fence) {
    return Error{ErrorCode::kAborted,
                 fmt::format("postgres store {}: {} is now at fence {} ({}), not {}: this owner "
                             "lost its claim and must not write",
                             url_->where, Describe(id), r.fence, RecordStateName(r.state), fence)};
  }
  if (std::find(rule.states.begin(), rule.states.end(), r.state) == rule.states.end()) {
    std::string allowed;
    for (RecordState s : rule.states) {
      allowed += (allowed.empty() ? "" : " or ") + std::string(RecordStateName(s));
    }
    return Error{ErrorCode::kFailedPrecondition,
                 fmt::format("postgres store {}: {} is {}; {} needs it {}", url_->where,
                             Describe(id), RecordStateName(r.state), rule.action, allowed)};
  }
  if (rule.needs_dead_owner && r.state == RecordState::kInProgress && r.lease_expires_at > now) {
    return Error{ErrorCode::kFailedPrecondition,
                 fmt::format("postgres store {}: {} is in progress and its owner's lease is "
                             "alive for {} ms; wait for it or for the lease to expire",
                             url_->where, Describe(id), (r.lease_expires_at - now).count())};
  }
  // The row qualifies now, so it did not when the write ran: another writer
  // changed it in between and back again, which fences rule out.
  return Error{ErrorCode::kAborted,
               fmt::format("postgres store {}: {} changed while it was being written; re-read it",
                           url_->where, Describe(id))};
}

Result<ClaimResult> PostgresStore::Claim(const ClaimRequest& req) {
  const TimePoint now = clock_.Now();
  // With read_before_claim, a duplicate (a replay, or a call still in
  // progress) is answered from a read of committed rows: it writes nothing,
  // so it waits for no batch. Without, the claim's statement finds it.
  if (url_->read_before_claim) {
    auto seen = Run<std::optional<Record>>(
        Retry::kSafe, [&](Connection& conn) { return postgres::ReadRecord(conn, req.id); });
    if (!seen) return std::unexpected(std::move(seen.error()));
    if (*seen && (*seen)->expires_at > now) return ClaimResult{false, std::move(**seen)};
  }

  Params p;
  p.Text(req.id.tenant)
      .Text(req.id.key)
      .Text(req.fingerprint)
      .Text(req.tool)
      .Text(req.turn)
      .Int(ToUnixMillis(now))
      .Int(ToUnixMillis(now + req.lease))
      .Int(ToUnixMillis(now + std::max(req.retention, req.lease)))
      .Text(ChangePayload(url_->schema, req.id))
      .Text(req.owner)
      .Int(req.retention.count());
  const Attempt* logged = req.logged ? &*req.logged : nullptr;
  auto with_log = BindLogged(p, logged);
  if (!with_log) return std::unexpected(std::move(with_log.error()));
  const std::string what = "claiming " + Describe(req.id);

  auto claimed = RunShared<ClaimResult>(req.id, postgres::kClaimInsert, *with_log,
                                        [&](postgres::BatchContext& ctx) -> Result<ClaimResult> {
    Connection& conn = ctx.conn;
    const Params& params = ctx.log_inline ? with_log->first : with_log->second;
    for (int round = 0; round < kMaxClaimRounds; ++round) {
      auto inserted = conn.Execute(postgres::kClaimInsert, params, what);
      if (!inserted) return std::unexpected(std::move(inserted.error()));
      if (inserted->size() == 1) {
        auto r = postgres::DecodeRecord(*inserted, 0, req.id, url_->where);
        if (!r) return std::unexpected(std::move(r.error()));
        ctx.Defer(logged);
        return ClaimResult{true, std::move(*r)};
      }

      // The key exists: this is a duplicate, or the old record is past
      // retention and may be replaced.
      auto existing = postgres::ReadRecord(conn, req.id);
      if (!existing) return std::unexpected(std::move(existing.error()));
      if (!*existing) continue;  // deleted since the insert: insert again
      if ((*existing)->expires_at > now) return ClaimResult{false, std::move(**existing)};

      auto replaced = conn.Execute(postgres::kClaimReplace, params, what);
      if (!replaced) return std::unexpected(std::move(replaced.error()));
      if (replaced->size() == 1) {
        auto r = postgres::DecodeRecord(*replaced, 0, req.id, url_->where);
        if (!r) return std::unexpected(std::move(r.error()));
        ctx.Defer(logged);
        return ClaimResult{true, std::move(*r)};
      }
      // Another instance replaced or deleted it first: look again.
    }
    return MakeError(ErrorCode::kUnavailable,
                     fmt::format("postgres store {}: {} was changed by other writers in each of "
                                 "{} attempts; retryable",
                                 url_->where, what, kMaxClaimRounds));
  });
  // Nobody waits on a record that did not exist (or had expired): only
  // in-process waiters on the expired one need a nudge.
  if (claimed && claimed->claimed) hub_->Notify(ChangeHub::KeyOf(req.id));
  return claimed;
}

Result<TimePoint> PostgresStore::Heartbeat(const RecordId& id, uint64_t fence, Duration lease) {
  const TimePoint now = clock_.Now();
  // Extending the lease to the same end again is harmless: safe to re-run.
  return Run<TimePoint>(Retry::kSafe, [&](Connection& conn) -> Result<TimePoint> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Int(static_cast<int64_t>(fence))
        .Int(ToUnixMillis(now + lease))
        .Int(ToUnixMillis(now));
    auto rows = conn.Execute(postgres::kHeartbeat, p, "renewing the lease of " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 0) {
      return std::unexpected(WhyNotWritten(conn, id, fence, now, kHeartbeatRule));
    }
    return now + lease;
  });
}

Result<Record> PostgresStore::Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                       Duration retention, const Attempt* logged) {
  const TimePoint now = clock_.Now();
  bool watched = false;
  Params p;
  p.Text(id.tenant)
      .Text(id.key)
      .Int(static_cast<int64_t>(fence))
      .Text(OutcomeClassName(outcome.cls))
      .Bytes(outcome.body)
      .Int(ToUnixMillis(now))
      .Int(ToUnixMillis(now + retention))
      .Text(ChangePayload(url_->schema, id));
  auto with_log = BindLogged(p, logged);
  if (!with_log) return std::unexpected(std::move(with_log.error()));
  auto done = RunShared<Record>(id, postgres::kComplete, *with_log,
                                [&](postgres::BatchContext& ctx) -> Result<Record> {
    Connection& conn = ctx.conn;
    auto rows = conn.Execute(postgres::kComplete,
                             ctx.log_inline ? with_log->first : with_log->second,
                             "completing " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 0) {
      return std::unexpected(WhyNotWritten(conn, id, fence, now, kCompleteRule));
    }
    watched = rows->Bool(0, postgres::kCompleteWatchedColumn).value_or(true);
    auto record = postgres::DecodeRecord(*rows, 0, id, url_->where);
    if (record) ctx.Defer(logged);
    return record;
  });
  // The common case, a call without duplicates, sends no announcement: no
  // other instance waits for this record unless it marked it watched.
  if (done) Changed(id, watched);
  return done;
}

Result<void> PostgresStore::Release(const RecordId& id, uint64_t fence) {
  const TimePoint now = clock_.Now();
  auto released = Run<void>(Retry::kUnsafe, [&](Connection& conn) -> Result<void> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Int(static_cast<int64_t>(fence))
        .Int(ToUnixMillis(now))
        .Text(ChangePayload(url_->schema, id));
    auto rows = conn.Execute(postgres::kRelease, p, "releasing " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 0) {
      return std::unexpected(WhyNotWritten(conn, id, fence, now, kReleaseRule));
    }
    return {};
  });
  if (released) Changed(id);
  return released;
}

Result<void> PostgresStore::Abandon(const RecordId& id, std::string_view owner) {
  if (owner.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "postgres store: abandon needs the claim's owner token");
  }
  const TimePoint now = clock_.Now();
  // Deleting our own claim twice is harmless (the second finds nothing):
  // safe to re-run after a lost connection.
  auto abandoned = Run<void>(Retry::kSafe, [&](Connection& conn) -> Result<void> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Text(owner)
        .Int(ToUnixMillis(now))
        .Text(ChangePayload(url_->schema, id));
    auto rows = conn.Execute(postgres::kAbandon, p, "abandoning " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 1) return {};
    auto row = postgres::ReadRecord(conn, id);
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row || (*row)->expires_at <= now) return std::unexpected(NotFound(url_->where, id));
    const Record& r = **row;
    if (r.owner != owner) {
      return MakeError(ErrorCode::kAborted,
                       fmt::format("postgres store {}: {} was claimed by another attempt (fence "
                                   "{}); it is not this attempt's to abandon",
                                   url_->where, Describe(id), r.fence));
    }
    if (r.state != RecordState::kInProgress) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("postgres store {}: {} is {}; abandon needs it in_progress",
                                   url_->where, Describe(id), RecordStateName(r.state)));
    }
    return MakeError(ErrorCode::kAborted,
                     fmt::format("postgres store {}: {} changed while it was being abandoned; "
                                 "re-read it",
                                 url_->where, Describe(id)));
  });
  if (abandoned) Changed(id);
  return abandoned;
}

Result<Record> PostgresStore::MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) {
  const TimePoint now = clock_.Now();
  auto marked = Run<Record>(Retry::kUnsafe, [&](Connection& conn) -> Result<Record> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Int(static_cast<int64_t>(fence))
        .Int(ToUnixMillis(now))
        .Int(ToUnixMillis(now + retention))
        .Text(ChangePayload(url_->schema, id));
    auto rows = conn.Execute(postgres::kMarkUnknown, p, "marking unknown " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 0) {
      return std::unexpected(WhyNotWritten(conn, id, fence, now, kMarkUnknownRule));
    }
    return postgres::DecodeRecord(*rows, 0, id, url_->where);
  });
  if (marked) Changed(id);
  return marked;
}

Result<Record> PostgresStore::TakeOver(const RecordId& id, uint64_t fence, Duration lease) {
  const TimePoint now = clock_.Now();
  auto taken = Run<Record>(Retry::kUnsafe, [&](Connection& conn) -> Result<Record> {
    Params p;
    p.Text(id.tenant)
        .Text(id.key)
        .Int(static_cast<int64_t>(fence))
        .Int(ToUnixMillis(now))
        .Int(ToUnixMillis(now + lease))
        .Text(ChangePayload(url_->schema, id));
    auto rows = conn.Execute(postgres::kTakeOver, p, "taking over " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    if (rows->size() == 0) {
      return std::unexpected(WhyNotWritten(conn, id, fence, now, kTakeOverRule));
    }
    return postgres::DecodeRecord(*rows, 0, id, url_->where);
  });
  if (taken) Changed(id);
  return taken;
}

Result<std::optional<Record>> PostgresStore::Get(const RecordId& id) {
  auto row = Run<std::optional<Record>>(
      Retry::kSafe, [&](Connection& conn) { return postgres::ReadRecord(conn, id); });
  if (row && *row && (*row)->expires_at <= clock_.Now()) return std::nullopt;
  return row;
}

Result<bool> PostgresStore::Evict(const RecordId& id) {
  auto evicted = Run<bool>(Retry::kUnsafe, [&](Connection& conn) -> Result<bool> {
    Params p;
    p.Text(id.tenant).Text(id.key).Text(ChangePayload(url_->schema, id));
    p.Text(postgres::EvictionPayload(url_->schema));
    auto rows = conn.Execute(postgres::kEvict, p, "evicting " + Describe(id));
    if (!rows) return std::unexpected(std::move(rows.error()));
    return rows->size() > 0;
  });
  if (evicted && *evicted) Changed(id);
  return evicted;
}

Result<void> PostgresStore::WaitForChange(const RecordId& id, const Record& seen,
                                          TimePoint deadline) {
  // Subscribe before the first read, so a change committed in between wakes
  // the wait instead of being missed.
  auto watch = hub_->Subscribe(id);
  bool marked = false;
  for (;;) {
    auto current = Get(id);
    if (!current) return std::unexpected(std::move(current.error()));
    if (!*current || (*current)->fence != seen.fence || (*current)->state != seen.state) {
      return {};
    }
    if (!marked) {
      // A completion is announced to other instances only if the record is
      // marked watched. One that committed between the read above and the
      // mark did not see it, so read again after marking.
      if (auto ok = MarkWatched(id, seen); !ok) return ok;
      marked = true;
      continue;
    }
    const TimePoint now = clock_.Now();
    if (now >= deadline) return {};
    // While the LISTEN connection is up, every change arrives as a
    // notification and the poll is only a safety net, so it runs at most once
    // a second: a storm of waiting duplicates must not become a storm of
    // queries. When the listener drops it wakes every waiter, and they poll
    // at options.poll_interval until it is back.
    const Duration poll = listener_->listening()
                              ? std::max(options_.poll_interval, kPollWhileListening)
                              : options_.poll_interval;
    watch->WaitUntil(clock_, std::min(deadline, now + poll));
  }
}

Result<size_t> PostgresStore::PurgeExpired(size_t limit) {
  if (limit == 0) return 0;
  const TimePoint now = clock_.Now();
  return Run<size_t>(Retry::kUnsafe, [&](Connection& conn) -> Result<size_t> {
    Params p;
    p.Int(ToUnixMillis(now))
        .Int(static_cast<int64_t>(
            std::min<size_t>(limit, static_cast<size_t>(std::numeric_limits<int64_t>::max()))));
    auto rows = conn.Execute(postgres::kPurgeExpired, p, "purging expired records");
    if (!rows) return std::unexpected(std::move(rows.error()));
    return static_cast<size_t>(rows->affected());
  });
}

// clock_timestamp(), not now(): the time of the read, not of a transaction's start.
Result<std::optional<TimePoint>> PostgresStore::ReadServerClock() {
  return Run<std::optional<TimePoint>>(
      Retry::kSafe, [&](Connection& conn) -> Result<std::optional<TimePoint>> {
        auto rows = conn.Execute(postgres::kServerClock, Params(), "reading the server's clock");
        if (!rows) return std::unexpected(std::move(rows.error()));
        const auto ms = rows->size() == 1 ? rows->Int(0, 0) : std::nullopt;
        if (!ms) {
          return MakeError(ErrorCode::kInternal,
                           fmt::format("postgres store {}: clock_timestamp() returned no number",
                                       url_->where));
        }
        return FromUnixMillis(*ms);
      });
}

Result<uint64_t> PostgresStore::CountRecords() {
  return Run<uint64_t>(Retry::kSafe, [&](Connection& conn) -> Result<uint64_t> {
    auto rows = conn.Execute(postgres::kCountRecords, Params(), "counting records");
    if (!rows) return std::unexpected(std::move(rows.error()));
    const auto n = rows->size() == 1 ? rows->Int(0, 0) : std::nullopt;
    if (!n || *n < 0) {
      return MakeError(ErrorCode::kInternal,
                       fmt::format("postgres store {}: count(*) returned no number", url_->where));
    }
    return static_cast<uint64_t>(*n);
  });
}

Result<void> PostgresStore::AppendAttempts(const std::vector<Attempt>& attempts) {
  if (attempts.empty()) return {};
  return Run<void>(Retry::kUnsafe,
                   [&](Connection& conn) { return postgres::InsertAttempts(conn, attempts); });
}

Result<std::vector<Attempt>> PostgresStore::QueryAttempts(const AttemptFilter& filter) {
  return Run<std::vector<Attempt>>(
      Retry::kSafe, [&](Connection& conn) { return postgres::SelectAttempts(conn, filter); });
}

Result<std::map<std::string, ToolStats>> PostgresStore::SummarizeAttempts(
    const AttemptFilter& filter) {
  return Run<std::map<std::string, ToolStats>>(
      Retry::kSafe, [&](Connection& conn) { return postgres::CountAttempts(conn, filter); });
}

Result<std::vector<ChainHead>> PostgresStore::ChainHeads(const std::optional<std::string>& tenant) {
  return Run<std::vector<ChainHead>>(
      Retry::kSafe, [&](Connection& conn) { return postgres::SelectChainHeads(conn, tenant); });
}

Result<ChainPage> PostgresStore::ReadChain(const std::optional<std::string>& tenant,
                                           const std::string& cursor, size_t limit) {
  return Run<ChainPage>(Retry::kSafe, [&](Connection& conn) {
    return postgres::SelectChain(conn, tenant, cursor, limit);
  });
}

// Safe to re-run: a purge whose reply was lost has nothing more to delete.
Result<size_t> PostgresStore::PurgeAttempts(TimePoint before, size_t limit) {
  if (limit == 0) return 0;
  return Run<size_t>(Retry::kSafe, [&](Connection& conn) {
    return postgres::DeleteOldAttempts(conn, before, limit);
  });
}

}  // namespace idem
