// The Redis store against real servers (tests/servers/redis.sh, started by
// the CTest fixtures redis, redis_cluster, redis_tls and redis_tls_cluster):
// the contract suite on one server and on a three-master cluster, plain and
// TLS, plus what only Redis has: wake-ups across instances by pub/sub, a
// server killed and restarted, a slot migrated while claims run, and TLS
// certificates that must not be accepted.
//
// IDEM_REDIS_URL_FILE / IDEM_REDIS_CLUSTER_URL_FILE / IDEM_REDIS_TLS_URL_FILE
// / IDEM_REDIS_TLS_CLUSTER_URL_FILE name the files holding the URLs. A
// missing file fails the tests: a server that could not start is a failure,
// never a skip.
#include "redis_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "cluster_slots.h"
#include "idem/attempt_chain.h"
#include "idem/caching_store.h"
#include "idem/forwarding_store.h"
#include "idem/ledger.h"
#include "idem/store.h"
#include "net/io_threads.h"
#include "redis_client.h"
#include "redis_codec.h"
#include "redis_connection.h"
#include "redis_url.h"
#include "store_contract.h"
#include "store_wrapper.h"

using namespace idem;
using namespace std::chrono_literals;

namespace {

using SteadyClock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The URL the fixture wrote, or "" after recording a failure.
std::string ServerUrl(const char* env) {
  const char* path = std::getenv(env);
  if (path == nullptr) {
    ADD_FAILURE() << env
                  << " is not set: run these tests through ctest (the fixtures redis, "
                     "redis_cluster, redis_tls and redis_tls_cluster start the servers)";
    return "";
  }
  std::string url = ReadFile(path);
  if (url.empty()) {
    ADD_FAILURE() << "no URL in " << path << ": the Redis server did not start (see the "
                  << "output of the redis_*start test)";
  }
  return url;
}

std::string UniquePrefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return what + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ":";
}

std::string WithOptions(const std::string& url, const std::string& options) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + options;
}

// `url` without its query option `name`.
std::string WithoutOption(const std::string& url, const std::string& name) {
  const size_t query = url.find('?');
  if (query == std::string::npos) return url;
  std::string kept = url.substr(0, query);
  std::istringstream options(url.substr(query + 1));
  for (std::string option; std::getline(options, option, '&');) {
    if (option.starts_with(name + "=")) continue;
    kept += (kept.find('?') == std::string::npos ? "?" : "&") + option;
  }
  return kept;
}

// `url` with its query option `name` set to `value` (%-encoded already).
std::string WithOption(const std::string& url, const std::string& name, const std::string& value) {
  return WithOptions(WithoutOption(url, name), name + "=" + value);
}

std::unique_ptr<Store> OpenOrFail(const std::string& url, Clock& clock,
                                  const StoreOptions& options = {}) {
  auto store = OpenStore(url, clock, options);
  if (!store) {
    ADD_FAILURE() << "OpenStore(" << url << "): " << store.error().ToString();
    return nullptr;
  }
  return std::move(*store);
}

StoreContractParam Contract(std::string name, const char* env) {
  return StoreContractParam{name, [name, env](Clock& clock) -> std::unique_ptr<Store> {
                              std::string url = ServerUrl(env);
                              if (url.empty()) return nullptr;
                              return OpenOrFail(WithOptions(url, "prefix=" + UniquePrefix(name)),
                                                clock);
                            }};
}

std::unique_ptr<redis::Connection> Connect(const redis::NodeAddress& node) {
  auto c = redis::Connection::Open(node, {});
  if (!c) {
    ADD_FAILURE() << c.error().ToString();
    return nullptr;
  }
  return std::move(*c);
}

redis::Reply RunCmd(redis::Connection& c, redis::Command cmd) {
  auto r = c.Run(cmd);
  EXPECT_TRUE(r) << r.error().ToString();
  if (!r) return nullptr;
  EXPECT_FALSE(redis::IsError(**r)) << cmd[0] << ": " << redis::Text(**r);
  return std::move(*r);
}

// Subscribers of `channel` summed over the masters.
long long NumSub(redis::RedisClient& client, const std::string& channel) {
  long long n = 0;
  for (const auto& node : client.Masters()) {
    auto r = client.RunOn(node, {"PUBSUB", "NUMSUB", channel});
    if (!r) {
      ADD_FAILURE() << r.error().ToString();
      return -1;
    }
    if ((*r)->type == REDIS_REPLY_ARRAY && (*r)->elements == 2) n += (*r)->element[1]->integer;
  }
  return n;
}

ClaimRequest Req(const std::string& key) {
  ClaimRequest r;
  r.id = RecordId{"default", key};
  r.fingerprint = "fp";
  r.tool = "charge";
  r.turn = "turn";
  r.lease = 30s;
  r.retention = 1h;
  return r;
}

Outcome Ok(std::string body) { return Outcome{OutcomeClass::kSuccess, std::move(body)}; }

// The ledger's call for the key Req(key) claims.
Call CallOf(const std::string& key) {
  Call c;
  c.id = RecordId{"default", key};
  c.fingerprint = "fp";
  c.tool = "charge";
  c.turn = "turn";
  return c;
}

