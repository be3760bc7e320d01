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
// It is sent as GET, with the key also in the route's key_header, the key
// being exactly what the upstream received (the client's header value as
// sent, quotes and all, or the derived key; never idemgate's record key,
// which may carry a credential scope), and with the retry's own credential
// headers (Authorization, X-Api-Key, Api-Key), so an upstream that wants
// them for its lookup gets them. A 2xx answer means the action happened:
// that answer becomes the stored outcome (retries get it, marked replayed).
// 404 or 410 means it did not: the call executes. Anything else, or no
// answer, cannot tell: the record stays unknown. So does a 2xx whose body is
// an empty list (`[]`, or an object without "id" whose arrays are all empty,
// such as `{"object":"list","data":[]}`): a search endpoint answers so when
// nothing matched, and that names no outcome. Such an endpoint is still a
// poor lookup (a search index may lag the write): use one that answers 404
// for an unknown key.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/config.h"
#include "idem/ledger.h"
#include "net/http_client.h"

namespace idem::proxy {

// The lookup target for a call to `tool` ("METHOD /path") whose key the
// upstream received as `forwarded_key`, or nullopt when its route has no
// `reconcile`.
std::optional<std::string> ReconcileTarget(const Config& config, std::string_view tool,
                                           std::string_view forwarded_key);

// The lookup of one gated request (Call::reconcile): `forwarded_key` as the
// upstream received it, `credentials` the request's credential headers. Runs
// inside Ledger::Begin on a worker thread and blocks there for the lookup (at
// most the pool's response_timeout). `config` and `upstream` must outlive the
// call.
ReconcileHook MakeRouteLookup(const Config& config, net::HttpClient& upstream,
                              std::string forwarded_key, std::vector<http::Header> credentials);

}  // namespace idem::proxy
