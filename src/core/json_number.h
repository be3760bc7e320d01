// JSON number literals to their canonical text (RFC 8785 §3.2.2.3 and the fingerprint's exact
// form, docs/DESIGN.md §3). Internal to idem_core; the parser checks the grammar, this file the value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::json {

// A number literal that already matched the JSON grammar, split into its parts.
struct NumberLiteral {
  std::string_view text;          // the whole literal, sign included
  bool negative = false;          // a leading '-'
  std::string_view int_digits;    // "0" or [1-9][0-9]*
  std::string_view frac_digits;   // digits after '.', possibly empty
  int64_t exponent = 0;           // the e/E part; clamped to +-kExponentLimit
  bool exponent_clamped = false;  // the written exponent was beyond +-kExponentLimit
};

// Exponents are accumulated up to this magnitude; anything larger overflows or underflows
// every double, whatever the digits.
inline constexpr int64_t kExponentLimit = 1'000'000'000'000'000;

enum class NumberProblem {
  kNone,
  kOverflow,         // beyond the largest double: rejected in every mode
  kUnderflow,        // a nonzero literal that is 0 as a double: rejected in the strict profile
  kExponentTooLarge  // exact mode only: an exponent too large to keep exactly
};

// Appends the canonical text of `lit` to `out`, or returns why it has none (then `out` may
// hold a partial write the caller discards).
//   exact=false: RFC 8785, the ECMAScript Number::toString of the nearest double.
//   exact=true:  the literal's exact decimal value, normalised (no leading/trailing zeros,
//                sign dropped for zero) and laid out like Number::toString with all its digits.
//                Equal to the RFC 8785 text whenever the literal is the shortest round-trip
//                form of its double; it never equals the RFC 8785 text of a different value.
//   strict:      a nonzero literal that underflows to 0 is kUnderflow, else it is "0" (or,
//                in exact mode, its exact value).
NumberProblem AppendCanonicalNumber(const NumberLiteral& lit, bool exact, bool strict,
                                    std::string& out);

// Appends the ECMAScript Number::toString (ECMA-262 Number::toString, radix 10) layout of the
// value 0.d1d2...dk x 10^n: `digits` is d1..dk, nonempty, no leading or trailing zero.
void AppendEcmaLayout(bool negative, std::string_view digits, int64_t n, std::string& out);

// Appends the RFC 8785 text of a finite double: its shortest round-trip digits in the
// Number::toString layout; -0 is "0".
void AppendJcsDouble(double value, std::string& out);

}  // namespace idem::json
