// FUZZ_CHECK: a property a fuzz target asserts. On failure it prints what
// was expected and aborts, so libFuzzer saves the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#define FUZZ_CHECK(cond)                                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// As FUZZ_CHECK, also printing two values that should have been equal.
#define FUZZ_CHECK_EQ(a, b)                                                                   \
  do {                                                                                        \
    const auto& fuzz_a_ = (a);                                                                \
    const auto& fuzz_b_ = (b);                                                                \
    if (!(fuzz_a_ == fuzz_b_)) {                                                              \
      std::fprintf(stderr, "%s:%d: property failed: %s == %s\n", __FILE__, __LINE__, #a, #b); \
      ::idem_fuzz::PrintValue("  left:  ", fuzz_a_);                                          \
      ::idem_fuzz::PrintValue("  right: ", fuzz_b_);                                          \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace idem_fuzz {

template <typename T>
void PrintValue(const char* label, const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    const std::string_view s = v;
    std::fprintf(stderr, "%s\"%.*s\"\n", label, static_cast<int>(s.size() > 2000 ? 2000 : s.size()),
                 s.data());
  } else if constexpr (std::is_integral_v<T>) {
    std::fprintf(stderr, "%s%lld\n", label, static_cast<long long>(v));
  } else {
    std::fprintf(stderr, "%s(not printable)\n", label);
  }
}

}  // namespace idem_fuzz