// Two store objects on one Redis (two idemgate instances) at the URL in the
// file `env` names: one waits, the other completes. With a poll interval of
// 10 s, a wake-up well under it can only be the pub/sub message.
void CrossInstanceWakeUp(const char* env, const std::string& label) {
  const std::string server_url = ServerUrl(env);
  ASSERT_FALSE(server_url.empty());
  const std::string url = WithOptions(server_url, "prefix=" + UniquePrefix("wake"));
  StoreOptions options;
  options.poll_interval = 10s;
  auto waiter_store = OpenOrFail(url, SystemClock::Default(), options);
  auto writer_store = OpenOrFail(url, SystemClock::Default(), options);
  ASSERT_TRUE(waiter_store && writer_store);
  auto config = redis::ParseRedisUrl(url);
  ASSERT_TRUE(config);
  auto client = redis::RedisClient::Open(*config);  // to count the subscribers
  ASSERT_TRUE(client) << client.error().ToString();
  const std::string channel = redis::KeysOf(config->prefix, RecordId{"default", "wake"}).channel;

  std::vector<std::chrono::microseconds> latencies;
  for (int round = 0; round < 5; ++round) {
    auto c = writer_store->Claim(Req("wake"));
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_TRUE(c->claimed);
    std::atomic<bool> done{false};
    SteadyClock::time_point woke;
    std::thread waiter([&] {
      auto w =
          waiter_store->WaitForChange(c->record.id, c->record, SystemClock::Default().Now() + 20s);
      woke = SteadyClock::now();
      EXPECT_TRUE(w) << w.error().ToString();
      done = true;
    });
    // Wait (bounded) until the waiter's subscription is live on the server
    // (in a cluster: on whichever node its subscriber connection chose).
    const auto give_up = SteadyClock::now() + 5s;
    while (NumSub(**client, channel) == 0 && SteadyClock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_FALSE(done.load()) << "WaitForChange returned before the record changed";
    const auto sent = SteadyClock::now();
    ASSERT_TRUE(writer_store->Complete(c->record.id, c->record.fence, Ok("x"), 1h));
    waiter.join();
    latencies.push_back(std::chrono::duration_cast<std::chrono::microseconds>(woke - sent));
    ASSERT_TRUE(writer_store->Evict(c->record.id));
  }
  std::chrono::microseconds worst{0};
  for (auto l : latencies) worst = std::max(worst, l);
  std::string all;
  for (auto l : latencies) all += std::to_string(l.count()) + "us ";
  std::cout << "[ " << label << " ] cross-instance wake-up latency: " << all << "(worst "
            << worst.count() << " us; poll interval 10 s)\n";
  EXPECT_LT(worst, 2s) << "woken by polling, not by pub/sub";
}

// A redis-server of our own, in a temporary directory, for tests that kill it.
class OwnServer {
 public:
  // `args` go to redis-server (e.g. "--replicaof 127.0.0.1 6379").
  explicit OwnServer(const std::string& name, std::string args = "") : args_(std::move(args)) {
    dir_ = std::filesystem::temp_directory_path() /
           ("idem-redis-" + name + "-" + std::to_string(getpid()));
    Start("auto");
  }
  ~OwnServer() {
    if (paused_) Resume();  // a stopped process would not hear the SIGTERM
    Script("stop " + dir_.string());
  }

  void Start(const std::string& port) {
    ASSERT_EQ(Script("start " + dir_.string() + " " + port + " " + args_), 0)
        << "redis.sh start failed";
    url_ = ReadFile((dir_ / "url").string());
    ASSERT_FALSE(url_.empty());
  }
  void Kill9() {
    const pid_t pid = std::stoi(ReadFile((dir_ / "redis.pid").string()));
    ASSERT_GT(pid, 1);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    // Gone, or a zombie nobody has reaped yet: either way it serves nothing.
    for (int i = 0; i < 500; ++i) {
      std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
      if (stat.empty() || stat.find(") Z") != std::string::npos) return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL() << "redis-server " << pid << " survived SIGKILL";
  }
  // Freezes the process (SIGSTOP) and lets it run again (SIGCONT): a replica
  // that is stopped keeps its connection but acknowledges nothing, so its
  // primary's WAIT counts it out.
  void Pause() {
    Signal(SIGSTOP);
    paused_ = true;
  }
  void Resume() {
    Signal(SIGCONT);
    paused_ = false;
  }
  const std::string& url() const { return url_; }
  std::string port() const { return url_.substr(url_.rfind(':') + 1); }

 private:
  void Signal(int sig) {
    const pid_t pid = std::stoi(ReadFile((dir_ / "redis.pid").string()));
    ASSERT_GT(pid, 1);
    ASSERT_EQ(kill(pid, sig), 0);
  }
  static int Script(const std::string& args) {
    return std::system(("bash " IDEM_REDIS_SH " " + args).c_str());
  }
  std::string args_;
  std::filesystem::path dir_;
  std::string url_;
  bool paused_ = false;
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(RedisSingle, StoreContractTest,
                         ::testing::Values(Contract("redis", "IDEM_REDIS_URL_FILE")),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(RedisCluster, StoreContractTest,
                         ::testing::Values(Contract("cluster", "IDEM_REDIS_CLUSTER_URL_FILE")),
                         [](const auto& info) { return info.param.name; });

// The contract again through the replay cache (CachingStore), which every
// front puts above a Redis store: answering from memory changes no answer.
StoreContractParam CachedContract(std::string name, const char* env) {
  StoreContractParam p = Contract(name, env);
  return StoreContractParam{name + "_cached",
                            [open = p.open](Clock& clock) -> std::unique_ptr<Store> {
                              auto store = open(clock);
                              if (!store) return nullptr;
                              return idem::testing::WithReplayCache(std::move(store), clock);
                            },
                            /*reads_some_async=*/true};
}
INSTANTIATE_TEST_SUITE_P(RedisSingleCached, StoreContractTest,
                         ::testing::Values(CachedContract("redis", "IDEM_REDIS_URL_FILE")),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(RedisClusterCached, StoreContractTest,
                         ::testing::Values(CachedContract("cluster",
                                                          "IDEM_REDIS_CLUSTER_URL_FILE")),
                         [](const auto& info) { return info.param.name; });

// The contract with the pipeline on the caller's io_context
// (StoreOptions::io), as `idemgate http` runs it: two threads, which stop
// after the store has closed.
StoreContractParam IoContract(std::string name, const char* env) {
  return StoreContractParam{
      name + "_io", [name, env](Clock& clock) -> std::unique_ptr<Store> {
        std::string url = ServerUrl(env);
        if (url.empty()) return nullptr;
        class OnIo final : public ForwardingStore {
         public:
          OnIo(std::unique_ptr<net::IoThreads> io, std::unique_ptr<Store> inner)
              : ForwardingStore(*inner), io_(std::move(io)), inner_(std::move(inner)) {}

         private:
          std::unique_ptr<net::IoThreads> io_;
          std::unique_ptr<Store> inner_;  // closed first
        };
        auto io = std::make_unique<net::IoThreads>(2);
        StoreOptions options;
        options.io = &io->context();
        auto store = OpenOrFail(WithOptions(url, "prefix=" + UniquePrefix(name)), clock, options);
        if (!store) return nullptr;
        return std::make_unique<OnIo>(std::move(io), std::move(store));
      }};
}
INSTANTIATE_TEST_SUITE_P(RedisSingleIo, StoreContractTest,
                         ::testing::Values(IoContract("redis", "IDEM_REDIS_URL_FILE")),
                         [](const auto& info) { return info.param.name; });

// Over TLS: the contract on one server, directly, through the replay cache
// and on a shared io_context (a reply's TLS records are read as they come),
// and on a cluster.
INSTANTIATE_TEST_SUITE_P(RedisTlsSingle, StoreContractTest,
                         ::testing::Values(Contract("redis_tls", "IDEM_REDIS_TLS_URL_FILE"),
                                           CachedContract("redis_tls", "IDEM_REDIS_TLS_URL_FILE"),
                                           IoContract("redis_tls", "IDEM_REDIS_TLS_URL_FILE")),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(RedisTlsCluster, StoreContractTest,
                         ::testing::Values(Contract("cluster_tls",
                                                    "IDEM_REDIS_TLS_CLUSTER_URL_FILE")),
                         [](const auto& info) { return info.param.name; });

// Polls `done` every millisecond for up to 10 s (what it waits for is a
// pub/sub message or a reconnect, not a time). Returns how long it took.
template <typename Fn>
std::optional<std::chrono::microseconds> AwaitCondition(Fn done) {
  const auto start = SteadyClock::now();
  while (!done()) {
    if (SteadyClock::now() - start > 10s) return std::nullopt;
    std::this_thread::sleep_for(1ms);
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - start);
}

// Two instances on one Redis, each with its replay cache: an eviction
// through one empties the other's cache by pub/sub, and the next attempt
// there executes instead of replaying the evicted outcome.
void EvictionReachesEveryCache(const std::string& server_url, const std::string& label) {
  const std::string url = WithOptions(server_url, "prefix=" + UniquePrefix("cache"));
  auto store_a = OpenOrFail(url, SystemClock::Default());
  auto store_b = OpenOrFail(url, SystemClock::Default());
  ASSERT_TRUE(store_a && store_b);
  CachingStore a(*store_a, SystemClock::Default(), 1 << 20);
  CachingStore b(*store_b, SystemClock::Default(), 1 << 20);
  ASSERT_TRUE(a.active() && b.active());
  // Down (drop 1) until the subscription is confirmed (drop 2).
  ASSERT_TRUE(AwaitCondition([&] { return b.stats().drops >= 2; })) << "feed never came up";

  auto c = a.Claim(Req("evicted"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(a.Complete(c->record.id, c->record.fence, Ok("first"), 1h));
  ASSERT_TRUE(b.Get(c->record.id));  // a miss: read from Redis, kept
  auto replay = b.Claim(Req("evicted"));
  ASSERT_TRUE(replay);
  EXPECT_FALSE(replay->claimed);
  EXPECT_EQ(b.stats().hits, 1u) << "the retry at B was answered from memory";

  const uint64_t drops = b.stats().drops;
  auto evicted = a.Evict(c->record.id);
  ASSERT_TRUE(evicted && *evicted);
  auto took = AwaitCondition([&] { return b.stats().drops > drops; });
  ASSERT_TRUE(took) << "B never heard of the eviction";
  std::cout << "[ " << label << " ] eviction reached the other instance's cache in "
            << took->count() << " us\n";
  EXPECT_EQ(b.stats().records, 0u);
  auto again = b.Claim(Req("evicted"));
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_TRUE(again->claimed) << "B replayed an evicted outcome";
}

TEST(RedisSingleTest, AnEvictionReachesEveryInstancesReplayCache) {
  const std::string url = ServerUrl("IDEM_REDIS_URL_FILE");
  ASSERT_FALSE(url.empty());
  EvictionReachesEveryCache(url, "single");
}

TEST(RedisClusterTest, AnEvictionReachesEveryInstancesReplayCache) {
  const std::string url = ServerUrl("IDEM_REDIS_CLUSTER_URL_FILE");
  ASSERT_FALSE(url.empty());
  EvictionReachesEveryCache(url, "cluster");
}

// Two instances on one Redis whose hosts' clocks are 25 s apart agree on a
// lease by the server's clock (TIME, through StoreClock).
void SkewedInstancesAgree(const char* env) {
  const std::string server = ServerUrl(env);
  ASSERT_FALSE(server.empty());
  const std::string url = WithOptions(server, "prefix=" + UniquePrefix("skew"));
  ExpectSkewedInstancesAgreeOnLeases([&](Clock& clock) { return OpenOrFail(url, clock); });
}

TEST(RedisSingleTest, InstancesWithSkewedClocksJudgeLeasesByTheServersClock) {
  SkewedInstancesAgree("IDEM_REDIS_URL_FILE");
}

TEST(RedisClusterTest, InstancesWithSkewedClocksJudgeLeasesByTheServersClock) {
  SkewedInstancesAgree("IDEM_REDIS_CLUSTER_URL_FILE");
}

// While the subscriber connection is down an eviction could go unheard, so
// the cache empties, and fills again once it is subscribed again. (That it
// keeps nothing in between is CachingStoreTest's.)
TEST(RedisSingleTest, TheReplayCacheEmptiesWhenItsFeedDropsAndFillsOnceItIsBack) {
  OwnServer server("feed");  // its subscriber connections are ours alone to cut
  auto config = redis::ParseRedisUrl(server.url());
  ASSERT_TRUE(config);
  auto store = OpenOrFail(WithOptions(server.url(), "prefix=feed:"), SystemClock::Default());
  ASSERT_TRUE(store);
  CachingStore cache(*store, SystemClock::Default(), 1 << 20);
  ASSERT_TRUE(AwaitCondition([&] { return cache.stats().drops >= 2; })) << "feed never came up";
  auto c = cache.Claim(Req("kept"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(cache.Complete(c->record.id, c->record.fence, Ok("x"), 1h));
  ASSERT_EQ(cache.stats().records, 1u);

  auto admin = Connect(config->nodes.front());
  ASSERT_TRUE(admin);
  const uint64_t drops = cache.stats().drops;
  RunCmd(*admin, {"CLIENT", "KILL", "TYPE", "pubsub"});
  // Down (one drop), then subscribed again after the reconnect (another).
  ASSERT_TRUE(AwaitCondition([&] { return cache.stats().drops >= drops + 2; }))
      << "the feed did not go down and come back";
  EXPECT_EQ(cache.stats().records, 0u);
  ASSERT_TRUE(cache.Get(c->record.id));  // read from Redis, kept again
  EXPECT_EQ(cache.stats().records, 1u);
  const uint64_t hits = cache.stats().hits;
  ASSERT_TRUE(cache.Get(c->record.id));
  EXPECT_EQ(cache.stats().hits, hits + 1);
}

TEST(RedisSingleTest, CrossInstanceWakeUpIsByPubSub) {
  CrossInstanceWakeUp("IDEM_REDIS_URL_FILE", "single");
}

TEST(RedisClusterTest, CrossInstanceWakeUpIsByPubSub) {
  CrossInstanceWakeUp("IDEM_REDIS_CLUSTER_URL_FILE", "cluster");
}

TEST(RedisTlsClusterTest, CrossInstanceWakeUpIsByPubSub) {
  CrossInstanceWakeUp("IDEM_REDIS_TLS_CLUSTER_URL_FILE", "tls cluster");
}

// ---------------------------------------------------------------------------
// The audit log's hash chain.

// Two instances (each with its own cache of heads) appending batches and
// claims with their entries at once: every script checks the head it was
// chained from, so the losers recompute, and one chain per tenant results.
void InstancesAppendOneChain(const char* env) {
  const std::string server = ServerUrl(env);
  ASSERT_FALSE(server.empty());
  const std::string url = WithOptions(server, "prefix=" + UniquePrefix("chain"));
  FakeClock clock;
  auto a = OpenOrFail(url, clock);
  auto b = OpenOrFail(url, clock);
  ASSERT_TRUE(a && b);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (Store* store : {a.get(), b.get(), a.get(), b.get()}) {
    threads.emplace_back([&, store] {
      static std::atomic<int> next{0};
      for (int r = 0; r < 15; ++r) {
        const std::string key = "k" + std::to_string(next++);
        if (auto ok = store->AppendAttempts({AuditEntry("t", key, r), AuditEntry("u", key, r)});
            !ok) {
          ADD_FAILURE() << ok.error().ToString();
          ++errors;
        }
        ClaimRequest req = Req(key);
        req.id.tenant = "u";
        req.logged = AuditEntry("u", key, r, "claimed", AttemptOutcome::kClaimed);
        auto c = store->Claim(req);
        if (!c || !c->claimed) {
          ADD_FAILURE() << (c ? "not claimed" : c.error().ToString());
          ++errors;
        }
        if (store->LogsWithRecords()) continue;
        if (auto ok = store->AppendAttempts({*req.logged}); !ok) {
          ADD_FAILURE() << ok.error().ToString();
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors.load(), 0);
  auto report = VerifyChains(*b, std::nullopt, 13);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 4u * 15 * 3);
  EXPECT_EQ(report->tenants, 2u);
}

TEST(RedisSingleTest, InstancesAppendingAtOnceKeepOneChain) {
  InstancesAppendOneChain("IDEM_REDIS_URL_FILE");
}

TEST(RedisClusterTest, InstancesAppendingAtOnceKeepOneChain) {
  InstancesAppendOneChain("IDEM_REDIS_CLUSTER_URL_FILE");
}

// A connection to the server of `url`, for commands behind the store's back;
// nullptr after recording a failure.
std::unique_ptr<redis::Connection> AdminOf(const std::string& url) {
  auto config = redis::ParseRedisUrl(url);
  if (!config) {
    ADD_FAILURE() << config.error().ToString();
    return nullptr;
  }
  return Connect(config->nodes.front());
}

// The single server's URL (into *server) and AdminOf it.
std::unique_ptr<redis::Connection> AdminOfSingle(std::string* server) {
  *server = ServerUrl("IDEM_REDIS_URL_FILE");
  if (server->empty()) return nullptr;
  return AdminOf(*server);
}

// Calls of `command` (lower case) the server has run, from INFO commandstats.
long long CommandCalls(redis::Connection& admin, const std::string& command) {
  redis::Reply info = RunCmd(admin, {"INFO", "commandstats"});
  if (!info) return -1;
  const std::string text(redis::Text(*info));
  const std::string tag = "cmdstat_" + command + ":calls=";
  const size_t at = text.find(tag);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + tag.size()));
}
long long EvalshaCalls(redis::Connection& admin) { return CommandCalls(admin, "evalsha"); }

// Issue 18: one instance's claims and completions, each with its audit
// entry, from many threads at once reach the server in the order they were
// chained, so no script is refused as stale and sent again. (Sent on pooled
// connections they raced: 29 scripts per claim and completion at 16
// threads, each refusal making the entries in flight behind it stale too.)
TEST(RedisSingleTest, ChainedClaimsAndCompletionsFromManyThreadsAreSentOnce) {
  // A server of its own: INFO commandstats counts every client's commands, and
  // the fixture's server serves other tests at the same time (ctest -j).
  OwnServer own("order");
  const std::string server = own.url();
  auto config = redis::ParseRedisUrl(server);
  ASSERT_TRUE(config) << config.error().ToString();
  auto admin = Connect(config->nodes.front());
  ASSERT_TRUE(admin);
  FakeClock clock;
  auto store = OpenOrFail(WithOptions(server, "prefix=" + UniquePrefix("order")), clock);
  ASSERT_TRUE(store && store->LogsWithRecords());
  auto run = [&](const std::string& key) {
    ClaimRequest req = Req(key);
    req.logged = AuditEntry("default", key, 1, "claimed", AttemptOutcome::kClaimed);
    auto claim = store->Claim(req);
    ASSERT_TRUE(claim && claim->claimed) << (claim ? "not claimed" : claim.error().ToString());
    const Attempt done = AuditEntry("default", key, 2, "executed", AttemptOutcome::kExecuted);
    auto completed = store->Complete(req.id, claim->record.fence, Ok("b"), 1h, &done);
    ASSERT_TRUE(completed) << completed.error().ToString();
  };
  run("warm-up");  // loads the scripts (NOSCRIPT, then EVAL)
  const long long before = EvalshaCalls(*admin);
  constexpr int kThreads = 8, kCalls = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) run("k" + std::to_string(t) + "-" + std::to_string(i));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(EvalshaCalls(*admin) - before, 2 * kThreads * kCalls);
  auto report = VerifyChains(*store, std::string("default"));
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 2u * (kThreads * kCalls + 1));
}

// Issue 18: on one server, a fresh call through the ledger's non-blocking
// path (Ledger::BeginWithoutBlocking, CompleteAsync, as `idemgate http` runs
// it) is the claim script and the completion script, with no read before
// the claim (Store::ReadsBeforeClaim); its retry is the one claim that finds
// the completed record and replays it. Neither needs a worker.
TEST(RedisSingleTest, AFreshCallIsTwoScriptsAndNoReadFirst) {
  OwnServer own("fresh");  // INFO commandstats counts this test's commands only
  auto admin = AdminOf(own.url());
  ASSERT_TRUE(admin);
  FakeClock clock;
  auto store = OpenOrFail(WithOptions(own.url(), "prefix=" + UniquePrefix("fresh")), clock);
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->ReadsBeforeClaim()) << "the pipelined claim answers as a read would";
  Ledger ledger(*store, clock, LedgerOptions{"test", nullptr, true});
  auto begin = [&](const Call& call) {
    std::promise<Result<Decision>> answer;
    ledger.BeginWithoutBlocking(
        call, [](std::function<void()>) { ADD_FAILURE() << "offloaded to a worker"; },
        [&](Result<Decision> d) { answer.set_value(std::move(d)); });
    return answer.get_future().get();
  };
  auto complete = [&](const Call& call, const Decision& d) {
    std::promise<Result<Record>> stored;
    EXPECT_TRUE(ledger.CompleteAsync(call, d, Outcome{OutcomeClass::kSuccess, "charged"},
                                     [&](Result<Record> r) { stored.set_value(std::move(r)); }));
    return stored.get_future().get();
  };
  auto call_for = [](const std::string& key) {
    Call c;
    c.id = RecordId{"default", key};
    c.fingerprint = "fp";
    c.tool = "charge";
    c.turn = "turn-1";
    return c;
  };

  // The warm-up loads every script (NOSCRIPT, then EVAL), the audit log's
  // append among them: a replay's entry is not written with a record.
  const Call warm = call_for("warm-up");
  auto warmed = begin(warm);
  ASSERT_TRUE(warmed) << warmed.error().ToString();
  ASSERT_TRUE(complete(warm, *warmed));
  ASSERT_TRUE(begin(warm));
  ledger.Flush();
  const long long scripts = EvalshaCalls(*admin), reads = CommandCalls(*admin, "hgetall");

  const Call call = call_for("fresh");
  auto fresh = begin(call);
  ASSERT_TRUE(fresh) << fresh.error().ToString();
  EXPECT_EQ(fresh->kind, Decision::Kind::kExecute);
  auto stored = complete(call, *fresh);
  ASSERT_TRUE(stored) << stored.error().ToString();
  EXPECT_EQ(EvalshaCalls(*admin) - scripts, 2) << "the claim and the completion";
  EXPECT_EQ(CommandCalls(*admin, "hgetall") - reads, 0) << "nothing was read first";

  const long long writes = CommandCalls(*admin, "hset"), waits = CommandCalls(*admin, "wait");
  auto retry = begin(call);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->kind, Decision::Kind::kReplay);
  ASSERT_TRUE(retry->record.outcome);
  EXPECT_EQ(retry->record.outcome->body, "charged");
  ledger.Flush();
  EXPECT_EQ(EvalshaCalls(*admin) - scripts, 4)
      << "and the claim that found the record, and the append of the replay's audit entry";
  // Without wait_replicas a completion found is not confirmed (guarantees
  // F4): the claim writes nothing and nothing WAITs.
  EXPECT_EQ(CommandCalls(*admin, "hset") - writes, 1) << "only the audit chain's head";
  EXPECT_EQ(CommandCalls(*admin, "wait") - waits, 0);
  // (Commands a script runs count as the server's too.)
  EXPECT_EQ(CommandCalls(*admin, "hgetall") - reads, 1)
      << "only the claim script's own read of the record it found";
}

// A claim's entry chained from a head another instance has moved since is
// refused (one script) and chained again from the head the refusal names (a
// second); while a third writer holds a live reservation of that head, the
// claim writes nothing, until the reservation lapses.
TEST(RedisSingleTest, AClaimFromAMovedHeadIsChainedAgainAndAReservationHoldsItBack) {
  OwnServer own("moved-head");  // INFO commandstats counts this test's commands only
  auto admin = AdminOf(own.url());
  ASSERT_TRUE(admin);
  const std::string prefix = UniquePrefix("moved");
  const std::string url = WithOptions(own.url(), "prefix=" + prefix);
  FakeClock clock;
  auto a = OpenOrFail(url, clock);
  auto b = OpenOrFail(url, clock);
  ASSERT_TRUE(a && b);
  auto logged_claim = [](const std::string& key) {
    ClaimRequest req = Req(key);
    req.id.tenant = "u";
    req.logged = AuditEntry("u", key, 1, "claimed", AttemptOutcome::kClaimed);
    return req;
  };

  auto first = a->Claim(logged_claim("k1"));  // a now caches u's head: seq 1
  ASSERT_TRUE(first && first->claimed) << (first ? "not claimed" : first.error().ToString());
  ASSERT_TRUE(b->AppendAttempts({AuditEntry("u", "k2", 2)}));  // seq 2, behind a's back
  const long long before = EvalshaCalls(*admin);
  auto second = a->Claim(logged_claim("k3"));
  ASSERT_TRUE(second && second->claimed) << (second ? "not claimed" : second.error().ToString());
  EXPECT_EQ(EvalshaCalls(*admin) - before, 2) << "refused as stale once, then written";

  // Another writer's reservation of u's head, live by the callers' clock.
  const std::string heads = redis::AttemptHeadsKey(prefix);
  redis::Reply head = RunCmd(*admin, {"HGET", heads, "u"});
  ASSERT_TRUE(head && head->type == REDIS_REPLY_STRING);
  const std::string free_head(redis::Text(*head));
  const std::string until = std::to_string(ToUnixMillis(clock.Now() + 1min));
  ASSERT_TRUE(RunCmd(*admin, {"HSET", heads, "u", free_head + " someoneelse " + until}));
  auto held = a->Claim(logged_claim("k4"));
  ASSERT_FALSE(held) << "claimed past another writer's reservation";
  EXPECT_EQ(held.error().code, ErrorCode::kUnavailable) << held.error().ToString();
  auto absent = a->Get(RecordId{"u", "k4"});
  ASSERT_TRUE(absent) << absent.error().ToString();
  EXPECT_FALSE(*absent) << "a refused claim wrote its record";

  clock.Advance(2min);  // the reservation lapses
  auto after = a->Claim(logged_claim("k4"));
  ASSERT_TRUE(after && after->claimed) << (after ? "not claimed" : after.error().ToString());
  auto report = VerifyChains(*a, std::string("u"));
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 4u);
}

// attempts_maxlen trims the stream, which is a purge: each trimmed tenant's
// head records where its chain restarts, and what is left verifies.
void TrimmingKeepsTheChainVerifiable(const char* env) {
  const std::string server = ServerUrl(env);
  ASSERT_FALSE(server.empty());
  const std::string url = WithOptions(server, "attempts_maxlen=5&prefix=" + UniquePrefix("trim"));
  FakeClock clock;
  auto store = OpenOrFail(url, clock);
  ASSERT_TRUE(store);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(store->AppendAttempts({AuditEntry(i % 3 ? "t" : "u", "k", i)}));
  }
  std::vector<Attempt> kept;
  for (std::string cursor;;) {
    auto page = store->ReadChain(std::nullopt, cursor, 100);
    ASSERT_TRUE(page) << page.error().ToString();
    kept.insert(kept.end(), page->entries.begin(), page->entries.end());
    if ((cursor = page->next).empty()) break;
  }
  ASSERT_EQ(kept.size(), 5u);
  auto heads = store->ChainHeads(std::nullopt);
  ASSERT_TRUE(heads && heads->size() == 2);
  for (const ChainHead& h : *heads) {
    EXPECT_GT(h.start_seq, 1u) << h.tenant;
    EXPECT_EQ(h.seq, h.tenant == "t" ? 8u : 4u);
  }
  auto report = VerifyChains(*store, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 5u);
  EXPECT_EQ(report->restarted, 2u);
}

TEST(RedisSingleTest, TrimmingTheStreamToMaxlenKeepsTheChainVerifiable) {
  TrimmingKeepsTheChainVerifiable("IDEM_REDIS_URL_FILE");
}

TEST(RedisClusterTest, TrimmingTheStreamToMaxlenKeepsTheChainVerifiable) {
  TrimmingKeepsTheChainVerifiable("IDEM_REDIS_CLUSTER_URL_FILE");
}

// Changing the stream behind idemgate's back, with Redis commands: an entry
// deleted, the stream rewritten with one entry edited, a forged entry
// appended, an entry from before the chain.
TEST(RedisSingleTest, VerifyNamesStreamEntriesChangedBehindItsBack) {
  std::string server;
  auto admin = AdminOfSingle(&server);
  ASSERT_TRUE(admin);
  FakeClock clock;
  // A fresh log of five entries of tenant t; the fault verify finds after `tamper`.
  auto fault_after = [&](const std::function<void(const std::string& stream)>& tamper) {
    const std::string prefix = UniquePrefix("tamper");
    auto store = OpenOrFail(WithOptions(server, "prefix=" + prefix), clock);
    EXPECT_TRUE(store);
    std::vector<Attempt> batch;
    for (int i = 1; i <= 5; ++i) batch.push_back(AuditEntry("t", "k" + std::to_string(i), i));
    EXPECT_TRUE(store->AppendAttempts(batch));
    tamper(redis::AttemptStreamKey(prefix));
    auto report = VerifyChains(*store, std::nullopt, 2);
    EXPECT_TRUE(report) << report.error().ToString();
    return report ? report->fault : std::nullopt;
  };
  auto entries = [&](const std::string& stream) {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;  // id, fields
    auto r = RunCmd(*admin, {"XRANGE", stream, "-", "+"});
    for (size_t i = 0; r && i < r->elements; ++i) {
      std::vector<std::string> fields;
      const redisReply& f = *r->element[i]->element[1];
      for (size_t k = 0; k < f.elements; ++k) fields.emplace_back(redis::Text(*f.element[k]));
      out.emplace_back(std::string(redis::Text(*r->element[i]->element[0])), std::move(fields));
    }
    return out;
  };
  auto xadd = [&](const std::string& stream, std::vector<std::string> fields) {
    redis::Command cmd = {"XADD", stream, "*"};
    cmd.insert(cmd.end(), fields.begin(), fields.end());
    RunCmd(*admin, cmd);
  };

  auto deleted = fault_after([&](const std::string& stream) {
    RunCmd(*admin, {"XDEL", stream, entries(stream)[1].first});
  });
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->kind, ChainFault::Kind::kDeleted);
  EXPECT_EQ(deleted->entry.seq, 3u) << deleted->message;

  auto edited = fault_after([&](const std::string& stream) {
    auto all = entries(stream);
    RunCmd(*admin, {"DEL", stream});
    for (auto& [id, fields] : all) {
      for (size_t k = 0; k + 1 < fields.size(); k += 2) {
        if (fields[k] == "key" && fields[k + 1] == "k3") fields[k + 1] = "k3-forged";
      }
      xadd(stream, fields);
    }
  });
  ASSERT_TRUE(edited);
  EXPECT_EQ(edited->kind, ChainFault::Kind::kEdited);
  EXPECT_NE(edited->message.find("tenant \"t\" seq 3 (key \"k3-forged\""), std::string::npos)
      << edited->message;

  auto appended = fault_after([&](const std::string& stream) {
    Attempt forged = AuditEntry("t", "k6", 6);
    forged.seq = 6;
    forged.prev_hash = std::string(64, '0');
    forged.hash = ChainHash(forged, forged.seq, forged.prev_hash);
    const char* names[] = {"at",      "tenant",   "key",    "tool", "turn", "outcome",
                           "latency", "instance", "detail", "seq",  "prev", "hash"};
    std::vector<std::string> fields;
    std::vector<std::string> values = redis::EncodeAttempt(forged);
    for (size_t k = 0; k < values.size(); ++k) fields.insert(fields.end(), {names[k], values[k]});
    xadd(stream, fields);
  });
  ASSERT_TRUE(appended);
  EXPECT_EQ(appended->kind, ChainFault::Kind::kInserted) << appended->message;
  EXPECT_EQ(appended->entry.seq, 6u);

  auto before = fault_after([&](const std::string& stream) {
    // An entry as idemgate wrote them before the chain: no seq, no hashes.
    xadd(stream, {"at", "1", "tenant", "t", "key", "old", "tool", "x", "turn", "", "outcome",
                  "executed", "latency", "0", "instance", "i", "detail", ""});
  });
  EXPECT_FALSE(before) << before->message;
}

TEST(RedisSingleTest, UnreachableServerIsUnavailableAndNamed) {
  // A port nobody listens on: bind one, learn it, close it.
  std::string port;
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = std::to_string(ntohs(addr.sin_port));
    close(fd);
  }
  const auto start = SteadyClock::now();
  auto store =
      OpenStore("redis://127.0.0.1:" + port + "?connect_timeout=500ms", SystemClock::Default());
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(store.error().retryable());
  EXPECT_NE(store.error().message.find("127.0.0.1:" + port), std::string::npos)
      << store.error().message;
  EXPECT_LT(SteadyClock::now() - start, 2s);
}

TEST(RedisSingleTest, BinaryOutcomeAndFieldsSurviveAcrossInstances) {
  const std::string url =
      WithOptions(ServerUrl("IDEM_REDIS_URL_FILE"), "prefix=" + UniquePrefix("bin"));
  FakeClock clock;
  auto a = OpenOrFail(url, clock);
  auto b = OpenOrFail(url, clock);
  ASSERT_TRUE(a && b);
  std::string body;
  for (int i = 0; i < 256 * 64; ++i) body += static_cast<char>(i);
  auto c = a->Claim(Req("bin"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(a->Complete(c->record.id, c->record.fence, Ok(body), 1h));
  auto seen = b->Claim(Req("bin"));
  ASSERT_TRUE(seen);
  EXPECT_FALSE(seen->claimed);
  ASSERT_TRUE(seen->record.outcome);
  EXPECT_EQ(seen->record.outcome->body, body) << "Claim must return the outcome to replay";
}

// The encoding Redis chose for a record's hash.
std::string Encoding(const redis::RedisConfig& config, const RecordId& id) {
  auto conn = Connect(config.nodes.front());
  if (!conn) return "(no connection)";
  auto r = RunCmd(*conn, {"OBJECT", "ENCODING", redis::KeysOf(config.prefix, id).record});
  return r ? std::string(redis::Text(*r)) : "(no reply)";
}

// A 200-byte outcome (a typical tool result) keeps the record a listpack on a
// server with default settings; in one field it would make it a hashtable.
// Either layout replays, whichever instance wrote it.
TEST(RedisSingleTest, OutcomeInListpackSizedFieldsKeepsTheRecordCompact) {
  const std::string prefix = "prefix=" + UniquePrefix("compact");
  const std::string split_url = WithOptions(ServerUrl("IDEM_REDIS_URL_FILE"), prefix);
  const std::string whole_url = WithOptions(split_url, "body_field_bytes=0");
  auto config = redis::ParseRedisUrl(split_url);
  ASSERT_TRUE(config) << config.error().ToString();
  FakeClock clock;
  auto split = OpenOrFail(split_url, clock);
  auto whole = OpenOrFail(whole_url, clock);
  ASSERT_TRUE(split && whole);
  const std::string body(200, 'r');
  for (auto [writer, encoding] : {std::pair{split.get(), "listpack"}, {whole.get(), "hashtable"}}) {
    const std::string key = std::string("compact-") + encoding;
    auto c = writer->Claim(Req(key));
    ASSERT_TRUE(c && c->claimed);
    ASSERT_TRUE(writer->Complete(c->record.id, c->record.fence, Ok(body), 1h));
    EXPECT_EQ(Encoding(*config, c->record.id), encoding);
    for (Store* reader : {split.get(), whole.get()}) {
      auto got = reader->Get(c->record.id);
      ASSERT_TRUE(got && got->has_value() && (**got).outcome) << key;
      EXPECT_EQ((**got).outcome->body, body) << key;
      auto again = reader->Claim(Req(key));
      ASSERT_TRUE(again && !again->claimed && again->record.outcome) << key;
      EXPECT_EQ(again->record.outcome->body, body) << key;
    }
  }
}

// A record written before claims carried owner tokens has no 'ow' field: it
// stays readable, with no owner, and no Abandon can delete it.
TEST(RedisSingleTest, RecordWithoutOwnerFieldIsReadableAndCannotBeAbandoned) {
  const std::string url =
      WithOptions(ServerUrl("IDEM_REDIS_URL_FILE"), "prefix=" + UniquePrefix("owner"));
  auto config = redis::ParseRedisUrl(url);
  ASSERT_TRUE(config) << config.error().ToString();
  FakeClock clock;
  auto store = OpenOrFail(url, clock);
  ASSERT_TRUE(store);
  ClaimRequest req = Req("old");
  req.owner = "owner-a";
  auto c = store->Claim(req);
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(c->record.owner, "owner-a");
  auto conn = Connect(config->nodes.front());
  ASSERT_TRUE(conn);
  RunCmd(*conn, {"HDEL", redis::KeysOf(config->prefix, req.id).record, "ow"});
  auto old = store->Get(req.id);
  ASSERT_TRUE(old && old->has_value()) << (old ? "" : old.error().ToString());
  EXPECT_EQ((*old)->state, RecordState::kInProgress);
  EXPECT_EQ((*old)->owner, "");
  EXPECT_EQ(store->Abandon(req.id, "owner-a").error().code, ErrorCode::kAborted);
}

TEST(RedisSingleTest, ServerKilledThenRestartedKeepsCompletedRecords) {
  OwnServer server("kill");
  const std::string url =
      WithOptions(server.url(), "connect_timeout=500ms&timeout=1s&prefix=kill:");
  auto store = OpenOrFail(url, SystemClock::Default());
  ASSERT_TRUE(store);
  auto c = store->Claim(Req("before"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("kept"), 1h));

  server.Kill9();
  for (int i = 0; i < 3; ++i) {
    const auto start = SteadyClock::now();
    auto claim = store->Claim(Req("during"));
    const auto took = SteadyClock::now() - start;
    ASSERT_FALSE(claim) << "a claim succeeded with the server dead";
    EXPECT_EQ(claim.error().code, ErrorCode::kUnavailable) << claim.error().ToString();
    EXPECT_NE(claim.error().message.find(server.url().substr(8)), std::string::npos)
        << claim.error().message;
    EXPECT_LT(took, 2s) << "an operation on a dead server must fail fast, not hang";
    auto get = store->Get(c->record.id);
    ASSERT_FALSE(get);
    EXPECT_EQ(get.error().code, ErrorCode::kUnavailable);
    if (i == 0) std::cout << "dead server: " << claim.error().message << "\n";
  }

  server.Start(server.port());  // same port, same directory (appendonly)
  std::optional<Record> kept;
  const auto give_up = SteadyClock::now() + 10s;
  for (;;) {
    auto got = store->Get(c->record.id);
    if (got) {
      ASSERT_TRUE(got->has_value()) << "the completed record was lost in the crash";
      kept = **got;
      break;
    }
    ASSERT_LT(SteadyClock::now(), give_up) << "never reconnected: " << got.error().ToString();
    std::this_thread::sleep_for(50ms);  // the pool's reconnect backoff is at most 1 s
  }
  EXPECT_EQ(kept->state, RecordState::kCompleted);
  ASSERT_TRUE(kept->outcome);
  EXPECT_EQ(kept->outcome->body, "kept");
  auto after = store->Claim(Req("after"));
  ASSERT_TRUE(after) << after.error().ToString();
  EXPECT_TRUE(after->claimed);
  // The same store object also waits again (its subscriber reconnected).
  auto w =
      store->WaitForChange(after->record.id, after->record, SystemClock::Default().Now() + 10ms);
  EXPECT_TRUE(w) << w.error().ToString();
}

// The pipeline of the asynchronous operations, on a thread of its own
// (false) and on the caller's io_context (true: StoreOptions::io, as
// `idemgate http` runs it, two threads).
class RedisPipelineTest : public ::testing::TestWithParam<bool> {
 protected:
  // A store destroyed before the test ends, so before the io_context's
  // threads stop.
  std::unique_ptr<Store> Open(const std::string& url) {
    StoreOptions options;
    if (GetParam()) {
      io_ = std::make_unique<net::IoThreads>(2);
      options.io = &io_->context();
    }
    return OpenOrFail(url, SystemClock::Default(), options);
  }
  // Whether the caller runs on a thread that runs the store's callbacks.
  bool OnCallbackThread(std::thread::id own) const {
    return io_ ? io_->context().get_executor().running_in_this_thread()
               : std::this_thread::get_id() != own;
  }
  std::unique_ptr<net::IoThreads> io_;
};
INSTANTIATE_TEST_SUITE_P(RedisSingle, RedisPipelineTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "io" : "own_thread"; });

// GetAsync's pipeline under concurrency: readers on many threads, each read
// answered once, with its own record (the replies are matched to callbacks
// by order alone, so a mix-up would show here), while writes go on beside.
TEST_P(RedisPipelineTest, GetAsyncFromManyThreadsAnswersEachReadWithItsRecord) {
  const std::string url = ServerUrl("IDEM_REDIS_URL_FILE");
  ASSERT_FALSE(url.empty());
  auto store = Open(WithOptions(url, "prefix=" + UniquePrefix("async")));
  ASSERT_TRUE(store);
  constexpr int kRecords = 50, kThreads = 8, kReadsPerThread = 500;
  for (int i = 0; i < kRecords; ++i) {
    auto c = store->Claim(Req("k" + std::to_string(i)));
    ASSERT_TRUE(c && c->claimed);
    if (i % 2 == 0) {
      ASSERT_TRUE(
          store->Complete(c->record.id, c->record.fence, Ok("out" + std::to_string(i)), 1h));
    }
  }
  std::atomic<int> answered{0}, wrong{0}, failed{0};
  std::mutex mu;
  std::condition_variable all_done;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < kReadsPerThread; ++n) {
        const int i = (t * 7 + n) % kRecords;
        const bool took = store->GetAsync(
            RecordId{"default", "k" + std::to_string(i)}, [&, i](Result<std::optional<Record>> r) {
              if (!r || !r->has_value()) {
                ++failed;
              } else {
                const Record& rec = **r;
                const bool completed = i % 2 == 0;
                if (rec.id.key != "k" + std::to_string(i) ||
                    (rec.state == RecordState::kCompleted) != completed ||
                    (completed && rec.outcome->body != "out" + std::to_string(i))) {
                  ++wrong;
                }
              }
              std::lock_guard g(mu);
              if (++answered == kThreads * kReadsPerThread) all_done.notify_all();
            });
        ASSERT_TRUE(took) << "a single server reads asynchronously";
      }
    });
  }
  // Writes beside the reads, on the store's other connections.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(store->Claim(Req("w" + std::to_string(i))));
  for (std::thread& t : threads) t.join();
  std::unique_lock lock(mu);
  ASSERT_TRUE(all_done.wait_for(lock, 30s, [&] { return answered == kThreads * kReadsPerThread; }))
      << answered << " of " << kThreads * kReadsPerThread << " reads answered";
  EXPECT_EQ(wrong.load(), 0) << "reads answered with another record";
  EXPECT_EQ(failed.load(), 0);
}

