#include "fronts/http_proxy/idempotency_key.h"

namespace idem::proxy {
namespace {

constexpr std::string_view kSend =
    "; send one key per request as an RFC 8941 string (Idempotency-Key: \"8e5b-41a2\") or a bare "
    "value of visible ASCII";

Result<std::string> Invalid(std::string what) {
  return MakeError(ErrorCode::kInvalidArgument,
                   "invalid Idempotency-Key header: " + std::move(what) + std::string(kSend));
}

std::string Hex(unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("0x") + kHex[c >> 4] + kHex[c & 15];
}

bool IsOws(char c) { return c == ' ' || c == '\t'; }

// Checks one byte of the key's content; empty when it is acceptable.
std::string BadByte(unsigned char c, size_t offset) {
  if (c == ' ') {
    return "a space at byte " + std::to_string(offset) +
           "; idemgate keys are visible ASCII without spaces";
  }
  if (c < 0x20 || c == 0x7f) {
    return "a control byte " + Hex(c) + " at byte " + std::to_string(offset);
  }
  if (c > 0x7f) {
    return "a non-ASCII byte " + Hex(c) + " at byte " + std::to_string(offset) +
           "; keys are ASCII only (encode other identifiers, e.g. as hex)";
  }
  return {};
}

Result<std::string> CheckLength(std::string key, const IdempotencyKeyOptions& options) {
  if (key.empty()) return Invalid("the key is empty");
  if (key.size() > options.max_bytes) {
    return Invalid("the key is " + std::to_string(key.size()) + " bytes, more than the limit of " +
                   std::to_string(options.max_bytes) + " (hash longer identifiers)");
  }
  return key;
}

}  // namespace

Result<std::string> ParseIdempotencyKey(std::string_view value,
                                        const IdempotencyKeyOptions& options) {
  size_t begin = 0, end = value.size();
  while (begin < end && IsOws(value[begin])) ++begin;
  while (end > begin && IsOws(value[end - 1])) --end;
  const std::string_view v = value.substr(begin, end - begin);
  if (v.empty()) return Invalid("the value is empty");

  if (v.front() != '"') {
    // A bare value: visible ASCII, no quotes, and none of the structure of
    // a structured field (parameters, lists) that would make it ambiguous.
    for (size_t i = 0; i < v.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(v[i]);
      if (c == ';') return Invalid("parameters (\";\") are not accepted");
      if (c == ',') return Invalid("a list (\",\") is not accepted; send exactly one key");
      if (c == '"' || c == '\\') {
        return Invalid("a stray '" + std::string(1, static_cast<char>(c)) + "' at byte " +
                       std::to_string(i) + " of a bare value; quote the whole key");
      }
      if (std::string bad = BadByte(c, i); !bad.empty()) return Invalid(bad);
    }
    return CheckLength(std::string(v), options);
  }

  // An sf-string (RFC 8941 §4.2.5).
  std::string key;
  key.reserve(v.size());
  size_t i = 1;
  bool closed = false;
  for (; i < v.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"') {
      closed = true;
      ++i;
      break;
    }
    if (c == '\\') {
      if (i + 1 >= v.size()) return Invalid("the string ends in a lone backslash");
      const char next = v[i + 1];
      if (next != '"' && next != '\\') {
        return Invalid("'\\" + std::string(1, next) + "' at byte " + std::to_string(i) +
                       " is not an escape; only \\\" and \\\\ are");
      }
      key.push_back(next);
      ++i;
      continue;
    }
    if (std::string bad = BadByte(c, i); !bad.empty()) return Invalid(bad);
    key.push_back(static_cast<char>(c));
  }
  if (!closed) return Invalid("the string has no closing quote");
  while (i < v.size() && IsOws(v[i])) ++i;
  if (i < v.size()) {
    if (v[i] == ';') return Invalid("parameters (\";\") are not accepted");
    if (v[i] == ',') return Invalid("a list (\",\") is not accepted; send exactly one key");
    return Invalid("unexpected text after the closing quote at byte " + std::to_string(i));
  }
  if (key.empty()) return Invalid("the key is the empty string");
  return CheckLength(std::move(key), options);
}

std::string SerializeIdempotencyKey(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace idem::proxy
