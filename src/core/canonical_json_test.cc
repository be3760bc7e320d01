#include "idem/canonical_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace idem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Canon(std::string_view input, CanonOptions options = {}) {
  auto out = Canonicalize(input, options);
  EXPECT_TRUE(out) << "input " << input << ": " << out.error().ToString();
  return out ? *out : std::string("<error>");
}

CanonOptions Strict() {
  CanonOptions o;
  o.strict = true;
  return o;
}

CanonOptions Exact() {
  CanonOptions o;
  o.exact_numbers = true;
  return o;
}

// The error Canonicalize gives for `input`; fails the test if it accepts it.
Error Rejection(std::string_view input, CanonOptions options = {}) {
  auto out = Canonicalize(input, options);
  EXPECT_FALSE(out) << "accepted " << input << " as " << *out;
  return out ? Error{ErrorCode::kInternal, "accepted"} : out.error();
}

std::string FingerprintOf(std::string_view input) {
  auto fp = Fingerprint(input);
  EXPECT_TRUE(fp) << "input " << input << ": " << fp.error().ToString();
  return fp ? *fp : std::string("<error>");
}

// --- RFC 8785 output ---------------------------------------------------------------------------

TEST(CanonicalJsonTest, Rfc8785SortingExample) {
  // RFC 8785 §3.2.3.
  const std::string input =
      "{\n"
      "  \"\\u20ac\": \"Euro Sign\",\n"
      "  \"\\r\": \"Carriage Return\",\n"
      "  \"\\ufb33\": \"Hebrew Letter Dalet With Dagesh\",\n"
      "  \"1\": \"One\",\n"
      "  \"\\ud83d\\ude00\": \"Emoji: Grinning Face\",\n"
      "  \"\\u0080\": \"Control\",\n"
      "  \"\\u00f6\": \"Latin Small Letter O With Diaeresis\"\n"
      "}";
  EXPECT_EQ(Canon(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xC2\x80\":\"Control\","
            "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\",\"\xE2\x82\xAC\":\"Euro Sign\","
            "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
            "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}");
}

TEST(CanonicalJsonTest, Rfc8785Example) {
  // RFC 8785 §3.2.4 (the input of §3.2.1).
  const std::string input = R"({
    "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
    "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
    "literals": [null, true, false]
  })";
  EXPECT_EQ(Canon(input),
            "{\"literals\":[null,true,false],"
            "\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
            "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
}

TEST(CanonicalJsonTest, DropsWhitespaceAndSortsMembersAtEveryLevel) {
  EXPECT_EQ(Canon(" \n\t{ \"b\" : [ {\"z\":1, \"a\":2} , 3 ] , \"a\" : {} }\r\n"),
            R"({"a":{},"b":[{"a":2,"z":1},3]})");
  EXPECT_EQ(Canon(R"({"ab":4,"aa":3,"":1,"a":2})"), R"({"":1,"a":2,"aa":3,"ab":4})");
  EXPECT_EQ(Canon("[3,1,2]"), "[3,1,2]");
  EXPECT_EQ(Canon(R"({"a":[],"b":{},"c":[{}],"d":[[]]})"), R"({"a":[],"b":{},"c":[{}],"d":[[]]})");
}

TEST(CanonicalJsonTest, SortsByUtf16CodeUnitsNotCodePoints) {
  // U+10000 is D800 DC00 in UTF-16, so it sorts before U+E000 although its code point is larger.
  EXPECT_EQ(Canon(R"({"\uE000":1,"\uD800\uDC00":2})"),
            "{\"\xF0\x90\x80\x80\":2,\"\xEE\x80\x80\":1}");
  EXPECT_EQ(Canon(R"({"\uFB33":1,"\uD83D\uDE00":2})"),
            "{\"\xF0\x9F\x98\x80\":2,\"\xEF\xAC\xB3\":1}");
  // Names compare unescaped: "\n" (0x0A) sorts before "\\n" (0x5C).
  EXPECT_EQ(Canon(R"({"\\n":1,"\n":2})"), R"({"\n":2,"\\n":1})");
}

TEST(CanonicalJsonTest, SortsLargeObjects) {
  // More members than the small-object insertion sort handles.
  std::string input = "{";
  for (int i = 249; i >= 0; --i) {
    input += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + (i > 0 ? "," : "}");
  }
  const std::string out = Canon(input);
  EXPECT_EQ(out.substr(0, 30), R"({"k0":0,"k1":1,"k10":10,"k100")");
  const std::string tail = R"("k98":98,"k99":99})";
  EXPECT_EQ(out.substr(out.size() - tail.size()), tail);
}

