// The store seam (docs/DESIGN.md §5). One interface, one contract suite
// (tests/store_contract.h) that every backend passes unchanged.
//
// Every state change is atomic and, after the claim, conditional on the
// fence: a write with a stale fence changes nothing and returns kAborted.
// Expiry (lease, retention) is judged by the store's Clock, never by a
// reader's guess. All methods are thread-safe.
//
// Errors: kUnavailable when the backend cannot be reached (the caller must
// fail closed), kAborted for a stale fence, kNotFound for a missing record,
// kDataLoss for a corrupt backend.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"

namespace boost::asio {
class io_context;
}

namespace idem {

struct ClaimRequest {
  RecordId id;
  std::string fingerprint;
  std::string tool;
  std::string turn;
  Duration lease{30'000};          // owner presumed dead after this without a heartbeat
  Duration retention{86'400'000};  // how long the record lives if nobody completes it
  // The audit entry of this claim (AttemptOutcome::kClaimed), appended to the
  // attempt log in the same write that creates the record (one transaction,
  // one script), so that no crash keeps the claim and loses its entry: the
  // trail names the attempt that executed even if it never finished. Not
  // written when the claim finds a live record. nullopt: none (audit off).
  std::optional<Attempt> logged;
  // Names the attempt that claims: random, 128 bits, new for every attempt
  // (the Ledger draws it). Stored in the record so that an attempt whose claim
  // reply was lost can take back a claim it never learnt it had (Abandon).
  // Empty: the claim cannot be abandoned.
  std::string owner;
};

struct ClaimResult {
  // True: this caller created (or re-created over an expired record) an
  // in-progress record and owns it with record.fence. False: `record` is the
  // live record someone else made; nothing was written.
  bool claimed = false;
  Record record;
};

// Per-tool replay statistics, for `idemgate stats`.
struct ToolStats {
  uint64_t attempts = 0;
  std::map<AttemptOutcome, uint64_t> by_outcome;
};

class Store {
 public:
  virtual ~Store() = default;

  // Atomically: if no live record exists for req.id (absent, or completed /
  // unknown past expires_at), creates kInProgress with a new fence greater
  // than any earlier fence of that id and a lease of req.lease; otherwise
  // returns the existing record untouched. An in-progress record whose lease
  // has expired is returned as it is: the caller decides (on_unknown).
  virtual Result<ClaimResult> Claim(const ClaimRequest& req) = 0;

  // Extends the lease of an in-progress record owned with `fence` to now +
  // lease. Returns the new lease expiry. kAborted if the fence moved on;
  // kFailedPrecondition if the record is no longer in progress; kNotFound if
  // it is gone. (Every fence-conditional write answers a matching fence in
  // the wrong state with kFailedPrecondition.)
  virtual Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) = 0;

  // Stores `outcome` and makes the record kCompleted until now + retention.
  // Allowed from kInProgress or kUnknown with a matching fence (the latter
  // is how an operator or a reconcile resolves an unknown record). Durable
  // before it returns. `logged`, if given, is appended to the attempt log in
  // the same write (its kExecuted entry), and only if the record is written.
  virtual Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                                  Duration retention, const Attempt* logged = nullptr) = 0;

  // Deletes the record owned with `fence` (kInProgress or kUnknown): nothing
  // happened, or an operator cleared it; the next attempt executes.
  virtual Result<void> Release(const RecordId& id, uint64_t fence) = 0;

  // Deletes the record iff it is live, kInProgress and was created by the
  // claim that carried `owner` (ClaimRequest::owner): a claim whose reply
  // was lost, so its caller never learnt the fence, never executed, and
  // must not leave the key blocked until the lease runs out. Atomic, and
  // announced to waiters like Release. Never touches a record someone else
  // claimed, took over, completed or marked unknown. Errors: kNotFound if
  // there is no live record; kAborted if another owner's (or a taken-over)
  // record; kFailedPrecondition if ours but no longer in progress;
  // kInvalidArgument for an empty owner.
  virtual Result<void> Abandon(const RecordId& id, std::string_view owner) = 0;

