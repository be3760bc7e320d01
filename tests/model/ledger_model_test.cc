// A model-based randomized test of the Ledger (docs/DESIGN.md §4) on every store (§5).
//
// Several Ledgers (idemgate instances) share one store, each on its own FakeClock, skewed by up to
// ±3 s and advanced together. A schedule drawn from a seeded std::mt19937_64 drives them: Begin,
// the simulated upstream running the tool, Settle with every Execution::Kind, Heartbeat, Release,
// "kill" (an instance forgets its executions without settling: their leases run out), clocks
// advanced past leases and retentions (also to the exact millisecond a lease or a retention ends),
// store faults (a write refused, or applied with its reply lost), a failed Settle sent again, one
// instance cut off from the store, the whole store down, an operator resolving, evicting and
// purging, and per key a random policy: on_unknown = fail / retry / reconcile (with a hook that
// answers truthfully or cannot tell), errors, on_drift, on_store_down, max_result_bytes, a turn
// fallback. Four keys: two key names, each in two tenants.
//
// A reference model, written here from §4, predicts every answer and every store operation; after
// each step the test compares the Ledger's answer and the store's record (read back) with it, and
// checks the invariants directly:
//  - at most one real execution per key and life (from a fresh claim to the end of its retention),
//    unless a documented policy allows more: on_unknown = retry after a take-over, errors =
//    release after a tool error, on_store_down = pass (an unguarded run). The reconcile hook
//    answers "not found" only when nothing ran, so reconcile never allows a repeat;
//  - no completed outcome is lost or changed: until it expires, every Begin answers it (kReplay,
//    the same bytes), kDrift, or an error, and a read returns it;
//  - fences only grow: every ownership of a key gets a fence above all earlier ones.
//
// The upstream acts only while its caller holds a current claim (§4 step 5 renews the lease while
// it works): a request that reaches the upstream after its owner was presumed dead is outside what
// a lease can prevent, and is not simulated.
//
// Policy.wait is 0, so Begin never waits (Decide answers kInProgress at once and never calls
// WaitForChange): the schedule is single-threaded and never sleeps. The ledgers' keeper threads
// only abandon claims whose reply failed; a lost-reply claim is waited for (a condition variable,
// no sleep) until its abandon lands.
//
// Each store is a CTest test (tests/CMakeLists.txt): memory, SQLite, Redis (one server and a
// cluster), PostgreSQL, and Redis and PostgreSQL under each instance's replay cache (CachingStore,
// as the fronts stack it). Under the cache the clocks agree, as the cache assumes (see
// LedgerModelRegression below), and nothing is evicted.
//
// Figures: schedules, steps, executions, duplicates, lost per store, on stdout and as test
// properties. IDEM_MODEL_SEEDS=N runs N schedules (seeds 1..N, default 20), IDEM_MODEL_STEPS=M
// steps each (default 200), IDEM_MODEL_SEED=S only seed S, printing its schedule. A failing seed
// prints its schedule.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/caching_store.h"
#include "idem/clock.h"
#include "idem/forwarding_store.h"
#include "idem/ledger.h"
#include "idem/store.h"
#include "memory_store.h"
#include "store_wrapper.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using DKind = Decision::Kind;
using EKind = Execution::Kind;
using SKind = Settlement::Kind;

constexpr int kInstances = 3;
constexpr int kKeys = 4;
constexpr Duration kMaxSkew{3000};

// ------------------------------------------------------------------------------------------------
// Settings and randomness

struct Settings {
  std::vector<uint64_t> seeds;
  int steps = 200;
  bool verbose = false;  // print every schedule (IDEM_MODEL_SEED)
};

Settings SettingsFromEnv() {
  Settings s;
  int n = 20;
  if (const char* v = std::getenv("IDEM_MODEL_SEEDS"); v && *v) n = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("IDEM_MODEL_STEPS"); v && *v) s.steps = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("IDEM_MODEL_SEED"); v && *v) {
    s.seeds.push_back(std::strtoull(v, nullptr, 10));
    s.verbose = true;
  } else {
    for (int i = 1; i <= n; ++i) s.seeds.push_back(static_cast<uint64_t>(i));
  }
  return s;
}

// Portable draws (the distributions of <random> differ between standard libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t Below(uint64_t n) { return n <= 1 ? 0 : g_() % n; }
  bool Percent(uint64_t p) { return Below(100) < p; }
  template <typename T>
  T Pick(std::initializer_list<T> v) {
    return *(v.begin() + Below(v.size()));
  }

 private:
  std::mt19937_64 g_;
};

// ------------------------------------------------------------------------------------------------
// Stores: one view per instance, each on that instance's clock

// The memory store is one object: it judges expiry by the clock of whichever instance is calling
// (the view it came through sets it for the calling thread), as a store reached over separate
// connections judges it by each caller's time (§4 step 4).
thread_local Clock* t_caller_clock = nullptr;

class CallerClock final : public Clock {
 public:
  TimePoint Now() override { return Current().Now(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override {
    Current().WaitUntil(cv, lock, deadline);
  }

 private:
  static Clock& Current() {
    if (t_caller_clock == nullptr) {
      std::fprintf(stderr, "ledger_model_test: memory store used without a caller clock\n");
      std::abort();
    }
    return *t_caller_clock;
  }
};

class CallerClockView final : public ForwardingStore {
 public:
  CallerClockView(std::shared_ptr<void> keep, Store& shared, Clock& clock)
      : ForwardingStore(shared), keep_(std::move(keep)), clock_(clock) {}

  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    As a(clock_);
    return target_.Claim(req);
  }
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    As a(clock_);
    return target_.Heartbeat(id, fence, lease);
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    As a(clock_);
    return target_.Complete(id, fence, outcome, retention, logged);
  }
  Result<void> Release(const RecordId& id, uint64_t fence) override {
    As a(clock_);
    return target_.Release(id, fence);
  }
  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    As a(clock_);
    return target_.Abandon(id, owner);
  }
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    As a(clock_);
    return target_.MarkUnknown(id, fence, retention);
  }
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    As a(clock_);
    return target_.TakeOver(id, fence, lease);
  }
  Result<std::optional<Record>> Get(const RecordId& id) override {
    As a(clock_);
    return target_.Get(id);
  }
  Result<bool> Evict(const RecordId& id) override {
    As a(clock_);
    return target_.Evict(id);
  }
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    As a(clock_);
    return target_.WaitForChange(id, seen, deadline);
  }
  Result<size_t> PurgeExpired(size_t limit) override {
    As a(clock_);
    return target_.PurgeExpired(limit);
  }
  bool GetAsync(const RecordId&, GetDone) override { return false; }
  bool ClaimAsync(const ClaimRequest&, ClaimDone) override { return false; }
  bool CompleteAsync(const RecordId&, uint64_t, const Outcome&, Duration, CompleteDone,
                     const Attempt*) override {
    return false;
  }
  bool WatchEvictions(EvictionFeed on_change) override {
    As a(clock_);
    return target_.WatchEvictions(std::move(on_change));
  }

 private:
  struct As {
    explicit As(Clock& c) : saved(t_caller_clock) { t_caller_clock = &c; }
    ~As() { t_caller_clock = saved; }
    Clock* saved;
  };
  std::shared_ptr<void> keep_;
  Clock& clock_;
};

// A store that owns what it needs kept alive (a directory, a schema) past its own close.
class Owning final : public ForwardingStore {
 public:
  Owning(std::shared_ptr<void> keep, std::unique_ptr<Store> store)
      : ForwardingStore(*store), keep_(std::move(keep)), store_(std::move(store)) {}

 private:
  std::shared_ptr<void> keep_;
  std::unique_ptr<Store> store_;  // declared last: closed first
};

// Opens instance views of one shared store; nullptr after recording a failure.
using Opener = std::function<std::unique_ptr<Store>(Clock&)>;

Opener MemoryOpener() {
  struct Shared {
    CallerClock clock;
    std::unique_ptr<Store> store = NewMemoryStore(clock);
  };
  auto shared = std::make_shared<Shared>();
  return [shared](Clock& clock) -> std::unique_ptr<Store> {
    return std::make_unique<CallerClockView>(shared, *shared->store, clock);
  };
}

std::unique_ptr<Store> OpenOrFail(std::shared_ptr<void> keep, const std::string& url,
                                  Clock& clock) {
  auto store = OpenStore(url, clock);
  if (!store) {
    ADD_FAILURE() << "OpenStore(" << url << "): " << store.error().ToString();
    return nullptr;
  }
  return std::make_unique<Owning>(std::move(keep), std::move(*store));
}

Opener SqliteOpener() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const char* base = std::getenv("TMPDIR");
      std::string tmpl = std::string(base && *base ? base : "/tmp") + "/idem_model_XXXXXX";
      if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  auto dir = std::make_shared<Dir>();
  return [dir](Clock& clock) {
    return OpenOrFail(dir, "sqlite:" + (dir->path / "model.db").string(), clock);
  };
}

