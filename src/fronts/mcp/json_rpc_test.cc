// The JSON-RPC framing, classification and byte-exact JSON edits: bytes in,
// values out, no pipes.
#include "fronts/mcp/json_rpc.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "json/json_text.h"

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
  EXPECT_EQ(Messages(framer.Feed("456789\"}")), Strings{});  // reported at its end of line
  EXPECT_EQ(Messages(framer.Feed("still the same line\n{\"ok\":1}\n")),
            (Strings{"<oversize>", "{\"ok\":1}"}));
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
  std::string answer = ParseErrorResponse("null", m.error().message);
  auto parsed = boost::json::parse(answer);
  EXPECT_EQ(parsed.at("id"), nullptr);
  EXPECT_EQ(parsed.at("error").at("code").as_int64(), -32700);
  EXPECT_EQ(parsed.at("jsonrpc"), "2.0");
}

// Boost.JSON says "syntax error" and "too deep"; a client needs where and what.
TEST(ParseMessageTest, RefusalsSayWhereAndWhy) {
  auto utf8 = ParseMessage("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\xC3\"}");
  ASSERT_FALSE(utf8);
  EXPECT_EQ(utf8.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(utf8.error().message.rfind("not valid JSON at byte 38: invalid UTF-8", 0), 0)
      << utf8.error().message;

  auto cut = ParseMessage(R"({"jsonrpc":"2.0","id":1,"method":)");
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message.find("at byte 33: unexpected end of input"), std::string::npos)
      << cut.error().message;

  std::string deep = R"({"id":1,"method":"x","params":)" + std::string(10'000, '[') +
                     std::string(10'000, ']') + "}";
  auto too_deep = ParseMessage(deep, 100);
  ASSERT_FALSE(too_deep);
  EXPECT_EQ(too_deep.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(too_deep.error().message, "nested deeper than 100 levels");
}

TEST(ParseMessageTest, ParseErrorsAnswerTheRequestWhenItsIdCanBeFound) {
  EXPECT_EQ(RecoverIdText("{\"id\":7,\"method\":\"a\xFF\"}"), "7");
  EXPECT_EQ(RecoverIdText(R"({"method":"x","params":{"a":[1,{"id":9}]},"id":"r-1"})"), "\"r-1\"");
  EXPECT_EQ(RecoverIdText(R"({"params":{"id":9},"method":"x"})"), "null");  // not top level
  EXPECT_EQ(RecoverIdText(R"({"id":{"a":1},"method":"x"})"), "null");       // not usable as an id
  EXPECT_EQ(RecoverIdText(R"({"id":true})"), "null");
  EXPECT_EQ(RecoverIdText("[1]"), "null");
  // A prefix: the id counts only when it is whole.
  EXPECT_EQ(RecoverIdText(R"({"jsonrpc":"2.0","id":123,"params":{"blob":"aaa)"), "123");
  EXPECT_EQ(RecoverIdText(R"({"jsonrpc":"2.0","id":12)"), "null");  // maybe 123…
  EXPECT_EQ(RecoverIdText(R"({"jsonrpc":"2.0","id":"ab)"), "null");
  EXPECT_EQ(RecoverIdText(R"({"params":{"blob":"aaa)"), "null");  // the id comes after
  auto answer = boost::json::parse(ParseErrorResponse("7", "not valid JSON at byte 3: x"));
  EXPECT_EQ(answer.at("id"), 7);
  EXPECT_EQ(answer.at("error").at("code"), kRpcParseError);
}

TEST(EnvelopeTest, MessagesAPeerWouldDropSilentlyAreNamed) {
  auto problem = [](std::string_view text) {
    return JsonRpcEnvelopeProblem(json_text::View(text)).value_or("<ok>");
  };
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":1,"method":"ping"})"), "<ok>");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":"a","method":"x","params":{}})"), "<ok>");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","method":"notifications/initialized"})"), "<ok>");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":1,"result":{}})"), "<ok>");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}})"), "<ok>");

  EXPECT_EQ(problem("42"),
            "a JSON-RPC message must be a JSON object (a batch: an array of them), not a number");
  EXPECT_NE(problem(R"({"foo":1})").find("neither a request"), std::string::npos);
  EXPECT_NE(problem(R"({"jsonrpc":"2.0","id":7})").find("neither a request"), std::string::npos);
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":8,"method":42})"),
            "\"method\" must be a string, not a number");
  EXPECT_EQ(problem(R"({"jsonrpc":"1.0","id":1,"method":"ping"})"),
            "\"jsonrpc\" must be \"2.0\" (JSON-RPC 2.0)");
  EXPECT_EQ(problem(R"({"id":1,"method":"ping"})"), "\"jsonrpc\" must be \"2.0\" (JSON-RPC 2.0)");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})"),
            "a request's \"id\" must be a string or a number, not an object");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":null,"method":"ping"})"),
            "a request's \"id\" must be a string or a number, not null");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":true,"method":"ping"})"),
            "a request's \"id\" must be a string or a number, not a boolean");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":9,"method":"tools/call","params":"x"})"),
            "\"params\" must be an object, not a string");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","method":"x","params":[1]})"),
            "\"params\" must be an object, not an array");

  // Parsers disagree about which copy wins: a member sent twice is refused,
  // an answer's "result" or "error" as much as a request's "method".
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":1,"result":{},"result":{"x":1}})"),
            "\"result\" is sent more than once; send it once");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":1,"error":{},"error":{}})"),
            "\"error\" is sent more than once; send it once");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","method":"x","result":1,"result":2})"),
            "\"result\" is sent more than once; send it once");
  EXPECT_EQ(problem(R"({"jsonrpc":"2.0","id":1,"method":"x","id":2})"),
            "\"id\" is sent more than once; send it once");
}

