// The one table of string escapes RFC 8785 §3.2.2.2 allows in canonical output. Internal to
// idem_core; shared by the parser (which writes string values in canonical form as it reads
// them) and the writer (which escapes member names).
#pragma once

#include <cstddef>

namespace idem::json {

// True for the characters canonical JSON must escape: '"', '\\' and controls below U+0020.
// Everything else, U+007F and U+2028/U+2029 included, is written as raw UTF-8.
inline bool NeedsEscape(unsigned char c) { return c < 0x20 || c == '"' || c == '\\'; }

// Writes the canonical escape of a character for which NeedsEscape() holds into `out`
// (\" \\ \b \f \n \r \t, else \u00xx in lowercase hex) and returns its length, 2 or 6.
inline size_t CanonicalEscape(unsigned char c, char out[6]) {
  static constexpr char kHex[] = "0123456789abcdef";
  out[0] = '\\';
  switch (c) {
    case '"':
      out[1] = '"';
      return 2;
    case '\\':
      out[1] = '\\';
      return 2;
    case '\b':
      out[1] = 'b';
      return 2;
    case '\f':
      out[1] = 'f';
      return 2;
    case '\n':
      out[1] = 'n';
      return 2;
    case '\r':
      out[1] = 'r';
      return 2;
    case '\t':
      out[1] = 't';
      return 2;
    default:
      out[1] = 'u';
      out[2] = '0';
      out[3] = '0';
      out[4] = kHex[c >> 4];
      out[5] = kHex[c & 0xF];
      return 6;
  }
}

}  // namespace idem::json
