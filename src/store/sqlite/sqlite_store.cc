#include "sqlite_store.h"

#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "core/change_hub.h"
#include "database_file.h"
#include "group_commit_writer.h"
#include "read_pool.h"
#include "sqlite_connection.h"
#include "sqlite_rows.h"
#include "sqlite_schema.h"
#include "write_lock.h"

namespace idem {
namespace {

using sqlite::Connection;
using sqlite::WriteContext;

// PRAGMA synchronous values accepted from options, as fixed SQL.
Result<const char*> SynchronousPragma(const std::string& mode) {
  if (mode == "full") return "PRAGMA synchronous = FULL";
  if (mode == "normal") return "PRAGMA synchronous = NORMAL";
  if (mode == "extra") return "PRAGMA synchronous = EXTRA";
  if (mode == "off") return "PRAGMA synchronous = OFF";
  return MakeError(ErrorCode::kInvalidArgument,
                   fmt::format("sqlite store: synchronous \"{}\" is not one of full, normal, "
                               "extra, off",
                               mode));
}

// The parts of a sqlite: store URL after the scheme.
struct Target {
  std::string path;
  bool write_lock = true;
};

// Splits PATH[?NAME=VALUE&…] (see OpenSqliteStore).
Result<Target> ParseTarget(std::string_view url) {
  const size_t q = url.find('?');
  Target target{std::string(url.substr(0, q)), true};
  if (q == std::string_view::npos) return target;
  std::string_view params = url.substr(q + 1);
  while (!params.empty()) {
    const size_t amp = params.find('&');
    const std::string_view param = params.substr(0, amp);
    params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
    if (param == "write_lock=flock") {
      target.write_lock = true;
    } else if (param == "write_lock=none") {
      target.write_lock = false;
    } else {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("sqlite store {}: unknown parameter \"{}\"; the one known is "
                                   "write_lock=flock|none (a path with '?' in it cannot be used)",
                                   target.path, param));
    }
  }
  return target;
}

Result<void> CheckOptions(const StoreOptions& options) {
  if (options.sqlite_busy_timeout < Duration(0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite store: the busy timeout must not be negative");
  }
  if (options.poll_interval <= Duration(0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite store: the poll interval must be positive");
  }
  if (options.max_batch == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "sqlite store: max_batch must be at least 1");
  }
  return {};
}

// Switches the file to WAL mode, waiting up to `busy_timeout` for other
// openers. The switch upgrades a shared lock; when another connection is
// upgrading too, SQLite answers SQLITE_BUSY at once rather than call the busy
// handler (waiting could deadlock), so the retry is here: the failed
// statement drops its lock, and one of the openers gets through.
Result<void> EnableWal(Connection& conn, Duration busy_timeout) {
  const auto give_up = std::chrono::steady_clock::now() + busy_timeout;
  auto pause = std::chrono::microseconds(100);
  Result<std::string> mode;
  for (;;) {
    mode = conn.QueryText("PRAGMA journal_mode = WAL", "switching the file to WAL mode");
    const int rc = sqlite3_errcode(conn.handle()) & 0xff;
    if (mode || (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) ||
        std::chrono::steady_clock::now() >= give_up) {
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20'000));
  }
  if (!mode) return std::unexpected(std::move(mode.error()));
  if (*mode != "wal") {
    return MakeError(ErrorCode::kUnavailable,
                     fmt::format("sqlite store {}: the file system does not support SQLite's WAL "
                                 "mode (journal mode stays \"{}\"); put the store on a local file "
                                 "system",
                                 conn.path(), *mode));
  }
  return {};
}

int64_t Micros(TimePoint t) { return ToUnixMillis(t) * 1000; }

std::string Describe(const RecordId& id) {
  return fmt::format("record \"{}\" of tenant \"{}\"", id.key, id.tenant);
}

Error NotFound(const RecordId& id) {
  return Error{ErrorCode::kNotFound,
               Describe(id) + " does not exist (never claimed, released, evicted or expired)"};
}

Error StaleFence(const Record& r, uint64_t fence) {
  return Error{ErrorCode::kAborted,
               fmt::format("{} is now at fence {} ({}), not {}: this owner lost its claim and "
                           "must not write",
                           Describe(r.id), r.fence, RecordStateName(r.state), fence)};
}

Error WrongState(const Record& r, std::string_view action, std::string_view allowed) {
  return Error{ErrorCode::kFailedPrecondition,
               fmt::format("{} is {}; {} needs it {}", Describe(r.id), RecordStateName(r.state),
                           action, allowed)};
}

// The live row of `id` owned with `fence`: kNotFound if absent or past
// retention, kAborted if the fence moved on.
Result<Record> ReadOwned(Connection& conn, const RecordId& id, uint64_t fence, TimePoint now) {
  auto row = sqlite::ReadRecord(conn, id);
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row || (*row)->expires_at <= now) return std::unexpected(NotFound(id));
  if ((*row)->fence != fence) return std::unexpected(StaleFence(**row, fence));
  return std::move(**row);
}

template <typename T, typename Fn>
class FnOp final : public sqlite::WriteOp {
 public:
  explicit FnOp(Fn& fn) : fn_(fn) {}

  Result<void> Run(WriteContext& ctx) override {
    result_.emplace(fn_(ctx));
    if (!*result_ && sqlite::IsStorageFailure(result_->error().code)) {
      return std::unexpected(result_->error());
    }
    return {};
  }

  void Fail(const Error& error) override { result_.emplace(std::unexpected(error)); }

  Result<T> Take() { return std::move(*result_); }

 private:
  Fn& fn_;
  std::optional<Result<T>> result_;
};

}  // namespace

Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path, Clock& clock,
                                               const StoreOptions& options) {
  auto store = SqliteStore::Open(path, clock, options);
  if (!store) return std::unexpected(std::move(store.error()));
  return std::unique_ptr<Store>(std::move(*store));
}

