// How the HTTP reverse proxy treats one request (docs/DESIGN.md §3, §6.2), as a
// pure function: which route rule applies, whether the request is gated, its
// key and fingerprint, and the refusals (bad key, missing required key, a
// JSON body that is not I-JSON).
//
// The rules, in order:
//  - The route is the first [[route]] whose match and methods fit
//    (Config::RouteFor). A request no rule matches gets the built-in rule:
//    POST and PATCH gated, key mode unset, [defaults] policy, the key
//    forwarded as Idempotency-Key. Other methods pass through.
//  - A route with mode = "off" passes through.
//  - An Idempotency-Key header (exactly one) always wins; a malformed one
//    → 400. mode = "explicit" without one → 400. A client that already
//    speaks the vendor's header (the route's key_header, e.g. a profile's
//    PayPal-Request-Id) may send its key there instead.
//  - Otherwise the key is derived like DeriveKey: mode unset or "turn" needs
//    the turn header ([http] turn_header) and passes through ungated without
//    it, as the IETF draft treats a request without a key; "args" and
//    "fields" gate every request.
//  - The fingerprint is SHA-256 over method, path, query and the body: its
//    RFC 8785 canonical form when Content-Type is JSON (application/json or
//    any +json; a body that is not I-JSON → 400), its raw bytes otherwise.
//    The "tool" of the key and of the audit log is "METHOD /path".
//
// No I/O; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "net/http_listener.h"
#include "idem/config.h"
#include "idem/ledger.h"

namespace idem::proxy {

struct PlanOptions {
  size_t max_key_bytes = kMaxKeyBytes;  // [http] max_key_bytes
  size_t max_json_depth = 128;          // [limits] max_depth
  size_t max_body_bytes = 1 << 20;      // [limits] max_body_bytes
};

// A refusal answered by the proxy itself, before the ledger (RFC 9457).
struct Refusal {
  int status = 400;
  std::string type;  // problem type slug: "invalid-idempotency-key"
  std::string title;
  std::string detail;
};

struct RequestPlan {
  enum class Kind {
    kPassThrough,  // forward as it is, no claim
    kGated,        // claim `call`, forward with `key_header: forward_key`
    kRefuse,       // answer `refusal`, forward nothing
  };
  Kind kind = Kind::kPassThrough;
  Call call;                // kGated
  std::string key_header;   // kGated: the header the key is forwarded in; empty: none
  std::string key_field;    // kGated: the body member it is forwarded in, if absent; empty: none
  std::string forward_key;  // kGated: its value (the client's header value as sent, the bare
                            // key for a vendor profile, or the derived key)
  bool client_key = false;  // kGated: the key came from Idempotency-Key
  Refusal refusal;          // kRefuse
};

RequestPlan PlanRequest(const http::Request& request, const Config& config,
                        const PlanOptions& options);

// What a request's records are scoped to when no [[tenant]] is configured:
// the vendor credential it is forwarded with (the first of [http]
// credential_headers it carries: by default Authorization, X-Api-Key,
// Api-Key), "c" + 32 hex of its HMAC-SHA-256 keyed with [http]
// credential_scope_secret (its plain SHA-256 when no secret is set), so two
// vendor accounts behind one proxy never answer from each other's records.
// Empty without a credential (PlanRequest then puts a key that looks scoped,
// 'c' … '/', under "c-/", so that "c1a2…/order-1" cannot name a scoped
// record: security review F5) and with tenants (the tenant scopes).
std::string CredentialScope(const http::Request& request, const Config& config);

// The request's credential headers ([http] credential_headers), as sent:
// what a reconcile lookup forwards on the caller's behalf.
std::vector<http::Header> CredentialHeaders(const http::Request& request, const Config& config);

// `body` with the member `field` set to `key` (a JSON string) when `body` is
// a JSON object that has no such member: Square reads its key from the body.
// Any other body, and one that already names its own key, is returned as
// it is (a client's own key is the vendor's to see).
std::string BodyWithKeyField(std::string body, std::string_view field, std::string_view key);

// "POST /v1/charges": the tool name of a route call in keys and the audit log.
std::string RouteCallName(std::string_view method, std::string_view path);

// The request fingerprint (see above): 64 lowercase hex. kInvalidArgument or
// kResourceExhausted for a JSON body the canonicalizer refuses.
Result<std::string> RequestFingerprint(const http::Request& request, const PlanOptions& options);

}  // namespace idem::proxy
