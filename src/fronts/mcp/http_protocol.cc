#include "fronts/mcp/http_protocol.h"

#include <openssl/rand.h>

#include <algorithm>

namespace idem::mcp {
namespace {

constexpr std::string_view kSentinelPrefix = "=?base64?";
constexpr std::string_view kSentinelSuffix = "?=";

bool LooksLikeSentinel(std::string_view v) {
  return v.size() >= kSentinelPrefix.size() + kSentinelSuffix.size() &&
         v.starts_with(kSentinelPrefix) && v.ends_with(kSentinelSuffix);
}

}  // namespace

bool IsSupportedProtocolVersion(std::string_view version) {
  return std::ranges::find(kSupportedProtocolVersions, version) !=
         std::end(kSupportedProtocolVersions);
}

bool IsStatelessProtocolVersion(std::string_view version) {
  return IsSupportedProtocolVersion(version) && version >= kStatelessProtocolVersion;
}

std::string SupportedProtocolVersionList() {
  std::string out;
  for (std::string_view v : kSupportedProtocolVersions) {
    if (!out.empty()) out.append(", ");
    out.append(v);
  }
  return out;
}

Result<std::string> NewSessionId() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    return MakeError(ErrorCode::kInternal, "the OS random generator failed to make a session id");
  }
  std::string id =
      Base64Encode(std::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
  while (!id.empty() && id.back() == '=') id.pop_back();
  std::ranges::replace(id, '+', '-');
  std::ranges::replace(id, '/', '_');
  return id;
}

bool IsValidSessionId(std::string_view id) {
  return !id.empty() && id.size() <= 1024 &&
         std::ranges::all_of(id, [](char c) { return c >= 0x21 && c <= 0x7E; });
}

std::string EncodeMirroredHeaderValue(std::string_view value) {
  bool plain = !value.empty() && value.front() != ' ' && value.back() != ' ' &&
               value.front() != '\t' && value.back() != '\t' && !LooksLikeSentinel(value) &&
               std::ranges::all_of(value, [](char c) { return c >= 0x20 && c <= 0x7E; });
  if (plain) return std::string(value);
  std::string out(kSentinelPrefix);
  out.append(Base64Encode(value)).append(kSentinelSuffix);
  return out;
}

Result<std::string> DecodeMirroredHeaderValue(std::string_view header_value) {
  if (!LooksLikeSentinel(header_value)) return std::string(header_value);
  return Base64Decode(
      header_value.substr(kSentinelPrefix.size(),
                          header_value.size() - kSentinelPrefix.size() - kSentinelSuffix.size()));
}

}  // namespace idem::mcp
