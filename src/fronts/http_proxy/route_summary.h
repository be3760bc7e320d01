// What `idemgate http` says at start about its routes (cmd_http.cc prints
// it to stderr), as a pure function of the config.
#pragma once

#include <string>
#include <vector>

#include "idem/config.h"

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

}  // namespace idem::proxy
