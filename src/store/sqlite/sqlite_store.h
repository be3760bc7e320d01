// The embedded default store (docs/DESIGN.md §5): one SQLite file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem {

class ChangeHub;
namespace sqlite {
class EvictionBell;
class GroupCommitWriter;
class ReadPool;
class SharedWriter;
}  // namespace sqlite

// Opens (creating if needed, mode 0600, parent directories 0700) the SQLite
// file at `path`: what follows "sqlite:" in a store URL, PATH[?PARAMS], where
// PARAMS are NAME=VALUE pairs joined by '&':
//   write_lock=flock (default): writers on this file, in this process and
//     others, take turns through an flock on PATH-lock and wait for it
//     asleep (sqlite::WriteLock);
//   write_lock=none: only SQLite's own lock, which a waiting writer polls
//     for up to the busy timeout;
//   shared_writer=on (default): the processes on this file hand their
//     claims, completions and audit entries to one of them, whose writer
//     commits them together (sqlite::SharedWriter); shared_writer=off: this
//     store commits its own writes;
//   shared_writer_clients=N (default 64): connections the serving process
//     answers at once;
//   coalesce_wal=on (default): with synchronous full or extra, the writes of
//     one commit reach the WAL as one write (sqlite::WalCoalescingVfs);
//     coalesce_wal=off: as SQLite makes them, two per page;
//   page_size=BYTES (default 1024, a power of two from 512 to 65536): the
//     page size of a file the store creates; an existing file keeps its own.
// `clock` must outlive the store. Errors, each naming the path and what to
// do: kInvalidArgument for bad options, a path that is a
// directory or an SQLite file of another program; kUnavailable for a file or
// directory that cannot be created or written, or a file locked by another
// process past the busy timeout; kDataLoss for a corrupt file or one that is
// not a database (left untouched); kFailedPrecondition for a file written by
// a newer idemgate. kInvalidArgument too for an unknown parameter or value.
Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path, Clock& clock,
                                               const StoreOptions& options);

// A Store in one SQLite file in WAL mode. Writes go through one group-commit
// writer thread with its own connection, so concurrent writes share one
// transaction and one fsync and each is durable before it returns; reads use
// a pool of read connections and never wait for the writer. Several stores
// and several processes may open the same file: the write lock (an flock
// beside the file) and SQLite's file locks order their transactions, and
// with the shared writer (the default) the claims, completions and audit
// entries of all of them go to the writer of the one that serves, and share
// its transactions. WaitForChange wakes at once for writes through this
// object and polls every options.poll_interval for other writers. Evict
// rings the file's eviction bell after its commit, and WatchEvictions
// listens for it (sqlite::EvictionBell), so a replay cache above this store
// hears of evictions by every process on the file. Thread-safe.
class SqliteStore final : public Store {
 public:
  // As OpenSqliteStore, with the concrete type (for tests and benchmarks).
  static Result<std::unique_ptr<SqliteStore>> Open(const std::string& path, Clock& clock,
                                                   const StoreOptions& options);
  ~SqliteStore() override;

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
  bool WatchEvictions(EvictionFeed on_change) override;
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override;
  Result<size_t> PurgeExpired(size_t limit) override;
  Result<uint64_t> CountRecords() override;
  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override;
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override;
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter) override;
  Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) override;
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override;
  Result<size_t> PurgeAttempts(TimePoint before, size_t limit) override;

  // Write transactions this store has committed. Fewer than writes() when
  // group commit shared transactions between concurrent writers.
  uint64_t commits() const;
  // Writes this store has committed.
  uint64_t writes() const;
  // Writes waiting for their transaction to commit.
  uint64_t pending_writes() const;
  // Times the writer found the write lock held by another and slept.
  uint64_t write_lock_waits() const;
  // Whether this store serves the file's shared writer, how many writes it
  // has run for other processes, and how many it has sent to another.
  bool serves_writes() const;
  uint64_t writes_served() const;
  uint64_t writes_sent() const;

 private:
  SqliteStore(std::string path, Clock& clock, const StoreOptions& options);

  // Runs `fn` in the writer's next transaction and returns its result once
  // the transaction committed.
  template <typename T, typename Fn>
  Result<T> Write(Fn fn);

  // Whether a claim, completion or append goes to the shared writer first:
  // there is one and this store does not serve it (the store that serves,
  // a lone process among them, writes as if there were none, without
  // encoding a call).
  bool SendsWrites() const;

  // Starts a write another process sent through the shared writer; `reply`
  // gets its reply once it is done.
  void Serve(std::string_view call, std::function<void(std::string)> reply);

  const std::string path_;
  Clock& clock_;
  const StoreOptions options_;
  std::unique_ptr<ChangeHub> hub_;
  std::unique_ptr<sqlite::ReadPool> readers_;
  std::unique_ptr<sqlite::GroupCommitWriter> writer_;
  // Null with shared_writer=off. Stopped before the writer it hands calls
  // to.
  std::unique_ptr<sqlite::SharedWriter> shared_;
  // The eviction watch of WatchEvictions; null while nobody watches.
  std::mutex bell_mu_;
  std::unique_ptr<sqlite::EvictionBell> bell_;
};

}  // namespace idem
