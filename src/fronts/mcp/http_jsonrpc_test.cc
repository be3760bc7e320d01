#include "fronts/mcp/http_jsonrpc.h"

#include <gtest/gtest.h>

#include "fronts/mcp/http_channels.h"

namespace idem::mcp {
namespace {

TEST(InspectBody, ClassifiesMessages) {
  auto b = InspectBody(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge",
      "arguments":{"amount":5},"_meta":{"progressToken":"p1"}}})",
                       64);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->messages.size(), 1u);
  const MessageInfo& m = b->messages[0];
  EXPECT_FALSE(b->is_batch);
  EXPECT_EQ(m.kind, MessageKind::kRequest);
  EXPECT_EQ(m.method, "tools/call");
  EXPECT_EQ(m.id_key, "1");
  EXPECT_EQ(m.name, "charge");
  EXPECT_EQ(m.progress_token, "\"p1\"");

  auto n = InspectMessage(R"({"jsonrpc":"2.0","method":"notifications/progress",
      "params":{"progressToken":7,"progress":1}})",
                          64);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->kind, MessageKind::kNotification);
  EXPECT_EQ(n->progress_token, "7");
  EXPECT_TRUE(n->id_key.empty());

  auto r =
      InspectMessage(R"({"jsonrpc":"2.0","id":"a","result":{"protocolVersion":"2025-06-18"}})", 64);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, MessageKind::kResponse);
  EXPECT_EQ(r->id_key, "\"a\"");
  EXPECT_EQ(r->result_protocol_version, "2025-06-18");

  auto e =
      InspectMessage(R"({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}})", 64);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, MessageKind::kResponse);
  EXPECT_EQ(e->id_key, "null");

  auto d = InspectMessage(R"({"jsonrpc":"2.0","id":2,"method":"resources/read","params":{
      "uri":"file:///x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})",
                          64);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "file:///x");
  EXPECT_EQ(d->meta_protocol_version, "2026-07-28");

  auto x = InspectMessage(R"({"jsonrpc":"2.0"})", 64);
  ASSERT_TRUE(x);
  EXPECT_EQ(x->kind, MessageKind::kInvalid);
}

TEST(InspectBody, BatchesKeepEachElementsBytes) {
  std::string body =
      R"( [ {"jsonrpc":"2.0","id":1,"method":"a"} ,{"jsonrpc":"2.0","method":"n"}] )";
  auto b = InspectBody(body, 64);
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->is_batch);
  ASSERT_EQ(b->messages.size(), 2u);
  EXPECT_EQ(b->messages[0].raw, R"({"jsonrpc":"2.0","id":1,"method":"a"})");
  EXPECT_EQ(b->messages[1].raw, R"({"jsonrpc":"2.0","method":"n"})");
  EXPECT_FALSE(InspectBody("[]", 64));
  EXPECT_FALSE(InspectBody("[1]", 64));
}

TEST(InspectBody, RefusesNonJsonAndDeepNesting) {
  EXPECT_FALSE(InspectBody("{", 64));
  EXPECT_FALSE(InspectBody("\"str\"", 64));
  std::string deep(100, '[');
  deep += std::string(100, ']');
  auto r = InspectBody(R"({"id":1,"method":"x","params":)" + deep + "}", 64);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(r.error().message, "the body is nested deeper than 64 levels");
  auto utf8 = InspectBody("{\"id\":1,\"method\":\"\xFF\"}", 64);
  ASSERT_FALSE(utf8);
  EXPECT_EQ(utf8.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(utf8.error().message.rfind("the body is not valid JSON at byte 18: invalid UTF-8", 0),
            0)
      << utf8.error().message;
}

TEST(InspectBody, NamesWhyAMessageIsNotJsonRpc) {
  auto b = InspectBody(R"([{"jsonrpc":"2.0","id":1,"method":"ping"},)"
                       R"({"jsonrpc":"2.0","id":[2],"method":"ping"},{"jsonrpc":"2.0","id":3}])",
                       64);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->messages.size(), 3u);
  EXPECT_EQ(b->messages[0].problem, "");
  EXPECT_EQ(b->messages[1].kind, MessageKind::kRequest);
  EXPECT_EQ(b->messages[1].problem,
            "a request's \"id\" must be a string or a number, not an array");
  EXPECT_EQ(b->messages[2].kind, MessageKind::kInvalid);
  EXPECT_NE(b->messages[2].problem.find("neither a request"), std::string::npos);
}

