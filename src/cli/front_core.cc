#include "front_core.h"

#include <fmt/format.h>
#include <unistd.h>

namespace idem::cli {

Result<std::unique_ptr<FrontCore>> OpenFrontCore(const GlobalOptions& globals, const Config& config,
                                                 std::string_view front, ReconcileHook reconcile,
                                                 std::function<void(std::string_view)> log) {
  auto core = std::make_unique<FrontCore>();
  Result<std::unique_ptr<Store>> store = OpenStoreFor(globals, config);
  if (!store) return std::unexpected(store.error());
  core->store = std::move(*store);

  const std::string instance = fmt::format("{}-{}", front, ::getpid());
  GatewayMetricsOptions metrics_options;
  metrics_options.alert = config.alert;
  metrics_options.instance = instance;
  metrics_options.log = std::move(log);
  Result<std::unique_ptr<GatewayMetrics>> metrics =
      GatewayMetrics::Create(SystemClock::Default(), metrics_options);
  if (!metrics) return std::unexpected(metrics.error());
  core->metrics = std::move(*metrics);

  core->measured_store =
      std::make_unique<InstrumentedStore>(*core->store, core->metrics->registry());
  core->probe = std::make_unique<StoreProbe>(*core->store, SystemClock::Default());
  core->ledger =
      std::make_unique<Ledger>(*core->measured_store, SystemClock::Default(),
                               LedgerOptions{instance, std::move(reconcile), true,
                                             core->metrics->ObserverFor(std::string(front))});
  Ledger* ledger = core->ledger.get();
  core->metrics->TrackInFlight(std::string(front),
                               [ledger] { return double(ledger->running_executions()); });
  return core;
}

}  // namespace idem::cli
