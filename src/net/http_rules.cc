#include "net/http_rules.h"

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <charconv>

namespace idem::net {
namespace {

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return Lower(x) == Lower(y); });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

bool AcceptsMediaType(std::string_view accept, std::string_view media_type) {
  if (Trim(accept).empty()) return true;
  std::string_view type = media_type.substr(0, media_type.find('/'));
  while (!accept.empty()) {
    size_t comma = accept.find(',');
    std::string_view item = accept.substr(0, comma);
    accept = comma == std::string_view::npos ? std::string_view() : accept.substr(comma + 1);
    std::string_view range = Trim(item.substr(0, item.find(';')));
    bool matches = EqualsIgnoreCase(range, media_type) || range == "*/*" ||
                   (range.size() == type.size() + 2 && range.ends_with("/*") &&
                    EqualsIgnoreCase(range.substr(0, type.size()), type));
    if (!matches) continue;
    // A q-value of 0 means "not acceptable".
    bool refused = false;
    std::string_view params = item.find(';') == std::string_view::npos
                                  ? std::string_view()
                                  : item.substr(item.find(';') + 1);
    while (!params.empty()) {
      size_t semi = params.find(';');
      std::string_view param = Trim(params.substr(0, semi));
      params = semi == std::string_view::npos ? std::string_view() : params.substr(semi + 1);
      if (param.size() >= 2 && Lower(param[0]) == 'q' && param[1] == '=') {
        std::string_view q = Trim(param.substr(2));
        refused = !q.empty() && q.find_first_not_of("0.") == std::string_view::npos;
      }
    }
    if (!refused) return true;
  }
  return false;
}

bool IsMediaType(std::string_view content_type, std::string_view media_type) {
  return EqualsIgnoreCase(Trim(content_type.substr(0, content_type.find(';'))), media_type);
}

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return false;
  if (host.back() == '.') host.remove_suffix(1);  // "localhost." is "localhost"
  if (EqualsIgnoreCase(host, "localhost")) return true;
  constexpr std::string_view kSuffix = ".localhost";
  if (host.size() > kSuffix.size() &&
      EqualsIgnoreCase(host.substr(host.size() - kSuffix.size()), kSuffix)) {
    return true;
  }
  boost::system::error_code ec;
  boost::asio::ip::address address = boost::asio::ip::make_address(std::string(host), ec);
  if (ec) return false;
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, address.to_v6())
        .is_loopback();
  }
  return address.is_loopback();
}

std::string_view HostOfAuthority(std::string_view authority) {
  authority = Trim(authority);
  if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority = authority.substr(at + 1);
  }
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return authority;
    return authority.substr(1, close - 1);
  }
  return authority.substr(0, authority.find(':'));
}

bool IsOriginAllowed(std::string_view origin, std::span<const std::string> allowed_origins) {
  origin = Trim(origin);
  for (const std::string& allowed : allowed_origins) {
    if (EqualsIgnoreCase(origin, allowed)) return true;
  }
  size_t sep = origin.find("://");
  if (sep == std::string_view::npos) return false;
  std::string_view scheme = origin.substr(0, sep);
  if (!EqualsIgnoreCase(scheme, "http") && !EqualsIgnoreCase(scheme, "https")) return false;
  std::string_view authority = origin.substr(sep + 3);
  authority = authority.substr(0, authority.find('/'));
  return IsLoopbackHost(HostOfAuthority(authority));
}

bool IsHostAllowedOnLoopback(std::string_view host_header,
                             std::span<const std::string> allowed_hosts) {
  std::string_view host = HostOfAuthority(host_header);
  if (IsLoopbackHost(host)) return true;
  for (const std::string& allowed : allowed_hosts) {
    if (EqualsIgnoreCase(host, allowed)) return true;
  }
  return false;
}

Result<HostPort> ParseHostPort(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "invalid listen address '" + std::string(text) + "': " + std::string(why) +
                         " (expected HOST:PORT, e.g. 127.0.0.1:8080, localhost:0 or [::1]:8080)");
  };
  HostPort out;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    out.host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
    if (!rest.starts_with(":")) return bad("missing ':PORT' after the IPv6 address");
    rest.remove_prefix(1);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing ':PORT'");
    out.host = std::string(text.substr(0, colon));
    if (out.host.find(':') != std::string::npos) return bad("put IPv6 addresses in brackets");
    rest = text.substr(colon + 1);
  }
  if (out.host.empty()) return bad("missing HOST");
  // FormatHostPort could not write such a host back ("[[]:8" is host "[").
  if (out.host.find_first_of("[]") != std::string::npos) return bad("'[' or ']' inside HOST");
  unsigned port = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
  if (rest.empty() || ec != std::errc() || end != rest.data() + rest.size() || port > 65535) {
    return bad("PORT must be a number from 0 to 65535");
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string FormatHostPort(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  out.append(":").append(std::to_string(port));
  return out;
}

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out.push_back(kBase64[(n >> 18) & 63]);
    out.push_back(kBase64[(n >> 12) & 63]);
    out.push_back(kBase64[(n >> 6) & 63]);
    out.push_back(kBase64[n & 63]);
  }
  if (i + 1 == bytes.size()) {
    uint32_t n = uint8_t(bytes[i]) << 16;
    out.push_back(kBase64[(n >> 18) & 63]);
    out.push_back(kBase64[(n >> 12) & 63]);
    out.append("==");
  } else if (i + 2 == bytes.size()) {
    uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out.push_back(kBase64[(n >> 18) & 63]);
    out.push_back(kBase64[(n >> 12) & 63]);
    out.push_back(kBase64[(n >> 6) & 63]);
    out.push_back('=');
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  auto bad = [] { return MakeError(ErrorCode::kInvalidArgument, "invalid base64"); };
  if (text.size() % 4 != 0) return bad();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return bad();
      v[k] = Base64Value(c);
      if (v[k] < 0) return bad();
    }
    uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>((n >> 16) & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return out;
}

std::string PrintableExcerpt(std::string_view text, size_t max) {
  std::string out;
  for (char c : text.substr(0, max)) out.push_back(c >= 0x20 && c <= 0x7E ? c : '?');
  if (text.size() > max) out.append("...");
  return out;
}

}  // namespace idem::net