// The URL a CTest fixture wrote into the file named by `env`, or "" after recording a failure.
std::string FixtureUrl(const char* env) {
  const char* file = std::getenv(env);
  if (file == nullptr || *file == '\0') {
    ADD_FAILURE() << env << " is not set: run this test through ctest, whose fixture starts the "
                  << "server (tests/servers/redis.sh, tests/servers/postgres.sh)";
    return "";
  }
  std::ifstream in(file);
  std::string url;
  std::getline(in, url);
  while (!url.empty() && (url.back() == ' ' || url.back() == '\r')) url.pop_back();
  if (url.empty()) ADD_FAILURE() << "no URL in " << file << ": the fixture's server did not start";
  return url;
}

std::string WithOption(const std::string& url, const std::string& option) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + option;
}

Opener RedisOpener(const char* env) {
  const std::string url = FixtureUrl(env);
  if (url.empty()) return nullptr;
  const std::string prefixed =
      WithOption(url, "prefix=ledger-model-" + std::to_string(::getpid()) + ":");
  return [prefixed](Clock& clock) { return OpenOrFail(nullptr, prefixed, clock); };
}

Opener PostgresOpener() {
  const std::string url = FixtureUrl("IDEM_POSTGRES_URL_FILE");
  if (url.empty()) return nullptr;
  // A schema of its own, dropped once every instance's store has closed.
  struct Schema {
    std::string url, name;
    ~Schema() {
      PGconn* c = PQconnectdb(url.c_str());
      PQsetNoticeReceiver(c, [](void*, const PGresult*) {}, nullptr);
      PQclear(PQexec(c, ("DROP SCHEMA IF EXISTS \"" + name + "\" CASCADE").c_str()));
      PQfinish(c);
    }
  };
  auto schema = std::make_shared<Schema>();
  schema->url = url;
  schema->name = "ledger_model_" + std::to_string(::getpid());
  return [schema](Clock& clock) {
    return OpenOrFail(schema, WithOption(schema->url, "schema=" + schema->name), clock);
  };
}

// Each instance's view under a replay cache of its own, as every front stacks it (§5).
Opener Cached(Opener open) {
  if (!open) return nullptr;
  return [open](Clock& clock) -> std::unique_ptr<Store> {
    auto store = open(clock);
    if (!store) return nullptr;
    return testing::WithReplayCache(std::move(store), clock);
  };
}

// One instance's way to the store: injects the schedule's faults. Record operations of the test
// thread are counted and traced per step; the fault plan fails the n-th of them, either before it
// reaches the store or after the store applied it (the reply is lost). While `down`, every
// operation of any thread fails unapplied. The keeper thread's abandons are never failed by the
// plan; those that delete a record are counted so that the test can wait for one.
class FaultStore final : public testing::StoreWrapper {
 public:
  explicit FaultStore(std::unique_ptr<Store> view)
      : StoreWrapper(*view), view_(std::move(view)), main_(std::this_thread::get_id()) {}

  Store& inner() { return *view_; }
  void set_down(bool down) { down_ = down; }
  void Arm(int fail_at, bool lost_reply) {
    fail_at_ = fail_at;
    lost_reply_ = lost_reply;
    ops_ = 0;
    trace_.clear();
  }
  std::vector<std::string> Disarm() {
    fail_at_ = 0;
    return std::move(trace_);
  }
  int abandoned() {
    std::lock_guard g(mu_);
    return abandoned_;
  }
  // Blocks until more than `n` abandons deleted a record; false after 60 s (a hang guard for a
  // claim that is never taken back, not a timing assertion).
  bool AwaitAbandoned(int n) {
    std::unique_lock g(mu_);
    return cv_.wait_for(g, 60s, [&] { return abandoned_ > n; });
  }

  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    return Op<ClaimResult>("Claim", [&] { return target_.Claim(req); });
  }
  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    return Op<TimePoint>("Heartbeat", [&] { return target_.Heartbeat(id, fence, lease); });
  }
  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    return Op<Record>("Complete",
                      [&] { return target_.Complete(id, fence, outcome, retention, logged); });
  }
  Result<void> Release(const RecordId& id, uint64_t fence) override {
    return Op<void>("Release", [&] { return target_.Release(id, fence); });
  }
  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    return Op<Record>("MarkUnknown", [&] { return target_.MarkUnknown(id, fence, retention); });
  }
  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    return Op<Record>("TakeOver", [&] { return target_.TakeOver(id, fence, lease); });
  }
  Result<std::optional<Record>> Get(const RecordId& id) override {
    return Op<std::optional<Record>>("Get", [&] { return target_.Get(id); });
  }
  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    return Op<void>("WaitForChange", [&] { return target_.WaitForChange(id, seen, deadline); });
  }
  Result<bool> Evict(const RecordId& id) override {
    return Op<bool>("Evict", [&] { return target_.Evict(id); });
  }
  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    if (down_) return Down<void>();
    auto r = target_.Abandon(id, owner);
    if (r) {
      std::lock_guard g(mu_);
      ++abandoned_;
      cv_.notify_all();
    }
    return r;
  }
  bool GetAsync(const RecordId&, GetDone) override { return false; }

 private:
  template <typename T>
  static Result<T> Down() {
    return std::unexpected(
        Error{ErrorCode::kUnavailable, "injected: the store is unreachable", /*unreached=*/true});
  }
  template <typename T, typename F>
  Result<T> Op(const char* name, F&& forward) {
    if (std::this_thread::get_id() != main_) {
      if (down_) return Down<T>();
      return forward();
    }
    trace_.push_back(name);
    const int n = ++ops_;
    if (down_) return Down<T>();
    if (n == fail_at_) {
      if (lost_reply_) (void)forward();
      // Refused before it was sent: not reached; applied with its reply lost:
      // reached, and something was written (error.h, Error::unreached).
      return std::unexpected(Error{ErrorCode::kUnavailable,
                                   lost_reply_ ? "injected: applied, but the reply was lost"
                                               : "injected: refused before it was sent",
                                   /*unreached=*/!lost_reply_});
    }
    return forward();
  }

  std::unique_ptr<Store> view_;
  const std::thread::id main_;
  std::atomic<bool> down_{false};
  int fail_at_ = 0;  // test thread only
  bool lost_reply_ = false;
  int ops_ = 0;
  std::vector<std::string> trace_;
  std::mutex mu_;
  std::condition_variable cv_;
  int abandoned_ = 0;
};

// The instances' clocks and stores, kept for every schedule of one test (each schedule has a
// tenant of its own). Stores are declared after the clocks they use.
struct World {
  std::vector<std::unique_ptr<FakeClock>> clocks;
  std::vector<std::unique_ptr<FaultStore>> stores;
  // Whether the schedule may evict: not above a replay cache, which hears of an eviction through
  // another process only a moment later (the window caching_store.h documents).
  bool evictions = true;
  // Whether the instances' clocks disagree. Not above a replay cache: a cache judges a completed
  // record live by its own clock, while an instance whose clock is ahead may already have
  // replaced it (LedgerModelRegression.DISABLED_ReplayCacheOutlivesARecordReplacedByAFasterClock).
  bool skew = true;
};

// ------------------------------------------------------------------------------------------------
// The reference model

std::string Str(DKind k) { return std::string(DecisionKindName(k)); }
std::string Str(ErrorCode c) { return std::string(ErrorCodeName(c)); }
std::string Str(RecordState s) { return std::string(RecordStateName(s)); }
std::string Str(const Outcome& o) {
  return std::string(OutcomeClassName(o.cls)) + ":\"" + o.body + "\"";
}
std::string Str(EKind k) {
  switch (k) {
    case EKind::kSuccess: return "success";
    case EKind::kToolError: return "tool_error";
    case EKind::kNotSent: return "not_sent";
    case EKind::kMaybeSent: return "maybe_sent";
    case EKind::kInterim: return "interim";
  }
  return "?";
}
std::string Str(SKind k) {
  switch (k) {
    case SKind::kStored: return "stored";
    case SKind::kReleased: return "released";
    case SKind::kUnknown: return "unknown";
  }
  return "?";
}
std::string Str(OnUnknown v) { return std::string(OnUnknownName(v)); }
std::string Ms(TimePoint t, TimePoint base) { return std::to_string((t - base).count()) + "ms"; }

// The store's record as the model knows it. `gen` names one ownership (a claim or take-over): the
// model cannot know fence numbers in advance, so it learns each generation's fence when it first
// sees it and checks that fences grow with generations.
struct ModelRecord {
  RecordState state = RecordState::kInProgress;
  uint64_t gen = 0;
  std::string fingerprint, tool;
  TimePoint lease_expires_at{}, expires_at{};
  std::optional<Outcome> outcome;
};