// A dead server fails asynchronous reads fast and clearly; once it is back
// the pipeline reconnects by itself; reads in flight when the store closes
// are answered, not dropped.
TEST_P(RedisPipelineTest, GetAsyncFailsFastOnADeadServerAndRecovers) {
  OwnServer server(GetParam() ? "async-kill-io" : "async-kill");
  auto store = Open(WithOptions(server.url(), "connect_timeout=500ms&timeout=1s"));
  ASSERT_TRUE(store);
  auto c = store->Claim(Req("kept"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("kept"), 1h));
  auto read = [&] {
    std::promise<Result<std::optional<Record>>> answer;
    auto future = answer.get_future();
    EXPECT_TRUE(store->GetAsync(
        c->record.id, [&](Result<std::optional<Record>> r) { answer.set_value(std::move(r)); }));
    return future.get();
  };
  auto before = read();
  ASSERT_TRUE(before && before->has_value()) << (before ? "absent" : before.error().ToString());

  server.Kill9();
  const auto start = SteadyClock::now();
  auto during = read();
  ASSERT_FALSE(during) << "a read succeeded with the server dead";
  EXPECT_EQ(during.error().code, ErrorCode::kUnavailable) << during.error().ToString();
  EXPECT_NE(during.error().message.find(server.url().substr(8)), std::string::npos)
      << "names the server: " << during.error().message;
  EXPECT_LT(SteadyClock::now() - start, 3s) << "must fail fast, not hang";

  server.Start(server.port());
  const auto give_up = SteadyClock::now() + 10s;
  for (;;) {
    auto after = read();
    if (after) {
      ASSERT_TRUE(after->has_value()) << "the completed record was lost";
      EXPECT_EQ((*after)->outcome->body, "kept");
      break;
    }
    ASSERT_LT(SteadyClock::now(), give_up) << "never reconnected: " << after.error().ToString();
    std::this_thread::sleep_for(50ms);
  }

  // Closing with reads queued: every callback still runs exactly once.
  std::atomic<int> answered{0};
  for (int i = 0; i < 200; ++i) {
    store->GetAsync(c->record.id, [&](Result<std::optional<Record>>) { ++answered; });
  }
  store.reset();
  EXPECT_EQ(answered.load(), 200);
}

