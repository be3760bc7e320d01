// Idempotency keys (docs/DESIGN.md §3).
//
// A derived key is versioned and unambiguous: "v1t.<turn>.<tool>.<fp>" (turn
// mode), "v1a.<tool>.<fp>" (args), "v1f.<tool>.<fp>" (fields). Parts are
// percent-encoded so '.' never appears inside one; a part longer than 80
// encoded bytes is replaced by "~" + 40 hex of its SHA-256 ('~' never occurs in
// an encoded part). Keys are at most 255 bytes of visible ASCII, so they fit an
// HTTP header as they are.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem {

enum class KeyMode { kTurn, kArgs, kFields, kExplicit, kOff };

std::string_view KeyModeName(KeyMode mode);
Result<KeyMode> ParseKeyMode(std::string_view name);

inline constexpr size_t kMaxKeyBytes = 255;

struct KeyInput {
  KeyMode mode = KeyMode::kTurn;
  std::string turn;         // turn mode; empty → falls back to args mode (see DeriveKey)
  std::string tool;         // tool name, or "METHOD /path" for the HTTP front
  std::string fingerprint;  // hex SHA-256 of the arguments (or of the selected fields)
  std::optional<std::string> explicit_key;  // a key the caller sent: always wins
};

struct DerivedKey {
  std::string key;
  KeyMode mode;             // the mode actually used
  bool turn_fallback = false;  // turn mode without a turn id: args mode, shorter window
};

// Derives the key for `input`. A caller-sent key always wins and must be
// 1..255 bytes of visible ASCII (kInvalidArgument otherwise). kExplicit without
// a key and kOff give kInvalidArgument.
Result<DerivedKey> DeriveKey(const KeyInput& input);

// Checks a caller-sent key: 1..255 bytes, each 0x21..0x7E.
Result<void> ValidateKey(std::string_view key);

// Scopes: one store may keep the records of several upstreams (two MCP
// servers behind one host, two instances of one server), and a call to one
// must never be answered from another's record: that would be a lost
// action. The record of `key` within `scope` is keyed "<scope>/<key>"; an
// empty scope leaves `key` as it is. A result that would pass 255 bytes
// keeps the scope and replaces the key by "~" + 40 hex of its SHA-256.
std::string ScopedKey(std::string_view scope, std::string_view key);

// The scope of an upstream named by `identity` (an MCP server's command
// line, its arguments joined by NUL bytes, or its URL): "u" + the first 12
// hex of its SHA-256.
std::string ScopeOfUpstream(std::string_view identity);

// Checks a configured scope: 1..64 bytes of [A-Za-z0-9_.:-].
Result<void> ValidateScope(std::string_view scope);

}  // namespace idem