struct KeyState {
  RecordId id;
  Policy policy;
  bool turn_fallback = false;
  std::optional<ModelRecord> rec;  // as stored; live for a caller while expires_at > its now
  bool released = false;           // rec is absent because it was released (the life goes on)
  uint64_t gens = 0;
  std::map<uint64_t, uint64_t> fences;  // generation → fence seen
  // The key's life: from a claim over no record (or an expired one) until it expires.
  int life = 0;
  int runs = 0;                         // real executions in this life
  std::optional<Outcome> first_result;  // what the first of them produced (the lookup's answer)
  std::string justified;                // the policy that allows more than one, if any
  // Oracle: the outcome the store accepted first in this life, and until when it lives.
  std::optional<Outcome> durable;
  TimePoint durable_expires{};

  Duration retention() const {
    return turn_fallback ? std::min(policy.window, policy.ttl) : policy.ttl;
  }
  bool Live(TimePoint now) const { return rec && rec->expires_at > now; }
};

Outcome Storable(const Policy& p, Outcome o) {
  if (o.body.size() > p.max_result_bytes) return Outcome{OutcomeClass::kTooLarge, {}};
  return o;
}

// The store's answer to a write conditional on `gen` at `now`, allowed in `states` (store.h).
std::optional<ErrorCode> Owned(const KeyState& k, uint64_t gen, TimePoint now,
                               std::initializer_list<RecordState> states) {
  if (!k.Live(now)) return ErrorCode::kNotFound;
  if (k.rec->gen != gen) return ErrorCode::kAborted;
  if (std::find(states.begin(), states.end(), k.rec->state) == states.end()) {
    return ErrorCode::kFailedPrecondition;
  }
  return std::nullopt;
}

// Simulates the store operations of one step under the step's fault plan.
struct OpSim {
  int fail_at = 0;
  bool lost_reply = false;
  bool down = false;
  std::vector<std::string> ops;
  struct R {
    bool applied;  // the store ran it
    bool failed;   // the caller got kUnavailable
  };
  R Next(const char* name) {
    ops.push_back(name);
    const int n = static_cast<int>(ops.size());
    if (down) return {false, true};
    if (n == fail_at) return {lost_reply, true};
    return {true, false};
  }
};

enum class HookMode { kTruth, kCannotTell };

// The lookup of on_unknown = reconcile: truthful when it answers at all.
Result<std::optional<Outcome>> HookAnswer(const KeyState& k, HookMode mode) {
  if (mode == HookMode::kCannotTell) {
    return MakeError(ErrorCode::kDeadlineExceeded, "lookup: cannot tell");
  }
  if (k.runs > 0) return std::optional<Outcome>(*k.first_result);
  return std::optional<Outcome>();
}

struct ExpectedBegin {
  std::optional<ErrorCode> error;
  DKind kind = DKind::kExecute;
  bool took_over = false, reconciled = false, drift = false;
  bool hook_called = false;
  bool await_abandon = false;  // a claim applied with its reply lost: the keeper takes it back
};

// Begin (ledger.cc) as §4 describes it, with policy.wait = 0. Mutates `k` into the state after.
ExpectedBegin PredictBegin(KeyState& k, const Call& call, TimePoint now, OpSim& sim,
                           HookMode hook) {
  ExpectedBegin e;
  const Policy& p = k.policy;
  const Duration retention = k.retention();
  const bool pass = p.on_store_down == OnStoreDown::kPass;
  auto fresh_claim = [&] {
    if (k.rec ? k.rec->expires_at <= now : !k.released) {  // a new life
      ++k.life;
      k.runs = 0;
      k.first_result.reset();
      k.justified.clear();
      k.durable.reset();
    }
    ModelRecord r;
    r.state = RecordState::kInProgress;
    r.gen = ++k.gens;
    r.fingerprint = call.fingerprint;
    r.tool = call.tool;
    r.lease_expires_at = now + p.lease;
    r.expires_at = now + std::max(retention, p.lease);
    k.rec = r;
    k.released = false;
  };
  auto failed = [&](ErrorCode code = ErrorCode::kUnavailable) {
    e.error = code;
    return e;
  };

  const bool live = k.Live(now);
  auto claim = sim.Next("Claim");
  if (claim.failed) {
    // Only a store that was not reached passes: an applied claim may stand.
    const bool passes = pass && !claim.applied;
    if (claim.applied && !live) {
      fresh_claim();
      if (!passes) {  // taken back by the keeper (§4 step 1)
        e.await_abandon = true;
        k.rec.reset();
        k.released = true;
      }
    }
    if (passes) {
      e.kind = DKind::kPassThrough;
      return e;
    }
    return failed();
  }
  if (!live) {
    fresh_claim();
    e.kind = DKind::kExecute;
    return e;
  }
  ModelRecord& r = *k.rec;
  const bool drifted = r.fingerprint != call.fingerprint;
  const bool other_tool = r.tool != call.tool;
  if (other_tool || (drifted && p.on_drift == OnDrift::kReject)) {
    e.kind = DKind::kDrift;
    return e;
  }
  if (r.state == RecordState::kCompleted) {
    e.kind = DKind::kReplay;
    e.drift = drifted;
    return e;
  }
  if (r.state == RecordState::kUnknown && p.on_unknown == OnUnknown::kFail) {
    e.kind = DKind::kUnknown;
    return e;
  }
  if (r.state == RecordState::kInProgress && r.lease_expires_at > now) {
    e.kind = DKind::kInProgress;
    return e;
  }
  // The owner is gone (§4 step 4).
  auto mark_unknown = [&]() -> ExpectedBegin {
    if (r.state == RecordState::kUnknown) {  // reconcile could not tell again: nothing written
      e.kind = DKind::kUnknown;
      e.took_over = false;
      return e;
    }
    auto op = sim.Next("MarkUnknown");
    if (op.applied) {
      r.state = RecordState::kUnknown;
      r.expires_at = now + retention;
    }
    if (op.failed) return failed();
    e.kind = DKind::kUnknown;
    e.took_over = false;  // a decision of its own (OnOwnerGone's `unknown`)
    return e;
  };
  if (p.on_unknown == OnUnknown::kFail) return mark_unknown();
  auto take_over = [&]() -> ExpectedBegin {
    auto take = sim.Next("TakeOver");
    if (take.applied) {
      r.state = RecordState::kInProgress;
      r.gen = ++k.gens;
      r.lease_expires_at = now + p.lease;
      r.expires_at = std::max(r.expires_at, r.lease_expires_at);
    }
    if (take.failed) return failed();
    e.kind = DKind::kExecute;
    e.took_over = true;
    return e;
  };
  if (p.on_unknown == OnUnknown::kRetry) {
    auto taken = take_over();
    if (!taken.error && k.justified.empty()) k.justified = "on_unknown=retry took it over";
    return taken;
  }
  // Reconcile asks first and keeps the owner's fence unless the lookup says
  // "never happened" (guarantees F3).
  e.hook_called = true;
  auto found = HookAnswer(k, hook);
  if (!found) return mark_unknown();
  if (!found->has_value()) return take_over();
  auto complete = sim.Next("Complete");
  if (complete.applied) {
    r.state = RecordState::kCompleted;
    r.outcome = **found;  // the hook's outcome is stored as it is
    r.expires_at = now + retention;
    k.durable = r.outcome;
    k.durable_expires = r.expires_at;
  }
  if (complete.failed) return failed();
  e.took_over = false;
  e.kind = DKind::kReplay;
  e.reconciled = true;
  return e;
}

// One execution in flight: a kExecute (or kPassThrough) that its instance has not settled.
struct Exec {
  int id = 0;
  int inst = 0;
  int key = 0;
  bool passthrough = false;
  uint64_t gen = 0;
  Call call;
  Decision decision;
  bool ran = false;
  Outcome result;  // what the upstream produced, once it ran
  // A Settle that failed with kUnavailable (retryable, error.h) that the front sends again.
  std::optional<EKind> retry;
};

struct ExpectedWrite {
  std::optional<ErrorCode> error;
  SKind kind = SKind::kStored;
  std::optional<Outcome> stored;
};

// A fence-conditional write of `exec` (Complete / Release / MarkUnknown / Heartbeat).
enum class Write { kComplete, kRelease, kMarkUnknown, kHeartbeat };

ExpectedWrite PredictWrite(KeyState& k, const Exec& x, Write w, TimePoint now, OpSim& sim,
                           const Outcome& outcome = {}, bool tool_error_released = false) {
  ExpectedWrite e;
  const char* name = w == Write::kComplete      ? "Complete"
                     : w == Write::kRelease     ? "Release"
                     : w == Write::kMarkUnknown ? "MarkUnknown"
                                                : "Heartbeat";
  auto op = sim.Next(name);
  std::optional<ErrorCode> refused;
  switch (w) {
    case Write::kComplete:
    case Write::kRelease:
      refused = Owned(k, x.gen, now, {RecordState::kInProgress, RecordState::kUnknown});
      break;
    case Write::kMarkUnknown:
    case Write::kHeartbeat:
      refused = Owned(k, x.gen, now, {RecordState::kInProgress});
      break;
  }
  if (op.applied && !refused) {
    ModelRecord& r = *k.rec;
    switch (w) {
      case Write::kComplete:
        r.state = RecordState::kCompleted;
        r.outcome = Storable(k.policy, outcome);
        r.expires_at = now + k.retention();
        if (!k.durable) {
          k.durable = r.outcome;
          k.durable_expires = r.expires_at;
        }
        break;
      case Write::kRelease:
        k.rec.reset();
        k.released = true;
        if (tool_error_released && k.justified.empty()) {
          k.justified = "errors=release released a tool error";
        }
        break;
      case Write::kMarkUnknown:
        r.state = RecordState::kUnknown;
        r.expires_at = now + k.retention();
        break;
      case Write::kHeartbeat:
        r.lease_expires_at = now + k.policy.lease;
        r.expires_at = std::max(r.expires_at, r.lease_expires_at);
        break;
    }
  }
  if (op.failed) {
    e.error = ErrorCode::kUnavailable;
  } else if (refused) {
    e.error = refused;
  }
  if (w == Write::kComplete) e.stored = Storable(k.policy, outcome);
  return e;
}