// A fresh call as `idemgate http` makes it: the claim's callback completes
// the record from where it runs (a thread that runs callbacks: of the
// io_context, or the pipeline's own), and the completion's callback gets the
// record. Blocking calls from other threads go through the same pipeline
// meanwhile, and a blocking call on a callback thread is answered too (it
// takes a pooled connection instead of waiting for its own thread).
TEST_P(RedisPipelineTest, AClaimsCallbackCompletesTheRecordFromWhereItRuns) {
  const std::string url = ServerUrl("IDEM_REDIS_URL_FILE");
  ASSERT_FALSE(url.empty());
  auto store = Open(WithOptions(url, "prefix=" + UniquePrefix("chain")));
  ASSERT_TRUE(store);
  const std::thread::id test_thread = std::this_thread::get_id();
  constexpr int kCalls = 200;
  std::atomic<int> completed{0}, off_thread{0}, failed{0};
  std::promise<void> all;
  for (int i = 0; i < kCalls; ++i) {
    ClaimRequest req = Req("fresh" + std::to_string(i));
    ASSERT_TRUE(store->ClaimAsync(req, [&, i](Result<ClaimResult> claimed) {
      if (!OnCallbackThread(test_thread)) ++off_thread;
      if (!claimed || !claimed->claimed) {
        ++failed;
        if (++completed == kCalls) all.set_value();
        return;
      }
      const Record rec = claimed->record;
      if (i % 10 == 0) {  // a blocking read from a callback thread
        auto read = store->Get(rec.id);
        if (!read || !read->has_value()) ++failed;
      }
      EXPECT_TRUE(store->CompleteAsync(rec.id, rec.fence, Ok("out" + std::to_string(i)), 1h,
                                       [&, i](Result<Record> done) {
                                         if (!OnCallbackThread(test_thread)) ++off_thread;
                                         if (!done || done->state != RecordState::kCompleted ||
                                             done->outcome->body != "out" + std::to_string(i)) {
                                           ++failed;
                                         }
                                         if (++completed == kCalls) all.set_value();
                                       }));
    }));
  }
  for (int i = 0; i < 50; ++i) {  // blocking claims beside them, through the pipeline
    auto c = store->Claim(Req("blocking" + std::to_string(i)));
    ASSERT_TRUE(c && c->claimed) << (c ? "not claimed" : c.error().ToString());
  }
  ASSERT_EQ(all.get_future().wait_for(30s), std::future_status::ready)
      << completed << " of " << kCalls << " calls answered";
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(off_thread.load(), 0) << "callbacks ran on a thread that does not run callbacks";
  for (int i = 0; i < kCalls; i += 37) {
    auto r = store->Get(RecordId{"default", "fresh" + std::to_string(i)});
    ASSERT_TRUE(r && r->has_value());
    EXPECT_EQ((*r)->outcome->body, "out" + std::to_string(i));
  }
}