TEST(CanonicalJsonTest, WritesStringsWithMinimalEscapes) {
  EXPECT_EQ(Canon(R"("\b\t\n\f\r")"), R"("\b\t\n\f\r")");
  EXPECT_EQ(Canon(R"("\u0008\u0009\u000a\u000c\u000d")"), R"("\b\t\n\f\r")");
  EXPECT_EQ(Canon(R"("\u0000\u001F\u0003")"), R"("\u0000\u001f\u0003")");
  EXPECT_EQ(Canon(R"("a\"b\\c\/d")"), R"("a\"b\\c/d")");
  EXPECT_EQ(Canon(R"("\u007f<>&")"), "\"\x7F<>&\"");
  EXPECT_EQ(Canon(R"("\u2028 \u2029")"), "\"\xE2\x80\xA8 \xE2\x80\xA9\"");
  EXPECT_EQ(Canon(R"("\u00e9\u4E2D\uD83D\uDE00")"), "\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\"");
  EXPECT_EQ(Canon("\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\""),
            "\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\"");
  // Escapes in names are rewritten the same way.
  EXPECT_EQ(Canon(R"({"\u0041\n\u0001":true})"), R"({"A\n\u0001":true})");
  // A long string with escapes spread over SIMD block boundaries.
  std::string in = "\"", want = "\"";
  for (int i = 0; i < 100; ++i) {
    in += "abcdefghijklmnopq\\u00e9\\\"";
    want += "abcdefghijklmnopq\xC3\xA9\\\"";
  }
  EXPECT_EQ(Canon(in + "\""), want + "\"");
}

TEST(CanonicalJsonTest, WritesNumbersInEcmaScriptForm) {
  const std::pair<const char*, const char*> cases[] = {
      {"0", "0"},
      {"-0", "0"},
      {"-0.0e-5", "0"},
      {"1.0", "1"},
      {"1.00000", "1"},
      {"1E2", "100"},
      {"1e+2", "100"},
      {"0.1e3", "100"},
      {"-1", "-1"},
      {"0.5", "0.5"},
      {"1e20", "100000000000000000000"},
      {"1e21", "1e+21"},
      {"123456789012345678901", "123456789012345680000"},
      {"0.000001", "0.000001"},
      {"1e-7", "1e-7"},
      {"9.999999999999997e-7", "9.999999999999997e-7"},
      {"5e-324", "5e-324"},
      {"3e-324", "5e-324"},
      {"1.7976931348623157e308", "1.7976931348623157e+308"},
      {"333333333.33333329", "333333333.3333333"},
      {"0.3333333333333333", "0.3333333333333333"},
      {"9007199254740991", "9007199254740991"},
      {"9007199254740993", "9007199254740992"},
      {"123456789012345678901234567890", "1.2345678901234568e+29"},
      {"-1.5e-9", "-1.5e-9"},
      {"4.50", "4.5"},
      {"2e-3", "0.002"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(Canon(in), want) << in;
}

TEST(CanonicalJsonTest, CanonicalFormIsAFixedPoint) {
  for (std::string_view input :
       {R"({"b":[1.50,"\u00e9",{"y":null,"x":1e21}],"a":"\u0001"})",
        R"([0.1,-0,1e-7,123456789012345678901234567890])", R"("\u2028")"}) {
    const std::string once = Canon(input);
    EXPECT_EQ(Canon(once), once);
  }
}

TEST(CanonicalJsonTest, SkipsLeadingByteOrderMarkOutsideStrictProfile) {
  EXPECT_EQ(Canon("\xEF\xBB\xBF 42"), "42");
  const Error e = Rejection(
      "\xEF\xBB\xBF"
      "42",
      Strict());
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.message, AllOf(HasSubstr("at byte 0"), HasSubstr("byte order mark")));
  // A BOM inside a string is an ordinary character.
  EXPECT_EQ(Canon("\"\xEF\xBB\xBF\"", Strict()), "\"\xEF\xBB\xBF\"");
}

// --- rejections ----------------------------------------------------------------------------------

struct RejectCase {
  const char* name;
  std::string input;
  const char* message;  // a substring the message must contain
};

class RejectTest : public ::testing::TestWithParam<RejectCase> {};

TEST_P(RejectTest, RefusesWithInvalidArgumentNamingTheProblem) {
  const RejectCase& c = GetParam();
  const Error e = Rejection(c.input);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.message, AllOf(HasSubstr("invalid JSON at byte "), HasSubstr(c.message)));
}

INSTANTIATE_TEST_SUITE_P(
    CanonicalJsonTest, RejectTest,
    ::testing::Values(
        // UTF-8
        RejectCase{"Utf8Overlong", "\"\xC0\xAF\"", "at byte 1: invalid UTF-8 (overlong"},
        RejectCase{"Utf8Overlong3", "\"\xE0\x80\xAF\"", "overlong"},
        RejectCase{"Utf8Overlong4", "\"\xF0\x80\x80\xAF\"", "overlong"},
        RejectCase{"Utf8EncodedSurrogate", "\"\xED\xA0\x80\"", "surrogate encoded in UTF-8"},
        RejectCase{"Utf8AboveMax", "\"\xF4\x90\x80\x80\"", "above U+10FFFF"},
        RejectCase{"Utf8AboveMaxLead", "\"\xF5\x80\x80\x80\"", "above U+10FFFF"},
        RejectCase{"Utf8TruncatedAtEnd", "\"\xE2\x82", "truncated"},
        RejectCase{"Utf8TruncatedBeforeQuote", "\"\xE2\x82\"", "truncated"},
        RejectCase{"Utf8StrayContinuation", "\"a\x80\"", "at byte 2: invalid UTF-8"},
        RejectCase{"Utf8InvalidByte", "\"\xFF\"", "invalid UTF-8"},
        RejectCase{"Utf8InName", "{\"\xFF\":1}", "invalid UTF-8"},
        RejectCase{"Utf8OutsideString", "\xC3\xA9", "unexpected byte 0xC3"},
        // \u escapes
        RejectCase{"LoneHighSurrogate", R"({"key":"\uD800"})", "at byte 8: lone high surrogate"},
        RejectCase{"HighSurrogateThenAscii", R"("\uD800\u0041")", "lone high surrogate"},
        RejectCase{"HighSurrogateThenText", R"("\uD800a")", "lone high surrogate"},
        RejectCase{"LoneLowSurrogate", R"("\uDEAD")", "lone low surrogate"},
        RejectCase{"ReversedPair", R"("\uDC00\uD800")", "lone low surrogate"},
        RejectCase{"LoneSurrogateInName", R"({"\uD800":1})", "lone high surrogate"},
        RejectCase{"ShortUnicodeEscape", R"("\u12")", "4 hex digits"},
        RejectCase{"BadUnicodeEscape", R"("\u12G4")", "4 hex digits"},
        RejectCase{"InvalidEscape", R"("\x")", "invalid escape"},
        RejectCase{"RawControl", std::string("\"a\x01\"", 4), "raw control character U+0001"},
        RejectCase{"RawNul", std::string("\"\0\"", 3), "raw control character U+0000"},
        RejectCase{"UnterminatedString", R"(["abc)", "at byte 1: unterminated string"},
        // member names
        RejectCase{"DuplicateName", R"({"a":1,"a":2})",
                   "at byte 7: duplicate member name \"a\"; send each member once"},
        RejectCase{"DuplicateAfterUnescape", R"({"\u0061":1,"a":2})",
                   "at byte 12: duplicate member name \"a\""},
        RejectCase{"DuplicateNested", R"([{"x":{"b":1,"c":2,"b":3}}])",
                   "duplicate member name \"b\""},
        RejectCase{"NameNotString", R"({a:1})", "expected a member name"},
        RejectCase{"MissingColon", R"({"a" 1})", "at byte 5: unexpected '1'; expected ':'"},
        // numbers
        RejectCase{"NaN", "NaN", "NaN and Infinity"},
        RejectCase{"NaNInArray", "[NaN]", "at byte 1: NaN and Infinity"},
        RejectCase{"Infinity", R"({"k":Infinity})", "NaN and Infinity"},
        RejectCase{"MinusInfinity", "-Infinity", "-Infinity is not a JSON number"},
        RejectCase{"LeadingZero", R"({"n":01})", "at byte 5: number with a leading zero"},
        RejectCase{"NegativeLeadingZero", "-01", "leading zero"},
        RejectCase{"FractionWithoutDigits", "1.", "digit after the decimal point"},
        RejectCase{"LeadingDot", ".5", "unexpected '.'"},
        RejectCase{"PlusSign", "+1", "unexpected '+'"},
        RejectCase{"ExponentWithoutDigits", "1e+", "digit in the exponent"},
        RejectCase{"MinusAlone", "-", "digit after '-'"},
        RejectCase{"HexFloat", R"({"n":0x1p-2})", "unexpected 'x'"},
        RejectCase{"Overflow", "1e400", "\"1e400\" is beyond the range of a double"},
        RejectCase{"NegativeOverflow", "[-1.8e308]", "at byte 1: number \"-1.8e308\" is beyond"},
        RejectCase{"HugeExponent", "1e99999999999999999999", "beyond the range"},
        // structure
        RejectCase{"Empty", "", "at byte 0: empty input"},
        RejectCase{"OnlyWhitespace", " \n ", "empty input"},
        RejectCase{"TrailingData", R"(42 "extra")", "at byte 3: unexpected '\"'"},
        RejectCase{"TwoValues", "{}{}", "send exactly one JSON value"},
        RejectCase{"TrailingCommaArray", "[1,]", "at byte 3: trailing comma"},
        RejectCase{"TrailingCommaObject", R"({"a":1,})", "trailing comma"},
        RejectCase{"MissingComma", "[1 2]", "expected ',' or ']'"},
        RejectCase{"UnclosedArray", "[1,2", "the array is missing a ']'"},
        RejectCase{"UnclosedObject", R"({"a":1)", "the object is missing a '}'"},
        RejectCase{"MismatchedBracket", R"({"a":1])", "expected ',' or '}'"},
        RejectCase{"TruncatedLiteral", "tru", "invalid literal"},
        RejectCase{"CapitalisedLiteral", "True", "unexpected 'T'"},
        RejectCase{"MissingValue", R"({"a":})", "unexpected '}'; expected a JSON value"}),
    [](const ::testing::TestParamInfo<RejectCase>& info) { return info.param.name; });

TEST(CanonicalJsonTest, StrictProfileRefusesNoncharactersBomAndUnderflow) {
  const std::pair<std::string, const char*> cases[] = {
      {R"("\uFDD0")", "noncharacter U+FDD0"},
      {R"("\uFDEF")", "noncharacter U+FDEF"},
      {R"("\uFFFE")", "noncharacter U+FFFE"},
      {R"("\uFFFF")", "noncharacter U+FFFF"},
      {R"("\uD83F\uDFFE")", "noncharacter U+1FFFE"},
      {"\"\xEF\xB7\x90\"", "noncharacter U+FDD0"},
      {"{\"\xF4\x8F\xBF\xBF\":1}", "noncharacter U+10FFFF"},
      {"1e-400", "underflows to 0"},
      {"2e-324", "underflows to 0"},
      {"[0.0000000000000000000000000000000000000000000000000000000000000000000000000000000000"
       "000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
       "000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
       "000000000000000000000000000000000000000000000000000000000000000000000000000000000001]",
       "underflows to 0"},
  };
  for (const auto& [input, message] : cases) {
    const Error e = Rejection(input, Strict());
    EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << input;
    EXPECT_THAT(e.message, AllOf(HasSubstr("invalid JSON at byte "), HasSubstr(message))) << input;
    auto exact = Strict();
    exact.exact_numbers = true;
    EXPECT_FALSE(Canonicalize(input, exact)) << input;
  }
  // Outside the strict profile these are accepted.
  EXPECT_EQ(Canon(R"("\uFDD0")"), "\"\xEF\xB7\x90\"");
  EXPECT_EQ(Canon(R"("\uFFFF")"), "\"\xEF\xBF\xBF\"");
  EXPECT_EQ(Canon("1e-400"), "0");
  EXPECT_EQ(Canon("2e-324"), "0");
  // The smallest subnormal is not an underflow.
  EXPECT_EQ(Canon("3e-324", Strict()), "5e-324");
  EXPECT_EQ(Canon("\"\xEF\xBF\xBD\"", Strict()), "\"\xEF\xBF\xBD\"");  // U+FFFD is fine
}

// --- limits --------------------------------------------------------------------------------------

std::string Nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(CanonicalJsonTest, AcceptsNestingUpToMaxDepth) {
  EXPECT_EQ(Canon(Nested(128)), Nested(128));
  CanonOptions shallow;
  shallow.max_depth = 2;
  EXPECT_EQ(Canon(R"({"a":[1]})", shallow), R"({"a":[1]})");
}

TEST(CanonicalJsonTest, RefusesNestingPastMaxDepthNamingTheLimit) {
  const Error e = Rejection(Nested(129));
  EXPECT_EQ(e.code, ErrorCode::kResourceExhausted);
  EXPECT_THAT(e.message, AllOf(HasSubstr("at byte 128"), HasSubstr("deeper than 128 levels"),
                               HasSubstr("max_depth")));
  CanonOptions shallow;
  shallow.max_depth = 2;
  EXPECT_THAT(Rejection(R"({"a":[{}]})", shallow).message, HasSubstr("deeper than 2 levels"));
}

TEST(CanonicalJsonTest, TenThousandDeepInputGivesAnErrorNotACrash) {
  const std::string deep = std::string(10000, '[') + "1" + std::string(10000, ']');
  const Error e = Rejection(deep);
  EXPECT_EQ(e.code, ErrorCode::kResourceExhausted);
  EXPECT_THAT(e.message, HasSubstr("deeper than 128 levels"));
  // Truncated deep input fails on depth before running out of input.
  EXPECT_EQ(Rejection(std::string(10000, '[')).code, ErrorCode::kResourceExhausted);
  // With the limit raised, parsing and writing are iterative: no stack overflow.
  CanonOptions deep_ok;
  deep_ok.max_depth = 20000;
  EXPECT_EQ(Canon(deep, deep_ok), deep);
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 10000; ++i) s += R"({"a":)";
    return s + "0" + std::string(10000, '}');
  }();
  auto fp = Fingerprint(objects, deep_ok);
  EXPECT_TRUE(fp) << fp.error().ToString();
}