  // kInProgress with `fence` → kUnknown, kept until now + retention.
  virtual Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) = 0;

  // Takes over a record whose owner is presumed dead (kInProgress with an
  // expired lease, or kUnknown) and whose fence is still `fence`: a new
  // fence (fence + 1 or more), kInProgress, lease now + lease, and no owner
  // token (so the dead owner's Abandon cannot delete it). kAborted if
  // someone else took it first; kFailedPrecondition if the lease is alive.
  virtual Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) = 0;

  // The live record, or nullopt if absent or past retention.
  virtual Result<std::optional<Record>> Get(const RecordId& id) = 0;

  // Get without blocking the caller, for stores that can (one pipelined
  // connection instead of a blocked thread per read). True if the store took
  // the read: `done` then runs exactly once with what Get would return
  // (kUnavailable if the store closes first): later, on a thread of the
  // store's, or, when the store has the answer at hand (CachingStore),
  // before GetAsync returns, on the caller's thread. It must not block.
  // False (the default) if this store has no such read: `done` is dropped
  // and the caller uses Get. The answer may differ from call to call: a
  // CachingStore takes the reads it can answer from memory even above a
  // store without asynchronous reads.
  using GetDone = std::function<void(Result<std::optional<Record>>)>;
  virtual bool GetAsync(const RecordId& id, GetDone done) {
    (void)id;
    (void)done;
    return false;
  }

  // The completed record of `id` if this store holds it in memory
  // (CachingStore), answered without reaching the backend or blocking;
  // nullopt (the default) when it holds none. Where the read before a claim
  // is skipped (ReadsBeforeClaim), a retry of a finished call is still
  // answered from memory without building a claim.
  virtual std::optional<Record> Held(const RecordId& id) {
    (void)id;
    return std::nullopt;
  }

  // Claim and Complete without blocking the caller, as GetAsync: true if
  // the store took the write, and `done` then runs exactly once, later, on a
  // thread of the store's, with what Claim or Complete would return; it must
  // not block. `logged` (Complete's audit entry) is read before
  // CompleteAsync returns. A write that fails in flight may still have been applied,
  // exactly as a blocking one whose reply was lost. False (the default): the
  // caller uses Claim or Complete.
  using ClaimDone = std::function<void(Result<ClaimResult>)>;
  virtual bool ClaimAsync(const ClaimRequest& req, ClaimDone done) {
    (void)req;
    (void)done;
    return false;
  }
  using CompleteDone = std::function<void(Result<Record>)>;
  virtual bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome,
                             Duration retention, CompleteDone done, const Attempt* logged = nullptr) {
    (void)id;
    (void)fence;
    (void)outcome;
    (void)retention;
    (void)done;
    (void)logged;
    return false;
  }

  // Whether a caller that can do either should read a record before it
  // claims it (Ledger::BeginWithoutBlocking). True (the default) where a
  // claim costs more than a read even when it finds the record (SQLite: the
  // claim queues for the one writer, a read does not). False where a claim
  // that finds the record writes nothing and returns it in one round trip,
  // as a read would (Redis: one script): the read first would only add a
  // round trip to every fresh call.
  virtual bool ReadsBeforeClaim() const { return true; }

  // Whether Claim and Complete append their `logged` entry in the record's
  // own write (one transaction, one script). False (the default): they
  // ignore it, and the caller appends the entry to the audit log itself, a
  // moment later (a Redis Cluster, whose audit stream lives in another slot
  // than the record, cannot write both in one script).
  virtual bool LogsWithRecords() const { return false; }

  // The store server's own clock, for a store that instances on several
  // machines share (Redis: TIME; PostgreSQL: clock_timestamp()): StoreClock
  // corrects this machine's clock by it, so every instance judges leases and
  // expiry by one clock. nullopt (the default) for a store whose clock is
  // this machine's (memory; SQLite, a local file). Errors: the store's.
  virtual Result<std::optional<TimePoint>> ReadServerClock() { return std::nullopt; }

  // Removes the record whatever its state. Returns whether one existed.
  virtual Result<bool> Evict(const RecordId& id) = 0;

  // For a cache of completed records kept above the store (CachingStore). A
  // completed record changes only when it expires, which a cache judges by
  // expires_at, or when it is evicted, which only the store can tell.
  // `on_change` runs on a thread of the store's (or inside Evict or this
  // call); it must not block or call the store:
  //  - with true when the cache must drop what it holds and may fill again:
  //    when the feed is up (from then on every Evict, through any process
  //    on this backend, reaches it) and after every eviction;
  //  - with false when an eviction may go unheard (the feed is down): the
  //    cache drops what it holds and keeps nothing until the next true.
  // One watcher per store; nullptr stops the feed and returns once no call
  // of the old watcher is running. Returns false (the default) if the store
  // cannot tell this process about evictions by other processes: then no
  // cache may be kept above it.
  using EvictionFeed = std::function<void(bool heard)>;
  virtual bool WatchEvictions(EvictionFeed on_change) {
    (void)on_change;
    return false;
  }

  // Blocks until the record differs from `seen` (another fence or state, or
  // gone) or until `deadline` by the store's clock, whichever is first. Wakes
  // at once for changes made through this process; changes made by other
  // processes are seen by the backend's notification or, at worst, by
  // polling. Returns without error on timeout; the caller re-reads.
  virtual Result<void> WaitForChange(const RecordId& id, const Record& seen,
                                     TimePoint deadline) = 0;

  // Deletes up to `limit` records past retention. Returns how many.
  virtual Result<size_t> PurgeExpired(size_t limit) = 0;

  // Number of records stored (live or not yet purged).
  virtual Result<uint64_t> CountRecords() = 0;

  // The audit log.
  virtual Result<void> AppendAttempts(const std::vector<Attempt>& attempts) = 0;
  virtual Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) = 0;
  // Counts per tool and outcome of the attempts matching `filter` (limit ignored).
  virtual Result<std::map<std::string, ToolStats>> SummarizeAttempts(
      const AttemptFilter& filter) = 0;

  // The hash chain of the audit log (docs/DESIGN.md §7). Every entry
  // written, through AppendAttempts or with a record (ClaimRequest::logged,
  // Complete's `logged`), is given the next seq of its tenant, the hash of
  // the tenant's previous entry and its own ChainHash, in the same atomic
  // write that stores it and moves the tenant's ChainHead: the store decides
  // which entry is previous, never a client that could race.
  //
  // The heads of every tenant with a chain (of `tenant` only, if given),
  // ordered by tenant.
  virtual Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) = 0;
  // The entries as the verifier walks them, a page of at most `limit` at a
  // time: each tenant's in chain order (by seq, then by storage order, so
  // a duplicated seq shows), tenants one after another or interleaved as the
  // store keeps them; unchained entries (seq 0) included. `tenant`
  // restricts to one. `cursor`: "" for the first page, then the page's next.
  virtual Result<ChainPage> ReadChain(const std::optional<std::string>& tenant,
                                      const std::string& cursor, size_t limit) = 0;
  // Deletes up to `limit` audit entries older than `before`, each tenant's
  // a prefix of its chain: from its start up to, not including, its first
  // entry not older than `before` (an older entry after a newer one, from an
  // instance whose clock lagged, stays). In the same write it moves each such
  // tenant's start_seq and start_prev to where its chain now begins, so the
  // rest stays verifiable. Unchained entries (seq 0) older than `before`
  // go too. Returns how many were deleted.
  virtual Result<size_t> PurgeAttempts(TimePoint before, size_t limit) = 0;
};

