// Ledger::Run throughput on the networked stores (Redis, Redis Cluster, PostgreSQL) against the
// servers' own benchmark tools doing one conditional write per request (issue 4).
//
//   store_bench [--redis URL] [--cluster URL] [--postgres URL] [--callers N] [--seconds N]
//               [--rounds N] [--scale N,N,...] [--only main|scale]
//               [--postgres-options OPTS]   (appended to the PostgreSQL store URL: pool_size=16)
//               [--redis-tls URL]           (rediss:// to the --redis server's TLS port)
//
// URLs are those of tests/servers/redis.sh and postgres.sh (no query part): redis://H:P,
// redis+cluster://H:P,H:P,..., postgres://postgres@H:P/DB. A backend without a URL is skipped.
// bench/store_bench.sh starts the three servers into temporary directories and runs this.
//
// Main cases, per backend, with --callers (16) threads, each run for --seconds (2) and
// alternated over --rounds (3), reversed every other round; tables show medians:
//  - claim->complete: Ledger::Run on a fresh key per call (claim, fn returns a 200-byte body at
//    once, complete), audit log on as idemgate runs it;
//  - replay: Ledger::Run on 1024 keys completed before the case (fn never runs);
//  - Redis baselines: redis-benchmark -c 16 -r 100000000 SET key:__rand_int__ value NX PX
//    86400000, unpipelined and with -P 16 (Cluster: --cluster and a {tag} in the key);
//  - PostgreSQL baseline: pgbench -n -c 16 -j 2 -T S with the one-statement script
//    INSERT INTO bench_kv(k, v) VALUES (:k, 'v') ON CONFLICT DO NOTHING;
//  - PostgreSQL ceiling: the same INSERT followed by UPDATE bench_kv SET v = 'w' WHERE k = :k,
//    each its own transaction: two durable commits in sequence per call, as a claim and its
//    completion need, so its ratio to the baseline is what this server and disk allow a call.
// Ratios are taken within each round (median and range): Redis claim->complete / SET NX
// (target >= 0.4), Redis replay / SET NX (>= 0.7), PostgreSQL claim->complete / pgbench (>= 1.0,
// issue #18: also printed as "PostgreSQL claim→complete / pgbench (target ≥ 1.0): X met|not met").
// With --redis-tls, claim->complete and replay also run over TLS on the same server (its
// counters read through --redis), and the bench prints TLS / plain for both.
//
// Where the time goes, from the servers' own counters around each case: Redis commands per call
// (INFO commandstats: EVALSHA, XADD, ...) and server CPU per call (INFO cpu); PostgreSQL
// transactions per call (pg_stat_database.xact_commit), WAL flushes (pg_stat_wal.wal_sync), WAL
// bytes per call and, when the server runs on this machine, its CPU per call (/proc: the
// postmaster, its children, and the children it has reaped).
//
// --scale N,M (Redis single and PostgreSQL): claim->complete, and replay of preloaded records
// drawn at random, with --callers on stores preloaded with N and M completed records; the
// sizes take turns over the rounds, and the bench prints large / small (target >= 0.8). The
// preloaded records are those Ledger::Run would have left (200-byte outcome, owner token,
// times of the last hour, the default policy's lease and 24 h ttl), in the store's own
// layout, and are checked by replaying some through the store before measuring:
//  - Redis: per record the HSET of every field the store's scripts write (redis_codec.h) and
//    the PEXPIRE they set, pipelined 10 000 records per round trip, each size in its own
//    database number; the AOF is off during the preload and rewritten from the data after it;
//  - PostgreSQL: one INSERT ... SELECT generate_series into the table the store's migrations
//    made, in key order, fences from the store's sequence, each size in its own schema; then
//    VACUUM ANALYZE and CHECKPOINT.
// Records and audit rows a case adds are deleted after it; the preloaded data at the end.
// Prints Redis used_memory and the PostgreSQL table + index size per size.
#include <dirent.h>
#include <hiredis/hiredis.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/ledger.h"
#include "idem/policy.h"
#include "idem/record.h"
#include "idem/store.h"
#include "redis_codec.h"
#include "redis_url.h"
#include "run_callers.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

struct Options {
  std::string redis, cluster, postgres;
  std::string redis_tls;         // the --redis server's TLS port, as a rediss:// URL
  std::string postgres_options;  // appended to the store's URL, e.g. pool_size=16
  int callers = 16;
  double seconds = 2;
  int rounds = 3;
  std::vector<uint64_t> scale;
  bool main_cases = true;
  bool scale_cases = true;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "store_bench: %s\n", what.c_str());
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

int64_t WallMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs a shell command and returns its standard output; dies if it fails.
std::string Shell(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) Die("popen: " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) Die("failed: " + cmd + "\n" + out);
  return out;
}

// "scheme://[user@]host:port[,host:port...][/db]" -> the host:port pairs.
std::vector<std::pair<std::string, int>> HostPorts(const std::string& url) {
  std::string rest = url.substr(url.find("://") + 3);
  if (auto at = rest.find('@'); at != std::string::npos) rest = rest.substr(at + 1);
  rest = rest.substr(0, rest.find_first_of("/?"));
  std::vector<std::pair<std::string, int>> out;
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    const std::string item = rest.substr(pos, comma - pos);
    const size_t colon = item.rfind(':');
    out.emplace_back(item.substr(0, colon), std::atoi(item.c_str() + colon + 1));
    pos = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Calls (as ledger_bench: a turn-mode key over a 64-hex pseudo fingerprint, a 200-byte body)

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

std::string FingerprintOf(uint64_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string fp(64, '0');
  for (int word = 0; word < 4; ++word) {
    uint64_t bits = SplitMix64(n * 4 + word);
    for (int i = 15; i >= 0; --i, bits >>= 4) fp[word * 16 + i] = kHex[bits & 15];
  }
  return fp;
}

// Call ids start from the wall clock, so that a run against servers that kept an earlier run's
// records never meets one of its keys.
std::atomic<uint64_t> next_call_id{(uint64_t{1} << 40) +
                                   (static_cast<uint64_t>(WallMillis()) << 11)};

idem::Call CallWith(std::string fingerprint) {
  idem::Call call;
  call.fingerprint = std::move(fingerprint);
  call.id.key = "v1t.turn.charge." + call.fingerprint;
  call.tool = "charge";
  call.turn = "turn";
  return call;
}

idem::Call NextCall() {
  return CallWith(FingerprintOf(next_call_id.fetch_add(1, std::memory_order_relaxed)));
}

idem::Execution Succeed() { return idem::Execution{idem::Execution::Kind::kSuccess, kBody}; }

std::unique_ptr<idem::Store> OpenOrDie(const std::string& url) {
  auto store = idem::OpenStore(url, idem::SystemClock::Default());
  if (!store) Die(url + ": " + store.error().ToString());
  return std::move(*store);
}

idem::LedgerOptions LedgerOptionsFor() {
  return idem::LedgerOptions{.instance = "store_bench", .reconcile = nullptr, .audit = true};
}

// ---------------------------------------------------------------------------------------------
// Server counters

using Counters = std::map<std::string, double>;

redisContext* RedisConnect(const std::string& host, int port) {
  redisContext* c = redisConnect(host.c_str(), port);
  if (c == nullptr || c->err) Die("redis " + host + ":" + std::to_string(port) + ": connect");
  return c;
}

std::string RedisInfo(redisContext* c, const char* section) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO %s", section));
  if (r == nullptr || r->type != REDIS_REPLY_STRING) Die("INFO");  // hiredis 0.14: RESP2
  std::string s(r->str, r->len);
  freeReplyObject(r);
  return s;
}