SqliteStore::SqliteStore(std::string path, Clock& clock, const StoreOptions& options)
    : path_(std::move(path)), clock_(clock), options_(options) {}

SqliteStore::~SqliteStore() = default;

Result<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& url, Clock& clock,
                                                       const StoreOptions& options) {
  auto target = ParseTarget(url);
  if (!target) return std::unexpected(std::move(target.error()));
  const std::string& path = target->path;
  if (auto ok = CheckOptions(options); !ok) return std::unexpected(std::move(ok.error()));
  auto synchronous = SynchronousPragma(options.sqlite_synchronous);
  if (!synchronous) return std::unexpected(std::move(synchronous.error()));
  if (auto ok = sqlite::PrepareDatabaseFile(path); !ok) {
    return std::unexpected(std::move(ok.error()));
  }

  auto conn = Connection::Open(path, options.sqlite_busy_timeout);
  if (!conn) return std::unexpected(std::move(conn.error()));
  if (auto ok = EnableWal(**conn, options.sqlite_busy_timeout); !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  if (auto ok = (*conn)->Exec(*synchronous, "setting PRAGMA synchronous"); !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  if (auto ok = sqlite::MigrateSchema(**conn); !ok) return std::unexpected(std::move(ok.error()));
  std::unique_ptr<sqlite::WriteLock> write_lock;
  if (target->write_lock) {
    auto opened = sqlite::WriteLock::Open(path);
    if (!opened) return std::unexpected(std::move(opened.error()));
    write_lock = std::move(*opened);
  }

  std::unique_ptr<SqliteStore> store(new SqliteStore(path, clock, options));
  store->hub_ = std::make_unique<ChangeHub>();
  const size_t max_idle_readers = std::max(4u, std::thread::hardware_concurrency());
  store->readers_ =
      std::make_unique<sqlite::ReadPool>(path, options.sqlite_busy_timeout, max_idle_readers);
  // Open one reader now so that a file readers cannot use fails here, not on
  // the first Get.
  if (auto reader = store->readers_->Acquire(); !reader) {
    return std::unexpected(std::move(reader.error()));
  }
  ChangeHub* hub = store->hub_.get();
  store->writer_ = std::make_unique<sqlite::GroupCommitWriter>(
      std::move(*conn), std::move(write_lock), options.max_batch,
      [hub](const std::vector<RecordId>& changed) {
        for (const RecordId& id : changed) hub->Notify(ChangeHub::KeyOf(id));
      });
  return store;
}

uint64_t SqliteStore::commits() const { return writer_->commits(); }
uint64_t SqliteStore::writes() const { return writer_->writes(); }
uint64_t SqliteStore::pending_writes() const { return writer_->pending(); }
uint64_t SqliteStore::write_lock_waits() const { return writer_->lock_waits(); }

template <typename T, typename Fn>
Result<T> SqliteStore::Write(Fn fn) {
  FnOp<T, Fn> op(fn);
  writer_->Execute(op);
  return op.Take();
}

Result<ClaimResult> SqliteStore::Claim(const ClaimRequest& req) {
  // A live record that someone else owns or completed is returned without a
  // write transaction: replays and duplicates then cost a read on a WAL
  // reader, not a turn of the single writer. Linearisable: a live record
  // read here was live at that instant, which is where this claim takes
  // effect. An absent or expired record still goes through the atomic
  // claim in the writer, so there is no check-then-insert.
  if (auto live = Get(req.id); live && *live) return ClaimResult{false, std::move(**live)};
  return Write<ClaimResult>([&](WriteContext& ctx) -> Result<ClaimResult> {
    const TimePoint now = clock_.Now();
    auto row = sqlite::ReadRecord(ctx.conn, req.id);
    if (!row) return std::unexpected(std::move(row.error()));
    if (*row && (*row)->expires_at > now) return ClaimResult{false, std::move(**row)};

    auto floor = sqlite::FenceFloor(ctx.conn);
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
    if (auto ok = sqlite::WriteRecord(ctx.conn, r); !ok) return std::unexpected(ok.error());
    if (req.logged) {
      if (auto ok = sqlite::InsertAttempt(ctx.conn, *req.logged); !ok) {
        return std::unexpected(ok.error());
      }
    }
    ctx.changed.push_back(req.id);
    return ClaimResult{true, std::move(r)};
  });
}

Result<TimePoint> SqliteStore::Heartbeat(const RecordId& id, uint64_t fence, Duration lease) {
  return Write<TimePoint>([&](WriteContext& ctx) -> Result<TimePoint> {
    const TimePoint now = clock_.Now();
    auto r = ReadOwned(ctx.conn, id, fence, now);
    if (!r) return std::unexpected(std::move(r.error()));
    if (r->state != RecordState::kInProgress) {
      return std::unexpected(WrongState(*r, "a heartbeat", "in_progress"));
    }
    r->lease_expires_at = now + lease;
    r->expires_at = std::max(r->expires_at, r->lease_expires_at);
    if (auto ok = sqlite::WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
    return r->lease_expires_at;
  });
}

Result<Record> SqliteStore::Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                     Duration retention, const Attempt* logged) {
  return Write<Record>([&](WriteContext& ctx) -> Result<Record> {
    const TimePoint now = clock_.Now();
    auto r = ReadOwned(ctx.conn, id, fence, now);
    if (!r) return r;
    if (r->state == RecordState::kCompleted) {
      return std::unexpected(WrongState(*r, "complete", "in_progress or unknown"));
    }
    r->state = RecordState::kCompleted;
    r->outcome = outcome;
    r->completed_at = now;
    r->expires_at = now + retention;
    if (auto ok = sqlite::WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
    if (logged) {
      if (auto ok = sqlite::InsertAttempt(ctx.conn, *logged); !ok) {
        return std::unexpected(ok.error());
      }
    }
    ctx.changed.push_back(id);
    return r;
  });
}

Result<void> SqliteStore::Release(const RecordId& id, uint64_t fence) {
  return Write<void>([&](WriteContext& ctx) -> Result<void> {
    auto r = ReadOwned(ctx.conn, id, fence, clock_.Now());
    if (!r) return std::unexpected(std::move(r.error()));
    if (r->state == RecordState::kCompleted) {
      return std::unexpected(WrongState(*r, "release", "in_progress or unknown"));
    }
    if (auto ok = sqlite::DeleteRecord(ctx.conn, id); !ok) return std::unexpected(ok.error());
    ctx.changed.push_back(id);
    return {};
  });
}

// One write transaction, like every write here: read, check, delete. The
// single writer connection makes it atomic.
Result<void> SqliteStore::Abandon(const RecordId& id, std::string_view owner) {
  if (owner.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite store: abandon needs the claim's owner token");
  }
  return Write<void>([&](WriteContext& ctx) -> Result<void> {
    auto row = sqlite::ReadRecord(ctx.conn, id);
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row || (*row)->expires_at <= clock_.Now()) return std::unexpected(NotFound(id));
    const Record& r = **row;
    if (r.owner != owner) {
      return MakeError(ErrorCode::kAborted,
                       fmt::format("{} was claimed by another attempt (fence {}); it is not "
                                   "this attempt's to abandon",
                                   Describe(id), r.fence));
    }
    if (r.state != RecordState::kInProgress) {
      return std::unexpected(WrongState(r, "abandon", "in_progress"));
    }
    if (auto ok = sqlite::DeleteRecord(ctx.conn, id); !ok) return std::unexpected(ok.error());
    ctx.changed.push_back(id);
    return {};
  });
}

Result<Record> SqliteStore::MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) {
  return Write<Record>([&](WriteContext& ctx) -> Result<Record> {
    const TimePoint now = clock_.Now();
    auto r = ReadOwned(ctx.conn, id, fence, now);
    if (!r) return r;
    if (r->state != RecordState::kInProgress) {
      return std::unexpected(WrongState(*r, "mark unknown", "in_progress"));
    }
    r->state = RecordState::kUnknown;
    r->completed_at = now;
    r->expires_at = now + retention;
    if (auto ok = sqlite::WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
    ctx.changed.push_back(id);
    return r;
  });
}

Result<Record> SqliteStore::TakeOver(const RecordId& id, uint64_t fence, Duration lease) {
  return Write<Record>([&](WriteContext& ctx) -> Result<Record> {
    const TimePoint now = clock_.Now();
    auto r = ReadOwned(ctx.conn, id, fence, now);
    if (!r) return r;
    if (r->state == RecordState::kCompleted) {
      return std::unexpected(WrongState(*r, "take over",
                                        "in_progress with an expired lease, or "
                                        "unknown"));
    }
    if (r->state == RecordState::kInProgress && r->lease_expires_at > now) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("{} is in progress and its owner's lease is alive for {} ms; "
                                   "wait for it or for the lease to expire",
                                   Describe(id), (r->lease_expires_at - now).count()));
    }
    r->state = RecordState::kInProgress;
    r->owner.clear();
    r->fence = fence + 1;
    r->lease_expires_at = now + lease;
    r->expires_at = std::max(r->expires_at, r->lease_expires_at);
    r->completed_at = TimePoint{};
    r->outcome.reset();
    if (auto ok = sqlite::WriteRecord(ctx.conn, *r); !ok) return std::unexpected(ok.error());
    ctx.changed.push_back(id);
    return r;
  });
}