TEST(CanonicalJsonTest, RefusesInputPastMaxBytesNamingTheLimit) {
  CanonOptions small;
  small.max_bytes = 16;
  EXPECT_EQ(Canon(R"({"a":"12345678"})", small), R"({"a":"12345678"})");  // exactly 16
  const Error e = Rejection(R"({"a":"123456789"})", small);
  EXPECT_EQ(e.code, ErrorCode::kResourceExhausted);
  EXPECT_THAT(e.message,
              AllOf(HasSubstr("17 bytes"), HasSubstr("limit of 16 bytes"), HasSubstr("max_bytes")));
  // The default is 1 MiB.
  const std::string big = "\"" + std::string(1 << 20, 'x') + "\"";
  EXPECT_EQ(Rejection(big).code, ErrorCode::kResourceExhausted);
  EXPECT_FALSE(Fingerprint(big));
}

// --- fingerprint ---------------------------------------------------------------------------------

TEST(FingerprintTest, IsSha256HexOfTheCanonicalForm) {
  const std::string input = R"({ "b": [1.0, "\u00e9"], "a": null })";
  const std::string fp = FingerprintOf(input);
  EXPECT_EQ(fp, Sha256Hex(R"({"a":null,"b":[1,"é"]})"));
  EXPECT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(FingerprintTest, SameForEverySpellingOfTheSameArguments) {
  EXPECT_EQ(FingerprintOf(R"({"a":1,"b":2})"), FingerprintOf(R"({ "b":2, "a":1 })"));
  EXPECT_EQ(FingerprintOf("1.0"), FingerprintOf("1"));
  EXPECT_EQ(FingerprintOf("1"), FingerprintOf("1e0"));
  EXPECT_EQ(FingerprintOf("100"), FingerprintOf("1E2"));
  EXPECT_EQ(FingerprintOf("0.5"), FingerprintOf("5e-1"));
  EXPECT_EQ(FingerprintOf("-0"), FingerprintOf("0"));
  EXPECT_EQ(FingerprintOf("12345678901234567891"), FingerprintOf("12345678901234567891.000"));
  EXPECT_EQ(FingerprintOf("12345678901234567891"), FingerprintOf("1.2345678901234567891e19"));
  EXPECT_EQ(FingerprintOf(R"({"\u00e9":"\u4e2d\ud83d\ude00"})"),
            FingerprintOf("{\"\xC3\xA9\":\"\xE4\xB8\xAD\xF0\x9F\x98\x80\"}"));
  EXPECT_EQ(FingerprintOf(R"("a\/b")"), FingerprintOf(R"("a/b")"));
}

TEST(FingerprintTest, DifferentNumbersNeverShareAFingerprint) {
  // Pure RFC 8785 rounds each pair to the same double.
  EXPECT_NE(FingerprintOf("12345678901234567891"), FingerprintOf("12345678901234567892"));
  EXPECT_NE(FingerprintOf("9007199254740993"), FingerprintOf("9007199254740992"));
  EXPECT_NE(FingerprintOf(R"({"id":12345678901234567891})"),
            FingerprintOf(R"({"id":12345678901234567892})"));
  EXPECT_NE(FingerprintOf("0.1000000000000000000001"), FingerprintOf("0.1"));
  EXPECT_NE(FingerprintOf("1e-400"), FingerprintOf("2e-400"));
  EXPECT_NE(FingerprintOf("1e-400"), FingerprintOf("0"));
  EXPECT_EQ(Canon("12345678901234567891"), Canon("12345678901234567892"));
}

TEST(FingerprintTest, ExactNumbersKeepTheLiteralsValue) {
  const std::pair<const char*, const char*> cases[] = {
      {"12345678901234567891", "12345678901234567891"},
      {"9007199254740993", "9007199254740993"},
      {"-9007199254740993", "-9007199254740993"},
      {"0.1000000000000000000001", "0.1000000000000000000001"},
      {"0.30000000000000001", "0.30000000000000001"},
      {"123456789012345678901234567890", "1.2345678901234567890123456789e+29"},
      {"1234567890123456789012", "1.234567890123456789012e+21"},
      {"0.00000012345678901234567890", "1.234567890123456789e-7"},
      {"1e-400", "1e-400"},
      {"-0.000", "0"},
      {"1.0", "1"},
      {"001", ""},  // still JSON: leading zeros are refused
  };
  for (const auto& [in, want] : cases) {
    if (*want == '\0') {
      EXPECT_FALSE(Canonicalize(in, Exact())) << in;
    } else {
      EXPECT_EQ(Canon(in, Exact()), want) << in;
    }
  }
  // Numbers beyond double range are refused in exact mode too.
  EXPECT_THAT(Rejection("1e400", Exact()).message, HasSubstr("beyond the range of a double"));
  EXPECT_THAT(Rejection("1.7976931348623159e308", Exact()).message, HasSubstr("beyond"));
  EXPECT_EQ(Canon("1.7976931348623158e308", Exact()), "1.7976931348623158e+308");
  EXPECT_THAT(Rejection("1e-99999999999999999999", Exact()).message,
              HasSubstr("exponent too large"));
}

TEST(FingerprintTest, ExactNumbersMatchRfc8785ForShortestLiterals) {
  // A literal that is already its double's shortest form is written exactly as JCS writes it,
  // so exact mode changes nothing for numbers a double holds.
  for (std::string_view literal : {"0",
                                   "1",
                                   "-1",
                                   "0.5",
                                   "100",
                                   "1e+21",
                                   "1e21",
                                   "100000000000000000000",
                                   "1e-7",
                                   "0.000001",
                                   "5e-324",
                                   "1.7976931348623157e+308",
                                   "333333333.3333333",
                                   "0.1",
                                   "0.3",
                                   "9007199254740992",
                                   "-123.456",
                                   "4.35",
                                   "2.5e-8",
                                   "123456789012345680000"}) {
    EXPECT_EQ(Canon(literal, Exact()), Canon(literal)) << literal;
  }
}

TEST(FingerprintTest, RefusesWhatCanonicalizeRefuses) {
  for (std::string_view input :
       {R"({"a":1,"a":2})", R"("\uD800")", "[1,]", "1e400", "", "\"\xC0\xAF\""}) {
    auto fp = Fingerprint(input);
    ASSERT_FALSE(fp) << input;
    EXPECT_EQ(fp.error().code, ErrorCode::kInvalidArgument);
    EXPECT_THAT(fp.error().message, HasSubstr("invalid JSON at byte "));
  }
}

TEST(FingerprintTest, LargeDocumentsStreamThroughTheHash) {
  // Larger than the hash buffer, so the digest is fed in chunks.
  std::string input = "[";
  std::string canonical = "[";
  for (int i = 0; i < 20000; ++i) {
    const std::string item = R"({"i":)" + std::to_string(i) + R"(,"s":"\u00e9x"})";
    input += (i ? ", " : "") + item;
    canonical += (i ? "," : "") + (R"({"i":)" + std::to_string(i) + ",\"s\":\"\xC3\xA9x\"}");
  }
  input += "]";
  canonical += "]";
  EXPECT_EQ(FingerprintOf(input), Sha256Hex(canonical));
}

// --- fingerprint of selected fields --------------------------------------------------------------

std::string FieldsOf(std::string_view input, const std::vector<std::string>& pointers) {
  auto fp = FingerprintFields(input, pointers);
  EXPECT_TRUE(fp) << fp.error().ToString();
  return fp ? *fp : std::string("<error>");
}

constexpr std::string_view kCustomer =
    R"({"email":"zoe@example.com","external_id":12345678901234567891,"name":"Zoë",
        "tags":["a","b"],"a/b":1,"m~n":2,"":3})";