// Commands by name (cmdstat_NAME:calls=N), all commands, and server CPU seconds, summed over
// the servers (one, or the cluster's masters).
Counters RedisCounters(const std::string& url) {
  Counters out;
  for (const auto& [host, port] : HostPorts(url)) {
    redisContext* c = RedisConnect(host, port);
    const std::string stats = RedisInfo(c, "commandstats");
    size_t pos = 0;
    while ((pos = stats.find("cmdstat_", pos)) != std::string::npos) {
      const size_t colon = stats.find(':', pos);
      const std::string name = stats.substr(pos + 8, colon - pos - 8);
      const double calls = std::atof(stats.c_str() + stats.find("calls=", colon) + 6);
      out[name] += calls;
      if (name != "info") out["all"] += calls;
      pos = colon;
    }
    const std::string cpu = RedisInfo(c, "cpu");
    for (const char* f : {"used_cpu_sys:", "used_cpu_user:"}) {
      const size_t at = cpu.find(f);
      if (at != std::string::npos) out["cpu"] += std::atof(cpu.c_str() + at + std::strlen(f));
    }
    redisFree(c);
  }
  return out;
}

// `s` as one word for sh: in single quotes, each ' written as '\''.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string Psql(const std::string& url, const std::string& sql) {
  return Shell("psql " + ShellQuote(url) + " -v ON_ERROR_STOP=1 -qtAX -c " + ShellQuote(sql) +
               " 2>&1");
}

// Of /proc/PID/stat: the parent's pid, the process's own CPU ticks (utime + stime) and those of
// its reaped children (cutime + cstime). False if there is no such process on this machine.
struct ProcCpu {
  long ppid = 0;
  double ticks = 0, reaped_ticks = 0;
};
bool ReadProcCpu(long pid, ProcCpu* out) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* after_name = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  unsigned long long ut = 0, st = 0, cut = 0, cst = 0;
  if (after_name == nullptr ||
      std::sscanf(after_name + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu",
                  &out->ppid, &ut, &st, &cut, &cst) != 5) {
    return false;
  }
  out->ticks = static_cast<double>(ut + st);
  out->reaped_ticks = static_cast<double>(cut + cst);
  return true;
}

// CPU seconds used so far by the PostgreSQL server whose postmaster is `postmaster`: its own,
// its live children's (backends, WAL writer, ...) and, through its cutime, those of the
// backends it has reaped. 0 when the server is not on this machine.
double PgServerCpuSeconds(long postmaster) {
  ProcCpu pm;
  if (postmaster <= 0 || !ReadProcCpu(postmaster, &pm)) return 0;
  double ticks = pm.ticks + pm.reaped_ticks;
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const long pid = std::atol(e->d_name);
      ProcCpu child;
      if (pid > 0 && ReadProcCpu(pid, &child) && child.ppid == postmaster) ticks += child.ticks;
    }
    ::closedir(d);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Transactions committed in the whole server, WAL flushes, WAL bytes and, when the server runs
