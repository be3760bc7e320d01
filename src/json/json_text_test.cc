#include "json/json_text.h"

#include <gtest/gtest.h>

#include <string>

namespace idem::json_text {
namespace {

TEST(JsonTextTest, SetMemberReplacesOnlyTheValue) {
  auto out = SetMember(R"({ "a" : 1.50 , "b":[1, 2] })", "a", "2");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({ "a" : 2 , "b":[1, 2] })");
}

TEST(JsonTextTest, SetMemberAppendsAfterTheLastMember) {
  auto out = SetMember(R"({"big":123456789012345678901234})", "k", "\"v\"");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({"big":123456789012345678901234,"k":"v"})");
  auto empty = SetMember(" { } ", "k", "true");
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, R"( {"k":true } )");
}

TEST(JsonTextTest, SetMemberMatchesEscapedNames) {
  auto out = SetMember(R"({"\u0061":1})", "a", "2");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({"\u0061":2})");
}

TEST(JsonTextTest, DuplicateMembersAreRefused) {
  EXPECT_FALSE(SetMember(R"({"a":1,"a":2})", "a", "3"));
  EXPECT_FALSE(RemoveMember(R"({"a":1,"a":2})", "a"));
}

TEST(JsonTextTest, RemoveMemberTakesItsComma) {
  EXPECT_EQ(*RemoveMember(R"({"a":1,"b":"}","c":3})", "b"), R"({"a":1,"c":3})");
  EXPECT_EQ(*RemoveMember(R"({"a":1,"b":2})", "b"), R"({"a":1})");
  EXPECT_EQ(*RemoveMember(R"({"a":1,"b":2})", "a"), R"({"b":2})");
  EXPECT_EQ(*RemoveMember(R"({"a":1})", "a"), R"({})");
  EXPECT_EQ(*RemoveMember(R"({"a":1})", "z"), R"({"a":1})");
}

TEST(JsonTextTest, AppendElement) {
  EXPECT_EQ(*AppendElement("[1, {\"x\":\"]\"}]", "3"), "[1, {\"x\":\"]\"},3]");
  EXPECT_EQ(*AppendElement("[ ]", "3"), "[3 ]");
}

TEST(JsonTextTest, MalformedTextIsAnErrorNotACrash) {
  for (std::string_view bad : {"", "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":[1}", "[1,",
                               "{\"a\":\"unterminated}", "{\"a\":1}x", "{1:2}"}) {
    EXPECT_FALSE(ObjectMembers(bad)) << bad;
  }
  EXPECT_FALSE(ArrayElements("[1,2"));
}

// fuzz/regressions/json_text/zero-with-a-huge-exponent: the element spans are
// the literal's bytes, whatever Boost.JSON makes of the number (it reads
// "0e400" as NaN, which the fuzz target's oracle now compares as equal).
TEST(JsonTextTest, ElementsOfAZeroWithAHugeExponentAreItsBytes) {
  const std::string text = "[\r\r\r0e400\r\r\r\r\r]\r\r\r\r \r";
  auto elements = ArrayElements(text);
  ASSERT_TRUE(elements) << elements.error().message;
  ASSERT_EQ(elements->size(), 1u);
  EXPECT_EQ((*elements)[0].In(text), "0e400");
  auto appended = AppendElement(text, "1");
  ASSERT_TRUE(appended);
  EXPECT_EQ(ArrayElements(*appended)->size(), 2u);
}

}  // namespace
}  // namespace idem::json_text
