// The PostgreSQL store (docs/DESIGN.md §5): several idemgate instances on one
// database behave as one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem {

class ChangeHub;
namespace postgres {
class BatchWriter;
class ChangeAnnouncer;
class ChangeListener;
class Connection;
class ConnectionPool;
class Params;
struct PostgresUrl;
struct Statement;
struct WriteRule;
}  // namespace postgres

// Opens the store at `url` (postgres:// or postgresql://, see
// postgres_url.h), creating or migrating its schema. `clock` must outlive the
// store. Errors: kInvalidArgument for a malformed URL or bad options;
// kUnavailable, naming host:port, if the server cannot be reached;
// kFailedPrecondition for a schema written by a newer idemgate.
Result<std::unique_ptr<Store>> OpenPostgresStore(std::string_view url, Clock& clock,
                                                 const StoreOptions& options);

// A Store in three tables of one PostgreSQL schema. Every operation is one
// atomic statement (a claim that loses a race takes up to three), run on a
// pooled connection with prepared statements; concurrent claims and
// completions share a transaction and its commit (BatchWriter, up to the
// URL's batch_size), each still answered only once it is durable. Expiry is judged by `clock`,
// passed to every statement as a parameter, never by the server's now().
// Each state change is announced on the channel idemgate_changes
// (pg_notify) once it has committed, batched off the request path by a
// ChangeAnnouncer; a completion only if a waiter marked the record watched
// (so a call without duplicates sends none). One LISTEN connection per store
// wakes this process's waiters for changes made by any instance. Waiters also re-read the record: every
// options.poll_interval while the LISTEN connection is down, at most once a
// second while it is up. Durability is the
// server's: with PostgreSQL's defaults (fsync, synchronous_commit on) a
// write is on disk before it returns. Thread-safe.
class PostgresStore final : public Store {
 public:
  // As OpenPostgresStore, with the concrete type (for tests).
  static Result<std::unique_ptr<PostgresStore>> Open(std::string_view url, Clock& clock,
                                                     const StoreOptions& options);
  ~PostgresStore() override;

  // Store:
  bool LogsWithRecords() const override { return true; }  // in the record's transaction
  Result<ClaimResult> Claim(const ClaimRequest& req) override;
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override;
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override;
  Result<void> Release(const RecordId& id, uint64_t fence) override;
  Result<void> Abandon(const RecordId& id, std::string_view owner) override;
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override;
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override;
  Result<std::optional<Record>> Get(const RecordId& id) override;
  Result<bool> Evict(const RecordId& id) override;
  // Every eviction is NOTIFYed in its own transaction and heard by the
  // listener's connection (kEvictionChannel).
  bool WatchEvictions(EvictionFeed on_change) override;
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override;
  Result<size_t> PurgeExpired(size_t limit) override;
  Result<uint64_t> CountRecords() override;
  Result<std::optional<TimePoint>> ReadServerClock() override;
  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override;
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override;
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter) override;
  Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) override;
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override;
  Result<size_t> PurgeAttempts(TimePoint before, size_t limit) override;

  // Whether the LISTEN connection is up (cross-instance wake-ups are
  // immediate) or down (they wait for the next poll).
  bool listening() const;

  // Shared commits so far (BatchWriter): transactions committed, the claims
  // and completions they held, and writes waiting for a batch now. All zero
  // with batch_size 1.
  struct BatchCounts {
    uint64_t commits = 0;
    uint64_t writes = 0;
    size_t queued = 0;
  };
  BatchCounts batch_counts() const;

 private:
  // Whether an operation may run again after its connection broke mid-way:
  // reads may; a write may have committed before the connection dropped.
  enum class Retry { kSafe, kUnsafe };

  PostgresStore(std::unique_ptr<postgres::PostgresUrl> url, Clock& clock,
                const StoreOptions& options);

  // Runs `fn` on a pooled connection; again on a fresh one after a deadlock
  // or serialization failure, and (kSafe) once after a lost connection.
  template <typename T, typename Fn>
  Result<T> Run(Retry retry, Fn fn);

  // Runs the write `fn` of record `id` in a transaction shared with other
  // concurrent claims and completions (BatchWriter), or, with batch_size 1,
  // as Run(kUnsafe). fn's first statement is `first` with params.first
  // (its audit entry inline) or params.second (BindLogged). Returns once
  // its transaction committed or failed.
  template <typename T, typename Fn>
  Result<T> RunShared(const RecordId& id, const postgres::Statement& first,
                      const std::pair<postgres::Params, postgres::Params>& params, Fn fn);

  // `p` twice, followed by BindAttempts' arrays: of `logged` (may be null)
  // for a write that appends its own audit entry, and empty for one whose
  // batch appends it (postgres::BatchContext). kInvalidArgument for text
  // PostgreSQL cannot store.
  Result<std::pair<postgres::Params, postgres::Params>> BindLogged(const postgres::Params& p,
                                                                  const Attempt* logged) const;

  // Explains why a fence-conditional write of `id` changed nothing: the
  // same codes as the memory store (kNotFound, kAborted, kFailedPrecondition).
  Error WhyNotWritten(postgres::Connection& conn, const RecordId& id, uint64_t fence, TimePoint now,
                      const postgres::WriteRule& rule);

  // Wakes this process's waiters on `id` and, unless `announce` is false,
  // those of other instances (after the commit, batched: ChangeAnnouncer). A
  // completion of a record no instance marked watched skips the second.
  void Changed(const RecordId& id, bool announce = true);

  // Marks the record watched if it still has seen's fence and state, so that
  // its completion is announced to this instance (kMarkWatched).
  Result<void> MarkWatched(const RecordId& id, const Record& seen);

  const std::unique_ptr<postgres::PostgresUrl> url_;
  Clock& clock_;
  const StoreOptions options_;
  std::unique_ptr<ChangeHub> hub_;
  std::unique_ptr<postgres::ConnectionPool> pool_;
  std::unique_ptr<postgres::ChangeAnnouncer> announcer_;  // uses pool_
  std::unique_ptr<postgres::BatchWriter> batch_;          // uses pool_; null for batch_size 1
  std::unique_ptr<postgres::ChangeListener> listener_;    // last: stopped first
};

}  // namespace idem
