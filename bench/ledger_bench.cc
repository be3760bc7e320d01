// Ledger::Run throughput end to end: claim → fn → complete (docs/DESIGN.md §4, §5).
//
//   ledger_bench [--seconds N] [--rounds N] [--dir DIR] [--scale N,N,...]
//                [--synchronous full|normal|off] [--audit on|off] [--only main|scale]
//                [--sqlite-params '?NAME=VALUE&…']
//
// Every call is a fresh key (a 64-hex pseudo fingerprint, so keys land all over the primary-key
// index as real SHA-256 keys do) and fn returns a ~200-byte success body at once, so what is
// measured is the ledger and its store, not a tool. Cases, each run for --seconds (default 2)
// and alternated over --rounds (default 3) so that noise from elsewhere on the machine hits
// them alike; the tables show medians:
//
//  - claim→complete calls/s on the memory store and on SQLite (WAL, synchronous=FULL, a file
//    under DIR) with 1 and 16 concurrent callers;
//  - replay calls/s with 16 callers: Run on keys already completed (claim finds the record,
//    the outcome is replayed, fn never runs);
//  - the bare-SQLite baselines of bare_sqlite.h doing the same row writes: one commit per
//    write, and 100 writes per commit.
//
// Then the group-commit ratios: sqlite16 / one-commit (target >= 3) and sqlite16 / batched
// (target >= 0.5).
//
// --scale N,M,... repeats claim→complete with 16 callers on SQLite and on memory stores
// preloaded with N, M, ... completed records and prints the throughput at the largest size over
// the smallest (target >= 0.8 for 10^7 over 10^4). SQLite scale files are built with one bulk
// INSERT in the store's own schema and kept in DIR as ledger_bench_scale_N.db: a later run
// reuses a file that holds exactly its N preloaded rows (the rows a measurement adds, rowids
// above N, are deleted after every case), and read through once before every case so that it
// is in the OS page cache. Memory stores are preloaded through the Store API.
//
// Besides calls/s, the tables show SQLite's writes per commit (how well group commit shares
// transactions), the cores the process kept busy (CPU time of all its threads over wall time:
// near the machine's core count, a case is bound by the CPUs; far below, by fsync) and the
// bytes it wrote to the disk per call.
//
// --audit (default on, as idemgate runs) keeps the audit log: every attempt is also appended to
// the store in batches, off the request path. --sqlite-params is appended to the store URL of the
// SQLite cases of the main table (`?coalesce_wal=off`, say). DIR (default $TMPDIR or /tmp) must
// be on the disk being measured: tmpfs makes fsync free.
#include <fcntl.h>
#include <linux/magic.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bare_sqlite.h"
#include "run_callers.h"
#include "idem/clock.h"
#include "idem/ledger.h"
#include "idem/record.h"
#include "idem/store.h"
#include "sqlite_store.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Options {
  double seconds = 2;
  int rounds = 3;
  std::string dir;
  std::vector<uint64_t> scale;
  std::string synchronous = "full";
  bool audit = true;
  std::string sqlite_params;  // after "sqlite:FILE" in the main table's cases
  bool main_cases = true;   // --only scale turns them off
  bool scale_cases = true;  // --only main turns them off
};

constexpr int kManyCallers = 16;
constexpr idem::Duration kPreloadRetention{365LL * 24 * 3600 * 1000};  // live whenever reused

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ledger_bench: %s\n", what.c_str());
  std::exit(1);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Calls

// A ~200-byte MCP tool result: what fn returns and the store keeps.
std::string MakeBody() {
  const std::string head = R"({"content":[{"type":"text","text":"charged EUR 129.95 to cus_8f3a; )";
  const std::string tail = R"("}],"isError":false})";
  std::string text = "receipt rcpt_";
  while (head.size() + text.size() + tail.size() < 200) {
    text += static_cast<char>('a' + text.size() % 26);
  }
  return head + text + tail;
}
const std::string kBody = MakeBody();

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