// ------------------------------------------------------------------------------------------------
// Figures

struct Figures {
  uint64_t schedules = 0, steps = 0, executions = 0, duplicates = 0, lost = 0;
  uint64_t allowed_repeats = 0;  // runs beyond the first that a policy allows
  uint64_t begins = 0, settles = 0, heartbeats = 0, kills = 0, faults = 0, errors = 0;
  std::map<std::string, uint64_t> decisions;
  std::map<std::string, uint64_t> events;  // paths taken, to show what the schedules covered

  void Add(const Figures& o) {
    schedules += o.schedules;
    steps += o.steps;
    executions += o.executions;
    duplicates += o.duplicates;
    lost += o.lost;
    allowed_repeats += o.allowed_repeats;
    begins += o.begins;
    settles += o.settles;
    heartbeats += o.heartbeats;
    kills += o.kills;
    faults += o.faults;
    errors += o.errors;
    for (const auto& [k, v] : o.decisions) decisions[k] += v;
    for (const auto& [k, v] : o.events) events[k] += v;
  }
};

// ------------------------------------------------------------------------------------------------
// One schedule

class Schedule {
 public:
  Schedule(World& world, std::string store, uint64_t seed, int steps)
      : w_(world), store_(std::move(store)), seed_(seed), steps_(steps), rng_(seed) {}
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  ~Schedule() {
    ledgers_.clear();
    for (auto& s : w_.stores) s->set_down(false);
  }

  // False when a check failed: then Report() says which, with the schedule so far.
  bool Run() {
    Setup();
    fig_.schedules = 1;
    for (int n = 1; n <= steps_; ++n) {
      step_ = n;
      ++fig_.steps;
      if (!Step()) return false;
    }
    // Every key, read back by every instance's clock.
    for (int i = 0; i < kInstances; ++i) {
      for (int k = 0; k < kKeys; ++k) {
        if (!Probe(k, i)) return false;
      }
    }
    return true;
  }

  const Figures& figures() const { return fig_; }
  std::string Report() const {
    std::ostringstream out;
    out << "store " << store_ << ", seed " << seed_ << ", tenant " << tenant_ << ":\n";
    for (const auto& [k, p] : policies_) out << "  " << p << "\n";
    out << "schedule (" << step_ << " steps):\n";
    for (const auto& l : log_) out << "  " << l << "\n";
    if (!failure_.empty()) {
      out << "FAILED at step " << step_ << ": " << failure_ << "\n";
      out << "replay: IDEM_MODEL_SEED=" << seed_ << " IDEM_MODEL_STEPS=" << steps_
          << " (ctest -R LedgerModel, or the test binary with --gtest_filter)\n";
    }
    return out.str();
  }

