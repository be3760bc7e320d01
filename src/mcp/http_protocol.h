// The header-level rules of MCP's Streamable HTTP transport, as pure
// functions: protocol versions, media-type negotiation, session ids,
// Origin/Host checks against DNS rebinding, listen addresses, and the
// encoding of mirrored header values. No I/O; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace idem::mcp {

// Protocol revisions the proxy accepts in MCP-Protocol-Version.
inline constexpr std::string_view kSupportedProtocolVersions[] = {
    "2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"};
// The first revision without sessions (server/discover, per-request metadata).
inline constexpr std::string_view kStatelessProtocolVersion = "2026-07-28";
// What a server assumes when a request carries no MCP-Protocol-Version.
inline constexpr std::string_view kDefaultProtocolVersion = "2025-03-26";

bool IsSupportedProtocolVersion(std::string_view version);
// True for revisions that have no sessions (2026-07-28 and later known ones).
bool IsStatelessProtocolVersion(std::string_view version);
// "2024-11-05, 2025-03-26, ..." for error messages.
std::string SupportedProtocolVersionList();

// True if the Accept header value admits `media_type` ("application/json"):
// listed exactly, or by "type/*" or "*/*", with a q-value above 0. An empty
// header admits everything (RFC 9110 §12.5.1).
bool AcceptsMediaType(std::string_view accept_header, std::string_view media_type);

// True if the Content-Type value names `media_type`, ignoring parameters and case.
bool IsMediaType(std::string_view content_type, std::string_view media_type);

// A new session id: 32 random bytes from the OS CSPRNG, base64url without
// padding (43 visible-ASCII characters). kInternal if the CSPRNG fails.
Result<std::string> NewSessionId();

// True if `id` can be a session id: 1..1024 characters, each visible ASCII
// (0x21..0x7E), as the spec requires and so that it is safe in a header.
bool IsValidSessionId(std::string_view id);

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

// A header value for a mirrored field (Mcp-Name, Mcp-Param-*; MCP
// 2026-07-28): the value itself when it is plain visible ASCII with no
// leading or trailing space and does not look like the sentinel, else
// "=?base64?<base64 of the UTF-8>?=".
std::string EncodeMirroredHeaderValue(std::string_view value);
// The inverse of EncodeMirroredHeaderValue; kInvalidArgument for a sentinel
// with invalid base64.
Result<std::string> DecodeMirroredHeaderValue(std::string_view header_value);

// Standard base64 (with padding) and its inverse (kInvalidArgument on bad input).
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

// `text` cut to `max` bytes with every byte outside printable ASCII replaced
// by '?': safe to put into logs and JSON error messages.
std::string PrintableExcerpt(std::string_view text, size_t max = 200);

}  // namespace idem::mcp