// Tuning shared by the backends. Every field documents its default.
struct StoreOptions {
  // SQLite: PRAGMA synchronous; "full" (default) makes a completion durable
  // against power loss before it is acknowledged; "normal" only against a
  // process crash.
  std::string sqlite_synchronous = "full";
  // SQLite: how long a writer waits for another process's lock. Default 5 s.
  Duration sqlite_busy_timeout{5'000};
  // How often WaitForChange re-reads a record changed by another process
  // when the backend has no notifications (SQLite). Default 50 ms.
  Duration poll_interval{50};
  // SQLite group commit: at most this many writes share one transaction.
  size_t max_batch = 256;
  // Redis (one server): run the pipelined connection of the asynchronous
  // operations on this io_context's threads instead of a thread of the
  // store's own, and their callbacks with it. A front whose listener and
  // upstream client run there too then carries a request from its read to
  // its answer on those threads alone (`idemgate http`). The io_context
  // must outlive the store, and its threads must run until the store is
  // destroyed. Default: none.
  boost::asio::io_context* io = nullptr;
};

// Opens a store from a URL: "memory:", "sqlite:PATH" (PATH may be relative),
// and the backends linked in. `clock` must outlive the store.
// kInvalidArgument for an unknown scheme or malformed URL, with the list of
// supported schemes.
Result<std::unique_ptr<Store>> OpenStore(std::string_view url, Clock& clock,
                                         const StoreOptions& options = {});

// The default store URL: sqlite: in $XDG_STATE_HOME/idemgate/idemgate.db,
// else ~/.local/state/idemgate/idemgate.db (docs/DESIGN.md §1).
std::string DefaultStoreUrl();

}  // namespace idem
