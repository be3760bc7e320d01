// `idemgate http`'s request handler (docs/DESIGN.md §6.2): the IETF Idempotency-Key
// reverse proxy in front of one upstream.
//
// For each request: RequestPlan (request_plan.h) decides pass-through, gated
// or refused. A gated request's life is the driver's (gate/gated_call.h,
// continuation-based): claimed, then answered from the record or executed:
// forwarded upstream (the key in the route's key_header) while a lease guard
// renews the claim, its answer classified by gate::ClassOfHttpStatus, and
// its outcome stored before the client sees it (§4.7); this front supplies
// the forward, the classification of its wire answer and the renders:
//
//   upstream answer / failure            record             client gets
//   2xx, 303                             completed          the answer
//   408, 409, 423, 425, 429, other 3xx   released           the answer
//   other 4xx                            completed (errors  the answer
//                                        = release: gone)
//   5xx                                  unknown            502 outcome-unknown
//   not sent (connect/DNS/TLS failure)   released           502 upstream-unreachable
//   sent, then no answer / broken        unknown            504 (timeout) / 502
//   body over max_response_bytes         as its status, a   502 upstream-answer-too-large
//                                        marker if stored
//   encoded answer over max_result_bytes too-large marker   the answer
//
// Retries: completed → the stored status, headers and body, byte for byte,
// plus `Idempotent-Replayed: true`; still running after `wait` → 409 +
// Retry-After; unknown → 409 outcome-unknown (a 4xx on purpose: retrying
// as is cannot help, and a generic client's retry-on-5xx must not hammer
// it; the problem says the action may have happened and how an operator
// resolves it); too-large marker → 409 outcome-too-large; drift → 422 drift;
// store unreachable → 503 + Retry-After (nothing was executed). With
// on_unknown = "reconcile" the ledger asks the route's lookup first
// (route_reconcile.h). Every answer
// idemgate makes itself is application/problem+json (RFC 9457).
//
// A request that is not gated is passed through: its answer is relayed as
// the upstream sends it (a download of any size, a text/event-stream), since
// it is never stored. A gated answer is read whole, within
// max_response_bytes, because it is stored before the client sees it.
//
// Request headers forwarded: all but hop-by-hop ones, Host (rewritten to the
// upstream's), Idempotency-Key and the turn header (idemgate's own; the key
// goes out in key_header), and Authorization when tenant tokens are
// configured (it carries the idemgate token, not the vendor's credentials).
// X-Forwarded-For gets the client's address appended.
//
// Thread-safe. Handle() never blocks: it runs on the listener's I/O thread.
// The store is reached in the cheapest way it offers
// (Ledger::BeginWithoutBlocking): a retry of a finished request is answered
// from the replay cache, or the store's non-blocking read or claim, and a
// fresh request is claimed and its answer stored by the store's non-blocking
// writes where it has them (Ledger::BeginAsync, CompleteAsync: Redis on one
// server); everything else that touches the store runs on the worker pool.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "core/worker_pool.h"
#include "net/http_listener.h"
#include "idem/config.h"
#include "idem/ledger.h"
#include "fronts/http_proxy/request_plan.h"
#include "net/http_client.h"

namespace idem::proxy {

struct ReverseProxyOptions {
  PlanOptions plan;
  // Forward the client's Authorization header upstream. Set false when
  // tenant tokens are configured. Default true.
  bool forward_authorization = true;
  // One line per gated request on `log` (key, decision, time). Default off.
  bool verbose = false;
  std::function<void(std::string_view line)> log;
};

// An upstream answer whose outcome is stored before it is relayed.
struct StoredAnswer {
  http::Response response;  // relayed to the client
  Outcome outcome;          // stored: the response, or a too-large marker
  int status = 0;           // the upstream's
};

class ReverseProxy {
 public:
  // Everything must outlive the proxy.
  ReverseProxy(Ledger& ledger, const Config& config, net::HttpClient& upstream, WorkerPool& workers,
               ReverseProxyOptions options);

  // The listener's handler.
  void Handle(http::Request request, http::Responder respond);
  http::Handler AsHandler() {
    return [this](http::Request request, http::Responder respond) {
      Handle(std::move(request), std::move(respond));
    };
  }

  // Waits until no request is in flight (each one's outcome stored or its
  // record settled), or `grace` passed. True if none is left.
  bool Drain(std::chrono::milliseconds grace);

 private:
  // One gated request: its context and the phases of the gated call's
  // driver (gate/gated_call.h), which owns its life.
  struct Gated;
  void PassThrough(http::Request request, http::Responder respond);
  net::HttpClientRequest Forwarded(http::Request& request, const RequestPlan* plan) const;
  void Log(std::string_view line) const;
  void Done();

  Ledger& ledger_;
  const Config& config_;
  net::HttpClient& upstream_;
  WorkerPool& workers_;
  const ReverseProxyOptions options_;

  std::mutex mu_;
  std::condition_variable idle_;
  size_t in_flight_ = 0;  // guarded by mu_
};

}  // namespace idem::proxy
