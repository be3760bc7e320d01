#include "front_core.h"

#include <fmt/format.h>
#include <unistd.h>

#include <memory>
#include <mutex>

namespace idem::cli {

namespace {

// idemgate_replay_cache_{hits,misses,drops}_total and _records/_bytes, read
// from the cache's counters whenever /metrics is rendered.
void TrackReplayCache(MetricsRegistry& registry, const CachingStore& cache) {
  struct Seen {
    std::mutex mu;
    CachingStore::Stats last;
  };
  auto seen = std::make_shared<Seen>();
  Counter& hits = registry
                      .AddCounter("idemgate_replay_cache_hits_total",
                                  "Retries of finished calls answered from memory")
                      .With({});
  Counter& misses = registry
                        .AddCounter("idemgate_replay_cache_misses_total",
                                    "Lookups in the replay cache that went to the store")
                        .With({});
  Counter& drops = registry
                       .AddCounter("idemgate_replay_cache_drops_total",
                                   "Times the replay cache was emptied: an eviction, or the "
                                   "store's eviction feed went down or came up")
                       .With({});
  Gauge& records =
      registry.AddGauge("idemgate_replay_cache_records", "Completed records held in memory")
          .With({});
  Gauge& bytes =
      registry.AddGauge("idemgate_replay_cache_bytes", "Estimated memory of the replay cache")
          .With({});
  // Like the in-flight gauge's source, `cache` must outlive the rendering.
  registry.OnCollect([seen, cache = &cache, hits = &hits, misses = &misses, drops = &drops,
                      records = &records, bytes = &bytes] {
    const CachingStore::Stats now = cache->stats();
    std::lock_guard lock(seen->mu);
    hits->Inc(now.hits - seen->last.hits);
    misses->Inc(now.misses - seen->last.misses);
    drops->Inc(now.drops - seen->last.drops);
    records->Set(double(now.records));
    bytes->Set(double(now.bytes));
    seen->last = now;
  });
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
  core->metrics->TrackInFlight(std::string(front),
                               [ledger] { return double(ledger->running_executions()); });
  return core;
}

}  // namespace idem::cli