TEST(RedisClusterTest, GetAsyncIsNotOfferedInACluster) {
  const std::string url = ServerUrl("IDEM_REDIS_CLUSTER_URL_FILE");
  ASSERT_FALSE(url.empty());
  auto store = OpenOrFail(url, SystemClock::Default());
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->GetAsync(RecordId{"default", "k"}, [](Result<std::optional<Record>>) {
    ADD_FAILURE() << "called back after refusing the read";
  }));
}

// Waits (bounded) until `replica` reports its link to the primary up: its
// first sync is done.
void AwaitLinkUp(const OwnServer& replica) {
  auto config = redis::ParseRedisUrl(replica.url());
  ASSERT_TRUE(config);
  auto conn = Connect(config->nodes[0]);
  ASSERT_TRUE(conn);
  const auto give_up = SteadyClock::now() + 10s;
  for (;;) {
    auto info = RunCmd(*conn, {"INFO", "replication"});
    ASSERT_TRUE(info);
    if (redis::Text(*info).find("master_link_status:up") != std::string_view::npos) break;
    ASSERT_LT(SteadyClock::now(), give_up) << "the replica never synced";
    std::this_thread::sleep_for(20ms);
  }
}

// ?wait_replicas=N: every record write is followed by WAIT on the same
// connection. With a replica attached it succeeds; without one it is
// kUnavailable (durability not confirmed), never a silent success.
TEST(RedisSingleTest, WaitReplicasConfirmsOrRefuses) {
  // The replica's first sync at once, not after the primary's default 5 s
  // wait for other replicas to share a diskless transfer.
  OwnServer primary("wait-primary", "--repl-diskless-sync-delay 0");
  OwnServer replica("wait-replica", "--replicaof 127.0.0.1 " + primary.port());
  AwaitLinkUp(replica);
  FakeClock clock;
  auto store = OpenOrFail(
      WithOptions(primary.url(), "wait_replicas=1&wait_timeout=1s&prefix=" + UniquePrefix("w")),
      clock);
  ASSERT_TRUE(store);
  auto c = store->Claim(Req("replicated"));
  ASSERT_TRUE(c) << c.error().ToString();
  auto done = store->Complete(c->record.id, c->record.fence, Ok("x"), 1h);
  ASSERT_TRUE(done) << done.error().ToString();

  auto lonely =
      OpenOrFail(WithOptions(ServerUrl("IDEM_REDIS_URL_FILE"),
                             "wait_replicas=1&wait_timeout=100ms&prefix=" + UniquePrefix("w")),
                 clock);
  ASSERT_TRUE(lonely);
  auto refused = lonely->Claim(Req("unreplicated"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(refused.error().message.find("replicas"), std::string::npos) << refused.error().message;
}

// Guarantees review F4: under wait_replicas, a completion no replica has
// acknowledged is served to nobody. Instance A completes K while the only
// replica is stopped (SIGSTOP: its link stays up, it acknowledges nothing):
// A's WAIT counts 0 and A answers "not stored". Instance B, and C with the
// replay cache, must not replay K then, by a claim, a read or the ledger,
// since a failover now would lose it; once the replica runs again, they
// confirm it (their own write after it, then WAIT) and replay it, and the
// replica holds it.
TEST(RedisSingleTest, AnUnconfirmedCompletionIsServedToNobody) {
  OwnServer primary("f4-primary", "--repl-diskless-sync-delay 0");
  OwnServer replica("f4-replica", "--replicaof 127.0.0.1 " + primary.port());
  AwaitLinkUp(replica);
  const std::string url = WithOptions(
      primary.url(), "wait_replicas=1&wait_timeout=500ms&prefix=" + UniquePrefix("f4"));
  auto a = OpenOrFail(url, SystemClock::Default());
  auto b = OpenOrFail(url, SystemClock::Default());
  auto c_store = OpenOrFail(url, SystemClock::Default());
  ASSERT_TRUE(a && b && c_store);
  CachingStore c(*c_store, SystemClock::Default(), 1 << 20);
  ASSERT_TRUE(AwaitCondition([&] { return c.stats().drops >= 2; })) << "feed never came up";

  auto claimed = a->Claim(Req("k"));
  ASSERT_TRUE(claimed && claimed->claimed) << (claimed ? "" : claimed.error().ToString());
  replica.Pause();
  auto completed = a->Complete(claimed->record.id, claimed->record.fence, Ok("charged"), 1h);
  ASSERT_FALSE(completed) << "WAIT counted a stopped replica";
  EXPECT_EQ(completed.error().code, ErrorCode::kUnavailable) << completed.error().ToString();

  auto served = [](const Result<ClaimResult>& r) {
    return r && !r->claimed && r->record.state == RecordState::kCompleted;
  };
  auto read = [](const Result<std::optional<Record>>& r) {
    return r && r->has_value() && (*r)->state == RecordState::kCompleted;
  };
  Ledger ledger(*b, SystemClock::Default(), LedgerOptions{"b", nullptr, false});
  const Call call = CallOf("k");
  for (int round = 0; round < 2; ++round) {  // the second round from the pools' used connections
    auto b_claim = b->Claim(Req("k"));
    EXPECT_FALSE(served(b_claim)) << "B's claim replayed an unconfirmed completion";
    if (!b_claim) {
      EXPECT_EQ(b_claim.error().code, ErrorCode::kUnavailable);
    }
    EXPECT_FALSE(read(b->Get(claimed->record.id))) << "B's read served an unconfirmed completion";
    auto begun = ledger.Begin(call);
    EXPECT_FALSE(begun && begun->kind == Decision::Kind::kReplay)
        << "B's ledger replayed an unconfirmed completion";
    EXPECT_FALSE(served(c.Claim(Req("k")))) << "C's claim replayed an unconfirmed completion";
    EXPECT_FALSE(read(c.Get(claimed->record.id))) << "C's read served an unconfirmed completion";
  }
  EXPECT_EQ(c.stats().records, 0u) << "the replay cache holds an unconfirmed completion";
  // The pipelined read under wait_replicas would answer unconfirmed: the
  // store does not offer it.
  EXPECT_FALSE(b->GetAsync(claimed->record.id, [](Result<std::optional<Record>>) {
    ADD_FAILURE() << "called back after refusing the read";
  }));

  replica.Resume();
  auto confirmed = b->Claim(Req("k"));
  ASSERT_TRUE(confirmed) << confirmed.error().ToString();
  EXPECT_TRUE(served(confirmed));
  EXPECT_EQ(confirmed->record.outcome->body, "charged");
  EXPECT_TRUE(read(b->Get(claimed->record.id)));
  EXPECT_TRUE(served(c.Claim(Req("k"))));
  EXPECT_EQ(c.stats().records, 1u) << "a confirmed completion is cached";
  auto begun = ledger.Begin(call);
  ASSERT_TRUE(begun) << begun.error().ToString();
  EXPECT_EQ(begun->kind, Decision::Kind::kReplay);

  auto on_replica = Connect(redis::ParseRedisUrl(replica.url())->nodes[0]);
  ASSERT_TRUE(on_replica);
  auto config = redis::ParseRedisUrl(url);
  ASSERT_TRUE(config);
  auto st = RunCmd(*on_replica,
                   {"HGET", redis::KeysOf(config->prefix, claimed->record.id).record, "st"});
  ASSERT_TRUE(st);
  EXPECT_EQ(redis::Text(*st), "completed") << "the confirmation WAITed for the replica";
}

// Issue 36 item 5: a failover with wait_replicas=1. Two instances (two
// stores, each with its ledger, as two fronts) run a fixed batch of calls
// on primary P, whose one replica is R; halfway through, while calls are in
// flight, R is promoted (REPLICAOF NO ONE) and P killed (SIGKILL), and the
// instances are pointed at R. Every call a client was told executed or
// replayed must be on R with the outcome it was told (lost: 0), and no call
// may run twice (duplicates: executions beyond one per key, counted in the
// test's own upstream function). The figures go to RELIABILITY.md.
TEST(RedisSingleTest, AFailoverToTheReplicaLosesAndDuplicatesNothingUnderWaitReplicas) {
  OwnServer primary("failover-p", "--repl-diskless-sync-delay 0");
  OwnServer replica("failover-r", "--replicaof 127.0.0.1 " + primary.port());
  AwaitLinkUp(replica);
  const std::string prefix = UniquePrefix("failover");
  const std::string on_p = WithOptions(
      primary.url(), "wait_replicas=1&wait_timeout=1s&connect_timeout=500ms&prefix=" + prefix);
  const std::string on_r =
      WithOptions(replica.url(), "connect_timeout=500ms&prefix=" + prefix);  // no replica left

  constexpr int kKeys = 100, kAttempts = 3, kCalls = kKeys * kAttempts;
  std::vector<int> order;  // the key of each call, in a fixed random order
  for (int k = 0; k < kKeys; ++k) order.insert(order.end(), kAttempts, k);
  std::mt19937 rng(36);
  std::shuffle(order.begin(), order.end(), rng);

  struct Front {
    std::unique_ptr<Store> store;
    std::unique_ptr<Ledger> ledger;
  };
  auto open_front = [](const std::string& url) {
    Front f;
    f.store = OpenOrFail(url, SystemClock::Default());
    if (f.store) {
      f.ledger = std::make_unique<Ledger>(*f.store, SystemClock::Default(),
                                          LedgerOptions{"failover", nullptr, false});
    }
    return f;
  };
  std::vector<Front> fronts;  // both instances on P, then both on R; all kept to the end
  fronts.push_back(open_front(on_p));
  fronts.push_back(open_front(on_p));
  ASSERT_TRUE(fronts[0].ledger && fronts[1].ledger);
  std::atomic<Ledger*> current[2] = {fronts[0].ledger.get(), fronts[1].ledger.get()};

  std::mutex mu;
  std::condition_variable progress;
  int answered = 0;                       // guarded by mu
  std::map<int, int> executions;          // guarded by mu: the upstream's own count per key
  std::map<int, std::string> told;        // guarded by mu: the outcome a client was told
  int executed = 0, replayed = 0, refused = 0, mismatched = 0;  // guarded by mu
  // 0: on P; 1: failing over; 2: on R. A call refused while failing over
  // waits for 2, as a client retries later, so that the calls after the
  // failover reach R instead of all failing on the dead P at once.
  int phase = 0;  // guarded by mu
  auto call_for = [](int key) {
    Call c = CallOf("k" + std::to_string(key));
    c.policy.wait = 1'000ms;  // a retry of a call whose owner is gone does not wait 10 s
    return c;
  };
  auto worker = [&](int w) {
    for (int i = w; i < kCalls; i += 2) {
      const int key = order[i];
      const Call call = call_for(key);
      auto result = current[w].load()->Run(call, [&] {
        std::lock_guard g(mu);
        const int n = ++executions[key];
        return Execution{Execution::Kind::kSuccess, "charged " + call.id.key + " #" + std::to_string(n)};
      });
      std::unique_lock lock(mu);
      const bool acked = result && result->outcome &&
                         (result->decision.kind == Decision::Kind::kExecute ||
                          result->decision.kind == Decision::Kind::kReplay);
      if (acked) {
        (result->decision.kind == Decision::Kind::kExecute ? executed : replayed)++;
        auto [it, fresh] = told.emplace(key, result->outcome->body);
        if (!fresh && it->second != result->outcome->body) ++mismatched;
      } else {
        ++refused;
      }
      ++answered;
      progress.notify_all();
      if (!acked && phase == 1) progress.wait(lock, [&] { return phase == 2; });
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  {
    std::unique_lock lock(mu);
    progress.wait(lock, [&] { return answered >= kCalls / 2; });
  }
  // The failover, with calls in flight: R becomes a primary, P dies. (The
  // workers are joined whatever fails here.)
  {
    std::lock_guard g(mu);
    phase = 1;
  }
  [&] {
    auto r_admin = AdminOf(replica.url());
    ASSERT_TRUE(r_admin);
    ASSERT_TRUE(RunCmd(*r_admin, {"REPLICAOF", "NO", "ONE"}));
    primary.Kill9();
    fronts.push_back(open_front(on_r));
    fronts.push_back(open_front(on_r));
    ASSERT_TRUE(fronts[2].ledger && fronts[3].ledger);
    current[0] = fronts[2].ledger.get();
    current[1] = fronts[3].ledger.get();
  }();
  {
    std::lock_guard g(mu);
    phase = 2;
  }
  progress.notify_all();
  a.join();
  b.join();
  ASSERT_EQ(fronts.size(), 4u);
  ASSERT_TRUE(fronts[2].ledger && fronts[3].ledger);

  // What R holds of every outcome a client was told, and a client's retry.
  int lost = 0, duplicates = 0, total_executions = 0;
  for (const auto& [key, n] : executions) {
    total_executions += n;
    duplicates += std::max(0, n - 1);
  }
  for (const auto& [key, body] : told) {
    const Call call = call_for(key);
    auto held = fronts[2].store->Get(call.id);
    auto retry = fronts[3].ledger->Run(call, [&] {
      std::lock_guard g(mu);
      ++executions[key];
      ++duplicates;
      return Execution{Execution::Kind::kSuccess, "again"};
    });
    const bool kept = held && held->has_value() && (*held)->state == RecordState::kCompleted &&
                      (*held)->outcome && (*held)->outcome->body == body && retry &&
                      retry->decision.kind == Decision::Kind::kReplay && retry->outcome &&
                      retry->outcome->body == body;
    if (!kept) {
      ++lost;
      ADD_FAILURE() << "k" << key << " was answered \"" << body << "\" and is "
                    << (held ? (held->has_value() ? RecordStateName((*held)->state)
                                                  : std::string_view("gone"))
                             : std::string_view("unreadable"))
                    << " on the promoted replica";
    }
  }
  std::cout << "[ failover ] calls " << kCalls << " (" << kKeys << " keys x " << kAttempts
            << "), answered executed " << executed << ", replayed " << replayed
            << ", refused or unknown " << refused << "; executions " << total_executions
            << ", duplicates " << duplicates << ", lost " << lost << ", keys acknowledged "
            << told.size() << "\n";
  EXPECT_EQ(duplicates, 0);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(mismatched, 0) << "a replay differed from the execution it replays";
  EXPECT_EQ(executed + replayed + refused, kCalls);
  EXPECT_GT(executed, 0);
  EXPECT_GT(replayed, 0);
}

// Security review F4: one query of the audit log (GET /v1/attempts?key=x,
// any tenant's) examines at most attempts_scan entries of the stream, and
// says it stopped (AttemptFilter::cut); it scanned the whole stream, up to
// attempts_maxlen (10^6) entries, for a key that does not exist.
TEST(RedisSingleTest, AnAttemptQueryExaminesAtMostAttemptsScanEntries) {
  OwnServer own("scan");  // INFO commandstats counts this test's commands only
  auto admin = AdminOf(own.url());
  ASSERT_TRUE(admin);
  constexpr int kEntries = 3000;
  auto store = OpenOrFail(WithOptions(own.url(), "attempts_scan=1000&prefix=scan:"),
                          SystemClock::Default());
  ASSERT_TRUE(store);
  std::vector<Attempt> log;
  for (int i = 0; i < kEntries; ++i) {
    Attempt a;
    a.at = SystemClock::Default().Now();
    a.tenant = "default";
    a.key = i == 0 ? "oldest" : (i == kEntries - 1 ? "newest" : "k" + std::to_string(i));
    a.tool = "charge";
    a.outcome = AttemptOutcome::kExecuted;
    log.push_back(std::move(a));
  }
  ASSERT_TRUE(store->AppendAttempts(log));

  auto query = [&](Store& s, const std::string& key, bool* cut) {
    AttemptFilter f;
    f.key = key;
    f.cut = cut;
    const long long before = CommandCalls(*admin, "xrevrange");
    auto found = s.QueryAttempts(f);
    EXPECT_TRUE(found) << found.error().ToString();
    return std::pair<size_t, long long>(found ? found->size() : 0,
                                        CommandCalls(*admin, "xrevrange") - before);
  };
  bool cut = false;
  auto [none, pages] = query(*store, "does-not-exist", &cut);
  EXPECT_EQ(none, 0u);
  EXPECT_TRUE(cut) << "the answer says the scan stopped";
  EXPECT_EQ(pages, 2) << "1000 entries: pages of 512 and 488, not the whole stream";
  cut = false;
  auto [newest, newest_pages] = query(*store, "newest", &cut);
  EXPECT_EQ(newest, 1u);
  EXPECT_TRUE(cut) << "limit 1000 not reached: older matches may exist";
  cut = false;
  auto [oldest, oldest_pages] = query(*store, "oldest", &cut);
  EXPECT_EQ(oldest, 0u) << "past the cap";
  EXPECT_TRUE(cut);

  auto whole = OpenOrFail(WithOptions(own.url(), "attempts_scan=0&prefix=scan:"),
                          SystemClock::Default());  // 0: no cap
  ASSERT_TRUE(whole);
  cut = false;
  auto [found, all_pages] = query(*whole, "oldest", &cut);
  EXPECT_EQ(found, 1u);
  EXPECT_FALSE(cut) << "the whole stream was examined";
  EXPECT_EQ(all_pages, (kEntries + 511) / 512);
}

// Guarantees review H5: on_store_down = "pass" applies to the pipelined
// claim (Ledger::BeginAsync, as `idemgate http` and `serve` run it on one
// server) as it does to the blocking one: a server that cannot be reached
// was certainly not written to, so the call passes through. (The
// pipeline's failures lost Error::unreached, and such calls were refused.)
TEST(RedisSingleTest, OnStoreDownPassAppliesToThePipelinedClaimOfAnUnreachableServer) {
  OwnServer server("h5");
  auto store = OpenOrFail(WithOptions(server.url(), "connect_timeout=500ms&timeout=1s&prefix=h5:"),
                          SystemClock::Default());
  ASSERT_TRUE(store);
  ASSERT_FALSE(store->ReadsBeforeClaim()) << "a single server claims through the pipeline";
  server.Kill9();
  Call call = CallOf("down");
  call.policy.on_store_down = OnStoreDown::kPass;
  // A ledger that declines the non-blocking claim (a take-back pending) is
  // a failure here, not a wait for an answer that never comes.
  auto begin_async = [&](Ledger& ledger) -> std::optional<Result<Decision>> {
    std::promise<std::optional<Result<Decision>>> answer;
    auto answered = answer.get_future();
    if (!ledger.BeginAsync(call, [&](std::optional<Result<Decision>> d) {
          answer.set_value(std::move(d));
        })) {
      ADD_FAILURE() << "the ledger declined the pipelined claim";
      return std::nullopt;
    }
    return answered.get();
  };
  // The pipeline's connection, open before the kill, may not have seen the
  // server go: a claim written into it fails while reading its answer, and,
  // as far as the store can tell, may have reached the server, so it is
  // refused, not passed, and its ledger then takes the claim back before it
  // claims again (no pipelined claim until then). Which one happens depends
  // on when the kernel reports the reset, so that first claim goes through
  // a ledger of its own and its answer is not checked.
  {
    Ledger first(*store, SystemClock::Default(), LedgerOptions{"test", nullptr, false});
    (void)begin_async(first);
  }
  Ledger ledger(*store, SystemClock::Default(), LedgerOptions{"test", nullptr, false});
  // Then one connects and is refused, and the next fails at once in the
  // node's connect backoff. Neither reached the server.
  for (int i = 0; i < 2; ++i) {
    auto piped = begin_async(ledger);
    ASSERT_TRUE(piped) << "a failed claim is the ledger's to answer";
    ASSERT_TRUE(*piped) << "refused instead of passed: " << piped->error().ToString();
    EXPECT_EQ((*piped)->kind, Decision::Kind::kPassThrough);
  }
  auto blocking = ledger.Begin(call);
  ASSERT_TRUE(blocking) << blocking.error().ToString();
  EXPECT_EQ(blocking->kind, Decision::Kind::kPassThrough);

  call.policy.on_store_down = OnStoreDown::kFail;  // and without pass, refused as before
  auto refused = begin_async(ledger);
  ASSERT_TRUE(refused);
  ASSERT_FALSE(*refused);
  EXPECT_EQ(refused->error().code, ErrorCode::kUnavailable);
}

// Resharding under load: the slot of a set of records moves to another
// master (IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE) while four threads
// claim and complete those records and others. Every operation must succeed
// (ASK and MOVED are followed inside the store; a record is one key, so
// there is no multi-key TRYAGAIN) and every key must have exactly one
// winning claim.
TEST(RedisClusterTest, SlotMigrationUnderLoadLosesAndDuplicatesNothing) {
  const std::string base = ServerUrl("IDEM_REDIS_CLUSTER_URL_FILE");
  ASSERT_FALSE(base.empty());
  const std::string prefix = UniquePrefix("mig");
  const std::string url = WithOptions(base, "prefix=" + prefix);
  auto store = OpenOrFail(url, SystemClock::Default());
  ASSERT_TRUE(store);
  auto config = redis::ParseRedisUrl(url);
  ASSERT_TRUE(config);

  // Keys whose records all live in the slot of "hot-0", and some elsewhere.
  auto slot_of = [&](const std::string& key) {
    return redis::KeySlot(redis::KeysOf(prefix, RecordId{"default", key}).record);
  };
  const int slot = slot_of("hot-0");
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 120; ++i) {
    std::string k = "hot-" + std::to_string(i);
    if (slot_of(k) == slot) keys.push_back(k);
  }
  for (int i = 0; i < 60; ++i) keys.push_back("cold-" + std::to_string(i));

  // Who owns the slot now, and who will.
  std::map<std::string, redis::NodeAddress> by_id;
  std::string source_id;
  for (const auto& seed : config->nodes) {
    auto c = Connect(seed);
    ASSERT_TRUE(c);
    auto id = RunCmd(*c, {"CLUSTER", "MYID"});
    ASSERT_TRUE(id);
    by_id[std::string(redis::Text(*id))] = seed;
    auto owner = RunCmd(*c, {"CLUSTER", "KEYSLOT", "x"});  // warm-up; ignored
    (void)owner;
  }
  {
    auto c = Connect(config->nodes[0]);
    auto slots = RunCmd(*c, {"CLUSTER", "SLOTS"});
    ASSERT_TRUE(slots);
    auto map = redis::SlotMap::Parse(slots.get(), config->nodes[0]);
    ASSERT_TRUE(map);
    for (auto& [id, node] : by_id) {
      if (node == *map->NodeFor(slot)) source_id = id;
    }
  }
  ASSERT_FALSE(source_id.empty());
  std::string target_id;
  for (auto& [id, node] : by_id) {
    if (id != source_id) target_id = id;
  }
  const redis::NodeAddress source = by_id[source_id], target = by_id[target_id];
  std::cout << "moving slot " << slot << " from " << source.ToString() << " to "
            << target.ToString() << "\n";

  std::atomic<int> errors{0};
  std::atomic<int> operations{0};
  std::atomic<int> operations_when_migrated{-1};
  std::mutex mu;
  std::map<std::string, int> winners;
  std::vector<std::string> error_texts;
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      // Cycle through the keys (later passes find them claimed) until well
      // after the slot has moved, so that every phase runs under load.
      for (size_t i = 0;; ++i) {
        const int migrated_at = operations_when_migrated.load();
        if (i >= keys.size() && migrated_at >= 0 && operations.load() > migrated_at + 300) break;
        // Two threads race on each key.
        const std::string& key = keys[(i + (t % 2) * 7) % keys.size()];
        auto c = store->Claim(Req(key));
        ++operations;
        if (!c) {
          ++errors;
          std::lock_guard g(mu);
          error_texts.push_back("claim " + key + ": " + c.error().ToString());
          continue;
        }
        if (!c->claimed) continue;
        {
          std::lock_guard g(mu);
          ++winners[key];
        }
        auto hb = store->Heartbeat(c->record.id, c->record.fence, 30s);
        auto done = store->Complete(c->record.id, c->record.fence, Ok("v-" + key), 1h);
        operations += 2;
        if (!hb || !done) {
          ++errors;
          std::lock_guard g(mu);
          error_texts.push_back("write " + key + ": " +
                                (!hb ? hb.error().ToString() : done.error().ToString()));
        }
      }
    });
  }

  // The standard resharding steps, while the workers run.
  auto src = Connect(source), dst = Connect(target);
  ASSERT_TRUE(src && dst);
  while (operations.load() < 40) std::this_thread::sleep_for(1ms);
  RunCmd(*dst, {"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", source_id});
  RunCmd(*src, {"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", target_id});
  int moved = 0;
  for (;;) {
    auto batch = RunCmd(*src, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "5"});
    ASSERT_TRUE(batch);
    if (batch->elements == 0) break;
    redis::Command migrate = {"MIGRATE", target.host, std::to_string(target.port), "", "0",
                              "5000",    "KEYS"};
    for (size_t i = 0; i < batch->elements; ++i) {
      migrate.emplace_back(redis::Text(*batch->element[i]));
    }
    moved += static_cast<int>(batch->elements);
    RunCmd(*src, migrate);
    std::this_thread::sleep_for(2ms);  // let claims land mid-migration (ASK / TRYAGAIN)
  }
  for (auto* c : {dst.get(), src.get()}) {
    RunCmd(*c, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", target_id});
  }
  for (auto& [id, node] : by_id) {
    if (id == source_id || id == target_id) continue;
    auto c = Connect(node);
    RunCmd(*c, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", target_id});
  }
  operations_when_migrated = operations.load();
  std::cout << "migrated " << moved << " keys; " << operations_when_migrated.load()
            << " operations before the slot was handed over\n";
  for (auto& w : workers) w.join();
  std::cout << operations.load() << " operations in all\n";

  for (const auto& e : error_texts) ADD_FAILURE() << e;
  EXPECT_EQ(errors.load(), 0);
  for (const std::string& key : keys) {
    EXPECT_EQ(winners[key], 1) << key;
    auto got = store->Get(RecordId{"default", key});
    ASSERT_TRUE(got) << got.error().ToString();
    ASSERT_TRUE(got->has_value()) << key << " was lost";
    EXPECT_EQ((*got)->state, RecordState::kCompleted) << key;
    EXPECT_EQ((*got)->outcome->body, "v-" + key);
  }
  // The records of the slot now live on the target.
  auto c = Connect(target);
  auto count = RunCmd(*c, {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)});
  ASSERT_TRUE(count);
  EXPECT_GT(count->integer, 0);
}