// A stand-in for the SHA-256 fingerprint of call n's arguments: 64 hex digits, spread like a
// hash, distinct for every n (the first 16 digits are a bijection of n).
std::string FingerprintOf(uint64_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string fp(64, '0');
  for (int word = 0; word < 4; ++word) {
    uint64_t bits = SplitMix64(n * 4 + word);
    for (int i = 15; i >= 0; --i, bits >>= 4) fp[word * 16 + i] = kHex[bits & 15];
  }
  return fp;
}

// A turn-mode key as DeriveKey makes it: "v1t.<turn>.<tool>.<fingerprint>".
std::string KeyOf(const std::string& fingerprint) { return "v1t.turn.charge." + fingerprint; }

// Call ids: measured calls draw from one process-wide counter, so no two calls of a run share a
// key; preloaded records use ids below kFirstCallId.
constexpr uint64_t kFirstCallId = uint64_t{1} << 40;
std::atomic<uint64_t> next_call_id{kFirstCallId};

idem::Call CallOf(uint64_t n) {
  idem::Call call;
  call.fingerprint = FingerprintOf(n);
  call.id.key = KeyOf(call.fingerprint);
  call.tool = "charge";
  call.turn = "turn";
  return call;
}

idem::Call NextCall() { return CallOf(next_call_id.fetch_add(1, std::memory_order_relaxed)); }

idem::Execution Succeed() { return idem::Execution{idem::Execution::Kind::kSuccess, kBody}; }

// The bare-SQLite baselines write the rows the ledger writes for the same calls.
idem_bench::BareCalls BareRows() {
  return idem_bench::BareCalls{
      .key = [](uint64_t n) { return KeyOf(FingerprintOf(kFirstCallId + n)); },
      .fingerprint = [](uint64_t n) { return FingerprintOf(kFirstCallId + n); },
      .body = kBody,
  };
}

// ---------------------------------------------------------------------------------------------
// Stores

std::unique_ptr<idem::Store> OpenOrDie(const std::string& url, const Options& o) {
  idem::StoreOptions options;
  options.sqlite_synchronous = o.synchronous;
  auto store = idem::OpenStore(url, idem::SystemClock::Default(), options);
  if (!store) Die(url + ": " + store.error().ToString());
  return std::move(*store);
}

// Store writes and the transactions they shared (group commit); zero for a non-SQLite store.
struct Commits {
  uint64_t commits = 0;
  uint64_t writes = 0;
};

Commits CommitsOf(idem::Store& store) {
  if (auto* sqlite = dynamic_cast<idem::SqliteStore*>(&store)) {
    return {sqlite->commits(), sqlite->writes()};
  }
  return {};
}

double WritesPerCommit(Commits before, Commits after) {
  const uint64_t commits = after.commits - before.commits;
  return commits == 0 ? 0 : static_cast<double>(after.writes - before.writes) / commits;
}

// ---------------------------------------------------------------------------------------------
// Callers

// One measurement of one case.
struct Sample {
  double calls_per_second = 0;
  // CPU time of the whole process (callers, the store's writer thread, the ledger's helper
  // threads) over wall time: near the number of cores when a case is bound by the CPUs, low
  // when it waits on fsync.
  double cores_busy = 0;
  double writes_per_commit = 0;  // SQLite: store writes per transaction (group commit)
  // Bytes the process sent to the storage layer per call (/proc/self/io write_bytes): the WAL,
  // checkpoints into the database file, the audit log.
  double bytes_written_per_call = 0;
};

// Bytes this process has caused to be written to storage so far; 0 if the kernel does not say.
uint64_t ProcessBytesWritten() {
  std::FILE* f = std::fopen("/proc/self/io", "r");
  if (f == nullptr) return 0;
  unsigned long long bytes = 0;
  char line[128];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "write_bytes: %llu", &bytes) == 1) break;
  }
  std::fclose(f);
  return bytes;
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

// Runs `callers` threads that start together and repeat one_call(thread, i) (i counts the
// thread's calls) until `seconds` have passed. Measures from the start until the last thread
// stopped. one_call returns false on a failure (having said why), which ends the benchmark.
template <typename OneCall>
Sample TimeCallers(int callers, double seconds, OneCall one_call) {
  double cpu_start = 0;
  uint64_t written_start = 0;
  const CallerRun run = RunCallers(callers, seconds, one_call, [&] {
    cpu_start = ProcessCpuSeconds();
    written_start = ProcessBytesWritten();
  });
  const double cpu = ProcessCpuSeconds() - cpu_start;
  const double written = static_cast<double>(ProcessBytesWritten() - written_start);
  if (run.failed) Die("a call failed");
  const uint64_t n = std::max<uint64_t>(run.calls, 1);
  return Sample{.calls_per_second = run.calls / run.seconds,
                .cores_busy = cpu / run.seconds,
                .bytes_written_per_call = written / n};
}

