// The header-level rules of MCP's Streamable HTTP transport, as pure
// functions: protocol versions, session ids and the encoding of mirrored
// header values; the HTTP rules it shares with the other fronts (media
// types, Origin/Host, listen addresses, base64) are net/http_rules.h. No
// I/O; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "net/http_rules.h"

namespace idem::mcp {

// The shared HTTP rules, under the names the MCP transport has always used.
using net::AcceptsMediaType;
using net::Base64Decode;
using net::Base64Encode;
using net::FormatHostPort;
using net::HostOfAuthority;
using net::HostPort;
using net::IsHostAllowedOnLoopback;
using net::IsLoopbackHost;
using net::IsMediaType;
using net::IsOriginAllowed;
using net::ParseHostPort;
using net::PrintableExcerpt;

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

// A new session id: 32 random bytes from the OS CSPRNG, base64url without
// padding (43 visible-ASCII characters). kInternal if the CSPRNG fails.
Result<std::string> NewSessionId();

// True if `id` can be a session id: 1..1024 characters, each visible ASCII
// (0x21..0x7E), as the spec requires and so that it is safe in a header.
bool IsValidSessionId(std::string_view id);

// A header value for a mirrored field (Mcp-Name, Mcp-Param-*; MCP
// 2026-07-28): the value itself when it is plain visible ASCII with no
// leading or trailing space and does not look like the sentinel, else
// "=?base64?<base64 of the UTF-8>?=".
std::string EncodeMirroredHeaderValue(std::string_view value);
// The inverse of EncodeMirroredHeaderValue; kInvalidArgument for a sentinel
// with invalid base64.
Result<std::string> DecodeMirroredHeaderValue(std::string_view header_value);

}  // namespace idem::mcp
