// Per-tool behaviour of the ledger (docs/DESIGN.md §4, §9). Every field documents
// its default; the config file and flags fill it in.
#pragma once

#include <cstddef>
#include <string_view>

#include "idem/clock.h"
#include "idem/error.h"

namespace idem {

// What to do when a record's owner died mid-call (lease expired).
enum class OnUnknown {
  kFail,       // answer "outcome unknown"; an operator or reconcile resolves it
  kRetry,      // take over and execute again: only for upstreams that dedupe on the key
  kReconcile,  // ask a read-only lookup hook; found → complete and replay, else execute
};
// What to do with an outcome the tool reported as an error.
enum class ErrorPolicy { kStore, kRelease };
// What to do when a key comes back with different arguments.
enum class OnDrift { kReject, kReplay };
// What to do when the store cannot be reached at claim.
enum class OnStoreDown { kFail, kPass };

std::string_view OnUnknownName(OnUnknown v);
Result<OnUnknown> ParseOnUnknown(std::string_view s);
std::string_view ErrorPolicyName(ErrorPolicy v);
Result<ErrorPolicy> ParseErrorPolicy(std::string_view s);
std::string_view OnDriftName(OnDrift v);
Result<OnDrift> ParseOnDrift(std::string_view s);
std::string_view OnStoreDownName(OnStoreDown v);
Result<OnStoreDown> ParseOnStoreDown(std::string_view s);

struct Policy {
  Duration ttl{24 * 3600 * 1000};   // retention of completed (and unknown) records: 24 h
  Duration lease{30'000};           // owner presumed dead without a heartbeat: 30 s
  Duration wait{10'000};            // how long a duplicate waits for the owner: 10 s
  Duration window{3600 * 1000};     // retention in args mode when no turn id came: 1 h
  OnUnknown on_unknown = OnUnknown::kFail;
  ErrorPolicy errors = ErrorPolicy::kStore;
  OnDrift on_drift = OnDrift::kReject;
  OnStoreDown on_store_down = OnStoreDown::kFail;
  size_t max_result_bytes = 1 << 20;  // larger outcomes store a "too large" marker: 1 MiB
  // Observe mode: keys are derived, claimed and recorded as usual, but every
  // call runs. A call enforcing would have answered itself runs unguarded
  // and its attempt is logged as what it would have got (would_replay,
  // would_drift, would_wait, would_unknown). For adopting idemgate: read what
  // it would have stopped, then switch to enforcing. Default false.
  bool observe = false;
};

}  // namespace idem
