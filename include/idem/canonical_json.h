// RFC 8785 (JCS) canonical JSON and the argument fingerprint (docs/DESIGN.md §3).
//
// The parser does no I/O: bytes in, canonical bytes out. Input that is not
// I-JSON is refused with kInvalidArgument and a message that names the
// problem and its byte offset ("invalid JSON at byte 17: duplicate member
// name \"a\"; send each member once"; offsets count from 0): invalid UTF-8,
// lone surrogates, duplicate member names (compared after unescaping),
// NaN/Infinity, leading zeros and other syntax errors, numbers that overflow a
// double, trailing data. The two configured limits, nesting past max_depth
// and input past max_bytes, give kResourceExhausted with a message that names
// the limit.
//
// All functions are thread-safe: they share no state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace idem {

struct CanonOptions {
  // Reject inputs longer than this many bytes. Default 1 MiB. Values above
  // 256 MiB act as 256 MiB.
  size_t max_bytes = 1 << 20;
  // Reject arrays/objects nested deeper than this (a top-level [] is depth 1).
  // Default 128. Parsing is iterative, so any depth is safe to allow.
  size_t max_depth = 128;
  // Strict I-JSON profile: also reject Unicode noncharacters, a leading BOM
  // and number literals that underflow to zero. Default off; then a leading
  // BOM is skipped (RFC 8259 §8.1), noncharacters are kept and an underflowing
  // literal is 0.
  bool strict = false;
  // Fingerprint mode: a number whose literal a double cannot hold exactly
  // (beyond 2^53, more digits than a double keeps) is written with its exact
  // decimal value, normalised, instead of the rounded double. Never collides
  // with the canonical form of any other number. Default off (pure RFC 8785).
  //
  // Precisely: the literal's exact decimal value, without leading or trailing
  // zeros, is laid out like ECMAScript Number::toString with all its digits
  // (12345678901234567891, 0.1000000000000000000001, 1.5e+400 is refused, see
  // below). When those digits are the double's shortest round-trip digits this
  // is exactly the RFC 8785 text, so "1.0", "1" and "1e0" agree, while
  // "0.30000000000000001" and "0.3" do not. Accepts what pure mode accepts:
  // numbers beyond double range are still refused; a literal that underflows
  // (1e-400) keeps its exact value unless strict refuses it; an exponent
  // beyond +-10^15 cannot be kept exactly and is refused.
  bool exact_numbers = false;
};

// Returns the RFC 8785 canonical form of the JSON text `input`.
Result<std::string> Canonicalize(std::string_view input, const CanonOptions& options = {});

// Returns lowercase hex SHA-256 of the canonical form of `input`, with
// options.exact_numbers forced on (§3's deliberate deviation).
Result<std::string> Fingerprint(std::string_view input, CanonOptions options = {});

// Fingerprint of a selection of `input`: the object {"<pointer>": value, ...}
// for each RFC 6901 JSON Pointer in `pointers`. Used by the `fields` key
// mode. kInvalidArgument, naming the pointer, when one selects nothing (an
// absent field would otherwise give every call without it one key; an
// explicit null is a value); for a malformed pointer (one that does not start
// with '/', has a '~' not followed by 0 or 1, or is not UTF-8); and for input
// Fingerprint() refuses. The empty pointer "" selects the whole
// document; an array index is "0" or digits without a leading zero, anything
// else (including "-") selects nothing; a pointer listed twice counts once.
Result<std::string> FingerprintFields(std::string_view input,
                                      const std::vector<std::string>& pointers,
                                      CanonOptions options = {});

// Lowercase hex SHA-256 of raw bytes.
std::string Sha256Hex(std::string_view bytes);

}  // namespace idem