idem::LedgerOptions LedgerOptionsFor(const Options& o) {
  return idem::LedgerOptions{.instance = "ledger_bench", .reconcile = nullptr, .audit = o.audit};
}

// ---------------------------------------------------------------------------------------------
// Cases

// Ledger::Run on fresh keys from `callers` threads: each call claims, runs fn and completes.
// When `made` is given, it receives the ids of the records the calls created.
Sample ClaimComplete(idem::Store& store, int callers, const Options& o,
                     std::vector<std::vector<idem::RecordId>>* made = nullptr) {
  idem::Ledger ledger(store, idem::SystemClock::Default(), LedgerOptionsFor(o));
  if (made) made->assign(callers, {});
  const Commits before = CommitsOf(store);
  Sample sample = TimeCallers(callers, o.seconds, [&](int t, uint64_t) {
    const idem::Call call = NextCall();
    auto run = ledger.Run(call, Succeed);
    if (!run) {
      std::fprintf(stderr, "ledger_bench: Run: %s\n", run.error().ToString().c_str());
      return false;
    }
    if (run->decision.kind != idem::Decision::Kind::kExecute) {
      std::fprintf(stderr, "ledger_bench: a fresh key was not executed but %s\n",
                   std::string(idem::DecisionKindName(run->decision.kind)).c_str());
      return false;
    }
    if (made) (*made)[t].push_back(call.id);
    return true;
  });
  sample.writes_per_commit = WritesPerCommit(before, CommitsOf(store));
  return sample;
}

// Ledger::Run on keys already completed, from `callers` threads: each call claims, finds the
// completed record and replays its outcome. fn never runs.
Sample Replay(idem::Store& store, int callers, const Options& o) {
  constexpr int kKeys = 1024;
  idem::Ledger ledger(store, idem::SystemClock::Default(), LedgerOptionsFor(o));
  std::vector<idem::Call> calls;
  for (int i = 0; i < kKeys; ++i) calls.push_back(NextCall());
  {  // Complete them first, from every caller so that SQLite shares commits.
    std::vector<std::thread> threads;
    for (int t = 0; t < callers; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t; i < kKeys; i += callers) {
          auto run = ledger.Run(calls[i], Succeed);
          if (!run) Die("completing the keys to replay: " + run.error().ToString());
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  std::atomic<bool> executed{false};
  auto must_not_run = [&] {
    executed = true;
    return Succeed();
  };
  const Commits before = CommitsOf(store);
  Sample sample = TimeCallers(callers, o.seconds, [&](int t, uint64_t i) {
    const idem::Call& call = calls[(t + i * callers) % kKeys];
    auto run = ledger.Run(call, must_not_run);
    if (!run) {
      std::fprintf(stderr, "ledger_bench: replay: %s\n", run.error().ToString().c_str());
      return false;
    }
    if (run->decision.kind != idem::Decision::Kind::kReplay || !run->outcome ||
        run->outcome->body.size() != kBody.size()) {
      std::fprintf(stderr, "ledger_bench: a completed key was not replayed\n");
      return false;
    }
    return true;
  });
  if (executed) Die("replay ran fn");
  sample.writes_per_commit = WritesPerCommit(before, CommitsOf(store));
  return sample;
}

// ---------------------------------------------------------------------------------------------
// Scale files

void RemoveDatabase(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix);
}

sqlite3* OpenBare(const std::string& path) {
  sqlite3* db = nullptr;
  idem_bench::CheckSqlite(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), db,
                          path.c_str());
  sqlite3_busy_timeout(db, 5000);
  return db;
}

int64_t QueryInt(sqlite3* db, const char* sql) {
  sqlite3_stmt* st = nullptr;
  idem_bench::CheckSqlite(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), db, sql);
  idem_bench::CheckSqlite(sqlite3_step(st), db, sql);
  const int64_t v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

