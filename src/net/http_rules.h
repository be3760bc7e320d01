// HTTP rules the HTTP server and the fronts share, as pure functions:
// media-type negotiation, Origin/Host checks against DNS rebinding, listen
// addresses, base64, and excerpts of untrusted bytes safe for logs and
// messages. No I/O; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::net {

// True if the Accept header value admits `media_type` ("application/json"):
// listed exactly, or by "type/*" or "*/*", with a q-value above 0. An empty
// header admits everything (RFC 9110 §12.5.1).
bool AcceptsMediaType(std::string_view accept_header, std::string_view media_type);

// True if the Content-Type value names `media_type`, ignoring parameters and case.
bool IsMediaType(std::string_view content_type, std::string_view media_type);

// True if `host` (a name or an IP literal, IPv6 with or without brackets) is
// the loopback: "localhost", "*.localhost", 127.0.0.0/8 or ::1.
bool IsLoopbackHost(std::string_view host);

// The host part of a Host header or an authority ("h:80" → "h",
// "[::1]:80" → "::1").
std::string_view HostOfAuthority(std::string_view authority);

// Whether a request's Origin header is acceptable (DNS-rebinding protection).
// An origin is "scheme://host[:port]". Loopback origins are always allowed;
// any other must appear exactly (case-insensitively) in `allowed_origins`.
// "null" and unparsable origins are refused.
bool IsOriginAllowed(std::string_view origin, std::span<const std::string> allowed_origins);

// Whether a request's Host header is acceptable for a listener bound to a
// loopback address: a loopback name, or one listed in `allowed_hosts`
// (host names without port, case-insensitive). A DNS-rebinding page reaches
// a loopback listener with its own name in Host, so this refuses it.
bool IsHostAllowedOnLoopback(std::string_view host_header,
                             std::span<const std::string> allowed_hosts);

// HOST:PORT of a listener. Host may be a name, IPv4, or a bracketed IPv6
// literal ("[::1]:8080"); port 0 asks the OS for a free port.
struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};
// kInvalidArgument with a message naming the accepted forms.
Result<HostPort> ParseHostPort(std::string_view text);
// "127.0.0.1:8080" or "[::1]:8080".
std::string FormatHostPort(std::string_view host, uint16_t port);

// Standard base64 (with padding) and its inverse (kInvalidArgument on bad input).
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

// `text` cut to `max` bytes with every byte outside printable ASCII replaced
// by '?': safe to put into logs and JSON error messages.
std::string PrintableExcerpt(std::string_view text, size_t max = 200);

}  // namespace idem::net
