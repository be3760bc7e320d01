// The Idempotency-Key request header (IETF draft-ietf-httpapi-idempotency-key-header,
// docs/DESIGN.md §6.2): its value is an RFC 8941 sf-string ("abc"; backslash-quote
// and backslash-backslash are the only escapes); a bare value (abc, a UUID) is
// accepted too, because many clients send Stripe-style keys unquoted.
//
// A parser without I/O: header values in, a key or an error out. Thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "idem/error.h"
#include "idem/key.h"

namespace idem::proxy {

struct IdempotencyKeyOptions {
  // Longest key accepted, in bytes after unescaping. Default 255, the most a
  // store key may hold (kMaxKeyBytes); config [http] max_key_bytes.
  size_t max_bytes = kMaxKeyBytes;
};

// Parses one Idempotency-Key field value. Leading and trailing spaces and tabs
// (HTTP optional whitespace) are ignored. Returns the key: the unescaped
// content of an sf-string, or a bare value as it stands.
//
// kInvalidArgument, with a message that says what was wrong and what to send,
// for: an empty value or empty string; a key longer than options.max_bytes;
// a byte outside visible ASCII (controls, non-ASCII; a space, which an
// sf-string allows but an idemgate key may not hold); an unterminated string,
// a backslash not followed by '"' or '\\'; parameters (";a=1") or a list
// ("a", "b"); anything after the closing quote.
Result<std::string> ParseIdempotencyKey(std::string_view value,
                                        const IdempotencyKeyOptions& options = {});

// The sf-string form of a key ("abc", with '"' and '\\' escaped), for a
// vendor that expects the draft's serialization. `key` is visible ASCII.
std::string SerializeIdempotencyKey(std::string_view key);

}  // namespace idem::proxy
