// The JSON-RPC framing, classification and byte-exact JSON edits: bytes in,
// values out, no pipes.
#include "mcp/json_rpc.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "mcp/json_text.h"

namespace idem::mcp {
namespace {

std::vector<std::string> Messages(const std::vector<LineFramer::Frame>& frames) {
  std::vector<std::string> out;
  for (const auto& f : frames) out.push_back(f.oversize ? "<oversize>" : f.message);
  return out;
}

using Strings = std::vector<std::string>;

TEST(LineFramerTest, SplitsMessagesOnNewlines) {
  LineFramer framer;
  EXPECT_EQ(Messages(framer.Feed("{\"a\":1}\n{\"b\":2}\n")), (Strings{"{\"a\":1}", "{\"b\":2}"}));
}

TEST(LineFramerTest, JoinsAMessageSplitAcrossChunks) {
  LineFramer framer;
  EXPECT_TRUE(framer.Feed("{\"jsonrpc\":").empty());
  EXPECT_TRUE(framer.Feed("\"2.0\",").empty());
  EXPECT_EQ(Messages(framer.Feed("\"id\":1}\n{\"x\"")), (Strings{R"({"jsonrpc":"2.0","id":1})"}));
  EXPECT_EQ(Messages(framer.Feed(":1}\n")), (Strings{R"({"x":1})"}));
}

TEST(LineFramerTest, OneByteAtATime) {
  LineFramer framer;
  const std::string input = "{\"a\":[1,2]}\r\n\n{\"b\":\"\\n\"}\n";
  Strings got;
  for (char c : input) {
    for (auto& m : Messages(framer.Feed(std::string_view(&c, 1)))) got.push_back(m);
  }
  EXPECT_EQ(got, (Strings{"{\"a\":[1,2]}", "{\"b\":\"\\n\"}"}));
}

TEST(LineFramerTest, StripsCarriageReturnAndSkipsBlankLines) {
  LineFramer framer;
  EXPECT_EQ(Messages(framer.Feed("\r\n  \n{\"a\":1}\r\n\n")), (Strings{"{\"a\":1}"}));
}

TEST(LineFramerTest, DeliversAnUnterminatedLastMessageAtEndOfStream) {
  LineFramer framer;
  EXPECT_TRUE(framer.Feed("{\"a\":1}").empty());
  EXPECT_EQ(Messages(framer.Finish()), (Strings{"{\"a\":1}"}));
  EXPECT_TRUE(framer.Finish().empty());
}

TEST(LineFramerTest, DropsAnOversizeMessageAndKeepsGoing) {
  LineFramer framer(10);
  EXPECT_EQ(Messages(framer.Feed("{\"a\":\"0123")), Strings{});
  EXPECT_EQ(Messages(framer.Feed("456789\"}")), (Strings{"<oversize>"}));  // reported once
  EXPECT_EQ(Messages(framer.Feed("still the same line\n{\"ok\":1}\n")), (Strings{"{\"ok\":1}"}));
}

TEST(LineFramerTest, MessageOfExactlyTheLimitPasses) {
  LineFramer framer(7);
  EXPECT_EQ(Messages(framer.Feed("{\"a\":1}\r\n{\"a\":12}\n")),
            (Strings{"{\"a\":1}", "<oversize>"}));
}

TEST(FrameLineTest, AppendsNewlineAndFlattensPrettyPrintedJson) {
  EXPECT_EQ(FrameLine("{\"a\":1}"), "{\"a\":1}\n");
  EXPECT_EQ(FrameLine("{\n  \"a\": \"x\\ny\"\r\n}"), "{   \"a\": \"x\\ny\"  }\n");
}

TEST(ParseMessageTest, ClassifiesRequestsNotificationsAndResponses) {
  auto req = ParseMessage(R"({"jsonrpc":"2.0","id":7,"method":"tools/list"})");
  ASSERT_TRUE(req);
  EXPECT_EQ(req->kind, Message::Kind::kRequest);
  EXPECT_EQ(req->method, "tools/list");
  EXPECT_EQ(req->id_text, "7");

  auto note = ParseMessage(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  ASSERT_TRUE(note);
  EXPECT_EQ(note->kind, Message::Kind::kNotification);
  EXPECT_EQ(note->id_text, "null");

  auto result = ParseMessage(R"({"jsonrpc":"2.0","id":"a","result":{}})");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->kind, Message::Kind::kResult);
  EXPECT_EQ(result->id_text, "\"a\"");

  auto error = ParseMessage(R"({"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"x"}})");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->kind, Message::Kind::kError);

  auto batch = ParseMessage(R"([{"jsonrpc":"2.0","method":"x"}])");
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->kind, Message::Kind::kBatch);

  auto other = ParseMessage(R"("hello")");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->kind, Message::Kind::kOther);
}

