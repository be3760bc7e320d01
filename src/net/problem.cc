// RFC 9457 problem documents and the small request helpers of
// http_listener.h. No I/O.
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>

#include "core/utf8.h"
#include "net/http_listener.h"

namespace idem::http {
namespace {

// A JSON string literal of `text`, with every byte that is not part of valid
// UTF-8 replaced by U+FFFD: details quote bytes from requests and stores
// (a bad header, a corrupt row), and the problem document must stay JSON.
std::string JsonLiteral(std::string_view text) {
  std::string valid;
  valid.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    if (*p < 0x80) {
      valid.push_back(static_cast<char>(*p++));
      continue;
    }
    utf8::Char c = utf8::DecodeMultiByte(p, end);
    if (c.problem == utf8::Problem::kNone) {
      valid.append(reinterpret_cast<const char*>(p), c.length);
      p += c.length;
    } else {
      valid.append("\xEF\xBF\xBD");
      ++p;
    }
  }
  return boost::json::serialize(boost::json::string(valid));
}

}  // namespace

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
  body += JsonLiteral("https://idemgate.dev/problems/" + std::string(type));
  body += ",\"title\":";
  body += JsonLiteral(title);
  body += ",\"status\":";
  body += std::to_string(status);
  body += ",\"detail\":";
  body += JsonLiteral(detail);
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
