// The Streamable HTTP header rules of src/fronts/mcp/http_protocol.h on arbitrary
// header values. Input: up to three values separated by NUL bytes (a header
// value cannot hold one). Properties:
//  - HostOfAuthority returns a part of its argument;
//  - IsValidSessionId is exactly "1..1024 bytes of 0x21..0x7E";
//  - ParseHostPort / FormatHostPort and the mirrored-header and base64
//    encodings round-trip, and encoded header values are visible ASCII;
//  - PrintableExcerpt is printable and bounded;
//  - errors are kInvalidArgument with a message.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "fronts/mcp/http_protocol.h"

namespace {

namespace mcp = idem::mcp;

bool IsVisibleAscii(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7E) return false;
  }
  return true;
}

template <typename T>
void CheckError(const idem::Result<T>& r) {
  if (!r) {
    FUZZ_CHECK(r.error().code == idem::ErrorCode::kInvalidArgument);
    FUZZ_CHECK(!r.error().message.empty());
  }
}

bool Within(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() < 2) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  while (parts.size() < 3) parts.push_back("application/json");
  const std::string_view a = parts[0], b = parts[1];
  const std::vector<std::string> allowed = {std::string(b), std::string(parts[2])};

  // Versions and media types.
  if (mcp::IsStatelessProtocolVersion(a)) FUZZ_CHECK(mcp::IsSupportedProtocolVersion(a));
  (void)mcp::AcceptsMediaType(a, b);
  FUZZ_CHECK(mcp::AcceptsMediaType("", b));
  (void)mcp::IsMediaType(a, b);
  if (!b.empty() && IsVisibleAscii(b) && b.find_first_of(";, \t") == std::string_view::npos) {
    FUZZ_CHECK(mcp::IsMediaType(std::string(b) + "; charset=utf-8", b));
  }

  // Session ids.
  bool valid_id = !a.empty() && a.size() <= 1024;
  for (char c : a) valid_id = valid_id && c >= 0x21 && c <= 0x7E;
  FUZZ_CHECK_EQ(mcp::IsValidSessionId(a), valid_id);

  // Hosts and origins.
  const std::string_view host = mcp::HostOfAuthority(a);
  FUZZ_CHECK(Within(host, a));
  (void)mcp::IsLoopbackHost(a);
  (void)mcp::IsOriginAllowed(a, std::span<const std::string>(allowed));
  if (mcp::IsLoopbackHost(host)) FUZZ_CHECK(mcp::IsHostAllowedOnLoopback(a, {}));
  (void)mcp::IsHostAllowedOnLoopback(a, std::span<const std::string>(allowed));

  // Listen addresses.
  const auto hp = mcp::ParseHostPort(a);
  CheckError(hp);
  if (hp) {
    FUZZ_CHECK(!hp->host.empty());
    const std::string formatted = mcp::FormatHostPort(hp->host, hp->port);
    const auto again = mcp::ParseHostPort(formatted);
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(again->host, hp->host);
    FUZZ_CHECK_EQ(again->port, hp->port);
  }

  // Mirrored header values and base64.
  const std::string encoded = mcp::EncodeMirroredHeaderValue(a);
  FUZZ_CHECK(IsVisibleAscii(encoded));
  const auto decoded = mcp::DecodeMirroredHeaderValue(encoded);
  FUZZ_CHECK(decoded.has_value());
  FUZZ_CHECK_EQ(*decoded, a);
  CheckError(mcp::DecodeMirroredHeaderValue(a));

  const std::string b64 = mcp::Base64Encode(a);
  FUZZ_CHECK_EQ(b64.size(), (a.size() + 2) / 3 * 4);
  const auto b64_back = mcp::Base64Decode(b64);
  FUZZ_CHECK(b64_back.has_value());
  FUZZ_CHECK_EQ(*b64_back, a);
  const auto raw = mcp::Base64Decode(a);
  CheckError(raw);
  if (raw) {
    const auto again = mcp::Base64Decode(mcp::Base64Encode(*raw));
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(*again, *raw);
  }

  // Log excerpts.
  const size_t max = b.size();
  const std::string excerpt = mcp::PrintableExcerpt(a, max);
  FUZZ_CHECK(IsVisibleAscii(excerpt));
  FUZZ_CHECK(excerpt.size() <= max + 3);
  return 0;
}