Result<std::optional<Record>> SqliteStore::Get(const RecordId& id) {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  auto row = sqlite::ReadRecord(**conn, id);
  if (!row) return row;
  if (*row && (*row)->expires_at <= clock_.Now()) return std::nullopt;
  return row;
}

Result<bool> SqliteStore::Evict(const RecordId& id) {
  return Write<bool>([&](WriteContext& ctx) -> Result<bool> {
    auto deleted = sqlite::DeleteRecord(ctx.conn, id);
    if (deleted && *deleted) ctx.changed.push_back(id);
    return deleted;
  });
}

Result<void> SqliteStore::WaitForChange(const RecordId& id, const Record& seen,
                                        TimePoint deadline) {
  // Subscribe before the first read, so a change committed in between wakes
  // the wait instead of being missed.
  auto watch = hub_->Subscribe(id);
  for (;;) {
    auto current = Get(id);
    if (!current) return std::unexpected(std::move(current.error()));
    if (!*current || (*current)->fence != seen.fence || (*current)->state != seen.state) {
      return {};
    }
    const TimePoint now = clock_.Now();
    if (now >= deadline) return {};
    watch->WaitUntil(clock_, std::min(deadline, now + options_.poll_interval));
  }
}

Result<size_t> SqliteStore::PurgeExpired(size_t limit) {
  if (limit == 0) return 0;
  return Write<size_t>([&](WriteContext& ctx) -> Result<size_t> {
    auto ids = sqlite::DeleteExpiredRecords(ctx.conn, clock_.Now(), limit);
    if (!ids) return std::unexpected(std::move(ids.error()));
    ctx.changed.insert(ctx.changed.end(), ids->begin(), ids->end());
    return ids->size();
  });
}

