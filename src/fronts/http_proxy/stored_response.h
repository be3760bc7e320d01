// How the HTTP reverse proxy stores an upstream answer in a record's outcome
// (docs/DESIGN.md §4.7, §6.2), and which headers never cross the proxy.
//
// The outcome body is the answer in a compact, readable framing that
// `idemgate inspect` prints as it is:
//
//   idemgate-http/1 <status>\n
//   <name>: <value>\n          one line per header, in the upstream's order
//   \n
//   <body bytes, exactly as received>
//
// Header names are HTTP tokens and values never hold CR or LF (the HTTP
// parser refuses them), so the framing needs no escaping; the body follows
// the blank line verbatim and runs to the end. Hop-by-hop headers and
// Content-Length are not stored (the proxy's listener frames every answer
// itself). A replay decodes the same status, headers and body bytes.
//
// Pure functions, no I/O; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "net/http_listener.h"
#include "idem/error.h"

namespace idem::proxy {

struct StoredResponse {
  int status = 200;
  std::vector<http::Header> headers;
  std::string body;
};

// True for headers that describe one connection, not the message (RFC 9110
// §7.6.1: Connection, Keep-Alive, Proxy-Connection, Proxy-Authenticate,
// Proxy-Authorization, TE, Trailer, Transfer-Encoding, Upgrade) and for
// Content-Length, which the sender of each hop sets. ASCII case-insensitive.
bool IsHopByHop(std::string_view name);

// The headers in `headers` that cross the proxy: hop-by-hop ones dropped, and
// so are the ones the Connection header names (`connection` is its value,
// a comma-separated list; may be empty).
std::vector<http::Header> EndToEndHeaders(std::vector<http::Header> headers,
                                          std::string_view connection);

// The outcome body for `response` (its headers are stored as given: pass
// end-to-end headers).
std::string EncodeStoredResponse(const StoredResponse& response);
// Parses what EncodeStoredResponse wrote. kDataLoss if `bytes` is not in
// that framing (a corrupt record, or one another front stored).
Result<StoredResponse> DecodeStoredResponse(std::string_view bytes);

// ASCII case-insensitive equality, for header names.
bool HeaderNameEquals(std::string_view a, std::string_view b);

}  // namespace idem::proxy