 private:
  // -------------------------------------------------------------------------- set-up
  void Setup() {
    tenant_ = "model-" + store_ + "-" + std::to_string(::getpid()) + "-" + std::to_string(seed_);
    // Clocks: later than anything an earlier schedule wrote, skewed by up to ±kMaxSkew.
    TimePoint latest{};
    for (auto& c : w_.clocks) latest = std::max(latest, c->Now());
    base_ = latest + Duration(2 * 86'400'000);
    for (int i = 0; i < kInstances; ++i) {
      const Duration skew =
          (Duration(static_cast<int64_t>(rng_.Below(2 * kMaxSkew.count() + 1))) - kMaxSkew) *
          (w_.skew ? 1 : 0);
      w_.clocks[i]->Advance(base_ + skew - w_.clocks[i]->Now());
      w_.stores[i]->set_down(false);
      down_[i] = false;
    }
    for (int k = 0; k < kKeys; ++k) {
      KeyState& s = keys_[k];
      // Two tenants with the same key names: records never cross tenants (§2).
      s.id = RecordId{tenant_ + (k % 2 == 0 ? "-a" : "-b"), "key" + std::to_string(k / 2)};
      Policy& p = s.policy;
      p.wait = Duration(0);
      p.lease = rng_.Pick({Duration(4000), Duration(10'000), Duration(30'000)});
      p.ttl = rng_.Pick({Duration(30'000), Duration(120'000), Duration(86'400'000)});
      p.window = Duration(20'000);
      p.on_unknown = rng_.Pick({OnUnknown::kFail, OnUnknown::kRetry, OnUnknown::kReconcile});
      p.errors = rng_.Percent(25) ? ErrorPolicy::kRelease : ErrorPolicy::kStore;
      p.on_drift = rng_.Percent(30) ? OnDrift::kReplay : OnDrift::kReject;
      p.on_store_down = rng_.Percent(15) ? OnStoreDown::kPass : OnStoreDown::kFail;
      p.max_result_bytes = rng_.Percent(20) ? 24 : (1u << 20);
      s.turn_fallback = rng_.Percent(15);
      std::ostringstream d;
      d << "k" << k << " (" << s.id.tenant << "/" << s.id.key << "): lease=" << p.lease.count() << "ms ttl=" << p.ttl.count()
        << "ms turn_fallback=" << s.turn_fallback << " (retention " << s.retention().count()
        << "ms) on_unknown=" << Str(p.on_unknown) << " errors=" << ErrorPolicyName(p.errors)
        << " on_drift=" << OnDriftName(p.on_drift)
        << " on_store_down=" << OnStoreDownName(p.on_store_down)
        << " max_result_bytes=" << p.max_result_bytes;
      policies_[k] = d.str();
    }
    std::ostringstream c;
    c << "clocks: base " << ToUnixMillis(base_) << " ms;";
    for (int i = 0; i < kInstances; ++i) c << " i" << i << " " << Ms(Now(i), base_);
    policies_[kKeys] = c.str();
    for (int i = 0; i < kInstances; ++i) ledgers_.push_back(MakeLedger(i));
  }

  std::unique_ptr<Ledger> MakeLedger(int i) {
    LedgerOptions o;
    o.instance = "i" + std::to_string(i);
    o.audit = false;
    o.reconcile = [this](const Call& call) { return Reconcile(call); };
    return std::make_unique<Ledger>(*w_.stores[i], *w_.clocks[i], std::move(o));
  }

  Result<std::optional<Outcome>> Reconcile(const Call& call) {
    ++hook_calls_;
    for (const KeyState& k : keys_) {
      if (k.id == call.id) return HookAnswer(k, hook_mode_);
    }
    ADD_FAILURE() << "reconcile hook asked about an unknown key " << call.id.key;
    return MakeError(ErrorCode::kInternal, "unknown key");
  }

  TimePoint Now(int i) { return w_.clocks[i]->Now(); }

  bool Fail(std::string why) {
    if (failure_.empty()) failure_ = std::move(why);
    return false;
  }

  void Log(std::string line) {
    log_.push_back("#" + std::to_string(step_) + " " + line);
  }

  struct FaultPlan {
    int at = 0;
    bool lost = false;
  };
  FaultPlan DrawFault() {
    FaultPlan f;
    if (rng_.Percent(12)) {
      const uint64_t r = rng_.Below(10);
      f.at = r < 5 ? 1 : r < 8 ? 2 : 3;
      f.lost = rng_.Percent(50);
      ++fig_.faults;
    }
    return f;
  }
  static std::string Describe(const FaultPlan& f) {
    if (f.at == 0) return "";
    return std::string(" fault@op") + std::to_string(f.at) + (f.lost ? "(reply lost)" : "(refused)");
  }
  std::string Down(int i) const { return down_[i] ? " [i" + std::to_string(i) + " cut off]" : ""; }

  Call MakeCall(int k, bool drift, bool other_tool) {
    Call c;
    c.id = keys_[k].id;
    c.fingerprint = "fp-" + keys_[k].id.key + (drift ? "-b" : "-a");  // the same in both tenants
    c.tool = other_tool ? "tool-b" : "tool-a";
    c.turn = "turn-1";
    c.policy = keys_[k].policy;
    c.turn_fallback = keys_[k].turn_fallback;
    return c;
  }

  // -------------------------------------------------------------------------- checks
  std::string Where(int k) const { return "k" + std::to_string(k); }

  // Generation `gen` of key `k` was seen with `fence`.
  bool Observe(int k, uint64_t gen, uint64_t fence, const std::string& where) {
    auto& fences = keys_[k].fences;
    if (auto it = fences.find(gen); it != fences.end()) {
      if (it->second != fence) {
        return Fail(where + ": generation " + std::to_string(gen) + " of " + Where(k) +
                    " had fence " + std::to_string(it->second) + ", now " + std::to_string(fence));
      }
      return true;
    }
    auto after = fences.upper_bound(gen);
    if (after != fences.end() && after->second <= fence) {
      return Fail(where + ": fence " + std::to_string(fence) + " of generation " +
                  std::to_string(gen) + " is not below the later generation's " +
                  std::to_string(after->second));
    }
    if (after != fences.begin() && std::prev(after)->second >= fence) {
      return Fail(where + ": fence did not grow: " + std::to_string(fence) + " after " +
                  std::to_string(std::prev(after)->second));
    }
    fences.emplace(gen, fence);
    return true;
  }

  // A record the store returned, against the model's `m` of key `k`.
  bool SameRecord(int k, const Record& got, const ModelRecord& m, const std::string& where) {
    auto bad = [&](const std::string& what, const std::string& want, const std::string& have) {
      return Fail(where + ": " + Where(k) + " " + what + ": model " + want + ", store " + have);
    };
    if (got.id != keys_[k].id) return bad("id", keys_[k].id.key, got.id.key);
    if (got.state != m.state) return bad("state", Str(m.state), Str(got.state));
    if (got.fingerprint != m.fingerprint) return bad("fingerprint", m.fingerprint, got.fingerprint);
    if (got.tool != m.tool) return bad("tool", m.tool, got.tool);
    if (got.expires_at != m.expires_at) {
      return bad("expires_at", Ms(m.expires_at, base_), Ms(got.expires_at, base_));
    }
    if (m.state == RecordState::kInProgress && got.lease_expires_at != m.lease_expires_at) {
      return bad("lease_expires_at", Ms(m.lease_expires_at, base_),
                 Ms(got.lease_expires_at, base_));
    }
    if (m.state == RecordState::kCompleted && got.outcome != m.outcome) {
      return bad("outcome", m.outcome ? Str(*m.outcome) : "none",
                 got.outcome ? Str(*got.outcome) : "none");
    }
    return Observe(k, m.gen, got.fence, where);
  }

  // Reads key `k` back (below the faults) by instance `p`'s clock and compares it with the model.
  bool Probe(int k, int p) {
    const KeyState& s = keys_[k];
    const TimePoint now = Now(p);
    auto got = w_.stores[p]->inner().Get(s.id);
    const std::string where = "read back by i" + std::to_string(p);
    if (!got) return Fail(where + ": Get(" + Where(k) + "): " + got.error().ToString());
    const bool durable_live = s.durable && s.durable_expires > now;
    if (durable_live && !(got->has_value() && (*got)->state == RecordState::kCompleted &&
                          (*got)->outcome == s.durable)) {
      ++fig_.lost;
      return Fail(where + ": LOST the completed outcome " + Str(*s.durable) + " of " + Where(k) +
                  " before it expires at " + Ms(s.durable_expires, base_));
    }
    if (s.Live(now) != got->has_value()) {
      return Fail(where + ": " + Where(k) + " is " + (s.Live(now) ? "live" : "absent") +
                  " in the model, " + (got->has_value() ? Str((*got)->state) : "absent") +
                  " in the store");
    }
    if (!got->has_value()) return true;
    return SameRecord(k, **got, *s.rec, where);
  }

  // -------------------------------------------------------------------------- steps
  bool Step() {
    if (std::any_of(down_.begin(), down_.end(), [](bool d) { return d; }) && rng_.Percent(25)) {
      return Heal();
    }
    // Steps that need an execution in flight fall back to Begin or Advance without one.
    const uint64_t r = rng_.Below(100);
    if (r < 36) return Begin();
    if (r < 58) return Settle();
    if (r < 66) return HeartbeatStep();
    if (r < 69) return ReleaseStep();
    if (r < 78) return RunStep();
    if (r < 80) return Kill();
    if (r < 94) return Advance();
    if (r < 97) return Operator();
    return CutOff();
  }

  bool Begin() {
    ++fig_.begins;
    const int i = static_cast<int>(rng_.Below(kInstances));
    const int k = static_cast<int>(rng_.Below(kKeys));
    const bool drift = rng_.Percent(8);
    const bool other_tool = rng_.Percent(3);
    const FaultPlan f = DrawFault();
    const HookMode hook = rng_.Percent(33) ? HookMode::kCannotTell : HookMode::kTruth;
    const Call call = MakeCall(k, drift, other_tool);
    const TimePoint now = Now(i);
    std::string line = "i" + std::to_string(i) + " Begin " + Where(k) + (drift ? " drifted" : "") +
                       (other_tool ? " other-tool" : "") + Describe(f) + Down(i) +
                       (hook == HookMode::kCannotTell ? " lookup=cannot-tell" : "");

    KeyState& key = keys_[k];
    KeyState next = key;
    OpSim sim{f.at, f.lost, down_[i], {}};
    const ExpectedBegin e = PredictBegin(next, call, now, sim, hook);
    const bool durable_live = key.durable && key.durable_expires > now;
    const bool rejected_drift = key.rec && (key.rec->tool != call.tool ||
                                            (key.rec->fingerprint != call.fingerprint &&
                                             key.policy.on_drift == OnDrift::kReject));

    FaultStore& fs = *w_.stores[i];
    const int abandoned_before = fs.abandoned();
    hook_mode_ = hook;
    hook_calls_ = 0;
    fs.Arm(f.at, f.lost);
    auto got = ledgers_[i]->Begin(call);
    const std::vector<std::string> trace = fs.Disarm();

    line += " -> " + (got ? Str(got->kind) + (got->took_over ? " took_over" : "") +
                                (got->reconciled ? " reconciled" : "") +
                                (got->drift ? " drift" : "") +
                                (got->kind == DKind::kExecute
                                     ? " fence " + std::to_string(got->fence)
                                     : "") +
                                (got->kind == DKind::kReplay && got->record.outcome
                                     ? " " + Str(*got->record.outcome)
                                     : "")
                          : "error " + Str(got.error().code));
    line += "  [store: " + Join(trace) + "]";
    Log(line);
    fig_.decisions[got ? Str(got->kind) : "error"]++;

    // The answer is the first outcome or an explicit condition (the oracle, apart from the model).
    if (durable_live) {
      const bool ok = got ? (got->kind == DKind::kReplay && got->record.outcome == key.durable) ||
                                (got->kind == DKind::kDrift && rejected_drift) ||
                                (got->kind == DKind::kPassThrough &&
                                 key.policy.on_store_down == OnStoreDown::kPass &&
                                 (f.at == 1 || down_[i]))
                          : f.at != 0 || down_[i];
      if (!ok) {
        ++fig_.lost;
        return Fail("LOST: " + Where(k) + " completed with " + Str(*key.durable) +
                    " (until " + Ms(key.durable_expires, base_) + "), but Begin answered " +
                    (got ? Str(got->kind) +
                               (got->record.outcome ? " " + Str(*got->record.outcome) : "")
                         : got.error().ToString()));
      }
    }
    // Against the model.
    if (!down_[i] && trace != sim.ops) {
      return Fail("store operations: model [" + Join(sim.ops) + "], ledger [" + Join(trace) + "]");
    }
    if (hook_calls_ != (e.hook_called ? 1 : 0)) {
      return Fail("reconcile hook called " + std::to_string(hook_calls_) + " times, model " +
                  (e.hook_called ? "1" : "0"));
    }
    if (e.error) {
      if (got) return Fail("model: error " + Str(*e.error) + ", ledger: " + Str(got->kind));
      if (got.error().code != *e.error) {
        return Fail("model: error " + Str(*e.error) + ", ledger: " + got.error().ToString());
      }
      ++fig_.errors;
    } else {
      if (!got) return Fail("model: " + Str(e.kind) + ", ledger: " + got.error().ToString());
      const Decision& d = *got;
      if (d.kind != e.kind) return Fail("model: " + Str(e.kind) + ", ledger: " + Str(d.kind));
      if (d.took_over != e.took_over || d.reconciled != e.reconciled || d.drift != e.drift ||
          d.attached) {
        return Fail("flags: model took_over/reconciled/drift " + std::to_string(e.took_over) +
                    std::to_string(e.reconciled) + std::to_string(e.drift) + ", ledger " +
                    std::to_string(d.took_over) + std::to_string(d.reconciled) +
                    std::to_string(d.drift) + " attached " + std::to_string(d.attached));
      }
      if (d.kind == DKind::kInProgress && d.retry_after != Duration(1000)) {
        return Fail("retry_after " + std::to_string(d.retry_after.count()) + "ms, model 1000ms");
      }
      if (d.kind != DKind::kPassThrough) {
        if (!next.rec) return Fail("model has no record after " + Str(d.kind));
        if (!SameRecord(k, d.record, *next.rec, "Begin's record")) return false;
        if (d.kind == DKind::kExecute && d.fence != d.record.fence) {
          return Fail("kExecute fence " + std::to_string(d.fence) + " but record fence " +
                      std::to_string(d.record.fence));
        }
      }
      if (d.kind == DKind::kExecute || d.kind == DKind::kPassThrough) {
        Exec x;
        x.id = next_exec_++;
        x.inst = i;
        x.key = k;
        x.passthrough = d.kind == DKind::kPassThrough;
        x.gen = x.passthrough ? 0 : next.rec->gen;
        x.call = call;
        x.decision = d;
        execs_.push_back(std::move(x));
      }
    }
    if (got && got->took_over) ++fig_.events["took_over"];
    if (got && got->reconciled) ++fig_.events["reconciled"];
    if (got && got->drift) ++fig_.events["drift_replayed"];
    if (e.await_abandon) ++fig_.events["lost_claim_abandoned"];
    if (next.life != key.life && key.life > 0) ++fig_.events["new_life_after_expiry"];
    if (got && got->kind == DKind::kReplay && got->record.outcome &&
        got->record.outcome->cls == OutcomeClass::kTooLarge) {
      ++fig_.events["too_large_replayed"];
    }
    key = std::move(next);
    if (e.await_abandon && !fs.AwaitAbandoned(abandoned_before)) {
      return Fail("the claim whose reply was lost was never abandoned");
    }
    return Probe(k, ProbeInstance());
  }

  int ProbeInstance() { return step_ % kInstances; }

  static std::string Join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }

