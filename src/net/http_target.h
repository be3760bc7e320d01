// Where an HTTP client sends its requests, from a URL: parsed the same way
// for the MCP Streamable HTTP upstream, the reverse proxy's upstream and the
// alert webhook.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::net {

struct HttpTarget {
  bool tls = false;         // https
  std::string host;         // a name or an IP literal, without brackets
  std::string port;         // "443" or "80" when the URL names none
  std::string host_header;  // as in the URL: "example.com:8443"
  std::string path;         // %-encoded, as in the URL; may be empty
  std::string query;        // %-encoded, without the '?'; empty when none

  // The request target: the path ("/" when empty) and the query.
  std::string RequestTarget() const;
  // "https://example.com:8443/mcp?x=1", for messages.
  std::string Display() const;
};

// Parses an http:// or https:// URL. kInvalidArgument that names `what` (the
// option, e.g. "upstream URL") and the URL, and says what is wrong: not
// absolute, another scheme, credentials in it (they belong in a header), no
// host, or a fragment.
Result<HttpTarget> ParseHttpTarget(std::string_view url, std::string_view what);

}  // namespace idem::net