// --- TLS (rediss://) on the redis_tls fixture's server ----------------------

class RedisTlsSingleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = ServerUrl("IDEM_REDIS_TLS_URL_FILE");
    ASSERT_FALSE(url_.empty());
    // tests/servers/redis.sh start-tls makes the certificates in tls/ beside the URL file.
    const auto url_file = std::filesystem::path(std::getenv("IDEM_REDIS_TLS_URL_FILE"));
    other_ca_ = (url_file.parent_path() / "tls" / "other-ca.crt").string();
  }
  std::string url_;
  std::string other_ca_;  // signed neither the server's certificate nor the client's
};

// Opening a store on `url` and reading a record with it fails with
// kUnavailable, naming the node and saying each of `reasons`. (A TLS failure
// surfaces at the first connection: at OpenStore or at the read.)
void ExpectUnavailable(const std::string& url, std::initializer_list<std::string_view> reasons) {
  auto config = redis::ParseRedisUrl(url);
  ASSERT_TRUE(config) << config.error().ToString();
  std::optional<Error> error;
  if (auto store = OpenStore(url, SystemClock::Default()); !store) {
    error = store.error();
  } else if (auto got = (*store)->Get(RecordId{"default", "tls"}); !got) {
    error = got.error();
  }
  ASSERT_TRUE(error) << "the store worked: " << url;
  std::cout << "refused: " << error->ToString() << "\n";
  EXPECT_EQ(error->code, ErrorCode::kUnavailable) << error->ToString();
  EXPECT_NE(error->message.find(config->nodes.front().ToString()), std::string::npos)
      << "names the node: " << error->message;
  for (std::string_view reason : reasons) {
    EXPECT_NE(error->message.find(reason), std::string::npos) << error->message;
  }
}