// on this machine, its CPU seconds ("cpu"; found through the checkpointer's parent).
Counters PgCounters(const std::string& url) {
  const std::string row = Psql(
      url,
      "SELECT (SELECT sum(xact_commit) FROM pg_stat_database), wal_sync, wal_bytes, "
      "(SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer') FROM pg_stat_wal");
  Counters out;
  double a = 0, b = 0, c = 0;
  long checkpointer = 0;
  if (std::sscanf(row.c_str(), "%lf|%lf|%lf|%ld", &a, &b, &c, &checkpointer) != 4) {
    Die("pg counters: " + row);
  }
  out["xact"] = a;
  out["wal_sync"] = b;
  out["wal_bytes"] = c;
  ProcCpu cp;
  out["cpu"] = ReadProcCpu(checkpointer, &cp) ? PgServerCpuSeconds(cp.ppid) : 0;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cases

struct Sample {
  double calls_per_second = 0;
  double client_cores = 0;  // this process's CPU over wall time
  double calls = 0;
  Counters server;  // server counter deltas over the case
};

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

template <typename OneCall>
Sample TimeCallers(int callers, double seconds, OneCall one_call) {
  double cpu_start = 0;
  const CallerRun run =
      RunCallers(callers, seconds, one_call, [&] { cpu_start = ProcessCpuSeconds(); });
  if (run.failed) Die("a call failed");
  return Sample{.calls_per_second = run.calls / run.seconds,
                .client_cores = (ProcessCpuSeconds() - cpu_start) / run.seconds,
                .calls = static_cast<double>(run.calls)};
}

Sample ClaimComplete(idem::Store& store, int callers, double seconds,
                     std::vector<std::vector<idem::RecordId>>* made = nullptr) {
  idem::Ledger ledger(store, idem::SystemClock::Default(), LedgerOptionsFor());
  if (made) made->assign(callers, {});
  return TimeCallers(callers, seconds, [&](int t, uint64_t) {
    const idem::Call call = NextCall();
    auto run = ledger.Run(call, Succeed);
    if (!run || run->decision.kind != idem::Decision::Kind::kExecute) {
      std::fprintf(stderr, "store_bench: Run: %s\n",
                   run ? "a fresh key was not executed" : run.error().ToString().c_str());
      return false;
    }
    if (made) (*made)[t].push_back(call.id);
    return true;
  });
}

// Runs `call`, which must find a completed record with kBody as its outcome: true if it
// replayed that, else false after saying why. Sets `executed` if fn ran.
bool Replayed(idem::Ledger& ledger, const idem::Call& call, std::atomic<bool>& executed) {
  auto run = ledger.Run(call, [&] {
    executed = true;
    return Succeed();
  });
  if (!run || run->decision.kind != idem::Decision::Kind::kReplay || !run->outcome ||
      run->outcome->body != kBody) {
    std::fprintf(stderr, "store_bench: replay of %s: %s\n", call.id.key.c_str(),
                 !run ? run.error().ToString().c_str()
                 : run->decision.kind != idem::Decision::Kind::kReplay
                     ? "the completed key was not replayed"
                     : "the replayed outcome is not the stored one");
    return false;
  }
  return true;
}

Sample Replay(idem::Store& store, int callers, double seconds) {
  constexpr int kKeys = 1024;
  idem::Ledger ledger(store, idem::SystemClock::Default(), LedgerOptionsFor());
  std::vector<idem::Call> calls;
  for (int i = 0; i < kKeys; ++i) calls.push_back(NextCall());
  {
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
  Sample s = TimeCallers(callers, seconds, [&](int t, uint64_t i) {
    return Replayed(ledger, calls[(t + i * callers) % kKeys], executed);
  });
  if (executed) Die("replay ran fn");
  return s;
}

// redis-benchmark's SET NX PX; n adapts to the last rate so that a run takes about `seconds`.
Sample RedisBenchmark(const std::string& url, bool cluster, int callers, int pipeline,
                      double seconds, double* last_rate) {
  const auto [host, port] = HostPorts(url).front();
  const double n = std::max(2000.0, *last_rate * seconds);
  const std::string cmd = "redis-benchmark -h " + host + " -p " + std::to_string(port) + " -c " +
                          std::to_string(callers) + " -n " +
                          std::to_string(static_cast<uint64_t>(n)) + " -r 100000000 -P " +
                          std::to_string(pipeline) + (cluster ? " --cluster" : "") + " --csv SET " +
                          (cluster ? "key:{tag}:__rand_int__" : "key:__rand_int__") +
                          " value NX PX 86400000 2>/dev/null";
  const auto start = SteadyClock::now();
  const std::string out = Shell(cmd);
  const double elapsed = SecondsSince(start);
  const size_t line = out.rfind("\"SET ");
  if (line == std::string::npos) Die("redis-benchmark said: " + out);
  const size_t field = out.find("\",\"", line);
  Sample s;
  s.calls_per_second = std::atof(out.c_str() + field + 3);
  s.calls = n;
  (void)elapsed;
  *last_rate = s.calls_per_second;
  return s;
}

// pgbench with the one-statement INSERT ... ON CONFLICT DO NOTHING script.
Sample Pgbench(const std::string& url, const std::string& script, int callers, double seconds) {
  const auto [host, port] = HostPorts(url).front();
  const std::string db = url.substr(url.rfind('/') + 1);
  const std::string out =
      Shell("pgbench -n -c " + std::to_string(callers) + " -j 2 -T " +
            std::to_string(std::max(1, static_cast<int>(seconds + 0.5))) + " -f " + script +
            " -h " + host + " -p " + std::to_string(port) + " -U postgres " + db + " 2>&1");
  const size_t at = out.find("tps = ");
  if (at == std::string::npos) Die("pgbench said: " + out);
  Sample s;
  s.calls_per_second = std::atof(out.c_str() + at + 6);
  s.calls = s.calls_per_second * seconds;
  return s;
}

// A case: how to measure it, which server counters to read around it.
struct Case {
  std::string name;
  std::function<Sample()> measure;
  std::function<Counters()> counters;  // may be empty
  std::vector<Sample> samples;
};

Sample MeasureCase(Case& c) {
  Counters before = c.counters ? c.counters() : Counters{};
  const auto start = SteadyClock::now();
  Sample s = c.measure();
  const double elapsed = SecondsSince(start);
  if (c.counters) {
    for (auto& [k, v] : c.counters()) s.server[k] = v - before[k];
    s.server["elapsed"] = elapsed;
  }
  return s;
}

double MedianRate(const std::vector<Sample>& v) {
  std::vector<double> r;
  for (const Sample& s : v) r.push_back(s.calls_per_second);
  return Median(r);
}

// Median over the samples of server counter `k` per call.
double PerCall(const std::vector<Sample>& v, const std::string& k) {
  std::vector<double> r;
  for (const Sample& s : v) {
    auto it = s.server.find(k);
    if (it != s.server.end() && s.calls > 0) r.push_back(it->second / s.calls);
  }
  return Median(r);
}

double Cores(const std::vector<Sample>& v, const std::string& k) {
  std::vector<double> r;
  for (const Sample& s : v) {
    auto it = s.server.find(k);
    auto e = s.server.find("elapsed");
    if (it != s.server.end() && e != s.server.end()) r.push_back(it->second / e->second);
  }
  return Median(r);
}

// The server counters of a case, per call (medians over its samples).
std::string ServerPerCall(const std::vector<Sample>& samples, bool pg) {
  char out[200];
  if (pg) {
    std::snprintf(out, sizeof out,
                  "%.2f xacts, %.2f WAL flushes, %.0f WAL bytes, %.1f us server CPU, %.2f server "
                  "cores",
                  PerCall(samples, "xact"), PerCall(samples, "wal_sync"),
                  PerCall(samples, "wal_bytes"), 1e6 * PerCall(samples, "cpu"),
                  Cores(samples, "cpu"));
  } else {
    std::snprintf(
        out, sizeof out,
        "%.2f cmds incl. in scripts (evalsha %.2f, xadd %.2f), %.1f us server CPU, %.2f server "
        "cores",
        PerCall(samples, "all"), PerCall(samples, "evalsha"), PerCall(samples, "xadd"),
        1e6 * PerCall(samples, "cpu"), Cores(samples, "cpu"));
  }
  return out;
}

void PrintRatio(const std::string& what, const std::vector<Sample>& num,
                const std::vector<Sample>& den, const char* target) {
  std::vector<double> ratios;
  for (size_t r = 0; r < num.size() && r < den.size(); ++r) {
    ratios.push_back(num[r].calls_per_second / den[r].calls_per_second);
  }
  if (ratios.empty()) return;
  // "met" or "NOT met" for a target ">= X" (the only kind here); nothing for "none".
  double floor = 0;
  const char* verdict = "";
  if (std::sscanf(target, ">= %lf", &floor) == 1) {
    verdict = Median(ratios) >= floor ? " met" : " NOT met";
  }
  std::printf("%s: %.2f (target %s; median of %zu rounds, range %.2f-%.2f)%s\n", what.c_str(),
              Median(ratios), target, ratios.size(),
              *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()), verdict);
}

// The pgbench scripts: one INSERT ... ON CONFLICT DO NOTHING per call (the baseline), and the
// same followed by an UPDATE of the row, each in a transaction of its own: two durable commits
// per call, in sequence, as a claim and its completion need.
constexpr const char* kPgbenchOneCommit =
    "\\set k random(1, 1000000000)\n"
    "INSERT INTO bench_kv(k, v) VALUES (:k, 'v') ON CONFLICT DO NOTHING;\n";
constexpr const char* kPgbenchTwoCommits =
    "\\set k random(1, 1000000000)\n"
    "INSERT INTO bench_kv(k, v) VALUES (:k, 'v') ON CONFLICT DO NOTHING;\n"
    "UPDATE bench_kv SET v = 'w' WHERE k = :k;\n";

std::string WriteBenchScript(const std::string& url, const std::string& text) {
  Psql(url, "CREATE TABLE IF NOT EXISTS bench_kv (k bigint PRIMARY KEY, v text NOT NULL)");
  char path[] = "/tmp/store_bench_pgbench_XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) Die("mkstemp");
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) Die("write");
  ::fchmod(fd, 0644);
  ::close(fd);
  return path;
}

