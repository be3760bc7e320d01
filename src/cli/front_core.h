// The store, metrics and ledger under every front (`mcp`, `serve`, `http`),
// wired the same way for each: the store is wrapped in an InstrumentedStore
// so every operation is timed, that in a CachingStore ([replay_cache]) so
// retries of finished calls skip the store where it announces evictions
// (Redis, PostgreSQL),
// the ledger reports every attempt to the metrics (and so to the replay
// alert), and a StoreProbe answers /readyz.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "cli_common.h"
#include "idem/caching_store.h"
#include "observe/gateway_metrics.h"
#include "observe/instrumented_store.h"
#include "idem/ledger.h"
#include "observe/store_probe.h"

namespace idem::cli {

// How often a front re-measures its clock's offset from the store's: often
// enough to follow a clock being slewed or stepped, a few reads an hour.
inline constexpr Duration kStoreClockSync{60'000};
// An offset worth telling the operator about at start.
inline constexpr Duration kNotableClockOffset{1'000};

// Members are destroyed in reverse order: the ledger (which flushes through
// the measured store) before the store it uses. Not copyable or movable
// once built: the members point at each other.
struct FrontCore {
  // Keeps StoreTime() synced to `store` until destroyed, before the store.
  class ClockSync {
   public:
    ClockSync() = default;
    ClockSync(const ClockSync&) = delete;
    ClockSync& operator=(const ClockSync&) = delete;
    ~ClockSync();
    void Start(Store& store, Duration every);

   private:
    bool running_ = false;
  };

  std::unique_ptr<Store> store;
  ClockSync clock_sync;
  std::unique_ptr<GatewayMetrics> metrics;
  std::unique_ptr<InstrumentedStore> measured_store;
  std::unique_ptr<CachingStore> cached_store;  // above measured_store: hits are not store calls
  std::unique_ptr<StoreProbe> probe;  // reads the store directly: unmeasured
  std::unique_ptr<Ledger> ledger;
};

// Opens the store of `config` (or --store), then the metrics with the
// [alert] settings, then the ledger named "<front>-<pid>" in the audit log,
// with `reconcile` for on_unknown = "reconcile" (may be empty) and the
// in-flight gauge of `front`. `log` gets the alert's lines. `store_options`
// go to OpenStore (StoreOptions::io). The error names what could not be
// opened.
Result<std::unique_ptr<FrontCore>> OpenFrontCore(const GlobalOptions& globals, const Config& config,
                                                 std::string_view front, ReconcileHook reconcile,
                                                 std::function<void(std::string_view)> log,
                                                 const StoreOptions& store_options = {});

}  // namespace idem::cli