// Deletes what measurements added to a scale file: the records above the preloaded rowids
// 1..n and the audit log; then empties the WAL so every case starts alike.
void TrimScaleFile(const std::string& path, uint64_t n) {
  sqlite3* db = OpenBare(path);
  sqlite3_stmt* st = nullptr;
  const char* sql = "DELETE FROM records WHERE rowid > ?1";
  idem_bench::CheckSqlite(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), db, sql);
  sqlite3_bind_int64(st, 1, static_cast<int64_t>(n));
  idem_bench::CheckSqlite(sqlite3_step(st), db, sql);
  sqlite3_finalize(st);
  idem_bench::ExecSqlite(db, "DELETE FROM attempts");
  idem_bench::ExecSqlite(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  sqlite3_close(db);
}

// True if `path` is an idemgate store holding exactly the n preloaded records (rowids 1..n),
// after deleting rows an earlier run's measurement may have left.
bool HoldsPreload(const std::string& path, uint64_t n, const Options& o) {
  if (!fs::exists(path)) return false;
  {
    idem::StoreOptions options;
    options.sqlite_synchronous = o.synchronous;
    auto store = idem::OpenStore("sqlite:" + path, idem::SystemClock::Default(), options);
    if (!store) return false;  // another program's file, a newer schema, corrupt: rebuild
  }
  TrimScaleFile(path, n);
  sqlite3* db = OpenBare(path);
  const int64_t count = QueryInt(db, "SELECT count(*) FROM records");
  const int64_t max_rowid = QueryInt(db, "SELECT coalesce(max(rowid), 0) FROM records");
  sqlite3_close(db);
  return count == static_cast<int64_t>(n) && max_rowid == static_cast<int64_t>(n);
}