// The issue's target line for a ratio: "WHAT (target >= MIN): X met|not met".
void PrintTarget(const std::string& what, const std::vector<Sample>& num,
                 const std::vector<Sample>& den, double min) {
  std::vector<double> ratios;
  for (size_t r = 0; r < num.size() && r < den.size(); ++r) {
    ratios.push_back(num[r].calls_per_second / den[r].calls_per_second);
  }
  if (ratios.empty()) return;
  const double median = Median(ratios);
  std::printf("%s (target \u2265 %.1f): %.2f %s\n", what.c_str(), min, median,
              median >= min ? "met" : "not met");
}

void RunMainCases(const Options& o) {
  std::vector<Case> cases;
  struct Pair {
    std::string label;
    size_t cc = 0, replay = 0, baseline = 0, pipelined = SIZE_MAX;  // PostgreSQL: no pipelined
    size_t two_commits = SIZE_MAX;  // PostgreSQL: pgbench with two commits per call
    bool pg = false;
  };
  std::vector<Pair> pairs;
  const int n = o.callers;
  auto rates = std::make_shared<std::map<std::string, double>>();
  std::string pg_script, pg_script_two;
  auto with_prefix = [](const std::string& url) {
    return url + (url.find('?') == std::string::npos ? "?" : "&") + "prefix=sb:";
  };
  auto redis_backend = [&](const std::string& label, const std::string& url, bool cluster) {
    const std::string store_url = with_prefix(url);
    Pair p{.label = label};
    auto counters = [url] { return RedisCounters(url); };
    p.cc = cases.size();
    cases.push_back({label + " claim->complete",
                     [=] { return ClaimComplete(*OpenOrDie(store_url), n, o.seconds); }, counters});
    p.replay = cases.size();
    cases.push_back(
        {label + " replay", [=] { return Replay(*OpenOrDie(store_url), n, o.seconds); }, counters});
    p.baseline = cases.size();
    (*rates)[label + "1"] = 10000;
    (*rates)[label + "16"] = 50000;
    cases.push_back(
        {label + " redis-benchmark SET NX PX",
         [=] { return RedisBenchmark(url, cluster, n, 1, o.seconds, &(*rates)[label + "1"]); },
         counters});
    p.pipelined = cases.size();
    cases.push_back(
        {label + " redis-benchmark SET NX PX -P 16",
         [=] { return RedisBenchmark(url, cluster, n, 16, o.seconds, &(*rates)[label + "16"]); },
         counters});
    pairs.push_back(p);
  };
  if (!o.redis.empty()) redis_backend("redis", o.redis, false);
  // The ledger over TLS on the same server: its counters through the plain port.
  size_t tls_cc = SIZE_MAX, tls_replay = SIZE_MAX;
  if (!o.redis_tls.empty()) {
    if (o.redis.empty()) Die("--redis-tls needs --redis: the same server's plain port");
    const std::string store_url = with_prefix(o.redis_tls);
    auto counters = [url = o.redis] { return RedisCounters(url); };
    tls_cc = cases.size();
    cases.push_back({"redis tls claim->complete",
                     [=] { return ClaimComplete(*OpenOrDie(store_url), n, o.seconds); }, counters});
    tls_replay = cases.size();
    cases.push_back({"redis tls replay",
                     [=] { return Replay(*OpenOrDie(store_url), n, o.seconds); }, counters});
  }
  if (!o.cluster.empty()) redis_backend("cluster", o.cluster, true);
  if (!o.postgres.empty()) {
    pg_script = WriteBenchScript(o.postgres, kPgbenchOneCommit);
    pg_script_two = WriteBenchScript(o.postgres, kPgbenchTwoCommits);
    const std::string store_url = o.postgres + "?schema=store_bench" +
                                  (o.postgres_options.empty() ? "" : "&" + o.postgres_options);
    const std::string url = o.postgres;
    Pair p{.label = "postgres", .pg = true};
    auto counters = [url] { return PgCounters(url); };
    p.cc = cases.size();
    cases.push_back({"postgres claim->complete",
                     [=] { return ClaimComplete(*OpenOrDie(store_url), n, o.seconds); }, counters});
    p.replay = cases.size();
    cases.push_back(
        {"postgres replay", [=] { return Replay(*OpenOrDie(store_url), n, o.seconds); }, counters});
    p.baseline = cases.size();
    cases.push_back({"postgres pgbench INSERT ON CONFLICT",
                     [=] { return Pgbench(url, pg_script, n, o.seconds); }, counters});
    p.two_commits = cases.size();
    cases.push_back({"postgres pgbench INSERT; UPDATE (2 commits)",
                     [=] { return Pgbench(url, pg_script_two, n, o.seconds); }, counters});
    pairs.push_back(p);
  }
  if (cases.empty()) return;
  for (int round = 0; round < o.rounds; ++round) {
    std::fprintf(stderr, "store_bench: round %d/%d\n", round + 1, o.rounds);
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t i = round % 2 == 0 ? k : cases.size() - 1 - k;
      cases[i].samples.push_back(MeasureCase(cases[i]));
      std::fprintf(stderr, "store_bench:   %-45s %10.0f calls/s\n", cases[i].name.c_str(),
                   cases[i].samples.back().calls_per_second);
    }
  }
  if (!pg_script.empty()) ::unlink(pg_script.c_str());
  if (!pg_script_two.empty()) ::unlink(pg_script_two.c_str());

  std::printf("calls/s with %d callers, median of %d rounds of %.1f s per case\n", n, o.rounds,
              o.seconds);
  std::printf("%-42s %10s %11s | %s\n", "case", "calls/s", "client cores",
              "server, per call (median)");
  auto row = [&](size_t i, bool pg) {
    if (i == SIZE_MAX) return;
    const Case& c = cases[i];
    std::vector<double> cores;
    for (const Sample& s : c.samples) cores.push_back(s.client_cores);
    std::printf("%-42s %10.0f %11.2f | %s\n", c.name.c_str(), MedianRate(c.samples), Median(cores),
                ServerPerCall(c.samples, pg).c_str());
  };
  for (const Pair& p : pairs) {
    for (size_t i : {p.cc, p.replay, p.baseline, p.two_commits, p.pipelined}) row(i, p.pg);
  }
  for (size_t i : {tls_cc, tls_replay}) row(i, false);
  for (const Pair& p : pairs) {
    if (p.pg) {
      PrintRatio("postgres claim->complete / pgbench", cases[p.cc].samples,
                 cases[p.baseline].samples, ">= 1.0");
      PrintTarget("PostgreSQL claim\u2192complete / pgbench", cases[p.cc].samples,
                  cases[p.baseline].samples, 1.0);
      // What two durable commits in sequence per call allow on this server and disk.
      PrintRatio("postgres pgbench 2 commits / pgbench", cases[p.two_commits].samples,
                 cases[p.baseline].samples, "none: the ceiling of two commits per call");
      PrintRatio("postgres claim->complete / pgbench 2 commits", cases[p.cc].samples,
                 cases[p.two_commits].samples, "none");
      PrintRatio("postgres replay / pgbench", cases[p.replay].samples, cases[p.baseline].samples,
                 "none");
    } else {
      PrintRatio(p.label + " claim->complete / SET NX", cases[p.cc].samples,
                 cases[p.baseline].samples, ">= 0.4");
      PrintRatio(p.label + " replay / SET NX", cases[p.replay].samples, cases[p.baseline].samples,
                 ">= 0.7");
      PrintRatio(p.label + " claim->complete / SET NX -P 16", cases[p.cc].samples,
                 cases[p.pipelined].samples, "none");
    }
  }
  if (tls_cc != SIZE_MAX) {
    const Pair& plain = pairs.front();
    PrintRatio("redis tls claim->complete / plain", cases[tls_cc].samples, cases[plain.cc].samples,
               "none");
    PrintRatio("redis tls replay / plain", cases[tls_replay].samples, cases[plain.replay].samples,
               "none");
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Scale: stores preloaded with N completed records

// Preloaded record k (0 <= k < N) is the record Ledger::Run leaves behind after completing
// PreloadedCall(k) with kBody. Its fingerprint is the hex SHA-256 of "preload k", which
// PostgreSQL computes itself (encode(sha256(...), 'hex')) in its INSERT ... SELECT; its owner
// token is the fingerprint's second half.
std::string PreloadedFingerprint(uint64_t k) {
  const std::string text = "preload " + std::to_string(k);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : digest) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

idem::Call PreloadedCall(uint64_t k) { return CallWith(PreloadedFingerprint(k)); }

// The times of the preloaded records, as the stores write them under the default policy: each
// completed 50 ms after its claim, at some moment of the hour before the preload, with the
// policy's lease, and kept for the policy's ttl after its completion.
struct PreloadTimes {
  int64_t now_ms = WallMillis();
  int64_t lease_ms = idem::Policy{}.lease.count();
  int64_t ttl_ms = idem::Policy{}.ttl.count();

  int64_t CompletedAt(uint64_t k, uint64_t n) const {
    return now_ms - 3'600'000 + static_cast<int64_t>(k * 3'600'000 / n);
  }
  // Every preloaded record expires by then; every record a case adds expires later.
  int64_t LastExpiry() const { return now_ms + ttl_ms; }
};

// Ledger::Run on preloaded records 0, n/2 and n-1 must replay kBody without running fn, and
// Store::Get must read them back as they were written (completed, fingerprint, owner, times):
// the preload wrote records that the store reads as its own.
void CheckPreloaded(idem::Store& store, uint64_t n, const PreloadTimes& times,
                    const std::string& where) {
  idem::Ledger ledger(store, idem::SystemClock::Default(),
                      idem::LedgerOptions{.instance = "store_bench", .reconcile = nullptr});
  for (uint64_t k : {uint64_t{0}, n / 2, n - 1}) {
    const idem::Call call = PreloadedCall(k);
    std::atomic<bool> executed{false};
    if (!Replayed(ledger, call, executed) || executed) {
      Die(where + ": preloaded record " + std::to_string(k) + " was not replayed");
    }
    auto record = store.Get(call.id);
    if (!record || !*record) {
      Die(where + ": preloaded record " + std::to_string(k) +
          " does not read back: " + (record ? "absent" : record.error().ToString()));
    }
    const idem::Record& r = **record;
    const int64_t completed = idem::ToUnixMillis(r.completed_at);
    if (r.state != idem::RecordState::kCompleted || r.fingerprint != call.fingerprint ||
        r.fence == 0 || r.owner != call.fingerprint.substr(32) ||
        completed < times.CompletedAt(0, n) || completed > times.now_ms ||
        idem::ToUnixMillis(r.expires_at) != completed + times.ttl_ms) {
      Die(where + ": preloaded record " + std::to_string(k) +
          " reads back with other fields than it was written with");
    }
  }
}

// The margin the Redis store adds to a record's native TTL (kGcMargin in redis_store.cc).
constexpr int64_t kRedisGcMarginMs = 60'000;

redisReply* RedisCommandOrDie(redisContext* c, const std::string& what, const char* format, ...) {
  va_list args;
  va_start(args, format);
  auto* r = static_cast<redisReply*>(redisvCommand(c, format, args));
  va_end(args);
  if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
    Die("redis: " + what + ": " + (r ? std::string(r->str, r->len) : std::string(c->errstr)));
  }
  return r;
}

