// The ledger's reconcile hook for `idemgate http` (on_unknown = "reconcile",
// docs/DESIGN.md §4 step 4): asks the route's read-only lookup whether the action
// of a call whose outcome is unknown happened.
//
// The route's `reconcile` is a path, optionally with a query, in which
// "{key}" is replaced by the record's key (percent-encoded):
//
//   [[route]]
//   match = "/v1/charges"
//   on_unknown = "reconcile"
//   reconcile = "/v1/charges?idempotency_key={key}"
//
// It is sent as GET, with the key also in the route's key_header. A 2xx
// answer means the action happened: that answer becomes the stored outcome
// (retries get it, marked replayed). 404 or 410 means it did not: the call
// executes. Anything else, or no answer, cannot tell: the record stays
// unknown. The lookup carries no client credentials (the hook runs for
// whichever retry comes first), so it suits upstreams reachable without them
// or with credentials the upstream URL's network grants.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "idem/config.h"
#include "idem/ledger.h"
#include "net/http_client.h"

namespace idem::proxy {

// The lookup target for `call` (its tool is "METHOD /path"), or nullopt when
// its route has no `reconcile`.
std::optional<std::string> ReconcileTarget(const Config& config, const Call& call);

// The hook for LedgerOptions::reconcile. Runs inside Ledger::Begin on a
// worker thread and blocks there for the lookup (at most the pool's
// response_timeout). `config` and `upstream` must outlive the ledger's use.
ReconcileHook MakeRouteReconcileHook(const Config& config, net::HttpClient& upstream);

}  // namespace idem::proxy
