#include "net/url_text.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace idem::net {
namespace {

// Query parameters that carry a secret: libpq takes `password` and
// `sslpassword` in a URL's query as well as in its user info.
bool IsSecretParameter(std::string_view name) {
  static constexpr std::array<std::string_view, 6> kSecret = {
      "password", "sslpassword", "passwd", "pass", "secret", "token"};
  return std::any_of(kSecret.begin(), kSecret.end(), [&](std::string_view s) {
    return name.size() == s.size() &&
           std::equal(name.begin(), name.end(), s.begin(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) == b;
           });
  });
}

// `url` with the values of IsSecretParameter parameters in its query
// replaced by "***".
std::string WithoutSecretParameters(std::string url) {
  const size_t q = url.find('?');
  if (q == std::string::npos) return url;
  const size_t end = std::min(url.find('#', q), url.size());
  std::string out = url.substr(0, q + 1);
  size_t i = q + 1;
  while (i <= end) {
    size_t amp = std::min(url.find('&', i), end);
    const std::string_view param = std::string_view(url).substr(i, amp - i);
    const size_t eq = param.find('=');
    if (eq != std::string_view::npos && IsSecretParameter(param.substr(0, eq))) {
      out.append(param.substr(0, eq + 1)).append("***");
    } else {
      out.append(param);
    }
    if (amp < end) out.push_back('&');
    i = amp + 1;
  }
  out.append(url.substr(end));
  return out;
}

std::string WithoutUserPassword(std::string_view url) {
  const size_t scheme = url.find("://");
  const size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
  // The authority ends at the path, the query or the fragment; its user info
  // at the last '@' before that.
  const size_t end = std::min(url.find_first_of("/?#", start), url.size());
  const size_t at = url.substr(0, end).rfind('@');
  if (at == std::string_view::npos || at < start) return std::string(url);
  const size_t colon = url.substr(0, at).find(':', start);
  if (colon == std::string_view::npos) {
    // "redis://secret@host": Redis URLs take a lone user info as the password.
    return std::string(url.substr(0, start)) + "***" + std::string(url.substr(at));
  }
  return std::string(url.substr(0, colon + 1)) + "***" + std::string(url.substr(at));
}

}  // namespace

std::string WithoutPassword(std::string_view url) {
  return WithoutSecretParameters(WithoutUserPassword(url));
}

}  // namespace idem::net