// Builds a store at `path` holding n completed records, rowids 1..n: OpenStore creates the
// schema, then one transaction inserts the rows with the column layout of sqlite_rows.cc
// (rollback journal during the load, so the rows are written once, not to the WAL and then
// again to the file; a large page cache holds the primary-key index the random keys go into).
void BuildScaleFile(const std::string& path, uint64_t n, const Options& o) {
  RemoveDatabase(path);
  OpenOrDie("sqlite:" + path, o).reset();
  sqlite3* db = OpenBare(path);
  idem_bench::ExecSqlite(db, "PRAGMA journal_mode = DELETE");
  idem_bench::ExecSqlite(db, "PRAGMA synchronous = FULL");
  idem_bench::ExecSqlite(db, "PRAGMA cache_size = -2097152");  // 2 GiB
  const char* sql =
      "INSERT INTO records (tenant, key, state, fingerprint, tool, turn, fence, created_at_ms, "
      "lease_expires_at_ms, completed_at_ms, expires_at_ms, outcome_class, outcome_body) "
      "VALUES ('default', ?1, ?2, ?3, 'charge', 'turn', ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
  sqlite3_stmt* st = nullptr;
  idem_bench::CheckSqlite(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), db, sql);
  const std::string_view completed = idem::RecordStateName(idem::RecordState::kCompleted);
  const std::string_view success = idem::OutcomeClassName(idem::OutcomeClass::kSuccess);
  const int64_t now = idem_bench::WallMillis();
  idem_bench::ExecSqlite(db, "BEGIN");
  for (uint64_t i = 0; i < n; ++i) {
    const std::string fp = FingerprintOf(i);
    const std::string key = KeyOf(fp);
    sqlite3_bind_text(st, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_text(st, 2, completed.data(), static_cast<int>(completed.size()), SQLITE_STATIC);
    sqlite3_bind_text(st, 3, fp.data(), static_cast<int>(fp.size()), SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now * 1000);
    sqlite3_bind_int64(st, 5, now - 1000);
    sqlite3_bind_int64(st, 6, now - 1000 + 30'000);
    sqlite3_bind_int64(st, 7, now);
    sqlite3_bind_int64(st, 8, now + kPreloadRetention.count());
    sqlite3_bind_text(st, 9, success.data(), static_cast<int>(success.size()), SQLITE_STATIC);
    sqlite3_bind_blob(st, 10, kBody.data(), static_cast<int>(kBody.size()), SQLITE_STATIC);
    idem_bench::CheckSqlite(sqlite3_step(st), db, sql);
    sqlite3_reset(st);
    if ((i + 1) % 1'000'000 == 0) {
      std::fprintf(stderr, "ledger_bench: preload %s: %llu rows\n", path.c_str(),
                   static_cast<unsigned long long>(i + 1));
    }
  }
  sqlite3_finalize(st);
  idem_bench::ExecSqlite(db, "COMMIT");
  idem_bench::ExecSqlite(db, "PRAGMA journal_mode = WAL");
  sqlite3_close(db);
}

// Completes n records in a fresh memory store through the Store API.
std::unique_ptr<idem::Store> PreloadMemory(uint64_t n, const Options& o) {
  auto store = OpenOrDie("memory:", o);
  for (uint64_t i = 0; i < n; ++i) {
    const idem::Call call = CallOf(i);
    auto claim = store->Claim(idem::ClaimRequest{call.id, call.fingerprint, call.tool, call.turn,
                                                 idem::Duration(30'000), kPreloadRetention});
    if (!claim || !claim->claimed) Die("memory preload: claim failed");
    auto done =
        store->Complete(call.id, claim->record.fence,
                        idem::Outcome{idem::OutcomeClass::kSuccess, kBody}, kPreloadRetention);
    if (!done) Die("memory preload: " + done.error().ToString());
  }
  return store;
}

// The share of `path`'s pages in the OS page cache. A case on a file read from the disk is
// slower than on one in memory, and which one it gets depends on what else ran.
double ResidentShare(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  double share = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const size_t size = static_cast<size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> resident((size + page - 1) / page);
      if (::mincore(map, size, resident.data()) == 0) {
        share = static_cast<double>(std::count_if(resident.begin(), resident.end(),
                                                  [](unsigned char r) { return r & 1; })) /
                resident.size();
      }
      ::munmap(map, size);
    }
  }
  ::close(fd);
  return share;
}

// Reads `path` through once, so that the case that follows finds it in the OS page cache, as
// a store does on a server whose RAM holds it (as it does here: 10^7 records take ~6 GB). Left
// to chance, the share cached ranged from 14% to 100% between runs on the same machine, and
// with it the throughput.
void WarmPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::vector<char> buf(1 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

// One store size of the scale test: a SQLite file and a memory store, both preloaded.
struct ScalePoint {
  uint64_t records = 0;
  std::string sqlite_path;
  std::unique_ptr<idem::Store> memory;
  std::string sqlite_preload;  // how the file was made, for the report
  double memory_preload_seconds = 0;
  std::vector<Sample> sqlite16, memory16;
  std::vector<double> sqlite_resident;        // page-cache share of the file before each case
  std::vector<double> memory_records_at_end;  // the preload plus what the case added
};

void PrepareScalePoint(ScalePoint& p, const Options& o) {
  p.sqlite_path =
      (fs::path(o.dir) / ("ledger_bench_scale_" + std::to_string(p.records) + ".db")).string();
  const auto start = SteadyClock::now();
  char note[512];
  if (HoldsPreload(p.sqlite_path, p.records, o)) {
    std::snprintf(note, sizeof note, "reused %s (checked in %.1f s)", p.sqlite_path.c_str(),
                  SecondsSince(start));
  } else {
    BuildScaleFile(p.sqlite_path, p.records, o);
    std::snprintf(note, sizeof note, "built %s in %.1f s (%.0f MB)", p.sqlite_path.c_str(),
                  SecondsSince(start), fs::file_size(p.sqlite_path) / 1e6);
  }
  p.sqlite_preload = note;
  std::fprintf(stderr, "ledger_bench: sqlite %llu records: %s\n",
               static_cast<unsigned long long>(p.records), note);
  const auto memory_start = SteadyClock::now();
  p.memory = PreloadMemory(p.records, o);
  p.memory_preload_seconds = SecondsSince(memory_start);
  std::fprintf(stderr, "ledger_bench: memory %llu records: preloaded in %.1f s\n",
               static_cast<unsigned long long>(p.records), p.memory_preload_seconds);
}

// Claim->complete on the SQLite file of one size, which is then put back to its preloaded
// records.
void MeasureScaleSqlite(ScalePoint& p, const Options& o) {
  WarmPageCache(p.sqlite_path);
  p.sqlite_resident.push_back(ResidentShare(p.sqlite_path));
  {
    auto store = OpenOrDie("sqlite:" + p.sqlite_path, o);
    p.sqlite16.push_back(ClaimComplete(*store, kManyCallers, o));
  }
  TrimScaleFile(p.sqlite_path, p.records);
}

// Claim->complete on the memory store of one size; the records it made are evicted after.
void MeasureScaleMemory(ScalePoint& p, const Options& o) {
  std::vector<std::vector<idem::RecordId>> made;
  p.memory16.push_back(ClaimComplete(*p.memory, kManyCallers, o, &made));
  auto count = p.memory->CountRecords();
  p.memory_records_at_end.push_back(count ? static_cast<double>(*count) : 0);
  for (const auto& ids : made) {
    for (const idem::RecordId& id : ids) (void)p.memory->Evict(id);
  }
}

template <typename Field>
double MedianOf(const std::vector<Sample>& samples, Field field) {
  std::vector<double> v;
  for (const Sample& s : samples) v.push_back(s.*field);
  return Median(v);
}

double MedianRate(const std::vector<Sample>& samples) {
  return MedianOf(samples, &Sample::calls_per_second);
}

// ---------------------------------------------------------------------------------------------
// The two tables

// Prints the median over the rounds of a ratio measured within each round (the cases of a
// round run back to back, so a slow drift of the disk or the CPUs mostly cancels out), with
// its range, so that noise is visible.
void PrintRatio(const char* what, const std::vector<Sample>& num, const std::vector<Sample>& den,
                const char* target) {
  std::vector<double> ratios;
  for (size_t r = 0; r < num.size() && r < den.size(); ++r) {
    ratios.push_back(num[r].calls_per_second / den[r].calls_per_second);
  }
  if (ratios.empty()) return;
  std::printf("%s: %.2f (target %s; median of %zu rounds, range %.2f-%.2f)\n", what, Median(ratios),
              target, ratios.size(), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
}

// A case of the first table: measures one sample in a round, given a fresh file name.
struct Case {
  const char* name;
  std::function<Sample(const std::string& file)> measure;
  std::vector<Sample> samples;
};

// A bare-SQLite baseline as a Sample: CPU over wall time around the whole run.
template <typename Baseline>
Sample MeasureBare(Baseline baseline, int writes_per_commit) {
  const double cpu_start = ProcessCpuSeconds();
  const uint64_t written_start = ProcessBytesWritten();
  const auto start = SteadyClock::now();
  const double rate = baseline();
  const double elapsed = SecondsSince(start);
  const double calls = std::max(rate * elapsed, 1.0);
  return Sample{.calls_per_second = rate,
                .cores_busy = (ProcessCpuSeconds() - cpu_start) / elapsed,
                .writes_per_commit = static_cast<double>(writes_per_commit),
                .bytes_written_per_call = (ProcessBytesWritten() - written_start) / calls};
}

// The cases of the first table, in the order of `cases` below.
enum MainCase : size_t { kBareOne, kBareBatched, kMemory1, kMemory16, kSqlite1, kSqlite16 };

void RunMainCases(const Options& o, const fs::path& dir) {
  const std::string sync = o.synchronous;
  // The SQLite cases' store, on `file`, with --sqlite-params.
  auto sqlite = [&](const std::string& file) {
    return OpenOrDie("sqlite:" + file + o.sqlite_params, o);
  };
  std::vector<Case> cases = {
      {"bare sqlite, one commit per write",
       [&](const std::string& file) {
         return MeasureBare(
             [&] { return idem_bench::BareOneCommitPerWrite(file, sync, o.seconds, BareRows()); },
             1);
       }},
      {"bare sqlite, 100 writes per commit",
       [&](const std::string& file) {
         return MeasureBare(
             [&] { return idem_bench::BareBatched(file, sync, o.seconds, BareRows()); },
             2 * idem_bench::kCallsPerBatchedCommit);
       }},
      {"claim->complete, memory, 1 caller",
       [&](const std::string&) { return ClaimComplete(*OpenOrDie("memory:", o), 1, o); }},
      {"claim->complete, memory, 16 callers",
       [&](const std::string&) {
         return ClaimComplete(*OpenOrDie("memory:", o), kManyCallers, o);
       }},
      {"claim->complete, sqlite, 1 caller",
       [&](const std::string& file) {
         return ClaimComplete(*sqlite(file), 1, o);
       }},
      {"claim->complete, sqlite, 16 callers",
       [&](const std::string& file) {
         return ClaimComplete(*sqlite(file), kManyCallers, o);
       }},
      {"replay, memory, 16 callers",
       [&](const std::string&) { return Replay(*OpenOrDie("memory:", o), kManyCallers, o); }},
      {"replay, sqlite, 16 callers",
       [&](const std::string& file) {
         return Replay(*sqlite(file), kManyCallers, o);
       }},
  };
  // The cases alternate over the rounds, in reverse order every other round, so that a burst of
  // disk or CPU use from elsewhere hits them alike; the table shows each case's medians.
  for (int round = 0; round < o.rounds; ++round) {
    std::fprintf(stderr, "ledger_bench: round %d/%d\n", round + 1, o.rounds);
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t i = round % 2 == 0 ? k : cases.size() - 1 - k;  // every other round reversed
      const std::string file =
          (dir / ("case" + std::to_string(i) + "-" + std::to_string(round) + ".db")).string();
      cases[i].samples.push_back(cases[i].measure(file));
    }
  }

  std::printf(
      "Ledger::Run calls/s, median of %d rounds of %.1f s per case; SQLite WAL, synchronous=%s, "
      "dir %s; audit log %s\n",
      o.rounds, o.seconds, o.synchronous.c_str(), o.dir.c_str(), o.audit ? "on" : "off");
  std::printf("%-40s %10s %14s %11s %13s\n", "case", "calls/s", "writes/commit", "cores busy",
              "KB disk/call");
  for (const Case& c : cases) {
    const double batch = MedianOf(c.samples, &Sample::writes_per_commit);
    char batch_text[32] = "";
    if (batch > 0) std::snprintf(batch_text, sizeof batch_text, "%.1f", batch);
    std::printf("%-40s %10.0f %14s %11.2f %13.1f\n", c.name, MedianRate(c.samples), batch_text,
                MedianOf(c.samples, &Sample::cores_busy),
                MedianOf(c.samples, &Sample::bytes_written_per_call) / 1024);
  }
  // A bare commit with one row write is one fsync: its time says how fast the disk was.
  std::printf("one commit (bare, one write): %.2f ms\n",
              1e3 / (2 * MedianRate(cases[kBareOne].samples)));
  PrintRatio("sqlite16 / one-commit", cases[kSqlite16].samples, cases[kBareOne].samples, ">= 3");
  PrintRatio("sqlite16 / batched", cases[kSqlite16].samples, cases[kBareBatched].samples, ">= 0.5");
  std::fflush(stdout);
}

void RunScaleCases(const Options& o) {
  std::vector<ScalePoint> points(o.scale.size());
  for (size_t i = 0; i < points.size(); ++i) {
    points[i].records = o.scale[i];
    PrepareScalePoint(points[i], o);
  }
  // The sizes of a store type run back to back, smallest first in even rounds and largest first
  // in odd ones, so that each round gives a fair pair for the ratio.
  for (int round = 0; round < o.rounds; ++round) {
    std::fprintf(stderr, "ledger_bench: scale round %d/%d\n", round + 1, o.rounds);
    std::vector<ScalePoint*> order;
    for (ScalePoint& p : points) order.push_back(&p);
    if (round % 2 == 1) std::reverse(order.begin(), order.end());
    for (ScalePoint* p : order) MeasureScaleSqlite(*p, o);
    for (ScalePoint* p : order) MeasureScaleMemory(*p, o);
  }

  std::printf(
      "\nscale: claim->complete calls/s with 16 callers on stores preloaded with N records, "
      "median of %d rounds\n",
      o.rounds);
  std::printf("%9s | %9s %14s %11s %13s %7s | %9s %11s %13s\n", "N", "sqlite16", "writes/commit",
              "cores busy", "KB disk/call", "cached", "memory16", "cores busy", "memory N end");
  for (const ScalePoint& p : points) {
    std::printf("%9llu | %9.0f %14.1f %11.2f %13.1f %6.0f%% | %9.0f %11.2f %13.0f\n",
                static_cast<unsigned long long>(p.records), MedianRate(p.sqlite16),
                MedianOf(p.sqlite16, &Sample::writes_per_commit),
                MedianOf(p.sqlite16, &Sample::cores_busy),
                MedianOf(p.sqlite16, &Sample::bytes_written_per_call) / 1024,
                100 * Median(p.sqlite_resident), MedianRate(p.memory16),
                MedianOf(p.memory16, &Sample::cores_busy), Median(p.memory_records_at_end));
  }
  std::printf(
      "(cached: share of the SQLite file in the OS page cache when the case began, after reading "
      "it through once)\n");
  for (const ScalePoint& p : points) {
    std::printf("preload %llu: sqlite %s; memory %.1f s\n",
                static_cast<unsigned long long>(p.records), p.sqlite_preload.c_str(),
                p.memory_preload_seconds);
  }
  if (points.size() >= 2) {
    const ScalePoint& small = points.front();
    const ScalePoint& large = points.back();
    const std::string sizes =
        " at " + std::to_string(large.records) + " / at " + std::to_string(small.records);
    PrintRatio(("sqlite16" + sizes).c_str(), large.sqlite16, small.sqlite16, ">= 0.8");
    PrintRatio(("memory16" + sizes).c_str(), large.memory16, small.memory16, ">= 0.8");
  }
}

// ---------------------------------------------------------------------------------------------
// Flags

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: ledger_bench [--seconds N] [--rounds N] [--dir DIR] [--scale N,N,...]\n"
               "                    [--synchronous full|normal|off] [--audit on|off] "
               "[--only main|scale]\n"
               "                    [--sqlite-params '?NAME=VALUE&...']\n");
  std::exit(2);
}

std::vector<uint64_t> ParseScale(const std::string& list) {
  std::vector<uint64_t> sizes;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(pos, comma - pos);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);  // 10000 or 1e7
    if (item.empty() || *end != '\0' || v < 1 || v > 1e12) Usage();
    sizes.push_back(static_cast<uint64_t>(v));
    pos = comma + 1;
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

Options ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage();
    const std::string value = argv[++i];
    if (flag == "--seconds") {
      o.seconds = std::max(0.1, std::atof(value.c_str()));
    } else if (flag == "--rounds") {
      o.rounds = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--dir") {
      o.dir = value;
    } else if (flag == "--scale") {
      o.scale = ParseScale(value);
    } else if (flag == "--synchronous" &&
               (value == "full" || value == "normal" || value == "off")) {
      o.synchronous = value;
    } else if (flag == "--audit" && (value == "on" || value == "off")) {
      o.audit = value == "on";
    } else if (flag == "--sqlite-params" && value.starts_with("?")) {
      o.sqlite_params = value;
    } else if (flag == "--only" && (value == "main" || value == "scale")) {
      o.main_cases = value == "main";
      o.scale_cases = value == "scale";
    } else {
      Usage();
    }
  }
  if (o.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    o.dir = tmp && *tmp ? tmp : "/tmp";
  }
  return o;
}

bool OnTmpfs(const std::string& dir) {
  struct statfs s;
  return statfs(dir.c_str(), &s) == 0 && s.f_type == TMPFS_MAGIC;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseFlags(argc, argv);
  std::error_code made_dir;
  fs::create_directories(o.dir, made_dir);
  if (OnTmpfs(o.dir)) {
    std::fprintf(stderr,
                 "ledger_bench: warning: %s is tmpfs, where fsync is free; pass --dir on the "
                 "disk being measured\n",
                 o.dir.c_str());
  }
  if (o.main_cases) {
    std::string tmpl = o.dir + "/idem_ledger_bench_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("ledger_bench: mkdtemp");
      return 1;
    }
    RunMainCases(o, tmpl);
    fs::remove_all(tmpl);
  }
  if (o.scale_cases && !o.scale.empty()) RunScaleCases(o);
  return 0;
}