TEST(ParseMessageTest, KeepsTheIdBytesAsSent) {
  auto m = ParseMessage(R"({"id" : "\u00e9t\u00e9" ,"method":"ping"})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id_text, R"("\u00e9t\u00e9")");
  EXPECT_EQ(m->id_key, "s:\xC3\xA9t\xC3\xA9");
}

TEST(ParseMessageTest, EqualIdsHaveEqualKeysHoweverSpelled) {
  EXPECT_EQ(IdKey(boost::json::parse("1")), IdKey(boost::json::parse("1.0")));
  EXPECT_EQ(IdKey(boost::json::parse("1")), IdKey(boost::json::parse("1e0")));
  EXPECT_NE(IdKey(boost::json::parse("1")), IdKey(boost::json::parse("\"1\"")));
  EXPECT_NE(IdKey(boost::json::parse("1")), IdKey(boost::json::parse("1.5")));
}

TEST(ParseMessageTest, InvalidJsonIsRefusedAndAnsweredWithParseError) {
  auto m = ParseMessage(R"({"jsonrpc":"2.0","id":1,"method":)");
  ASSERT_FALSE(m);
  std::string answer = ParseErrorResponse(m.error().message);
  auto parsed = boost::json::parse(answer);
  EXPECT_EQ(parsed.at("id"), nullptr);
  EXPECT_EQ(parsed.at("error").at("code").as_int64(), -32700);
  EXPECT_EQ(parsed.at("jsonrpc"), "2.0");
}

TEST(ParseMessageTest, DuplicateIdIsRefused) {
  EXPECT_FALSE(ParseMessage(R"({"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call"})"));
}

TEST(ParseMessageTest, DeepButBoundedNestingIsAccepted) {
  std::string deep = R"({"jsonrpc":"2.0","method":"x","params":)" + std::string(200, '[') +
                     std::string(200, ']') + "}";
  EXPECT_TRUE(ParseMessage(deep));
  EXPECT_FALSE(ParseMessage(deep, 100));
}

TEST(ResponsesTest, ErrorResponseIsValidJsonRpc) {
  auto v = boost::json::parse(
      ErrorResponse("\"x\"", kRpcStoreUnavailable, "store \"down\"", R"({"retryable":true})"));
  EXPECT_EQ(v.at("id"), "x");
  EXPECT_EQ(v.at("error").at("code").as_int64(), -32001);
  EXPECT_EQ(v.at("error").at("message"), "store \"down\"");
  EXPECT_EQ(v.at("error").at("data").at("retryable"), true);
}

// ---- json_text: byte-exact edits

TEST(JsonTextTest, SetMemberReplacesOnlyTheValue) {
  auto out = json_text::SetMember(R"({ "a" : 1.50 , "b":[1, 2] })", "a", "2");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({ "a" : 2 , "b":[1, 2] })");
}

TEST(JsonTextTest, SetMemberAppendsAfterTheLastMember) {
  auto out = json_text::SetMember(R"({"big":123456789012345678901234})", "k", "\"v\"");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({"big":123456789012345678901234,"k":"v"})");
  auto empty = json_text::SetMember(" { } ", "k", "true");
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, R"( {"k":true } )");
}

TEST(JsonTextTest, SetMemberMatchesEscapedNames) {
  auto out = json_text::SetMember(R"({"\u0061":1})", "a", "2");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"({"\u0061":2})");
}

TEST(JsonTextTest, DuplicateMembersAreRefused) {
  EXPECT_FALSE(json_text::SetMember(R"({"a":1,"a":2})", "a", "3"));
  EXPECT_FALSE(json_text::RemoveMember(R"({"a":1,"a":2})", "a"));
}

TEST(JsonTextTest, RemoveMemberTakesItsComma) {
  EXPECT_EQ(*json_text::RemoveMember(R"({"a":1,"b":"}","c":3})", "b"), R"({"a":1,"c":3})");
  EXPECT_EQ(*json_text::RemoveMember(R"({"a":1,"b":2})", "b"), R"({"a":1})");
  EXPECT_EQ(*json_text::RemoveMember(R"({"a":1,"b":2})", "a"), R"({"b":2})");
  EXPECT_EQ(*json_text::RemoveMember(R"({"a":1})", "a"), R"({})");
  EXPECT_EQ(*json_text::RemoveMember(R"({"a":1})", "z"), R"({"a":1})");
}

TEST(JsonTextTest, AppendElement) {
  EXPECT_EQ(*json_text::AppendElement("[1, {\"x\":\"]\"}]", "3"), "[1, {\"x\":\"]\"},3]");
  EXPECT_EQ(*json_text::AppendElement("[ ]", "3"), "[3 ]");
}

TEST(JsonTextTest, MalformedTextIsAnErrorNotACrash) {
  for (std::string_view bad : {"", "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":[1}", "[1,",
                               "{\"a\":\"unterminated}", "{\"a\":1}x", "{1:2}"}) {
    EXPECT_FALSE(json_text::ObjectMembers(bad)) << bad;
  }
  EXPECT_FALSE(json_text::ArrayElements("[1,2"));
}

}  // namespace
}  // namespace idem::mcp
