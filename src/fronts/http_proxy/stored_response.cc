#include "fronts/http_proxy/stored_response.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace idem::proxy {
namespace {

constexpr std::string_view kMagic = "idemgate-http/1 ";

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Result<StoredResponse> Corrupt(std::string_view what) {
  return MakeError(ErrorCode::kDataLoss,
                   "the stored HTTP answer is unreadable (" + std::string(what) +
                       "); inspect the record with `idemgate inspect` and evict it");
}

}  // namespace

bool HeaderNameEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

bool IsHopByHop(std::string_view name) {
  static constexpr std::string_view kHopByHop[] = {
      "connection",
      "keep-alive",
      "proxy-connection",
      "proxy-authenticate",
      "proxy-authorization",
      "te",
      "trailer",
      "transfer-encoding",
      "upgrade",
      "content-length",
  };
  for (std::string_view h : kHopByHop) {
    if (HeaderNameEquals(name, h)) return true;
  }
  return false;
}

std::vector<http::Header> EndToEndHeaders(std::vector<http::Header> headers,
                                          std::string_view connection_value) {
  // A copy: `connection_value` may point into one of `headers`, which the
  // erase below moves around.
  const std::string connection(connection_value);
  auto named_by_connection = [&](std::string_view name) {
    std::string_view rest(connection);
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view token = Trim(rest.substr(0, comma));
      if (!token.empty() && HeaderNameEquals(token, name)) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return false;
  };
  std::erase_if(headers, [&](const http::Header& h) {
    return IsHopByHop(h.name) || named_by_connection(h.name);
  });
  return headers;
}

std::string EncodeStoredResponse(const StoredResponse& response) {
  size_t size = kMagic.size() + 5 + response.body.size();
  for (const http::Header& h : response.headers) size += h.name.size() + h.value.size() + 3;
  std::string out;
  out.reserve(size);
  out.append(kMagic).append(std::to_string(response.status)).push_back('\n');
  for (const http::Header& h : response.headers) {
    out.append(h.name).append(": ").append(h.value).push_back('\n');
  }
  out.push_back('\n');
  out.append(response.body);
  return out;
}

namespace {

// RFC 9110 §5.6.2 tchar.
bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) !=
                                std::string_view::npos;
}

// A field value without control characters but HTAB (RFC 9110 §5.5):
// a bare CR would end the line for some readers and start a header of the
// client's choosing.
bool IsFieldValue(std::string_view value) {
  for (unsigned char c : value) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

Result<StoredResponse> DecodeStoredResponse(std::string_view bytes) {
  if (!bytes.starts_with(kMagic)) return Corrupt("it does not start with \"idemgate-http/1\"");
  bytes.remove_prefix(kMagic.size());
  StoredResponse out;
  size_t eol = bytes.find('\n');
  if (eol == std::string_view::npos) return Corrupt("no status line");
  std::string_view status = bytes.substr(0, eol);
  auto [end, ec] = std::from_chars(status.data(), status.data() + status.size(), out.status);
  // A final answer: 1xx are interim (101 would switch protocols) and never
  // stored; past 599 is no HTTP status (security review F13).
  if (ec != std::errc() || end != status.data() + status.size() || out.status < 200 ||
      out.status > 599) {
    return Corrupt("bad status: a stored answer's status must be 200 to 599");
  }
  bytes.remove_prefix(eol + 1);
  while (true) {
    eol = bytes.find('\n');
    if (eol == std::string_view::npos) return Corrupt("no blank line after the headers");
    std::string_view line = bytes.substr(0, eol);
    bytes.remove_prefix(eol + 1);
    if (line.empty()) break;
    size_t colon = line.find(": ");
    if (colon == std::string_view::npos || colon == 0) return Corrupt("a malformed header line");
    const std::string_view name = line.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), [](char c) { return IsTokenChar(c); })) {
      return Corrupt("a header name that is not a token");
    }
    if (!IsFieldValue(line.substr(colon + 2))) {
      return Corrupt("a control character (CR, NUL, ESC …) in a header value");
    }
    out.headers.push_back(
        {std::string(line.substr(0, colon)), std::string(line.substr(colon + 2))});
  }
  out.body.assign(bytes);
  return out;
}

}  // namespace idem::proxy