Result<uint64_t> SqliteStore::CountRecords() {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::CountRecordRows(**conn);
}

Result<void> SqliteStore::AppendAttempts(const std::vector<Attempt>& attempts) {
  if (attempts.empty()) return {};
  return Write<void>([&](WriteContext& ctx) -> Result<void> {
    for (const Attempt& a : attempts) {
      if (auto ok = sqlite::InsertAttempt(ctx.conn, a); !ok) return ok;
    }
    return {};
  });
}

Result<std::vector<Attempt>> SqliteStore::QueryAttempts(const AttemptFilter& filter) {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::SelectAttempts(**conn, filter);
}

Result<std::map<std::string, ToolStats>> SqliteStore::SummarizeAttempts(
    const AttemptFilter& filter) {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::CountAttempts(**conn, filter);
}

Result<std::vector<ChainHead>> SqliteStore::ChainHeads(const std::optional<std::string>& tenant) {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::SelectChainHeads(**conn, tenant);
}

Result<ChainPage> SqliteStore::ReadChain(const std::optional<std::string>& tenant,
                                         const std::string& cursor, size_t limit) {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::SelectChain(**conn, tenant, cursor, limit);
}

Result<size_t> SqliteStore::PurgeAttempts(TimePoint before, size_t limit) {
  if (limit == 0) return 0;
  return Write<size_t>(
      [&](WriteContext& ctx) { return sqlite::DeleteOldAttempts(ctx.conn, before, limit); });
}

}  // namespace idem