// A claim on a store opened on `url` succeeds.
void ExpectClaims(const std::string& url) {
  auto store =
      OpenOrFail(WithOptions(url, "prefix=" + UniquePrefix("tls")), SystemClock::Default());
  ASSERT_TRUE(store);
  auto c = store->Claim(Req("k"));
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
}

TEST_F(RedisTlsSingleTest, CrossInstanceWakeUpIsByPubSub) {
  CrossInstanceWakeUp("IDEM_REDIS_TLS_URL_FILE", "tls single");
}

TEST_F(RedisTlsSingleTest, ACertificateFromAnotherCaFailsVerification) {
  ExpectUnavailable(WithOption(url_, "tls_ca", other_ca_), {"certificate verify failed"});
}

// The server's certificate names localhost and 127.0.0.1.
TEST_F(RedisTlsSingleTest, ACertificateForAnotherNameFailsVerification) {
  ExpectUnavailable(WithOption(url_, "tls_server_name", "wrong.example"),
                    {"certificate verify failed", "hostname mismatch"});
}

TEST_F(RedisTlsSingleTest, TheServerNameToVerifyNeedNotBeTheHostConnectedTo) {
  ExpectClaims(WithOption(url_, "tls_server_name", "localhost"));
}

// Redis asks for a client certificate (tls-auth-clients yes).
TEST_F(RedisTlsSingleTest, WithoutAClientCertificateTheServerRefuses) {
  ExpectUnavailable(WithoutOption(WithoutOption(url_, "tls_cert"), "tls_key"), {});
}