// The value of `field` in INFO `section` ("" if absent).
std::string RedisInfoField(redisContext* c, const char* section, const std::string& field) {
  const std::string info = RedisInfo(c, section);
  const size_t at = info.find("\n" + field + ":");
  if (at == std::string::npos) return "";
  const size_t start = at + field.size() + 2;
  return info.substr(start, info.find_first_of("\r\n", start) - start);
}

// Writes n preloaded records into database `db` of the Redis server: per record the HSET of
// every field the store's scripts write (redis_codec.h: RecordFieldNames, KeysOf) and the
// PEXPIRE their keep() sets, pipelined 10 000 records per round trip. The AOF is off while
// it runs, then rewritten from the data (CONFIG SET appendonly yes) before measuring.
void PreloadRedis(const std::string& url, int db, const std::string& prefix, uint64_t n,
                  const PreloadTimes& times) {
  const auto [host, port] = HostPorts(url).front();
  redisContext* c = RedisConnect(host, port);
  freeReplyObject(RedisCommandOrDie(c, "SELECT", "SELECT %d", db));
  freeReplyObject(RedisCommandOrDie(c, "FLUSHDB", "FLUSHDB"));
  freeReplyObject(RedisCommandOrDie(c, "AOF off", "CONFIG SET appendonly no"));
  const std::vector<std::string> names = idem::redis::RecordFieldNames();
  const std::string st(idem::RecordStateName(idem::RecordState::kCompleted));
  // As the complete script writes it, with the store's default body_field_bytes.
  const idem::redis::OutcomeFields outcome = idem::redis::EncodeOutcome(
      {idem::OutcomeClass::kSuccess, kBody}, idem::redis::RedisConfig().body_field_bytes);
  constexpr uint64_t kBatch = 10'000;
  for (uint64_t i = 0; i < n;) {
    const uint64_t end = std::min(n, i + kBatch);
    for (uint64_t k = i; k < end; ++k) {
      const idem::Call call = PreloadedCall(k);
      const std::string key = idem::redis::KeysOf(prefix, call.id).record;
      const int64_t co = times.CompletedAt(k, n), cr = co - 50, ex = co + times.ttl_ms;
      const std::map<std::string, std::string> value = {
          {"st", st},
          {"fp", call.fingerprint},
          {"tool", call.tool},
          {"turn", call.turn},
          {"fence", std::to_string(cr * 1000)},  // the claim script's fence: now in us
          {"cr", std::to_string(cr)},
          {"le", std::to_string(cr + times.lease_ms)},
          {"co", std::to_string(co)},
          {"ex", std::to_string(ex)},
          {"oc", outcome.cls},
          {"ow", call.fingerprint.substr(32)},
          {"rt", std::to_string(times.ttl_ms)}};  // the retention the claim decided
      std::vector<const char*> argv = {"HSET", key.c_str()};
      std::vector<size_t> lens = {4, key.size()};
      for (const std::string& name : names) {
        const auto v = value.find(name);
        if (v == value.end() || value.size() != names.size()) {
          Die("redis preload: the store's record fields changed (" + name + "): update it");
        }
        argv.insert(argv.end(), {name.c_str(), v->second.c_str()});
        lens.insert(lens.end(), {name.size(), v->second.size()});
      }
      for (const std::string& part : outcome.pairs) {
        argv.push_back(part.c_str());
        lens.push_back(part.size());
      }
      redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
      const std::string ttl = std::to_string(ex - times.now_ms + kRedisGcMarginMs);
      redisAppendCommand(c, "PEXPIRE %b %b", key.data(), key.size(), ttl.data(), ttl.size());
    }
    for (uint64_t r = 0; r < 2 * (end - i); ++r) {
      void* reply = nullptr;
      if (redisGetReply(c, &reply) != REDIS_OK) Die("redis preload: " + std::string(c->errstr));
      if (static_cast<redisReply*>(reply)->type == REDIS_REPLY_ERROR) Die("redis preload: error");
      freeReplyObject(reply);
    }
    i = end;
  }
  freeReplyObject(RedisCommandOrDie(c, "AOF on", "CONFIG SET appendonly yes"));
  const auto give_up = SteadyClock::now() + std::chrono::minutes(30);
  while (RedisInfoField(c, "persistence", "aof_rewrite_in_progress") != "0" ||
         RedisInfoField(c, "persistence", "aof_rewrite_scheduled") != "0" ||
         RedisInfoField(c, "persistence", "aof_enabled") != "1") {
    if (SteadyClock::now() > give_up) Die("redis: the AOF rewrite after the preload never ended");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // polling, not timing
  }
  if (RedisInfoField(c, "persistence", "aof_last_bgrewrite_status") != "ok") {
    Die("redis: the AOF rewrite after the preload failed");
  }
  redisFree(c);
}

