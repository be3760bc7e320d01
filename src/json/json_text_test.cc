#include "json/json_text.h"

#include <boost/json.hpp>
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

// The scanner finds a string's end with memchr and the parity of the
// backslashes before each quote, and keeps 64 open brackets in place before
// it spills to the heap: both at their edges.
TEST(JsonTextTest, StringEndsAndDeepNestingAtTheScannersEdges) {
  const std::string text = R"({"a":"x\\","b":"y\"z","c":"\\\"","d":1})";
  auto members = ObjectMembers(text);
  ASSERT_TRUE(members) << members.error().message;
  ASSERT_EQ(members->size(), 4u);
  EXPECT_EQ((*members)[0].value.In(text), R"("x\\")");
  EXPECT_EQ((*members)[1].value.In(text), R"("y\"z")");
  EXPECT_EQ((*members)[2].value.In(text), R"("\\\"")");
  EXPECT_FALSE(ObjectMembers(R"({"a":"\"})"));  // the quote is escaped: unterminated

  for (size_t depth : {63, 64, 65, 200}) {
    const std::string deep = "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
    auto m = ObjectMembers(deep);
    ASSERT_TRUE(m) << depth;
    EXPECT_EQ((*m)[0].value.end, deep.size() - 1) << depth;
    std::string unbalanced = deep;
    unbalanced[unbalanced.size() - 2] = '}';
    EXPECT_FALSE(ObjectMembers(unbalanced)) << depth;
  }
}

TEST(JsonTextTest, SetMemberWithKnownMembersSplicesLikeSetMember) {
  for (std::string_view object : {R"({"a":1, "b":{"c":2}})", "{ }", R"({"b":3})"}) {
    auto members = ObjectMembers(object);
    ASSERT_TRUE(members);
    EXPECT_EQ(*SetMember(object, *members, "b", "[4]"), *SetMember(object, "b", "[4]"));
  }
  auto twice = ObjectMembers(R"({"b":1,"b":2})");
  ASSERT_TRUE(twice);
  EXPECT_FALSE(SetMember(R"({"b":1,"b":2})", *twice, "b", "3"));
}

// Quote is valid JSON for any bytes: a byte that is not UTF-8 becomes U+FFFD,
// so a problem detail or a log line quoting a peer's bytes stays parseable.
// Pins fuzz/regressions/json_text/quote-of-bytes-that-are-not-utf8.
TEST(JsonTextTest, QuoteOfBytesThatAreNotUtf8IsValidJson) {
  EXPECT_EQ(Quote("a\xC0\xAF" "b"), "\"a\xEF\xBF\xBD\xEF\xBF\xBD" "b\"");
  EXPECT_EQ(boost::json::parse(Quote("\xAFype")).as_string(), "\xEF\xBF\xBDype");
  // UTF-8 and the escapes RFC 8785 writes are kept.
  EXPECT_EQ(Quote("é\"\\\n\x01"), "\"é\\\"\\\\\\n\\u0001\"");
  EXPECT_EQ(boost::json::parse(Quote("é\"\\\n\x01")).as_string(), "é\"\\\n\x01");
}

TEST(ViewTest, MembersAreFoundByScanningAndReadAsTheirType) {
  const std::string text =
      R"( {"id": 7, "method":"tools\/call", "params":{"name":"a\"b","arguments":{"n":[1,{"x":"}"}]},)"
      R"("flag":true,"big":18446744073709551615,"frac":1.5}} )";
  const View v(text);
  EXPECT_TRUE(v.is_object());
  EXPECT_EQ(v["id"].int64(), 7);
  EXPECT_EQ(v["method"].string(), "tools/call");  // unescaped
  EXPECT_EQ(v["params"]["name"].string(), "a\"b");
  EXPECT_EQ(v["params"]["arguments"].text(), R"({"n":[1,{"x":"}"}]})");
  EXPECT_EQ(v["params"]["flag"].boolean(), true);
  EXPECT_EQ(v["params"]["big"].int64(), std::nullopt);  // beyond int64
  EXPECT_TRUE(v["params"]["big"].is_number());
  EXPECT_EQ(v["params"]["frac"].int64(), std::nullopt);
  EXPECT_FALSE(v["missing"].present());
  EXPECT_FALSE(v["params"]["name"]["deeper"].present());  // not an object
  EXPECT_EQ(v["id"].string(), std::nullopt);
  EXPECT_STREQ(v["params"]["arguments"]["n"].KindName(), "an array");
  ASSERT_EQ(v["params"]["arguments"]["n"].Elements().size(), 2u);
  EXPECT_EQ(v["params"]["arguments"]["n"].Elements()[1]["x"].string(), "}");
}

// Parsers disagree about which copy wins, so a duplicated member is read as
// neither: ambiguous, not present.
TEST(ViewTest, AMemberSentTwiceIsAmbiguousNotPresent) {
  const View v(R"({"a":1,"b":2,"\u0061":3})");
  EXPECT_FALSE(v["a"].present());
  EXPECT_TRUE(v["a"].ambiguous());
  EXPECT_EQ(v["b"].int64(), 2);
  EXPECT_FALSE(v["b"].ambiguous());
}

TEST(ViewTest, TextCutShortFindsWhatComesBeforeTheCut) {
  const View v(R"({"id":"r-1","params":{"blob":"aaa)");
  EXPECT_EQ(v["id"].string(), "r-1");
  EXPECT_FALSE(v["params"].present());
  EXPECT_FALSE(View("")["id"].present());
  EXPECT_FALSE(View("[1,2")["id"].present());
}

TEST(ValidateTest, AcceptsOneValueAndNamesWhatIsWrong) {
  EXPECT_TRUE(Validate(R"( {"a":[1,2,{"b":null}]} )", 64));
  EXPECT_TRUE(Validate("0e400", 64));
  auto trailing = Validate(R"({"a":1} x)", 64);
  ASSERT_FALSE(trailing);
  EXPECT_EQ(trailing.error().code, ErrorCode::kInvalidArgument);
  auto bad = Validate(R"({"a":tru})", 64);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("byte"), std::string::npos) << bad.error().message;
  auto utf8 = Validate("\"\xff\"", 64);
  ASSERT_FALSE(utf8);
  auto deep = Validate(std::string(65, '[') + std::string(65, ']'), 64);
  ASSERT_FALSE(deep);
  EXPECT_EQ(deep.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(Validate(std::string(64, '[') + std::string(64, ']'), 64));
}

}  // namespace
}  // namespace idem::json_text