TEST_F(RedisTlsSingleTest, AFileThatCannotBeLoadedIsAnInvalidArgumentNamingIt) {
  for (const char* option : {"tls_ca", "tls_cert", "tls_key"}) {
    auto store = OpenStore(WithOption(url_, option, "/nonexistent"), SystemClock::Default());
    ASSERT_FALSE(store) << option << "=/nonexistent was accepted";
    EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument) << store.error().ToString();
    for (std::string_view names : {std::string_view(option), std::string_view("/nonexistent")}) {
      EXPECT_NE(store.error().message.find(names), std::string::npos) << store.error().message;
    }
  }
}

TEST_F(RedisTlsSingleTest, TlsVerifyFalseAcceptsAnyCertificate) {
  ExpectClaims(WithOptions(WithOption(url_, "tls_ca", other_ca_),
                           "tls_server_name=wrong.example&tls_verify=false"));
}

// The server drops a client that does not start a TLS handshake: the store
// fails with an error that names the node (ctest's timeout catches a hang).
TEST_F(RedisTlsSingleTest, PlainRedisToATlsPortFails) {
  auto config = redis::ParseRedisUrl(url_);
  ASSERT_TRUE(config) << config.error().ToString();
  ExpectUnavailable(
      "redis://" + config->nodes.front().ToString() + "?timeout=300ms&connect_timeout=300ms", {});
}