  // The upstream acts only while the caller's claim is current (see the top of this file).
  bool Permitted(const Exec& x) {
    if (x.ran || x.retry) return false;
    if (x.passthrough) return true;
    const KeyState& k = keys_[x.key];
    const TimePoint now = Now(x.inst);
    return k.Live(now) && k.rec->gen == x.gen && k.rec->state == RecordState::kInProgress &&
           k.rec->lease_expires_at > now;
  }

  // The simulated upstream performs the side effect of `x`.
  bool RunUpstream(Exec& x) {
    KeyState& k = keys_[x.key];
    if (x.passthrough && k.justified.empty()) k.justified = "on_store_down=pass ran it unguarded";
    if (x.passthrough) ++fig_.events["unguarded_runs"];
    ++fig_.executions;
    std::string line = "upstream runs exec " + std::to_string(x.id) + " (" + Where(x.key) + ", i" +
                       std::to_string(x.inst) + ")";
    if (k.runs > 0) {
      if (k.justified.empty()) {
        ++fig_.duplicates;
        Log(line + ": DUPLICATE");
        return Fail("DUPLICATE execution of " + Where(x.key) + " (life " + std::to_string(k.life) +
                    ", run " + std::to_string(k.runs + 1) + ") that no policy allows");
      }
      ++fig_.allowed_repeats;
      line += " again: allowed, " + k.justified;
    }
    ++k.runs;
    x.ran = true;
    std::string body = "k" + std::to_string(x.key) + ".life" + std::to_string(k.life) + ".run" +
                       std::to_string(k.runs) + ".i" + std::to_string(x.inst);
    if (k.policy.max_result_bytes < 100 && rng_.Percent(30)) body += std::string(40, 'x');
    x.result = Outcome{rng_.Percent(80) ? OutcomeClass::kSuccess : OutcomeClass::kToolError, body};
    if (!k.first_result) k.first_result = x.result;
    Log(line + " -> " + Str(x.result));
    return true;
  }

  Exec* PickExec(const std::function<bool(const Exec&)>& ok) {
    std::vector<Exec*> v;
    for (auto& x : execs_) {
      if (ok(x)) v.push_back(&x);
    }
    return v.empty() ? nullptr : v[rng_.Below(v.size())];
  }
  void Forget(const Exec* x) {
    const int id = x->id;
    std::erase_if(execs_, [id](const Exec& e) { return e.id == id; });
  }

  // A fence-conditional write by `x` through the Ledger, checked against the model.
  template <typename Real>
  bool WriteStep(Exec& x, Write w, const std::string& what, const FaultPlan& f, EKind kind,
                 Real real) {
    KeyState& key = keys_[x.key];
    const TimePoint now = Now(x.inst);
    KeyState next = key;
    OpSim sim{f.at, f.lost, down_[x.inst], {}};
    ExpectedWrite e;
    const bool released_tool_error =
        kind == EKind::kToolError && key.policy.errors == ErrorPolicy::kRelease;
    if (x.passthrough) {  // unguarded: nothing is written (ledger.cc)
      e.kind = w == Write::kComplete ? SKind::kStored
               : w == Write::kRelease ? SKind::kReleased
                                      : SKind::kUnknown;
      if (w == Write::kComplete) e.stored = x.result;
    } else {
      e = PredictWrite(next, x, w, now, sim, x.result, released_tool_error);
      e.kind = w == Write::kComplete ? SKind::kStored
               : w == Write::kRelease ? SKind::kReleased
                                      : SKind::kUnknown;
    }
    const bool durable_live = key.durable && key.durable_expires > now;
    FaultStore& fs = *w_.stores[x.inst];
    fs.Arm(f.at, f.lost);
    auto [ok, shown, err, settled] = real();
    const std::vector<std::string> trace = fs.Disarm();
    Log("i" + std::to_string(x.inst) + " " + what + " exec " + std::to_string(x.id) + " (" +
        Where(x.key) + ", fence " + std::to_string(x.decision.fence) + ")" + Describe(f) +
        Down(x.inst) + " -> " + (ok ? shown : "error " + Str(err.code)) + "  [store: " +
        Join(trace) + "]");
    // The oracle, apart from the model: a completed outcome is never replaced.
    if (ok && settled && settled->kind == SKind::kStored && !x.passthrough && durable_live) {
      ++fig_.lost;
      return Fail("CHANGED: " + Where(x.key) + " already completed with " + Str(*key.durable) +
                  ", and Settle stored " +
                  (settled->record.outcome ? Str(*settled->record.outcome) : "nothing"));
    }
    if (!down_[x.inst] && trace != sim.ops) {
      return Fail("store operations: model [" + Join(sim.ops) + "], ledger [" + Join(trace) + "]");
    }
    last_error_ = e.error;
    if (e.error) {
      if (ok) return Fail("model: error " + Str(*e.error) + ", ledger: " + shown);
      if (err.code != *e.error) {
        return Fail("model: error " + Str(*e.error) + ", ledger: " + err.ToString());
      }
      ++fig_.errors;
      if (*e.error != ErrorCode::kUnavailable) ++fig_.events["refused_" + Str(*e.error)];
    } else if (!ok) {
      return Fail("model: OK, ledger: " + err.ToString());
    } else if (settled) {
      const Settlement& s = *settled;
      if (s.kind != e.kind) return Fail("model: " + Str(e.kind) + ", ledger: " + Str(s.kind));
      if (s.kind == SKind::kStored && s.record.outcome != e.stored) {
        return Fail("stored outcome: model " + (e.stored ? Str(*e.stored) : "none") + ", ledger " +
                    (s.record.outcome ? Str(*s.record.outcome) : "none"));
      }
      if (!x.passthrough && s.kind != SKind::kReleased) {
        if (!next.rec) return Fail("model has no record after " + Str(s.kind));
        if (s.record.fence != x.decision.fence) {
          return Fail("settled record fence " + std::to_string(s.record.fence) + ", exec's " +
                      std::to_string(x.decision.fence));
        }
        if (!SameRecord(x.key, s.record, *next.rec, "Settle's record")) return false;
      }
    }
    if (ok && !x.passthrough && key.rec && key.rec->state == RecordState::kUnknown &&
        w == Write::kComplete) {
      ++fig_.events["completed_from_unknown"];
    }
    if (ok && w == Write::kHeartbeat && key.rec && key.rec->lease_expires_at <= now) {
      ++fig_.events["expired_lease_renewed"];
    }
    key = std::move(next);
    return true;
  }

  struct Outcome4 {
    bool ok;
    std::string shown;
    Error err;
    std::optional<Settlement> settled;
  };

