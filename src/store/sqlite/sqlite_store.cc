#include "sqlite_store.h"

#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "core/change_hub.h"
#include "database_file.h"
#include "eviction_bell.h"
#include "group_commit_writer.h"
#include "read_pool.h"
#include "shared_writer.h"
#include "sqlite_connection.h"
#include "sqlite_rows.h"
#include "sqlite_schema.h"
#include "sqlite_writes.h"
#include "wal_coalescing_vfs.h"
#include "write_lock.h"
#include "writer_protocol.h"

namespace idem {
namespace {

using sqlite::Connection;
using sqlite::WriteContext;

// A PRAGMA synchronous value accepted from options.
struct Synchronous {
  const char* pragma;  // as fixed SQL
  // Every commit syncs the WAL before it is published, which a commit's WAL
  // writes made as one need (wal_coalescing_vfs.h says why).
  bool syncs_commits;
};

Result<Synchronous> ParseSynchronous(const std::string& mode) {
  if (mode == "full") return Synchronous{"PRAGMA synchronous = FULL", true};
  if (mode == "normal") return Synchronous{"PRAGMA synchronous = NORMAL", false};
  if (mode == "extra") return Synchronous{"PRAGMA synchronous = EXTRA", true};
  if (mode == "off") return Synchronous{"PRAGMA synchronous = OFF", false};
  return MakeError(ErrorCode::kInvalidArgument,
                   fmt::format("sqlite store: synchronous \"{}\" is not one of full, normal, "
                               "extra, off",
                               mode));
}

// The parts of a sqlite: store URL after the scheme.
struct Target {
  std::string path;
  bool write_lock = true;
  bool shared_writer = true;
  size_t shared_writer_clients = 64;
  // A commit's WAL writes made as one (wal_coalescing_vfs.h).
  bool coalesce_wal = true;
  // The page size a new file is created with; an existing file keeps its own.
  size_t page_size = 1024;
};

constexpr std::string_view kClientsParam = "shared_writer_clients=";
constexpr std::string_view kPageSizeParam = "page_size=";

// A whole number in `value`, or nothing.
std::optional<size_t> WholeNumber(std::string_view value) {
  size_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size()) return std::nullopt;
  return n;
}

// Splits PATH[?NAME=VALUE&…] (see OpenSqliteStore).
Result<Target> ParseTarget(std::string_view url) {
  const size_t q = url.find('?');
  Target target{std::string(url.substr(0, q))};
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
    } else if (param == "shared_writer=on") {
      target.shared_writer = true;
    } else if (param == "shared_writer=off") {
      target.shared_writer = false;
    } else if (param == "coalesce_wal=on") {
      target.coalesce_wal = true;
    } else if (param == "coalesce_wal=off") {
      target.coalesce_wal = false;
    } else if (param.starts_with(kClientsParam)) {
      const std::string_view value = param.substr(kClientsParam.size());
      const std::optional<size_t> n = WholeNumber(value);
      if (!n || *n == 0) {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("sqlite store {}: shared_writer_clients=\"{}\" is not a "
                                     "positive whole number of connections",
                                     target.path, value));
      }
      target.shared_writer_clients = *n;
    } else if (param.starts_with(kPageSizeParam)) {
      const std::string_view value = param.substr(kPageSizeParam.size());
      const std::optional<size_t> n = WholeNumber(value);
      if (!n || *n < 512 || *n > 65536 || (*n & (*n - 1)) != 0) {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("sqlite store {}: page_size=\"{}\" is not a power of two "
                                     "from 512 to 65536 bytes",
                                     target.path, value));
      }
      target.page_size = *n;
    } else {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("sqlite store {}: unknown parameter \"{}\"; the known ones "
                                   "are write_lock=flock|none, shared_writer=on|off, "
                                   "shared_writer_clients=N, coalesce_wal=on|off and "
                                   "page_size=BYTES (a path "
                                   "with '?' in it cannot be used)",
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

// A write that runs `fn` and keeps its result. Fn is a reference for a
// caller that waits in Execute, a value for a write submitted for later.
template <typename T, typename Fn>
class FnOp : public sqlite::WriteOp {
 public:
  explicit FnOp(Fn fn) : fn_(std::forward<Fn>(fn)) {}

  Result<void> Run(WriteContext& ctx) override {
    result_.emplace(fn_(ctx));
    if (!*result_ && sqlite::IsStorageFailure(result_->error().code)) {
      return std::unexpected(result_->error());
    }
    return {};
  }

  void Fail(const Error& error) override { result_.emplace(std::unexpected(error)); }

  Result<T> Take() { return std::move(*result_); }

 protected:
  const Result<T>& result() const { return *result_; }

 private:
  Fn fn_;
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
  auto synchronous = ParseSynchronous(options.sqlite_synchronous);
  if (!synchronous) return std::unexpected(std::move(synchronous.error()));
  if (auto ok = sqlite::PrepareDatabaseFile(path); !ok) {
    return std::unexpected(std::move(ok.error()));
  }

  auto conn = Connection::Open(
      path, options.sqlite_busy_timeout,
      target->coalesce_wal && synchronous->syncs_commits ? sqlite::WalCoalescingVfs() : nullptr);
  if (!conn) return std::unexpected(std::move(conn.error()));
  // Takes effect only while the file is empty: before WAL mode is set.
  if (auto ok = (*conn)->Exec(fmt::format("PRAGMA page_size = {}", target->page_size).c_str(),
                              "setting PRAGMA page_size");
      !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  if (auto ok = EnableWal(**conn, options.sqlite_busy_timeout); !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  if (auto ok = (*conn)->Exec(synchronous->pragma, "setting PRAGMA synchronous"); !ok) {
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
      [](sqlite::WriteContext& ctx) { return sqlite::WriteHeads(ctx.conn, ctx.heads); },
      [hub](const std::vector<RecordId>& changed) {
        for (const RecordId& id : changed) hub->Notify(ChangeHub::KeyOf(id));
      });
  if (target->shared_writer) {
    SqliteStore* self = store.get();
    auto shared = sqlite::SharedWriter::Open(
        path,
        [self](std::string_view call, sqlite::SharedWriter::Reply reply) {
          self->Serve(call, std::move(reply));
        },
        target->shared_writer_clients, options.sqlite_busy_timeout);
    if (!shared) return std::unexpected(std::move(shared.error()));
    store->shared_ = std::move(*shared);
  }
  return store;
}

uint64_t SqliteStore::commits() const { return writer_->commits(); }
uint64_t SqliteStore::writes() const { return writer_->writes(); }
uint64_t SqliteStore::pending_writes() const { return writer_->pending(); }
uint64_t SqliteStore::write_lock_waits() const { return writer_->lock_waits(); }
bool SqliteStore::serves_writes() const { return shared_ && shared_->serving(); }
uint64_t SqliteStore::writes_served() const { return shared_ ? shared_->served() : 0; }
uint64_t SqliteStore::writes_sent() const { return shared_ ? shared_->sent() : 0; }

bool SqliteStore::SendsWrites() const { return shared_ && !shared_->serving(); }

template <typename T, typename Fn>
Result<T> SqliteStore::Write(Fn fn) {
  FnOp<T, Fn&> op(fn);
  writer_->Execute(op);
  return op.Take();
}

namespace {

// Whether `r` is the claim of the attempt with owner token `owner`: owner
// tokens are random and new for every attempt, so only its own claim
// carries it.
bool ClaimedBy(const Record& r, const std::string& owner) {
  return !owner.empty() && r.owner == owner && r.state == RecordState::kInProgress;
}

}  // namespace

Result<ClaimResult> SqliteStore::Claim(const ClaimRequest& req) {
  // A live record that someone else owns or completed is returned without a
  // write transaction: replays and duplicates then cost a read on a WAL
  // reader, not a turn of the single writer. Linearisable: a live record
  // read here was live at that instant, which is where this claim takes
  // effect. An absent or expired record still goes through the atomic
  // claim in the writer, so there is no check-then-insert.
  if (auto live = Get(req.id); live && *live) return ClaimResult{false, std::move(**live)};
  bool lost = false;
  if (SendsWrites()) {
    if (auto sent = shared_->Call(sqlite::wire::EncodeClaim(req, clock_.Now()))) {
      if (*sent) {
        auto claimed = sqlite::wire::DecodeClaimReply(**sent);
        if (claimed && claimed->claimed) hub_->Notify(ChangeHub::KeyOf(req.id));
        return claimed;
      }
      // The server died, or did not answer in time, with the claim in
      // hand. A live record with this attempt's owner token is the claim it
      // committed; with none, the claim is made here. A server that did
      // not answer may still run its copy later, and whichever of the two
      // claims comes second finds the other's record and writes nothing.
      lost = true;
      auto live = Get(req.id);
      if (!live) return std::unexpected(std::move(live.error()));
      if (*live) return ClaimResult{ClaimedBy(**live, req.owner), std::move(**live)};
    }
  }
  auto result = Write<ClaimResult>(
      [&](WriteContext& ctx) { return sqlite::ClaimInTx(ctx, req, clock_.Now()); });
  // The server's late copy committed between the read above and this claim.
  if (lost && result && !result->claimed) result->claimed = ClaimedBy(result->record, req.owner);
  return result;
}

Result<TimePoint> SqliteStore::Heartbeat(const RecordId& id, uint64_t fence, Duration lease) {
  return Write<TimePoint>([&](WriteContext& ctx) {
    return sqlite::HeartbeatInTx(ctx, id, fence, lease, clock_.Now());
  });
}

Result<Record> SqliteStore::Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                     Duration retention, const Attempt* logged) {
  // A completion the server committed: the record is completed at this
  // fence (a later one would have a fence of its own).
  auto committed = [&]() -> std::optional<Record> {
    auto current = Get(id);
    if (current && *current && (*current)->fence == fence &&
        (*current)->state == RecordState::kCompleted) {
      return std::move(**current);
    }
    return std::nullopt;
  };
  bool lost = false;
  if (SendsWrites()) {
    if (auto sent = shared_->Call(
            sqlite::wire::EncodeComplete(id, fence, outcome, retention, logged, clock_.Now()))) {
      if (*sent) {
        auto completed = sqlite::wire::DecodeRecordReply(**sent);
        if (completed) hub_->Notify(ChangeHub::KeyOf(id));
        return completed;
      }
      // The server died, or did not answer in time, with the completion in
      // hand. If it committed, the record says so; otherwise it is written
      // here, fenced as always, so at most one completion of this fence
      // takes effect.
      lost = true;
      if (auto done = committed()) return std::move(*done);
    }
  }
  auto result = Write<Record>([&](WriteContext& ctx) {
    return sqlite::CompleteInTx(ctx, id, fence, outcome, retention, logged, clock_.Now());
  });
  // The server's late copy committed between the read above and this write.
  if (lost && !result && result.error().code == ErrorCode::kFailedPrecondition) {
    if (auto done = committed()) return std::move(*done);
  }
  return result;
}

Result<void> SqliteStore::Release(const RecordId& id, uint64_t fence) {
  return Write<void>(
      [&](WriteContext& ctx) { return sqlite::ReleaseInTx(ctx, id, fence, clock_.Now()); });
}

Result<void> SqliteStore::Abandon(const RecordId& id, std::string_view owner) {
  if (owner.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite store: abandon needs the claim's owner token");
  }
  return Write<void>(
      [&](WriteContext& ctx) { return sqlite::AbandonInTx(ctx, id, owner, clock_.Now()); });
}

Result<Record> SqliteStore::MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) {
  return Write<Record>([&](WriteContext& ctx) {
    return sqlite::MarkUnknownInTx(ctx, id, fence, retention, clock_.Now());
  });
}

Result<Record> SqliteStore::TakeOver(const RecordId& id, uint64_t fence, Duration lease) {
  return Write<Record>(
      [&](WriteContext& ctx) { return sqlite::TakeOverInTx(ctx, id, fence, lease, clock_.Now()); });
}

namespace {

// A write another process sent through the shared writer: submitted to the
// group-commit writer, which sends its reply from its own thread and deletes
// it (WriteOp::Done).
template <typename T, typename Fn>
class ServedOp final : public FnOp<T, Fn> {
 public:
  ServedOp(Fn fn, sqlite::SharedWriter::Reply reply)
      : FnOp<T, Fn>(std::move(fn)), reply_(std::move(reply)) {}

  void Done() override {
    reply_(sqlite::wire::EncodeReply(this->result()));
    delete this;
  }

 private:
  sqlite::SharedWriter::Reply reply_;
};

template <typename T, typename Fn>
void Submit(sqlite::GroupCommitWriter& writer, Fn fn, sqlite::SharedWriter::Reply reply) {
  writer.Submit(*new ServedOp<T, Fn>(std::move(fn), std::move(reply)));
}

}  // namespace

void SqliteStore::Serve(std::string_view bytes, sqlite::SharedWriter::Reply reply) {
  auto call = sqlite::wire::DecodeCall(bytes);
  if (!call) {
    reply(sqlite::wire::EncodeReply(Result<void>(std::unexpected(call.error()))));
    return;
  }
  if (auto* c = std::get_if<sqlite::wire::ClaimCall>(&*call)) {
    Submit<ClaimResult>(
        *writer_,
        [claim = std::move(*c)](WriteContext& ctx) {
          return sqlite::ClaimInTx(ctx, claim.req, claim.now);
        },
        std::move(reply));
  } else if (auto* c = std::get_if<sqlite::wire::CompleteCall>(&*call)) {
    Submit<Record>(
        *writer_,
        [done = std::move(*c)](WriteContext& ctx) {
          return sqlite::CompleteInTx(ctx, done.id, done.fence, done.outcome, done.retention,
                                      done.logged ? &*done.logged : nullptr, done.now);
        },
        std::move(reply));
  } else {
    Submit<void>(
        *writer_,
        [a = std::move(std::get<sqlite::wire::AppendCall>(*call))](WriteContext& ctx) {
          return sqlite::AppendAttemptsInTx(ctx, a.attempts);
        },
        std::move(reply));
  }
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
  auto evicted = Write<bool>([&](WriteContext& ctx) { return sqlite::EvictInTx(ctx, id); });
  // Rung after the COMMIT, so that a cache that drops on hearing it cannot
  // refill from the file with the record still in it; rung also when
  // nothing was there or the write failed, so that evicting again repairs
  // a ring that failed (and the write may have committed).
  if (auto rung = sqlite::EvictionBell::Ring(path_); !rung) {
    return MakeError(rung.error().code,
                     fmt::format("{}; other processes on this file may go on replaying the "
                                 "record \"{}\" of tenant \"{}\" from their replay caches: fix "
                                 "that and evict it again",
                                 rung.error().message, id.key, id.tenant));
  }
  return evicted;
}

bool SqliteStore::WatchEvictions(EvictionFeed on_change) {
  std::lock_guard g(bell_mu_);
  bell_.reset();  // returns once the old watcher's calls are over
  if (!on_change) return true;
  auto bell = sqlite::EvictionBell::Watch(
      path_, std::move(on_change),
      std::max(std::chrono::milliseconds(1),
               std::chrono::duration_cast<std::chrono::milliseconds>(options_.poll_interval)));
  if (!bell) return false;
  bell_ = std::move(*bell);
  return true;
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
  return Write<size_t>(
      [&](WriteContext& ctx) { return sqlite::PurgeExpiredInTx(ctx, limit, clock_.Now()); });
}

Result<uint64_t> SqliteStore::CountRecords() {
  auto conn = readers_->Acquire();
  if (!conn) return std::unexpected(std::move(conn.error()));
  return sqlite::CountRecordRows(**conn);
}

Result<void> SqliteStore::AppendAttempts(const std::vector<Attempt>& attempts) {
  if (attempts.empty()) return {};
  if (SendsWrites()) {
    // A reply lost with the server is an error: whether the entries were
    // written is unknown, and writing them again could log them twice.
    if (auto sent = shared_->Call(sqlite::wire::EncodeAppend(attempts))) {
      if (!*sent) return std::unexpected(std::move(sent->error()));
      return sqlite::wire::DecodeVoidReply(**sent);
    }
  }
  return Write<void>([&](WriteContext& ctx) { return sqlite::AppendAttemptsInTx(ctx, attempts); });
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
  return Write<size_t>([&](WriteContext& ctx) -> Result<size_t> {
    // The purge moves the heads' restart points, on their rows: the
    // entries this transaction appended first put their heads there.
    if (auto written = sqlite::WriteHeads(ctx.conn, ctx.heads); !written) {
      return std::unexpected(std::move(written.error()));
    }
    return sqlite::DeleteOldAttempts(ctx.conn, before, limit);
  });
}

}  // namespace idem