// Deletes the records a case made.
void RedisDelete(const std::string& url, int db, const std::string& prefix,
                 const std::vector<std::vector<idem::RecordId>>& made) {
  const auto [host, port] = HostPorts(url).front();
  redisContext* c = RedisConnect(host, port);
  freeReplyObject(RedisCommandOrDie(c, "SELECT", "SELECT %d", db));
  size_t pending = 0;
  for (const auto& ids : made) {
    for (const idem::RecordId& id : ids) {
      const std::string key = idem::redis::KeysOf(prefix, id).record;
      redisAppendCommand(c, "DEL %b", key.data(), key.size());
      ++pending;
    }
  }
  for (; pending > 0; --pending) {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK) Die("redis delete");
    freeReplyObject(r);
  }
  redisFree(c);
}

int64_t RedisUsedMemory(const std::string& url) {
  const auto [host, port] = HostPorts(url).front();
  redisContext* c = RedisConnect(host, port);
  const int64_t bytes = std::atoll(RedisInfoField(c, "memory", "used_memory").c_str());
  redisFree(c);
  return bytes;
}

void RedisFlush(const std::string& url, int db) {
  const auto [host, port] = HostPorts(url).front();
  redisContext* c = RedisConnect(host, port);
  freeReplyObject(RedisCommandOrDie(c, "SELECT", "SELECT %d", db));
  freeReplyObject(RedisCommandOrDie(c, "FLUSHDB", "FLUSHDB"));
  redisFree(c);
}

