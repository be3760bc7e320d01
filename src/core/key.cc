#include "idem/key.h"

#include <algorithm>

#include "idem/canonical_json.h"

namespace idem {
namespace {

// An encoded part longer than this is replaced by its hash, so that the
// longest key ("v1t." + 2 parts + 64 hex + separators) stays under 255 bytes.
constexpr size_t kMaxPartBytes = 80;

bool IsUnreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// Percent-encodes every byte outside [A-Za-z0-9_-], so '.', '~' and '%'
// never appear raw inside an encoded part: '.' separates parts and '~'
// marks a hashed one, which makes the joined key unambiguous.
std::string EncodePart(std::string_view part) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(part.size());
  for (unsigned char c : part) {
    if (IsUnreserved(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (out.size() > kMaxPartBytes) return "~" + Sha256Hex(part).substr(0, 40);
  return out;
}

bool IsHexFingerprint(std::string_view fp) {
  if (fp.size() != 64) return false;
  for (char c : fp) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string_view KeyModeName(KeyMode mode) {
  switch (mode) {
    case KeyMode::kTurn: return "turn";
    case KeyMode::kArgs: return "args";
    case KeyMode::kFields: return "fields";
    case KeyMode::kExplicit: return "explicit";
    case KeyMode::kOff: return "off";
  }
  return "?";
}

Result<KeyMode> ParseKeyMode(std::string_view name) {
  for (KeyMode m : {KeyMode::kTurn, KeyMode::kArgs, KeyMode::kFields, KeyMode::kExplicit,
                    KeyMode::kOff}) {
    if (KeyModeName(m) == name) return m;
  }
  return MakeError(ErrorCode::kInvalidArgument,
                   "unknown key mode \"" + std::string(name) +
                       "\"; expected one of: turn args fields explicit off");
}

Result<void> ValidateKey(std::string_view key) {
  if (key.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "the idempotency key is empty; send 1 to 255 "
                                                  "visible ASCII characters");
  }
  if (key.size() > kMaxKeyBytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "the idempotency key is " + std::to_string(key.size()) +
                         " bytes; keys are at most 255 bytes (hash longer identifiers)");
  }
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x21 || c > 0x7e) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the idempotency key has a byte 0x" +
                           std::string(1, "0123456789abcdef"[c >> 4]) +
                           std::string(1, "0123456789abcdef"[c & 15]) + " at offset " +
                           std::to_string(i) +
                           "; keys are visible ASCII (0x21-0x7e): no spaces, controls or UTF-8");
    }
  }
  return {};
}

Result<DerivedKey> DeriveKey(const KeyInput& input) {
  if (input.explicit_key) {
    if (auto ok = ValidateKey(*input.explicit_key); !ok) return std::unexpected(ok.error());
    return DerivedKey{*input.explicit_key, KeyMode::kExplicit, false};
  }
  switch (input.mode) {
    case KeyMode::kOff:
      return MakeError(ErrorCode::kInvalidArgument,
                       "key mode \"off\" has no key: the call passes through ungated");
    case KeyMode::kExplicit:
      return MakeError(ErrorCode::kInvalidArgument,
                       "tool \"" + input.tool +
                           "\" requires an explicit idempotency key and none was sent; send one "
                           "(MCP _meta \"dev.idemgate/idempotencyKey\", HTTP Idempotency-Key, "
                           "ledger API \"key\")");
    default:
      break;
  }
  if (!IsHexFingerprint(input.fingerprint)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "fingerprint must be 64 lowercase hex digits (SHA-256)");
  }
  if (input.tool.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "tool name is empty");
  }
  const std::string tool = EncodePart(input.tool);
  switch (input.mode) {
    case KeyMode::kTurn:
      if (input.turn.empty()) {
        return DerivedKey{"v1a." + tool + "." + input.fingerprint, KeyMode::kArgs, true};
      }
      return DerivedKey{"v1t." + EncodePart(input.turn) + "." + tool + "." + input.fingerprint,
                        KeyMode::kTurn, false};
    case KeyMode::kArgs:
      return DerivedKey{"v1a." + tool + "." + input.fingerprint, KeyMode::kArgs, false};
    case KeyMode::kFields:
      return DerivedKey{"v1f." + tool + "." + input.fingerprint, KeyMode::kFields, false};
    default:
      return MakeError(ErrorCode::kInternal, "unreachable key mode");
  }
}

std::string ScopedKey(std::string_view scope, std::string_view key) {
  if (scope.empty()) return std::string(key);
  std::string scoped = std::string(scope) + "/" + std::string(key);
  if (scoped.size() <= kMaxKeyBytes) return scoped;
  return std::string(scope) + "/~" + Sha256Hex(key).substr(0, 40);
}

std::string ScopeOfUpstream(std::string_view identity) {
  return "u" + Sha256Hex(identity).substr(0, 12);
}

Result<void> ValidateScope(std::string_view scope) {
  constexpr size_t kMaxScopeBytes = 64;
  auto allowed = [](unsigned char c) { return IsUnreserved(c) || c == '.' || c == ':'; };
  if (scope.empty() || scope.size() > kMaxScopeBytes ||
      !std::all_of(scope.begin(), scope.end(), allowed)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "scope \"" + std::string(scope.substr(0, 80)) +
                         "\" is not usable: give 1 to 64 characters of A-Z a-z 0-9 _ - . :");
  }
  return {};
}

}  // namespace idem