TEST(InspectBody, EqualIdsGiveEqualKeys) {
  auto a = InspectMessage(R"({"id":"a\u0062","result":{}})", 8);
  auto b = InspectMessage(R"({"id":"ab","method":"m"})", 8);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->id_key, b->id_key);
}

TEST(FindTopLevelMember, FindsOnlyTopLevel) {
  std::string_view msg =
      R"( { "params" : {"id": 99, "s":"}\"{"}, "id" : "x\"y" , "z":[1,{"id":2}]} )";
  auto id = FindTopLevelMember(msg, "id");
  ASSERT_TRUE(id);
  EXPECT_EQ(*id, R"("x\"y")");
  auto z = FindTopLevelMember(msg, "z");
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, R"([1,{"id":2}])");
  EXPECT_FALSE(FindTopLevelMember(msg, "missing"));
  EXPECT_FALSE(FindTopLevelMember("[1]", "id"));
  EXPECT_FALSE(FindTopLevelMember("{}", "id"));
  auto num = FindTopLevelMember(R"({"id":-12.5e3})", "id");
  ASSERT_TRUE(num);
  EXPECT_EQ(*num, "-12.5e3");
}

TEST(ReplaceId, ChangesOnlyTheIdBytes) {
  // A number no double holds must survive byte for byte (the ledger
  // fingerprints the arguments).
  std::string msg =
      R"({"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"arguments":{"n":12345678901234567891,"f":1.10}}})";
  auto out = ReplaceId(msg, "\"idemgate-1\"");
  ASSERT_TRUE(out);
  EXPECT_EQ(
      *out,
      R"({"jsonrpc":"2.0","id":"idemgate-1","method":"tools/call","params":{"arguments":{"n":12345678901234567891,"f":1.10}}})");
  auto back = ReplaceId(*out, "17");
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, msg);
  EXPECT_FALSE(ReplaceId(R"({"method":"n"})", "1"));
}

TEST(SplitTopLevelArray, Elements) {
  auto parts = SplitTopLevelArray(R"([ 1, "a,]", {"b":[2,3]}, null ])");
  ASSERT_TRUE(parts);
  ASSERT_EQ(parts->size(), 4u);
  EXPECT_EQ((*parts)[1], R"("a,]")");
  EXPECT_EQ((*parts)[2], R"({"b":[2,3]})");
  auto empty = SplitTopLevelArray("[ ]");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(SplitTopLevelArray("[1,"));
  EXPECT_FALSE(SplitTopLevelArray("{}"));
}

TEST(MirroredParams, ReadsAnnotationsReachableThroughProperties) {
  std::string list = R"({"jsonrpc":"2.0","id":1,"result":{"tools":[
    {"name":"execute_sql","inputSchema":{"type":"object","properties":{
      "region":{"type":"string","x-mcp-header":"Region"},
      "opts":{"type":"object","properties":{"tenant":{"type":"integer","x-mcp-header":"Tenant"}}},
      "list":{"type":"array","items":{"type":"object","properties":{"x":{"x-mcp-header":"X"}}}},
      "bad":{"type":"string","x-mcp-header":"Evil\r\nInjected: 1"},
      "query":{"type":"string"}}}},
    {"name":"plain","inputSchema":{"type":"object","properties":{"a":{"type":"string"}}}}]}})";
  auto params = ParseMirroredParams(list, 64);
  ASSERT_EQ(params.size(), 1u);
  const auto& p = params["execute_sql"];
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].header, "Region");
  EXPECT_EQ(p[0].path, std::vector<std::string>{"region"});
  EXPECT_EQ(p[1].header, "Tenant");
  EXPECT_EQ(p[1].path, (std::vector<std::string>{"opts", "tenant"}));
  EXPECT_TRUE(ParseMirroredParams(R"({"jsonrpc":"2.0","id":1,"result":{}})", 64).empty());

  auto headers = MirroredParamHeaders(
      p,
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_sql","arguments":{"region":"Grüße","opts":{"tenant":42},"query":"x"}}})",
      64);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[0],
            (std::pair<std::string, std::string>{"Mcp-Param-Region", "=?base64?R3LDvMOfZQ==?="}));
  EXPECT_EQ(headers[1], (std::pair<std::string, std::string>{"Mcp-Param-Tenant", "42"}));
  auto none = MirroredParamHeaders(
      p,
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_sql","arguments":{"region":null,"opts":{"tenant":1.5}}}})",
      64);
  EXPECT_TRUE(none.empty()) << "null and non-integer numbers get no header";
}

