#include "front_core.h"

#include <fmt/format.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include "core/worker_pool.h"
#include "store/store_transport.h"

namespace idem::cli {

namespace {

// Keeps `counter` equal to `total()`, a running total its source keeps, by
// adding what it grew by since the last rendering of /metrics.
void FollowTotal(MetricsRegistry& registry, Counter& counter, std::function<uint64_t()> total) {
  struct Seen {
    std::mutex mu;
    uint64_t last = 0;
  };
  registry.OnCollect(
      [seen = std::make_shared<Seen>(), counter = &counter, total = std::move(total)] {
        // Read under the lock: two renderings at once must not see the
        // totals in one order and subtract them in the other.
        std::lock_guard lock(seen->mu);
        const uint64_t now = total();
        counter->Inc(now - seen->last);
        seen->last = now;
      });
}

// idemgate_replay_cache_{hits,misses,drops}_total and _records/_bytes, read
// from the cache's counters whenever /metrics is rendered. Like the in-flight
// gauge's source, `cache` must outlive the rendering.
void TrackReplayCache(MetricsRegistry& registry, const CachingStore& cache) {
  FollowTotal(registry,
              registry
                  .AddCounter("idemgate_replay_cache_hits_total",
                              "Retries of finished calls answered from memory")
                  .With({}),
              [&cache] { return cache.stats().hits; });
  FollowTotal(registry,
              registry
                  .AddCounter("idemgate_replay_cache_misses_total",
                              "Lookups in the replay cache that went to the store")
                  .With({}),
              [&cache] { return cache.stats().misses; });
  FollowTotal(registry,
              registry
                  .AddCounter("idemgate_replay_cache_drops_total",
                              "Times the replay cache was emptied: an eviction, or the "
                              "store's eviction feed went down or came up")
                  .With({}),
              [&cache] { return cache.stats().drops; });
  Gauge& records =
      registry.AddGauge("idemgate_replay_cache_records", "Completed records held in memory")
          .With({});
  Gauge& bytes =
      registry.AddGauge("idemgate_replay_cache_bytes", "Estimated memory of the replay cache")
          .With({});
  registry.OnCollect([&cache, records = &records, bytes = &bytes] {
    const CachingStore::Stats now = cache.stats();
    records->Set(double(now.records));
    bytes->Set(double(now.bytes));
  });
}

// idemgate_audit_entries_dropped_total{reason}: audit entries lost to a store
// that writes more slowly than calls arrive (backlog) or that refused a batch
// (store_error), each also reported on stderr. `ledger` must outlive the
// rendering.
void TrackAuditDrops(MetricsRegistry& registry, const Ledger& ledger) {
  CounterFamily& dropped =
      registry.AddCounter("idemgate_audit_entries_dropped_total",
                          "Audit entries lost (never a record): past [limits] max_audit_backlog "
                          "while the store was slow, or in a batch the store refused",
                          {"reason"});
  FollowTotal(registry, dropped.With({"backlog"}),
              [&ledger] { return ledger.audit_drops().backlog; });
  FollowTotal(registry, dropped.With({"store_error"}),
              [&ledger] { return ledger.audit_drops().refused; });
}

}  // namespace

FrontCore::ClockSync::~ClockSync() {
  if (running_) StoreTime().Stop();
}

void FrontCore::ClockSync::Start(Store& store, Duration every) {
  StoreTime().KeepInSync(store, every);
  running_ = true;
}

Result<std::unique_ptr<FrontCore>> OpenFrontCore(const GlobalOptions& globals, const Config& config,
                                                 std::string_view front, ReconcileHook reconcile,
                                                 std::function<void(std::string_view)> log,
                                                 const StoreOptions& store_options) {
  // Every pool made from here on ([limits], security review F16).
  WorkerPool::SetDefaultOptions(WorkerPool::Options{
      .max_threads = config.limits.max_worker_threads,
      .idle_timeout = config.limits.worker_idle_timeout,
  });
  // A store on another host without verified TLS: said once, before it is
  // reached (F17).
  if (auto warning = UnverifiedStoreTransport(StoreUrlFor(globals, config)); warning && log) {
    log(*warning);
  }
  auto core = std::make_unique<FrontCore>();
  Result<std::unique_ptr<Store>> store = OpenStoreFor(globals, config, store_options);
  if (!store) return std::unexpected(store.error());
  core->store = std::move(*store);
  // Leases and expiry are judged by the store's clock (StoreTime), followed
  // while the front runs.
  core->clock_sync.Start(*core->store, kStoreClockSync);
  if (log && std::chrono::abs(StoreTime().offset()) >= kNotableClockOffset) {
    log(fmt::format("note: this machine's clock is {:.1f} s {} the store's; idemgate judges "
                    "leases and expiry by the store's clock",
                    std::abs(StoreTime().offset().count()) / 1000.0,
                    StoreTime().offset().count() > 0 ? "behind" : "ahead of"));
  }

  // on_store_down = "pass" trades the guarantee for availability: say so.
  bool pass = config.defaults.on_store_down == OnStoreDown::kPass;
  for (const ToolRule& r : config.tools) pass |= r.overrides.on_store_down == OnStoreDown::kPass;
  for (const RouteRule& r : config.routes) pass |= r.overrides.on_store_down == OnStoreDown::kPass;
  if (pass && log) {
    log("warning: on_store_down = \"pass\" is configured: while the store cannot be reached, "
        "those calls run unguarded and their retries run again");
  }

  const std::string instance = fmt::format("{}-{}", front, ::getpid());
  GatewayMetricsOptions metrics_options;
  metrics_options.alert = config.alert;
  metrics_options.max_hosts = config.metrics.max_hosts;
  metrics_options.max_tools = config.metrics.max_tools;
  metrics_options.max_label_bytes = config.metrics.max_label_bytes;
  metrics_options.instance = instance;
  metrics_options.log = log;  // copied: the replay cache note below needs it too
  Result<std::unique_ptr<GatewayMetrics>> metrics =
      GatewayMetrics::Create(SystemClock::Default(), metrics_options);
  if (!metrics) return std::unexpected(metrics.error());
  core->metrics = std::move(*metrics);

  core->measured_store =
      std::make_unique<InstrumentedStore>(*core->store, core->metrics->registry());
  core->cached_store = std::make_unique<CachingStore>(
      *core->measured_store, StoreTime(),
      config.replay_cache.enabled ? config.replay_cache.max_bytes : 0);
  if (core->cached_store->active()) {
    TrackReplayCache(core->metrics->registry(), *core->cached_store);
  } else if (config.replay_cache.enabled && config.replay_cache.max_bytes > 0 && log) {
    log("note: the replay cache is off: the store cannot tell this process of evictions made "
        "through others (SQLite: no inotify instance left, see fs.inotify.max_user_instances), "
        "so every retry is read from the store");
  }
  core->probe = std::make_unique<StoreProbe>(*core->store, StoreTime());
  core->ledger =
      std::make_unique<Ledger>(*core->cached_store, StoreTime(),
                               LedgerOptions{instance, std::move(reconcile), true,
                                             core->metrics->ObserverFor(std::string(front)),
                                             config.limits.max_audit_backlog});
  Ledger* ledger = core->ledger.get();
  TrackAuditDrops(core->metrics->registry(), *ledger);
  core->metrics->TrackInFlight(std::string(front),
                               [ledger] { return double(ledger->running_executions()); });
  return core;
}

}  // namespace idem::cli
