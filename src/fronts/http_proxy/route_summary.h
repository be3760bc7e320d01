// What `idemgate http` says at start about its routes (cmd_http.cc prints
// it to stderr), as a pure function of the config.
#pragma once

#include <string>
#include <vector>

#include "idem/config.h"
#include "idem/error.h"

namespace idem::proxy {

// One line per [[route]]: its methods and match, key mode, where the key is
// forwarded (header or body field), how long results are kept, its vendor
// profile; one for the requests no route matches; one per route that leaves
// a mutating method ungated (mode = "off"), whose retries run again. Then a
// "warning: " line for each route whose ttl outlives the vendor's window
// (RouteRule::vendor_window: after it the vendor runs a retry idemgate
// forwards again), and a "note: " line for a profile whose vendor publishes
// no window. Lines without a newline.
std::vector<std::string> DescribeRoutes(const Config& config);

// Refuses a config where a gated request's lease could run out while the
// request is still open at the vendor: every route's lease (and [defaults]'
// for the requests no route matches) must be longer than
// upstream_connect_timeout + upstream_timeout, the longest a request can be
// open after its claim. Otherwise an owner cut off from the store loses its
// lease mid-request and a retry runs or looks the call up while the vendor
// may still act on the first (guarantees review F3, docs/DESIGN.md §4). The
// error names the route, both figures and what to change.
Result<void> CheckLeasesOutliveRequests(const Config& config);

}  // namespace idem::proxy
