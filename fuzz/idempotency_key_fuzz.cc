// The Idempotency-Key field parser of the HTTP reverse proxy
// (src/fronts/http_proxy/idempotency_key.h) on arbitrary header values:
//  - a refusal is kInvalidArgument with a message;
//  - an accepted key is 1..max_bytes bytes of visible ASCII without spaces,
//    a valid idemgate key, and its sf-string serialization parses back to it;
//  - a bare value is accepted exactly when it is visible ASCII without
//    '"', '\\', ';' and ',' and fits the limit, and then as it stands;
//  - a smaller limit accepts a subset, with the same key.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "idem/key.h"
#include "fronts/http_proxy/idempotency_key.h"

namespace {

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsPlainBare(std::string_view v) {
  if (v.empty() || v.front() == '"') return false;
  for (char c : v) {
    if (c < 0x21 || c > 0x7E || c == '"' || c == '\\' || c == ';' || c == ',') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  namespace proxy = idem::proxy;

  const auto key = proxy::ParseIdempotencyKey(value);
  if (!key) {
    FUZZ_CHECK(key.error().code == idem::ErrorCode::kInvalidArgument);
    FUZZ_CHECK(!key.error().message.empty());
  } else {
    FUZZ_CHECK(!key->empty() && key->size() <= idem::kMaxKeyBytes);
    FUZZ_CHECK(idem::ValidateKey(*key).has_value());
    const auto again = proxy::ParseIdempotencyKey(proxy::SerializeIdempotencyKey(*key));
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(*again, *key);
  }

  const std::string_view trimmed = TrimOws(value);
  if (IsPlainBare(trimmed)) {
    FUZZ_CHECK_EQ(key.has_value(), trimmed.size() <= idem::kMaxKeyBytes);
    if (key) FUZZ_CHECK_EQ(*key, trimmed);
  } else if (trimmed.empty() || trimmed.front() != '"') {
    FUZZ_CHECK(!key.has_value());
  }

  const size_t small = size % 17;
  const auto limited = proxy::ParseIdempotencyKey(value, {.max_bytes = small});
  if (limited) {
    FUZZ_CHECK(key.has_value());
    FUZZ_CHECK_EQ(*limited, *key);
    FUZZ_CHECK(limited->size() <= small);
  } else if (key) {
    FUZZ_CHECK(key->size() > small);
  }
  return 0;
}
