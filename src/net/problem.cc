// RFC 9457 problem documents and the small request helpers of
// http_listener.h. No I/O.
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>

#include "json/json_text.h"
#include "net/http_listener.h"

namespace idem::http {

std::optional<std::string_view> Request::FindHeader(std::string_view name) const {
  for (const Header& h : headers) {
    if (boost::beast::iequals(h.name, name)) return std::string_view(h.value);
  }
  return std::nullopt;
}

size_t Request::CountHeader(std::string_view name) const {
  size_t n = 0;
  for (const Header& h : headers) n += boost::beast::iequals(h.name, name) ? 1 : 0;
  return n;
}

Response Problem(int status, std::string_view type, std::string_view title, std::string_view detail,
                 std::string_view extra_json) {
  std::string body = "{\"type\":";
  body += json_text::Quote("https://idemgate.dev/problems/" + std::string(type));
  body += ",\"title\":";
  body += json_text::Quote(title);
  body += ",\"status\":";
  body += std::to_string(status);
  body += ",\"detail\":";
  body += json_text::Quote(detail);
  if (!extra_json.empty()) {
    body += ',';
    body.append(extra_json);
  }
  body += '}';
  Response r;
  r.status = status;
  r.headers.push_back({"Content-Type", "application/problem+json"});
  r.body = std::move(body);
  return r;
}

}  // namespace idem::http
