#include "net/url_text.h"

namespace idem::net {

std::string WithoutPassword(std::string_view url) {
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

}  // namespace idem::net