// Fills the store's own table (made by its migrations, in schema `schema`) with n preloaded
// records in one INSERT ... SELECT, in key order so that both indexes fill from the right,
// fences from the store's sequence; then VACUUM ANALYZE (hint bits and the visibility map, as
// autovacuum would have left an old table) and a CHECKPOINT, so that neither falls into a
// measurement.
void PreloadPostgres(const std::string& url, const std::string& schema, uint64_t n,
                     const PreloadTimes& times) {
  Psql(url, "DROP SCHEMA IF EXISTS " + schema + " CASCADE");
  OpenOrDie(url + "?schema=" + schema).reset();
  std::string body;
  for (char ch : kBody) body += ch == '\'' ? std::string("''") : std::string(1, ch);
  const std::string s = schema + ".";
  Psql(url,
       "SET work_mem = '256MB'; INSERT INTO " + s +
           "idemgate_records (tenant, key, state, fingerprint, tool, turn, fence, created_at_ms, "
           "lease_expires_at_ms, completed_at_ms, expires_at_ms, outcome_class, outcome_body, "
           "owner) SELECT 'default', 'v1t.turn.charge.' || fp, '" +
           std::string(idem::RecordStateName(idem::RecordState::kCompleted)) +
           "', fp, 'charge', 'turn', nextval('" + s + "idemgate_fences'), co - 50, co - 50 + " +
           std::to_string(times.lease_ms) + ", co, co + " + std::to_string(times.ttl_ms) + ", '" +
           std::string(idem::OutcomeClassName(idem::OutcomeClass::kSuccess)) + "', convert_to('" +
           body + "', 'UTF8'), substr(fp, 33) FROM (SELECT fp, " + std::to_string(times.now_ms) +
           " - 3600000 + (row_number() OVER (ORDER BY fp) - 1) * 3600000 / " + std::to_string(n) +
           " AS co FROM (SELECT encode(sha256(convert_to('preload ' || k, 'UTF8')), 'hex') AS fp "
           "FROM generate_series(0, " +
           std::to_string(n - 1) + ") AS k) AS f) AS s ORDER BY fp");
  Psql(url, "VACUUM ANALYZE " + s + "idemgate_records");
  Psql(url, "CHECKPOINT");
}

// Deletes what a case added: the records made after the preload (they expire after every
// preloaded one, so the expiry index finds them) and the audit log.
void PostgresTrim(const std::string& url, const std::string& schema, const PreloadTimes& times) {
  Psql(url, "DELETE FROM " + schema + ".idemgate_records WHERE expires_at_ms > " +
                std::to_string(times.LastExpiry()) + "; DELETE FROM " + schema +
                ".idemgate_attempts");
  Psql(url, "VACUUM " + schema + ".idemgate_records");
}

