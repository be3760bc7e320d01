// UTF-8 validation and UTF-16 ordering for the canonicalizer. Internal to idem_core.
//
// Everything here is header-only because it sits on the parser's per-byte path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace idem::utf8 {

// Why a byte sequence is not UTF-8 (RFC 3629), named in error messages.
enum class Problem : uint8_t {
  kNone,
  kInvalidByte,  // a continuation byte or 0xF8..0xFF where a character must start
  kOverlong,     // a longer encoding than needed (C0 AF for '/')
  kSurrogate,    // U+D800..U+DFFF encoded directly (CESU-8 / WTF-8)
  kTooLarge,     // above U+10FFFF
  kTruncated,    // the input ends, or a non-continuation byte comes, mid-character
};

inline const char* ProblemName(Problem p) {
  switch (p) {
    case Problem::kNone:
      return "valid";
    case Problem::kInvalidByte:
      return "byte that cannot start a character";
    case Problem::kOverlong:
      return "overlong encoding";
    case Problem::kSurrogate:
      return "UTF-16 surrogate encoded in UTF-8";
    case Problem::kTooLarge:
      return "code point above U+10FFFF";
    case Problem::kTruncated:
      return "truncated multi-byte sequence";
  }
  return "invalid sequence";
}

struct Char {
  uint32_t code_point;
  uint32_t length;  // bytes consumed; 0 when problem != kNone
  Problem problem;
};

inline bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes the non-ASCII character starting at p (*p >= 0x80, p < end).
[[gnu::always_inline]] inline Char DecodeMultiByte(const unsigned char* p,
                                                   const unsigned char* end) {
  const unsigned char c = p[0];
  const size_t avail = static_cast<size_t>(end - p);
  if (c < 0xC2) {
    return {0, 0, c >= 0xC0 ? Problem::kOverlong : Problem::kInvalidByte};
  }
  if (c < 0xE0) {
    if (avail < 2 || !IsContinuation(p[1])) return {0, 0, Problem::kTruncated};
    return {(uint32_t{c} & 0x1F) << 6 | (p[1] & 0x3F), 2, Problem::kNone};
  }
  if (c < 0xF0) {
    if (avail < 2 || !IsContinuation(p[1])) return {0, 0, Problem::kTruncated};
    if (c == 0xE0 && p[1] < 0xA0) return {0, 0, Problem::kOverlong};
    if (c == 0xED && p[1] >= 0xA0) return {0, 0, Problem::kSurrogate};
    if (avail < 3 || !IsContinuation(p[2])) return {0, 0, Problem::kTruncated};
    return {(uint32_t{c} & 0x0F) << 12 | (uint32_t{p[1]} & 0x3F) << 6 | (p[2] & 0x3F), 3,
            Problem::kNone};
  }
  if (c < 0xF5) {
    if (avail < 2 || !IsContinuation(p[1])) return {0, 0, Problem::kTruncated};
    if (c == 0xF0 && p[1] < 0x90) return {0, 0, Problem::kOverlong};
    if (c == 0xF4 && p[1] >= 0x90) return {0, 0, Problem::kTooLarge};
    if (avail < 3 || !IsContinuation(p[2])) return {0, 0, Problem::kTruncated};
    if (avail < 4 || !IsContinuation(p[3])) return {0, 0, Problem::kTruncated};
    return {(uint32_t{c} & 0x07) << 18 | (uint32_t{p[1]} & 0x3F) << 12 |
                (uint32_t{p[2]} & 0x3F) << 6 | (p[3] & 0x3F),
            4, Problem::kNone};
  }
  return {0, 0, c < 0xF8 ? Problem::kTooLarge : Problem::kInvalidByte};
}

// Unicode noncharacters (U+FDD0..U+FDEF and the last two code points of every plane), which
// I-JSON (RFC 7493 §2.1) says must not appear; refused only by the strict profile.
inline bool IsNoncharacter(uint32_t cp) {
  return (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFE) == 0xFFFE;
}

// Appends the UTF-8 encoding of a Unicode scalar value to `out`; returns the new end.
inline char* Encode(uint32_t cp, char* out) {
  if (cp < 0x80) {
    *out++ = static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out++ = static_cast<char>(0xC0 | (cp >> 6));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out++ = static_cast<char>(0xE0 | (cp >> 12));
    *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out++ = static_cast<char>(0xF0 | (cp >> 18));
    *out++ = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Returns the first byte in [p, end) that ends a run of plain string bytes: '"', '\\', a
// control character (< 0x20) or a non-ASCII byte (>= 0x80); `end` if there is none. This is
// the loop almost all string bytes go through, hence 16 bytes at a time where SSE2 exists
// (every x86-64).
inline const char* SkipPlainStringBytes(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (end - p >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed compare: bytes >= 0x80 are negative, so "< 0x20" also flags them.
    const __m128i special =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                     _mm_cmplt_epi8(v, space));
    const unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(special));
    if (mask != 0) return p + __builtin_ctz(mask);
    p += 16;
  }
#endif
  while (p < end) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return p;
    ++p;
  }
  return p;
}

// Three-way comparison of two valid UTF-8 strings by their UTF-16 code units, the member
// order RFC 8785 §3.2.3 prescribes. Byte order of UTF-8 equals code point order, which
// differs from UTF-16 order in one place only: characters above U+FFFF (UTF-8 lead byte
// F0..F4, UTF-16 surrogates D800..DFFF) sort before U+E000..U+FFFF (lead byte EE..EF).
// Both strings share the bytes before the first difference, so that difference sits at the
// same position inside the same-length-so-far characters; it is a lead-byte difference
// exactly when the two bytes can be lead bytes of different classes.
inline int CompareUtf16Order(std::string_view a, std::string_view b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  if (i == n) return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
  const auto ca = static_cast<unsigned char>(a[i]);
  const auto cb = static_cast<unsigned char>(b[i]);
  const bool a_high_bmp = ca == 0xEE || ca == 0xEF;
  const bool b_high_bmp = cb == 0xEE || cb == 0xEF;
  if (a_high_bmp && cb >= 0xF0) return 1;
  if (b_high_bmp && ca >= 0xF0) return -1;
  return ca < cb ? -1 : 1;
}

}  // namespace idem::utf8