  bool Settle() {
    ++fig_.settles;
    Exec* x = PickExec([](const Exec&) { return true; });
    if (x == nullptr) return Begin();
    const int k = x->key;
    if (!x->retry && !x->ran && Permitted(*x) && rng_.Percent(50)) {
      if (!RunUpstream(*x)) return false;
    }
    EKind kind;
    if (x->retry) {
      kind = *x->retry;
      ++fig_.events["settle_retried"];
    } else if (x->ran) {
      kind = rng_.Percent(15) ? EKind::kMaybeSent
             : x->result.cls == OutcomeClass::kSuccess ? EKind::kSuccess
                                                       : EKind::kToolError;
    } else {
      const uint64_t r = rng_.Below(100);
      kind = r < 40 ? EKind::kNotSent : r < 80 ? EKind::kMaybeSent : EKind::kInterim;
    }
    const FaultPlan f = DrawFault();
    const Policy& p = keys_[k].policy;
    const Write w = kind == EKind::kSuccess ||
                            (kind == EKind::kToolError && p.errors == ErrorPolicy::kStore)
                        ? Write::kComplete
                    : kind == EKind::kMaybeSent ? Write::kMarkUnknown
                                                : Write::kRelease;
    Exec& e = *x;
    Execution ex{kind, x->ran ? x->result.body : "(not run)"};
    bool ok = WriteStep(e, w, std::string(x->retry ? "retried " : "") + "Settle(" + Str(kind) + ")",
                        f, kind, [&] {
      auto r = ledgers_[e.inst]->Settle(e.call, e.decision, ex);
      if (!r) return Outcome4{false, "", r.error(), std::nullopt};
      std::string shown = Str(r->kind);
      if (r->kind == SKind::kStored && r->record.outcome) shown += " " + Str(*r->record.outcome);
      return Outcome4{true, shown, Error{}, *r};
    });
    if (!ok) return false;
    if (last_error_ == ErrorCode::kUnavailable && !x->passthrough && rng_.Percent(50)) {
      x->retry = kind;  // the front will send it again
    } else {
      Forget(x);  // answered (or failed): the front is done with it
    }
    return Probe(k, ProbeInstance());
  }

  bool HeartbeatStep() {
    ++fig_.heartbeats;
    Exec* x = PickExec([](const Exec& e) { return !e.passthrough && !e.retry; });
    if (x == nullptr) return Advance();
    const FaultPlan f = DrawFault();
    Exec& e = *x;
    const TimePoint want = Now(e.inst) + keys_[e.key].policy.lease;
    std::optional<TimePoint> got_lease;
    bool ok = WriteStep(e, Write::kHeartbeat, "Heartbeat", f, EKind::kSuccess, [&] {
      auto r = ledgers_[e.inst]->Heartbeat(e.call, e.decision.fence);
      if (!r) return Outcome4{false, "", r.error(), std::nullopt};
      got_lease = *r;
      return Outcome4{true, "lease until " + Ms(*r, base_), Error{}, std::nullopt};
    });
    if (!ok) return false;
    if (got_lease && *got_lease != want) {
      return Fail("heartbeat lease until " + Ms(*got_lease, base_) + ", model " + Ms(want, base_));
    }
    return Probe(e.key, ProbeInstance());
  }

  // The front releases a claim it did not use (the caller went away before it was sent).
  bool ReleaseStep() {
    Exec* x = PickExec([](const Exec& e) { return !e.passthrough && !e.ran && !e.retry; });
    if (x == nullptr) return Begin();
    const FaultPlan f = DrawFault();
    Exec& e = *x;
    const int k = e.key;
    bool ok = WriteStep(e, Write::kRelease, "Release", f, EKind::kNotSent, [&] {
      auto r = ledgers_[e.inst]->Release(e.call, e.decision);
      if (!r) return Outcome4{false, "", r.error(), std::nullopt};
      return Outcome4{true, "released", Error{}, std::nullopt};
    });
    if (!ok) return false;
    Forget(x);
    return Probe(k, ProbeInstance());
  }

  bool RunStep() {
    Exec* x = PickExec([this](const Exec& e) { return Permitted(e); });
    if (x == nullptr) return Advance();
    return RunUpstream(*x);
  }

  // Instance i dies: its executions are never settled (some reached the upstream first), its
  // leases run out, and it restarts with a new Ledger.
  bool Kill() {
    ++fig_.kills;
    const int i = static_cast<int>(rng_.Below(kInstances));
    Log("i" + std::to_string(i) + " killed and restarted");
    for (auto& x : execs_) {
      if (x.inst == i && Permitted(x) && rng_.Percent(50)) {
        if (!RunUpstream(x)) return false;
      }
    }
    std::erase_if(execs_, [i](const Exec& e) { return e.inst == i; });
    ledgers_[i].reset();
    ledgers_[i] = MakeLedger(i);
    return true;
  }

  // A time one instance will reach next where a record changes meaning (a lease or a retention
  // ends), exactly or 1 ms either side: how far to advance to land there.
  std::optional<Duration> Boundary() {
    const int i = static_cast<int>(rng_.Below(kInstances));
    const int k = static_cast<int>(rng_.Below(kKeys));
    if (!keys_[k].rec) return std::nullopt;
    const ModelRecord& r = *keys_[k].rec;
    const TimePoint at = (r.state == RecordState::kInProgress && rng_.Percent(60))
                             ? r.lease_expires_at
                             : r.expires_at;
    const Duration d = at + Duration(static_cast<int64_t>(rng_.Below(3)) - 1) - Now(i);
    if (d <= Duration(0)) return std::nullopt;
    ++fig_.events["boundary_advances"];
    return d;
  }

