#include "fronts/http_proxy/idempotency_key.h"

#include <gtest/gtest.h>

namespace idem::proxy {
namespace {

std::string Ok(std::string_view value, IdempotencyKeyOptions options = {}) {
  Result<std::string> key = ParseIdempotencyKey(value, options);
  EXPECT_TRUE(key) << value << ": " << key.error().message;
  return key.value_or("");
}

std::string Err(std::string_view value, IdempotencyKeyOptions options = {}) {
  Result<std::string> key = ParseIdempotencyKey(value, options);
  EXPECT_FALSE(key) << value << " parsed as " << key.value_or("");
  if (key) return "";
  EXPECT_EQ(key.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(key.error().message.starts_with("invalid Idempotency-Key header: "))
      << key.error().message;
  return key.error().message;
}

TEST(IdempotencyKeyTest, AcceptsAnSfString) {
  EXPECT_EQ(Ok(R"("8e5b-41a2")"), "8e5b-41a2");
  EXPECT_EQ(Ok(R"("a\"b\\c")"), R"(a"b\c)");
  EXPECT_EQ(Ok(" \t\"abc\"\t "), "abc") << "optional whitespace around the value";
  EXPECT_EQ(Ok(R"("!#$%&'()*+-./:<=>?@[]^_`{|}~")"), "!#$%&'()*+-./:<=>?@[]^_`{|}~");
}

TEST(IdempotencyKeyTest, AcceptsABareValue) {
  EXPECT_EQ(Ok("8e5b41a2-0f3c-4b7e-9d55-1c2d3e4f5a6b"), "8e5b41a2-0f3c-4b7e-9d55-1c2d3e4f5a6b");
  EXPECT_EQ(Ok("key_123:abc/def"), "key_123:abc/def");
  EXPECT_EQ(Ok("  abc  "), "abc");
}

TEST(IdempotencyKeyTest, RefusesEmptyValues) {
  EXPECT_NE(Err("").find("empty"), std::string::npos);
  EXPECT_NE(Err("  \t").find("empty"), std::string::npos);
  EXPECT_NE(Err(R"("")").find("empty string"), std::string::npos);
}

TEST(IdempotencyKeyTest, RefusesKeysOverTheLimit) {
  const std::string at_limit(255, 'k');
  EXPECT_EQ(Ok(at_limit), at_limit);
  EXPECT_EQ(Ok("\"" + at_limit + "\""), at_limit);
  std::string message = Err(std::string(256, 'k'));
  EXPECT_NE(message.find("256 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("limit of 255"), std::string::npos) << message;
  Err("\"" + std::string(256, 'k') + "\"");
  // The limit counts unescaped bytes and is configurable.
  EXPECT_EQ(Ok(R"("ab\\")", {.max_bytes = 3}), R"(ab\)");
  Err("abcd", {.max_bytes = 3});
}

TEST(IdempotencyKeyTest, RefusesBytesOutsideVisibleAscii) {
  EXPECT_NE(Err("\"caf\xc3\xa9\"").find("non-ASCII byte 0xc3 at byte 4"), std::string::npos);
  EXPECT_NE(Err("caf\xc3\xa9").find("non-ASCII"), std::string::npos);
  EXPECT_NE(Err("\"a\x01z\"").find("control byte 0x01"), std::string::npos);
  EXPECT_NE(Err("a\x7fz").find("control byte 0x7f"), std::string::npos);
  EXPECT_NE(Err(R"("a b")").find("space"), std::string::npos)
      << "an sf-string may hold a space, an idemgate key may not";
  EXPECT_NE(Err("a b").find("space"), std::string::npos);
}

TEST(IdempotencyKeyTest, RefusesParametersAndLists) {
  EXPECT_NE(Err(R"("abc";v=1)").find("parameters"), std::string::npos);
  EXPECT_NE(Err("abc;v=1").find("parameters"), std::string::npos);
  EXPECT_NE(Err(R"("a", "b")").find("list"), std::string::npos);
  EXPECT_NE(Err("a,b").find("list"), std::string::npos);
  EXPECT_NE(Err(R"("a" "b")").find("after the closing quote"), std::string::npos);
}

TEST(IdempotencyKeyTest, RefusesMalformedStrings) {
  EXPECT_NE(Err(R"("abc)").find("no closing quote"), std::string::npos);
  EXPECT_NE(Err(R"("abc\)").find("lone backslash"), std::string::npos);
  EXPECT_NE(Err(R"("a\nb")").find("not an escape"), std::string::npos);
  EXPECT_NE(Err(R"(ab"c)").find("stray"), std::string::npos);
  EXPECT_NE(Err(R"(ab\c)").find("stray"), std::string::npos);
}

TEST(IdempotencyKeyTest, EveryParsedKeyIsAValidStoreKey) {
  for (std::string_view value : {R"("a\"b")", "x", R"("~!@")", "v1t.abc.def"}) {
    EXPECT_TRUE(ValidateKey(Ok(value))) << value;
  }
}

TEST(IdempotencyKeyTest, SerializeRoundTrips) {
  for (std::string_view key : {"abc", R"(a"b\c)", "8e5b-41a2"}) {
    EXPECT_EQ(Ok(SerializeIdempotencyKey(key)), key);
  }
  EXPECT_EQ(SerializeIdempotencyKey(R"(a"b)"), R"("a\"b")");
}

}  // namespace
}  // namespace idem::proxy