TEST(FingerprintFieldsTest, IsTheFingerprintOfThePointerObject) {
  EXPECT_EQ(FieldsOf(kCustomer, {"/email", "/external_id"}),
            FingerprintOf(R"({"/external_id":12345678901234567891,"/email":"zoe@example.com"})"));
}

TEST(FingerprintFieldsTest, DependsOnlyOnTheSelectedFields) {
  const std::vector<std::string> pointers = {"/email", "/external_id"};
  const std::string fp = FieldsOf(kCustomer, pointers);
  EXPECT_EQ(fp, FieldsOf(R"({"external_id":12345678901234567891,"email":"zoe@example.com",
                             "name":"Someone else"})",
                         pointers));
  EXPECT_EQ(fp, FieldsOf(kCustomer, {"/external_id", "/email", "/email"}));
  EXPECT_NE(
      fp, FieldsOf(R"({"email":"zoe@example.com","external_id":12345678901234567892})", pointers));
}

TEST(FingerprintFieldsTest, FollowsRfc6901) {
  EXPECT_EQ(FieldsOf(kCustomer, {"/a~1b"}), FingerprintOf(R"({"/a~1b":1})"));
  EXPECT_EQ(FieldsOf(kCustomer, {"/m~0n"}), FingerprintOf(R"({"/m~0n":2})"));
  EXPECT_EQ(FieldsOf(kCustomer, {"/"}), FingerprintOf(R"({"/":3})"));
  EXPECT_EQ(FieldsOf(kCustomer, {"/tags/1"}), FingerprintOf(R"({"/tags/1":"b"})"));
  EXPECT_EQ(FieldsOf(R"({"a":{"b":[{"c":[10,20]}]}})", {"/a/b/0/c/1"}),
            FingerprintOf(R"({"/a/b/0/c/1":20})"));
  // The empty pointer is the whole document.
  EXPECT_EQ(FieldsOf(R"({"x":[1.0]})", {""}), FingerprintOf(R"({"":{"x":[1]}})"));
}

