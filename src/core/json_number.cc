#include "core/json_number.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace idem::json {
namespace {

// Where the value of a literal starts and how big it is: value = 0.d1d2... x 10^n with d1 the
// first nonzero digit. `zero` when every digit is 0.
struct Magnitude {
  bool zero = true;
  int64_t n = 0;
  bool lead_in_int = false;  // d1 is in the integer part (which then has no leading zero)
  size_t lead_frac = 0;      // else: index of d1 in frac_digits
};

Magnitude Measure(const NumberLiteral& lit) {
  Magnitude m;
  if (lit.int_digits != "0") {
    m.zero = false;
    m.lead_in_int = true;
    m.n = static_cast<int64_t>(lit.int_digits.size()) + lit.exponent;
    return m;
  }
  const size_t j = lit.frac_digits.find_first_not_of('0');
  if (j == std::string_view::npos) return m;
  m.zero = false;
  m.lead_frac = j;
  m.n = lit.exponent - static_cast<int64_t>(j);
  return m;
}

struct Parsed {
  double value;
  bool out_of_range;
};

Parsed ParseDouble(std::string_view text) {
  double d = 0;
  // std::from_chars is correctly rounded and leaves `d` untouched on ERANGE.
  const auto r = std::from_chars(text.data(), text.data() + text.size(), d);
  return {d, r.ec == std::errc::result_out_of_range || std::isinf(d)};
}

// Does the nonzero literal round to infinity (or past DBL_MAX)? Only literals in
// [1e308, 1e309) need the real conversion to tell.
bool Overflows(const NumberLiteral& lit, const Magnitude& m) {
  if (m.n >= 310) return true;
  if (m.n <= 308) return false;
  return ParseDouble(lit.text).out_of_range;
}

// Does the nonzero literal round to 0? The smallest subnormal is 4.9e-324 and half of it rounds
// up, so only literals in [1e-324, 1e-323) need the real conversion to tell.
bool Underflows(const NumberLiteral& lit, const Magnitude& m) {
  if (m.n <= -324) return true;
  if (m.n >= -322) return false;
  const Parsed p = ParseDouble(lit.text);
  return p.out_of_range || p.value == 0;
}

void AppendExactDecimal(const NumberLiteral& lit, const Magnitude& m, std::string& out) {
  // The significant digits: from d1 through the last nonzero digit, skipping the '.'.
  std::string_view first = m.lead_in_int ? lit.int_digits : lit.frac_digits.substr(m.lead_frac);
  std::string_view second = m.lead_in_int ? lit.frac_digits : std::string_view();
  const size_t second_end = second.find_last_not_of('0');
  if (second_end == std::string_view::npos) {
    second = {};
    first = first.substr(0, first.find_last_not_of('0') + 1);
  } else {
    second = second.substr(0, second_end + 1);
  }
  if (second.empty()) {
    AppendEcmaLayout(lit.negative, first, m.n, out);
    return;
  }
  char small[64];
  std::string large;
  char* digits = small;
  const size_t k = first.size() + second.size();
  if (k > sizeof(small)) {
    large.resize(k);
    digits = large.data();
  }
  first.copy(digits, first.size());
  second.copy(digits + first.size(), second.size());
  AppendEcmaLayout(lit.negative, std::string_view(digits, k), m.n, out);
}

}  // namespace

NumberProblem AppendCanonicalNumber(const NumberLiteral& lit, bool exact, bool strict,
                                    std::string& out) {
  const Magnitude m = Measure(lit);
  if (m.zero) {
    out += '0';
    return NumberProblem::kNone;
  }
  if (exact) {
    if (Overflows(lit, m)) return NumberProblem::kOverflow;
    if (strict && Underflows(lit, m)) return NumberProblem::kUnderflow;
    // A clamped exponent is not the literal's exponent: writing it would let two different
    // tiny numbers share a fingerprint.
    if (lit.exponent_clamped) return NumberProblem::kExponentTooLarge;
    AppendExactDecimal(lit, m, out);
    return NumberProblem::kNone;
  }
  const Parsed p = ParseDouble(lit.text);
  if (p.out_of_range && m.n > 0) return NumberProblem::kOverflow;
  if (p.out_of_range || p.value == 0) {
    if (strict) return NumberProblem::kUnderflow;
    out += '0';
    return NumberProblem::kNone;
  }
  AppendJcsDouble(p.value, out);
  return NumberProblem::kNone;
}

void AppendEcmaLayout(bool negative, std::string_view digits, int64_t n, std::string& out) {
  const auto k = static_cast<int64_t>(digits.size());
  if (negative) out += '-';
  if (k <= n && n <= 21) {
    out += digits;
    out.append(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n));
    out += '.';
    out += digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {
    out += digits[0];
    if (k > 1) {
      out += '.';
      out += digits.substr(1);
    }
    const int64_t e = n - 1;
    out += e < 0 ? "e-" : "e+";
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof(buf), e < 0 ? -e : e);
    out.append(buf, r.ptr);
  }
}

void AppendJcsDouble(double value, std::string& out) {
  if (value == 0) {  // also -0
    out += '0';
    return;
  }
  // Shortest round-trip digits, as "-d.ddde+XX"; at most 17 digits.
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const char* p = buf;
  const char* end = r.ptr;
  const bool negative = *p == '-';
  if (negative) ++p;
  char digits[24];
  size_t k = 0;
  digits[k++] = *p++;
  if (*p == '.') {
    ++p;
    while (*p != 'e') digits[k++] = *p++;
  }
  ++p;  // 'e'
  if (*p == '+') ++p;
  int exp = 0;
  std::from_chars(p, end, exp);
  AppendEcmaLayout(negative, std::string_view(digits, k), exp + 1, out);
}

}  // namespace idem::json
