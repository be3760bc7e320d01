// Lowercase hexadecimal of raw bytes: digests in keys, fingerprints and the
// audit chain. Pure; safe from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace idem {

inline std::string LowerHex(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return out;
}

}  // namespace idem
