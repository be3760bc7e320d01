// The canonicalizer (include/idem/canonical_json.h) on arbitrary bytes, and
// the properties it promises beyond not crashing:
//  - errors are kInvalidArgument or kResourceExhausted, with a UTF-8 message;
//  - what it accepts, Boost.JSON accepts too;
//  - canonical output is a fixed point (it re-parses to itself);
//  - the strict profile only refuses more: where it accepts, lenient
//    accepts with the same output;
//  - exact-number mode accepts only what pure mode accepts, is a fixed point
//    too, and its output canonicalizes (pure) to the pure output;
//  - Fingerprint is SHA-256 of the exact-number form; FingerprintFields of
//    the pointer "" is the fingerprint of {"": document};
//  - a derived key from any turn and non-empty tool is a valid header value.
#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "idem/canonical_json.h"
#include "idem/key.h"

namespace {

using idem::CanonOptions;
using idem::ErrorCode;

// Messages reach JSON-RPC errors and problem documents as JSON strings, so
// they must be UTF-8 (Boost.JSON serializes other bytes verbatim).
bool IsUtf8(std::string_view s) {
  boost::system::error_code ec;
  (void)boost::json::parse(boost::json::serialize(boost::json::string(s)), ec);
  return !ec;
}

void CheckError(const idem::Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kResourceExhausted);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(IsUtf8(e.message));
}

template <typename T>
void CheckErrorOf(const idem::Result<T>& r) {
  if (!r) CheckError(r.error());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  const CanonOptions lenient;
  CanonOptions strict;
  strict.strict = true;
  CanonOptions exact;
  exact.exact_numbers = true;
  CanonOptions strict_exact = exact;
  strict_exact.strict = true;

  const auto pure = idem::Canonicalize(input, lenient);
  const auto pure_strict = idem::Canonicalize(input, strict);
  const auto exact_out = idem::Canonicalize(input, exact);
  const auto exact_strict = idem::Canonicalize(input, strict_exact);
  CheckErrorOf(pure);
  CheckErrorOf(pure_strict);
  CheckErrorOf(exact_out);
  CheckErrorOf(exact_strict);

  if (pure) {
    // What the canonicalizer accepts is JSON to an independent parser too.
    std::string_view json = input;
    if (json.starts_with("\xEF\xBB\xBF")) json.remove_prefix(3);
    boost::json::parse_options options;
    options.max_depth = lenient.max_depth + 1;
    boost::system::error_code ec;
    (void)boost::json::parse(json, ec, {}, options);
    // Boost.JSON refuses exponents past +-2^31 that the canonicalizer reads
    // as 0 (underflow, lenient profile) or refuses (overflow).
    FUZZ_CHECK(!ec || ec == boost::json::error::exponent_overflow);

    const auto again = idem::Canonicalize(*pure, lenient);
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(*again, *pure);
  }
  if (pure_strict) {
    FUZZ_CHECK(pure.has_value());
    FUZZ_CHECK_EQ(*pure_strict, *pure);
    const auto again = idem::Canonicalize(*pure_strict, strict);
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(*again, *pure_strict);
  }
  if (exact_out) {
    FUZZ_CHECK(pure.has_value());
    const auto again = idem::Canonicalize(*exact_out, exact);
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK_EQ(*again, *exact_out);
    const auto as_pure = idem::Canonicalize(*exact_out, lenient);
    FUZZ_CHECK(as_pure.has_value());
    FUZZ_CHECK_EQ(*as_pure, *pure);
  }
  if (exact_strict) {
    FUZZ_CHECK(exact_out.has_value());
    FUZZ_CHECK_EQ(*exact_strict, *exact_out);
  }

  const auto fp = idem::Fingerprint(input);
  CheckErrorOf(fp);
  FUZZ_CHECK_EQ(fp.has_value(), exact_out.has_value());
  if (fp) {
    FUZZ_CHECK_EQ(*fp, idem::Sha256Hex(*exact_out));
    const auto whole = idem::FingerprintFields(input, {""});
    FUZZ_CHECK(whole.has_value());
    FUZZ_CHECK_EQ(*whole, idem::Sha256Hex("{\"\":" + *exact_out + "}"));
  }

  // The limits: a smaller max_bytes refuses, a shallower max_depth either
  // refuses or agrees.
  if (size > 0) {
    CanonOptions small = lenient;
    small.max_bytes = size - 1;
    const auto refused = idem::Canonicalize(input, small);
    FUZZ_CHECK(!refused.has_value());
    CheckError(refused.error());
  }
  CanonOptions shallow = lenient;
  shallow.max_depth = 3;
  const auto shallow_out = idem::Canonicalize(input, shallow);
  CheckErrorOf(shallow_out);
  if (shallow_out) {
    FUZZ_CHECK(pure.has_value());
    FUZZ_CHECK_EQ(*shallow_out, *pure);
  }

  // Keys from arbitrary parts stay valid header values.
  idem::KeyInput key;
  key.turn = std::string(input.substr(0, size / 2));
  key.tool = std::string(input.substr(size / 2));
  key.fingerprint = fp ? *fp : idem::Sha256Hex(input);
  for (idem::KeyMode mode : {idem::KeyMode::kTurn, idem::KeyMode::kArgs, idem::KeyMode::kFields}) {
    key.mode = mode;
    const auto derived = idem::DeriveKey(key);
    if (key.tool.empty()) {  // refused: a key needs a tool name
      FUZZ_CHECK(!derived.has_value());
      continue;
    }
    FUZZ_CHECK(derived.has_value());
    FUZZ_CHECK(derived->key.size() <= idem::kMaxKeyBytes);
    FUZZ_CHECK(idem::ValidateKey(derived->key).has_value());
  }
  return 0;
}