TEST(StatelessHttpStatus, MapsTheErrorsThe2026DialectGivesAStatus) {
  EXPECT_EQ(StatelessHttpStatus(R"({"jsonrpc":"2.0","id":1,"result":{"error":-32601}})"), 200);
  EXPECT_EQ(
      StatelessHttpStatus(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"x"}})"),
      404);
  EXPECT_EQ(
      StatelessHttpStatus(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"x"}})"),
      400);
  EXPECT_EQ(
      StatelessHttpStatus(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32020,"message":"x"}})"),
      400);
  EXPECT_EQ(
      StatelessHttpStatus(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}})"),
      200);
}

TEST(JsonRpcError, Shape) {
  EXPECT_EQ(JsonRpcError("7", -32600, "bad \"x\""),
            R"({"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"bad \"x\""}})");
  EXPECT_EQ(JsonRpcError("", 1, "m", R"({"a":1})"),
            R"({"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m","data":{"a":1}}})");
}

TEST(DeliveryFailure, SynthesisedAnswersClassify) {
  std::string not_sent = MakeDeliveryFailure("\"r1\"", DeliveryFailure::kNotSent,
                                             "cannot connect (Connection refused)");
  auto info = InspectMessage(not_sent, 16);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->kind, MessageKind::kResponse);
  EXPECT_EQ(info->id_key, "\"r1\"");
  EXPECT_NE(not_sent.find(R"("code":-31001)"), std::string::npos);
  EXPECT_NE(not_sent.find(R"("idemgate":"not_sent")"), std::string::npos);
  EXPECT_EQ(ClassifyDeliveryFailure(not_sent), DeliveryFailure::kNotSent);

  std::string maybe = MakeDeliveryFailure("5", DeliveryFailure::kMaybeSent, "HTTP 502", 502);
  EXPECT_NE(maybe.find(R"("http_status":502)"), std::string::npos);
  EXPECT_NE(maybe.find(R"("code":-31002)"), std::string::npos);
  EXPECT_EQ(ClassifyDeliveryFailure(maybe), DeliveryFailure::kMaybeSent);
}

TEST(DeliveryFailure, ForgedOrOrdinaryAnswersDoNotClassify) {
  EXPECT_EQ(ClassifyDeliveryFailure(R"({"jsonrpc":"2.0","id":1,"result":{}})"), std::nullopt);
  // An upstream that copies the documented shape without our nonce.
  EXPECT_EQ(
      ClassifyDeliveryFailure(
          R"({"jsonrpc":"2.0","id":1,"error":{"code":-31001,"message":"x","data":{"idemgate":"not_sent","nonce":"guess"}}})"),
      std::nullopt);
  // The right nonce under the wrong code.
  std::string real = MakeDeliveryFailure("1", DeliveryFailure::kNotSent, "x");
  std::string wrong_code = real;
  wrong_code.replace(wrong_code.find("-31001"), 6, "-31002");
  EXPECT_EQ(ClassifyDeliveryFailure(wrong_code), std::nullopt);
}

}  // namespace
}  // namespace idem::mcp