TEST(LineFramerTest, AnOversizeMessageKeepsItsIdWhereverItComes) {
  LineFramer framer(64);
  EXPECT_TRUE(
      framer
          .Feed(R"({"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"arguments":{"blob":")")
          .empty());
  EXPECT_TRUE(framer.Feed(std::string(1 << 20, 'a')).empty());  // still the same line
  std::vector<LineFramer::Frame> frames = framer.Feed("\"}}}\n{\"id\":42}\n");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_TRUE(frames[0].oversize);
  EXPECT_EQ(frames[0].id_text, "41");
  EXPECT_EQ(frames[1].message, R"({"id":42})");

  // The id last, after a megabyte of params, as the TypeScript SDK writes it.
  EXPECT_TRUE(framer.Feed(R"({"method":"tools/call","params":{"arguments":{"blob":")").empty());
  EXPECT_TRUE(framer.Feed(std::string(1 << 20, 'a') + R"(\"}\\"}},"jsonrpc":"2.0",)").empty());
  frames = framer.Feed("\"id\":\"req-43\"}\n");
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_TRUE(frames[0].oversize);
  EXPECT_EQ(frames[0].id_text, R"("req-43")");

  // Neither an id inside params nor one cut short is taken.
  framer.Feed(R"({"params":{"id":9,"blob":")" + std::string(100, 'a') + "\"}}\n");
  frames = framer.Feed(R"({"id":")" + std::string(2000, 'x') + "\"}\n");
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].id_text, "null");
}

TEST(IdSkeletonTest, KeepsTheTopLevelOnly) {
  IdSkeleton s;
  s.Feed(R"({"a":[1,{"id":2}],"b":"x\"y",)");
  s.Feed(R"("id":17})");
  EXPECT_EQ(s.IdText(), "17");
  IdSkeleton nested;
  nested.Feed(R"({"params":{"id":9}})");
  EXPECT_EQ(nested.IdText(), "null");
}

TEST(ParseMessageTest, DuplicateIdIsRefused) {
  EXPECT_FALSE(ParseMessage(R"({"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call"})"));
}

// Found by fuzzing: Boost.JSON reads "0e4001" as NaN, which serializes as
// null and equals nothing, so no answer could carry the id back.
TEST(ParseMessageTest, IdBeyondADoubleIsRefusedAndNotRecovered) {
  for (std::string id : {"1e400", "-1e400"}) {
    const std::string text = R"({"jsonrpc":"2.0","id":)" + id + R"(,"method":"tools/call"})";
    auto m = ParseMessage(text);
    ASSERT_FALSE(m) << id;
    EXPECT_NE(m.error().message.find("beyond what a double holds"), std::string::npos)
        << m.error().message;
    EXPECT_EQ(RecoverIdText(text), "null") << id;
  }
  auto big = ParseMessage(R"({"jsonrpc":"2.0","id":1e300,"method":"tools/call"})");
  ASSERT_TRUE(big) << "a large but finite id is an id";
  EXPECT_EQ(big->id_text, "1e300");
}

// Boost.JSON reads "0e4001" as NaN (0 * inf); the fuzzer's regression
// fuzz/regressions/jsonrpc_framing/id-beyond-a-double holds it. It is the id 0.
TEST(ParseMessageTest, IdOfZeroWithAHugeExponentIsTheIdZero) {
  for (std::string id : {"0e4001", "0.000e999", "-0e400"}) {
    const std::string text = R"({"jsonrpc":"2.0","id":)" + id + R"(,"method":"tools/call"})";
    auto m = ParseMessage(text);
    ASSERT_TRUE(m) << id << ": " << m.error().message;
    EXPECT_EQ(m->id_text, id) << "answered with the id as sent";
    EXPECT_EQ(m->id_key, "n:0") << id;
  }
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

}  // namespace
}  // namespace idem::mcp
