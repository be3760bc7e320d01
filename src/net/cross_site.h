// Refusing requests a browser sends on behalf of another site (docs/DESIGN.md
// §8, security review F7). Without tokens every loopback caller is an admin,
// so any web page the operator opens could make the browser GET
// /v1/records/…, /console/api/replay or /metrics: the answer is unreadable to
// the page, but the work is done. Browsers say where a request comes from
// (Sec-Fetch-Site, Origin); CLI clients and agents send neither and pass.
#pragma once

#include <optional>

#include "net/http_listener.h"

namespace idem::http {

// A 403 "cross-site" problem when `request` says it was sent from another
// site or origin: Sec-Fetch-Site other than same-origin or none (same-site
// too: another port of 127.0.0.1 is the same site), or an Origin other than
// http(s)://<Host> ("null" included). nullopt when it did not come from
// elsewhere.
std::optional<Response> CrossSiteRefusal(const Request& request);

// `next`, with every request CrossSiteRefusal refuses answered 403 first.
Handler RefuseCrossSite(Handler next);

// `next`, with `Content-Security-Policy: sandbox` added to each of its
// answers. For `idemgate http`, whose console shares its origin with the
// upstream's answers it relays and replays (security review F8): a page
// among them, opened in a browser, gets an opaque origin (no script, no
// access to the console's pages, its requests marked cross-site). A policy
// the upstream sent is kept: a browser enforces every policy given. API
// clients ignore the header.
Handler SandboxAnswers(Handler next);

}  // namespace idem::http