// Found by reading: a missing field hashed as null, so every call without
// the business field shared one key (the second such call was answered
// with the first one's outcome). Absent is refused, naming the field; an
// explicit null is a value.
TEST(FingerprintFieldsTest, AMissingFieldIsRefusedAndNamed) {
  for (const char* pointer : {"/phone", "/tags/x", "/tags/2", "/tags/-", "/tags/01", "/email/x"}) {
    auto fp = FingerprintFields(kCustomer, {"/email", pointer});
    ASSERT_FALSE(fp) << pointer;
    EXPECT_EQ(fp.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(fp.error().message.find(std::string("the key field ") + pointer + " is missing"),
              std::string::npos)
        << fp.error().message;
  }
  EXPECT_EQ(FieldsOf(R"({"phone":null})", {"/phone"}), FingerprintOf(R"({"/phone":null})"));
}

TEST(FingerprintFieldsTest, RefusesMalformedPointers) {
  for (const std::string& pointer :
       {std::string("email"), std::string("/a~2"), std::string("/a~"), std::string("#/email")}) {
    auto fp = FingerprintFields(kCustomer, {"/email", pointer});
    ASSERT_FALSE(fp) << pointer;
    EXPECT_EQ(fp.error().code, ErrorCode::kInvalidArgument);
    EXPECT_THAT(fp.error().message, AllOf(HasSubstr("JSON Pointer"), HasSubstr(pointer)));
  }
  EXPECT_FALSE(FingerprintFields(kCustomer, {"/\xFF"}));
  EXPECT_FALSE(FingerprintFields(R"({"a":1,"a":2})", {"/a"}));
}

// --- SHA-256 -------------------------------------------------------------------------------------

TEST(Sha256HexTest, MatchesKnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace idem