  bool Advance() {
    const uint64_t r = rng_.Below(100);
    const KeyState& k = keys_[rng_.Below(kKeys)];
    Duration d;
    std::optional<Duration> boundary;
    if (r < 15 && (boundary = Boundary())) {
      d = *boundary;
    } else if (r < 50) {
      d = Duration(1 + rng_.Below(2000));
    } else if (r < 85) {
      d = k.policy.lease / 2 + Duration(rng_.Below(k.policy.lease.count()));
    } else if (r < 97) {
      d = Duration(1 + rng_.Below(15'000));
    } else {
      d = k.retention() + Duration(rng_.Below(5000));
    }
    for (auto& c : w_.clocks) c->Advance(d);
    Log("clocks +" + std::to_string(d.count()) + "ms (i0 at " + Ms(Now(0), base_) + ")");
    for (int key = 0; key < kKeys; ++key) {
      if (!Probe(key, ProbeInstance())) return false;
    }
    return true;
  }

  // What an operator does (§4 table, cmd_records.cc), through one instance's store without
  // faults: resolve an unknown record (release it, or complete it with an outcome), evict a
  // record, or purge everything past its retention.
  bool Operator() {
    const int p = static_cast<int>(rng_.Below(kInstances));
    const int k = static_cast<int>(rng_.Below(kKeys));
    KeyState& key = keys_[k];
    Store& store = w_.stores[p]->inner();
    const TimePoint now = Now(p);
    const uint64_t r = rng_.Below(100);
    const std::string who = "operator (i" + std::to_string(p) + "'s clock)";
    if (r < 20) {
      auto purged = store.PurgeExpired(1'000'000);
      if (!purged) return Fail(who + " purge: " + purged.error().ToString());
      Log(who + " purges expired records: " + std::to_string(*purged));
      for (KeyState& s : keys_) {
        if (s.rec && s.rec->expires_at <= now) {
          s.rec.reset();  // gone at the end of its retention: the next claim starts a new life
          s.released = false;
        }
        if (s.durable && s.durable_expires <= now) s.durable.reset();
      }
      ++fig_.events["operator_purges"];
      for (int i = 0; i < kKeys; ++i) {
        if (!Probe(i, p)) return false;
      }
      return true;
    }
    if (r < 40 && w_.evictions) {
      auto evicted = store.Evict(key.id);
      if (!evicted) return Fail(who + " evict: " + evicted.error().ToString());
      Log(who + " evicts " + Where(k) + " -> " + (*evicted ? "evicted" : "nothing there"));
      if (*evicted != key.rec.has_value()) {
        return Fail("Evict answered " + std::to_string(*evicted) + ", model has " +
                    (key.rec ? "a record" : "none"));
      }
      if (key.rec) {
        key.rec.reset();
        key.released = true;
        if (key.justified.empty()) key.justified = "an operator evicted it";
        key.durable.reset();
        ++fig_.events["operator_evictions"];
      }
      return Probe(k, p);
    }
    auto got = store.Get(key.id);
    if (!got) return Fail(who + " Get: " + got.error().ToString());
    if (!got->has_value() || (*got)->state != RecordState::kUnknown) {
      Log(who + ": " + Where(k) + " has nothing to resolve");
      return Probe(k, p);
    }
    if (!key.Live(now) || key.rec->state != RecordState::kUnknown) {
      return Fail(who + ": the store has " + Where(k) + " unknown, the model does not");
    }
    const uint64_t fence = (*got)->fence;
    if (rng_.Percent(50)) {
      auto released = store.Release(key.id, fence);
      Log(who + " resolves " + Where(k) + " --release -> " +
          (released ? "released" : released.error().ToString()));
      if (!released) return Fail("resolve --release: " + released.error().ToString());
      key.rec.reset();
      key.released = true;
      if (key.justified.empty()) key.justified = "an operator released it";
    } else {
      const Outcome o{OutcomeClass::kSuccess, "operator:" + Where(k)};
      auto done = store.Complete(key.id, fence, o, key.policy.ttl);
      Log(who + " resolves " + Where(k) + " with " + Str(o) + " -> " +
          (done ? "completed" : done.error().ToString()));
      if (!done) return Fail("resolve with an outcome: " + done.error().ToString());
      key.rec->state = RecordState::kCompleted;
      key.rec->outcome = o;
      key.rec->expires_at = now + key.policy.ttl;
      key.durable = o;
      key.durable_expires = key.rec->expires_at;
      if (!SameRecord(k, *done, *key.rec, "resolved record")) return false;
    }
    ++fig_.events["operator_resolves"];
    return Probe(k, p);
  }

  bool CutOff() {
    if (rng_.Percent(30)) {
      Log("store down for every instance");
      for (int i = 0; i < kInstances; ++i) SetDown(i, true);
    } else {
      const int i = static_cast<int>(rng_.Below(kInstances));
      Log("i" + std::to_string(i) + " cut off from the store");
      SetDown(i, true);
    }
    return true;
  }

  bool Heal() {
    Log("store reachable again");
    for (int i = 0; i < kInstances; ++i) SetDown(i, false);
    return true;
  }

  void SetDown(int i, bool down) {
    down_[i] = down;
    w_.stores[i]->set_down(down);
  }

  World& w_;
  const std::string store_;
  const uint64_t seed_;
  const int steps_;
  Rng rng_;
  std::string tenant_;
  TimePoint base_{};
  std::map<int, std::string> policies_;
  KeyState keys_[kKeys];
  std::vector<bool> down_ = std::vector<bool>(kInstances, false);
  std::vector<Exec> execs_;
  int next_exec_ = 1;
  int step_ = 0;
  std::optional<ErrorCode> last_error_;  // of the last WriteStep
  HookMode hook_mode_ = HookMode::kTruth;
  int hook_calls_ = 0;
  std::vector<std::string> log_;
  std::string failure_;
  Figures fig_;
  std::vector<std::unique_ptr<Ledger>> ledgers_;  // last: destroyed first
};

// ------------------------------------------------------------------------------------------------
// The per-store tests

void RunModel(const std::string& store, const Opener& open, bool cached = false) {
  ASSERT_TRUE(open) << "no store to run on";
  const Settings settings = SettingsFromEnv();
  World world;
  world.evictions = !cached;
  world.skew = !cached;
  for (int i = 0; i < kInstances; ++i) {
    world.clocks.push_back(std::make_unique<FakeClock>());
    auto view = open(*world.clocks.back());
    ASSERT_NE(view, nullptr);
    world.stores.push_back(std::make_unique<FaultStore>(std::move(view)));
  }
  const auto started = std::chrono::steady_clock::now();
  Figures total;
  int failed = 0;
  for (uint64_t seed : settings.seeds) {
    Schedule s(world, store, seed, settings.steps);
    const bool ok = s.Run();
    total.Add(s.figures());
    if (!ok && ++failed <= 3) ADD_FAILURE() << s.Report();
    if (ok && settings.verbose) std::printf("%s", s.Report().c_str());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::ostringstream by_kind;
  for (const auto& [k, v] : total.decisions) by_kind << " " << k << "=" << v;
  by_kind << " | paths:";
  for (const auto& [k, v] : total.events) by_kind << " " << k << "=" << v;
  std::printf(
      "[ledger-model] store=%s schedules=%llu steps=%llu executions=%llu duplicates=%llu "
      "lost=%llu allowed_repeats=%llu failed_schedules=%d | begins=%llu settles=%llu "
      "heartbeats=%llu kills=%llu faults=%llu errors=%llu decisions:%s | %.1fs\n",
      store.c_str(), (unsigned long long)total.schedules, (unsigned long long)total.steps,
      (unsigned long long)total.executions, (unsigned long long)total.duplicates,
      (unsigned long long)total.lost, (unsigned long long)total.allowed_repeats, failed,
      (unsigned long long)total.begins, (unsigned long long)total.settles,
      (unsigned long long)total.heartbeats, (unsigned long long)total.kills,
      (unsigned long long)total.faults, (unsigned long long)total.errors, by_kind.str().c_str(),
      seconds);
  std::fflush(stdout);
  ::testing::Test::RecordProperty("schedules", static_cast<int>(total.schedules));
  ::testing::Test::RecordProperty("steps", static_cast<int>(total.steps));
  ::testing::Test::RecordProperty("executions", static_cast<int>(total.executions));
  ::testing::Test::RecordProperty("duplicates", static_cast<int>(total.duplicates));
  ::testing::Test::RecordProperty("lost", static_cast<int>(total.lost));
  ::testing::Test::RecordProperty("allowed_repeats", static_cast<int>(total.allowed_repeats));
  EXPECT_EQ(failed, 0) << failed << " of " << settings.seeds.size() << " schedules failed";
  EXPECT_EQ(total.duplicates, 0u);
  EXPECT_EQ(total.lost, 0u);
}

TEST(LedgerModel, Memory) { RunModel("memory", MemoryOpener()); }
TEST(LedgerModel, Sqlite) { RunModel("sqlite", SqliteOpener()); }
TEST(LedgerModel, SqliteCached) {
  RunModel("sqlite_cached", Cached(SqliteOpener()), /*cached=*/true);
}
TEST(LedgerModel, RedisSingle) { RunModel("redis", RedisOpener("IDEM_REDIS_URL_FILE")); }
TEST(LedgerModel, RedisSingleCached) {
  RunModel("redis_cached", Cached(RedisOpener("IDEM_REDIS_URL_FILE")), /*cached=*/true);
}
TEST(LedgerModel, RedisCluster) {
  RunModel("redis_cluster", RedisOpener("IDEM_REDIS_CLUSTER_URL_FILE"));
}
TEST(LedgerModel, Postgres) { RunModel("postgres", PostgresOpener()); }
TEST(LedgerModel, PostgresCached) {
  RunModel("postgres_cached", Cached(PostgresOpener()), /*cached=*/true);
}

// Found by LedgerModel.RedisSingleCached and PostgresCached when their instances' clocks were
// skewed (seed 3, step 67: "read back by i1: k3 state: model in_progress, store completed"), and
// reduced here to two instances on the memory store. A replay cache judges a completed record live
// by its own instance's clock (caching_store.h: "which the cache judges by expires_at on the
// store's clock, as the store does"); but another instance whose clock is ahead sees the record
// expire first and claims the key anew. The store then holds the new claim, and later its
// outcome, while the slower instance's cache goes on replaying the old outcome until its own
// clock reaches the old expiry: a second window, as long as the clock skew, beside the eviction
// window caching_store.h documents. Nothing runs twice and no outcome is lost; two instances
// answer differently for up to the skew. Disabled: it fails today. Run it with
// --gtest_also_run_disabled_tests.
TEST(LedgerModelRegression, DISABLED_ReplayCacheOutlivesARecordReplacedByAFasterClock) {
  CallerClock caller_clock;
  auto memory = NewMemoryStore(caller_clock);
  FakeClock fast_clock, slow_clock;
  fast_clock.Advance(3s);  // A runs 3 s ahead of B
  CallerClockView a_store(nullptr, *memory, fast_clock);
  CallerClockView b_store(nullptr, *memory, slow_clock);
  CachingStore b_cache(b_store, slow_clock, 1 << 20);
  ASSERT_TRUE(b_cache.active());
  LedgerOptions quiet;
  quiet.audit = false;
  Ledger a(a_store, fast_clock, quiet);
  Ledger b(b_cache, slow_clock, quiet);
  Call call;
  call.id = RecordId{"t", "k"};
  call.fingerprint = "fp";
  call.tool = "tool";
  call.policy.wait = Duration(0);
  call.policy.ttl = Duration(60'000);

  // A executes and stores "first"; B replays it, and its cache keeps it.
  auto first = a.Begin(call);
  ASSERT_TRUE(first && first->kind == DKind::kExecute);
  ASSERT_TRUE(a.Settle(call, *first, Execution{EKind::kSuccess, "first"}));
  auto replayed = b.Begin(call);
  ASSERT_TRUE(replayed && replayed->kind == DKind::kReplay);

  // 60 s on, the record has expired by A's clock and has 3 s left by B's. A claims the key anew.
  fast_clock.Advance(Duration(60'000));
  slow_clock.Advance(Duration(60'000));
  auto second = a.Begin(call);
  ASSERT_TRUE(second && second->kind == DKind::kExecute);
  auto stored = b_store.Get(call.id);  // what B reads without its cache: A's new claim
  ASSERT_TRUE(stored && stored->has_value());
  ASSERT_EQ((*stored)->state, RecordState::kInProgress);

  auto during = b.Begin(call);
  ASSERT_TRUE(during);
  EXPECT_EQ(Str(during->kind), Str(DKind::kInProgress))
      << "B answered " << Str(during->kind)
      << (during->record.outcome ? " " + Str(*during->record.outcome) : "")
      << " from its cache while the store holds A's new claim";

  ASSERT_TRUE(a.Settle(call, *second, Execution{EKind::kSuccess, "second"}));
  auto after = b.Begin(call);
  ASSERT_TRUE(after && after->kind == DKind::kReplay);
  ASSERT_TRUE(after->record.outcome);
  EXPECT_EQ(after->record.outcome->body, "second")
      << "B replays its cached outcome; the store holds \"second\"";
}

}  // namespace
}  // namespace idem