std::string PostgresSize(const std::string& url, const std::string& schema) {
  const std::string t = "'" + schema + ".idemgate_records'";
  std::string out =
      Psql(url, "SELECT pg_size_pretty(pg_total_relation_size(" + t +
                    ")) || ' (table ' || pg_size_pretty(pg_relation_size(" + t +
                    ")) || ', indexes ' || pg_size_pretty(pg_indexes_size(" + t + ")) || ')'");
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Replay on preloaded records drawn at random from all n.
Sample ReplayPreloaded(idem::Store& store, int callers, double seconds, uint64_t n) {
  idem::Ledger ledger(store, idem::SystemClock::Default(), LedgerOptionsFor());
  const uint64_t salt = static_cast<uint64_t>(WallMillis()) << 20;
  std::atomic<bool> executed{false};
  Sample s = TimeCallers(callers, seconds, [&](int t, uint64_t i) {
    const uint64_t k = SplitMix64(salt + (static_cast<uint64_t>(t) << 40) + i) % n;
    return Replayed(ledger, PreloadedCall(k), executed);
  });
  if (executed) Die("replay ran fn");
  return s;
}

void RunScaleCases(const Options& o) {
  struct Point {
    std::string backend;
    uint64_t records = 0;
    Case claim_complete, replay;  // with the server's counters
    std::function<void()> trim;   // after each case, not measured: deletes what it added
    double preload_seconds = 0;
    std::string memory;
  };
  std::vector<Point> points;
  std::vector<std::function<void()>> cleanups;
  const int n = o.callers;
  int64_t redis_memory = o.redis.empty() ? 0 : RedisUsedMemory(o.redis);
  for (size_t i = 0; i < o.scale.size(); ++i) {
    const uint64_t records = o.scale[i];
    const PreloadTimes times;
    if (!o.redis.empty()) {
      const int db = static_cast<int>(i) + 1;
      const std::string prefix = "sbs:";
      const std::string store_url = o.redis + "/" + std::to_string(db) + "?prefix=" + prefix;
      const std::string url = o.redis;
      const auto start = SteadyClock::now();
      PreloadRedis(url, db, prefix, records, times);
      Point p{.backend = "redis", .records = records};
      p.preload_seconds = SecondsSince(start);
      CheckPreloaded(*OpenOrDie(store_url), records, times, "redis db " + std::to_string(db));
      const int64_t used = RedisUsedMemory(url);
      char memory[160];
      std::snprintf(memory, sizeof memory, "used_memory %.2f GiB, +%.0f B per record",
                    used / 1073741824.0, static_cast<double>(used - redis_memory) / records);
      p.memory = memory;
      redis_memory = used;
      auto counters = [url] { return RedisCounters(url); };
      auto made = std::make_shared<std::vector<std::vector<idem::RecordId>>>();
      p.claim_complete = {
          "claim->complete",
          [=] { return ClaimComplete(*OpenOrDie(store_url), n, o.seconds, &*made); }, counters};
      p.trim = [=] {
        RedisDelete(url, db, prefix, *made);
        made->clear();
      };
      p.replay = {"replay",
                  [=] { return ReplayPreloaded(*OpenOrDie(store_url), n, o.seconds, records); },
                  counters};
      cleanups.push_back([=] { RedisFlush(url, db); });
      std::fprintf(stderr, "store_bench: redis db %d: %llu records in %.1f s, %s\n", db,
                   static_cast<unsigned long long>(records), p.preload_seconds, memory);
      points.push_back(std::move(p));
    }
    if (!o.postgres.empty()) {
      const std::string url = o.postgres, schema = "store_bench_scale_" + std::to_string(records);
      const std::string store_url =
          url + "?schema=" + schema + (o.postgres_options.empty() ? "" : "&" + o.postgres_options);
      const auto start = SteadyClock::now();
      PreloadPostgres(url, schema, records, times);
      Point p{.backend = "postgres", .records = records};
      p.preload_seconds = SecondsSince(start);
      CheckPreloaded(*OpenOrDie(store_url), records, times, "postgres " + schema);
      p.memory = PostgresSize(url, schema);
      auto counters = [url] { return PgCounters(url); };
      p.claim_complete = {"claim->complete",
                          [=] { return ClaimComplete(*OpenOrDie(store_url), n, o.seconds); },
                          counters};
      p.replay = {"replay",
                  [=] { return ReplayPreloaded(*OpenOrDie(store_url), n, o.seconds, records); },
                  counters};
      p.trim = [=] { PostgresTrim(url, schema, times); };
      cleanups.push_back([=] { Psql(url, "DROP SCHEMA " + schema + " CASCADE"); });
      std::fprintf(stderr, "store_bench: postgres %s: %llu records in %.1f s, %s\n", schema.c_str(),
                   static_cast<unsigned long long>(records), p.preload_seconds, p.memory.c_str());
      points.push_back(std::move(p));
    }
  }
  for (int round = 0; round < o.rounds; ++round) {
    std::fprintf(stderr, "store_bench: scale round %d/%d\n", round + 1, o.rounds);
    for (size_t k = 0; k < points.size(); ++k) {
      Point& p = points[round % 2 == 0 ? k : points.size() - 1 - k];
      for (Case* c : {&p.claim_complete, &p.replay}) {
        c->samples.push_back(MeasureCase(*c));
        p.trim();
      }
      std::fprintf(stderr, "store_bench:   %s %llu: claim->complete %.0f, replay %.0f calls/s\n",
                   p.backend.c_str(), static_cast<unsigned long long>(p.records),
                   p.claim_complete.samples.back().calls_per_second,
                   p.replay.samples.back().calls_per_second);
    }
  }
  for (auto& cleanup : cleanups) cleanup();
  std::printf(
      "\nscale: calls/s with %d callers on stores preloaded with N completed records "
      "(replay: random preloaded records), median of %d rounds\n",
      n, o.rounds);
  std::printf("%-10s %10s %16s %10s %10s  %s\n", "backend", "N", "claim->complete", "replay",
              "preload s", "memory / size");
  for (const Point& p : points) {
    std::printf("%-10s %10llu %16.0f %10.0f %10.1f  %s\n", p.backend.c_str(),
                static_cast<unsigned long long>(p.records), MedianRate(p.claim_complete.samples),
                MedianRate(p.replay.samples), p.preload_seconds, p.memory.c_str());
  }
  std::printf("server, per call (median):\n");
  for (const Point& p : points) {
    for (const Case* c : {&p.claim_complete, &p.replay}) {
      std::printf("%-10s %10llu %-16s %s\n", p.backend.c_str(),
                  static_cast<unsigned long long>(p.records), c->name.c_str(),
                  ServerPerCall(c->samples, p.backend == "postgres").c_str());
    }
  }
  for (const char* backend : {"redis", "postgres"}) {
    const Point* small = nullptr;
    const Point* large = nullptr;
    for (const Point& p : points) {
      if (p.backend != backend) continue;
      if (!small || p.records < small->records) small = &p;
      if (!large || p.records > large->records) large = &p;
    }
    if (!small || !large || small == large) continue;
    const std::string sizes =
        " at " + std::to_string(large->records) + " / at " + std::to_string(small->records);
    PrintRatio(std::string(backend) + " claim->complete" + sizes, large->claim_complete.samples,
               small->claim_complete.samples, ">= 0.8");
    PrintRatio(std::string(backend) + " replay" + sizes, large->replay.samples,
               small->replay.samples, ">= 0.8");
  }
}

[[noreturn]] void Usage() {
  std::fprintf(
      stderr,
      "usage: store_bench [--redis URL] [--redis-tls URL] [--cluster URL] [--postgres URL]\n"
      "                   [--callers N]\n"
      "                   [--postgres-options pool_size=N]\n"
      "                   [--seconds N] [--rounds N] [--scale N,N,...] "
      "[--only main|scale]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage();
    const std::string v = argv[++i];
    if (flag == "--redis") {
      o.redis = v;
    } else if (flag == "--redis-tls") {
      o.redis_tls = v;
    } else if (flag == "--cluster") {
      o.cluster = v;
    } else if (flag == "--postgres") {
      o.postgres = v;
    } else if (flag == "--postgres-options") {
      o.postgres_options = v;
    } else if (flag == "--callers") {
      o.callers = std::max(1, std::atoi(v.c_str()));
    } else if (flag == "--seconds") {
      o.seconds = std::max(0.5, std::atof(v.c_str()));
    } else if (flag == "--rounds") {
      o.rounds = std::max(1, std::atoi(v.c_str()));
    } else if (flag == "--scale") {
      size_t pos = 0;
      while (pos < v.size()) {
        size_t comma = v.find(',', pos);
        if (comma == std::string::npos) comma = v.size();
        o.scale.push_back(static_cast<uint64_t>(std::strtod(v.c_str() + pos, nullptr)));
        pos = comma + 1;
      }
      std::sort(o.scale.begin(), o.scale.end());
    } else if (flag == "--only" && (v == "main" || v == "scale")) {
      o.main_cases = v == "main";
      o.scale_cases = v == "scale";
    } else {
      Usage();
    }
  }
  if (o.main_cases) RunMainCases(o);
  if (o.scale_cases && !o.scale.empty()) RunScaleCases(o);
  return 0;
}
