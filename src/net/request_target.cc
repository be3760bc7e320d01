#include "net/request_target.h"

#include <boost/beast/core/string.hpp>

namespace idem::net {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsUnreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_' || c == '~';
}

// Percent-encoding normalisation (RFC 3986 §6.2.2.2) of `path`.
Result<std::string> NormalizeEscapes(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      out.push_back(path[i]);
      continue;
    }
    const int hi = i + 2 < path.size() ? HexValue(path[i + 1]) : -1;
    const int lo = hi >= 0 ? HexValue(path[i + 2]) : -1;
    if (lo < 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the request target has a malformed percent-escape at byte " +
                           std::to_string(i) + " of its path: '%' must be followed by two hex "
                           "digits");
    }
    const char c = static_cast<char>(hi * 16 + lo);
    if (IsUnreserved(c)) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[hi]);
      out.push_back(kHex[lo]);
    }
    i += 2;
  }
  return out;
}

// Collapses runs of '/' and removes "." and ".." segments of an absolute
// path (RFC 3986 §5.2.4 on segments).
std::string RemoveDotSegments(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  size_t i = 0;
  while (i < path.size()) {
    // Here path[i] == '/' (the path starts with one, and each step ends at one).
    size_t end = path.find('/', i + 1);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view segment = path.substr(i + 1, end - i - 1);
    const bool last = end == path.size();
    if (segment.empty() && !last) {
      // "//": an empty segment, collapsed.
    } else if (segment == ".") {
      if (last) out.push_back('/');
    } else if (segment == "..") {
      const size_t slash = out.rfind('/');
      out.erase(slash == std::string::npos ? 0 : slash);
      if (last) out.push_back('/');
    } else {
      out.push_back('/');
      out.append(segment);
    }
    i = end;
  }
  return out.empty() ? "/" : out;
}

}  // namespace

Result<std::string> NormalizeTarget(std::string_view target, std::string_view host) {
  if (!target.starts_with('/')) {
    const size_t scheme_end = target.find("://");
    const std::string_view scheme = target.substr(0, scheme_end);
    if (scheme_end == std::string_view::npos ||
        !(boost::beast::iequals(scheme, "http") || boost::beast::iequals(scheme, "https"))) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the request target must be a path starting with '/' (origin-form); "
                       "authority-form (CONNECT) and '*' are not served here");
    }
    std::string_view rest = target.substr(scheme_end + 3);
    const size_t path_at = rest.find_first_of("/?");
    const std::string_view authority = rest.substr(0, path_at);
    if (authority.empty() || !boost::beast::iequals(authority, host)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the absolute-form request target names another host than the Host "
                       "header: this listener is not a forward proxy; send the path "
                       "(origin-form) to the host you mean");
    }
    rest = path_at == std::string_view::npos ? std::string_view("/") : rest.substr(path_at);
    return NormalizeTarget(rest.starts_with('?') ? "/" + std::string(rest) : std::string(rest),
                           host);
  }
  const size_t q = target.find('?');
  Result<std::string> path = NormalizeEscapes(target.substr(0, q));
  if (!path) return path;
  std::string out = RemoveDotSegments(*path);
  if (q != std::string_view::npos) out.append(target.substr(q));
  return out;
}

}  // namespace idem::net
