// HttpMcpServer over loopback (port 0) with an echo upstream behind it,
// driven by a raw HTTP client so that every status code and header is seen.
#include <gtest/gtest.h>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/http_test_support.h"

namespace idem::mcp {
namespace {

using namespace idem::mcp::testing;

const std::string kServerInitialize = InitializeRequest("2025-06-18");
constexpr char kVersion[] = "2025-06-18";

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    options.announce = false;
    auto server = HttpMcpServer::Start(options, echo_.Factory());
    ASSERT_TRUE(server) << server.error().message;
    server_ = std::move(*server);
    port_ = static_cast<uint16_t>(
        std::stoi(server_->bound_address().substr(server_->bound_address().rfind(':') + 1)));
  }

  // Runs initialize + initialized; returns the session id.
  std::string Initialize(RawClient& c) {
    RawResponse init = c.Request(http::verb::post, "/mcp", McpHeaders(), kServerInitialize);
    EXPECT_EQ(init.status, 200);
    std::string id = init.header("mcp-session-id");
    EXPECT_TRUE(IsValidSessionId(id));
    RawResponse note = c.Request(http::verb::post, "/mcp", McpHeaders(id, kVersion), kInitialized);
    EXPECT_EQ(note.status, 202);
    return id;
  }

  // POSTs tools/call of `tool` with `id` and reads only the response header.
  RawResponse OpenCall(RawClient& c, const std::string& session, int id, const std::string& tool) {
    return c.Open(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                  R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
                      R"(,"method":"tools/call","params":{"name":")" + tool + R"("}})");
  }

  EchoUpstream echo_;
  std::unique_ptr<HttpMcpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(HttpServerTest, BindsPortZeroAndServesHealthz) {
  StartServer();
  EXPECT_NE(port_, 0);
  EXPECT_EQ(server_->url(), "http://" + server_->bound_address() + "/mcp");
  RawClient c(port_);
  RawResponse r = c.Request(http::verb::get, "/healthz", {});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  RawResponse missing = c.Request(http::verb::get, "/nope", {});
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("/mcp"), std::string::npos);
}

// Issue 3: a request answered with nothing before the answer gets one
// complete response (header and the one SSE event, with Content-Length), as
// the SDK's own server sends it, instead of a chunked stream of three writes.
void ExpectOneSseResponse(const RawResponse& r) {
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_EQ(r.header("transfer-encoding"), "");
  EXPECT_EQ(r.header("content-length"), std::to_string(r.body.size()));
  EXPECT_EQ(r.body.rfind("event: message\ndata: ", 0), 0u) << r.body;
}

TEST_F(HttpServerTest, InitializeCreatesASessionAndToolsCallAnswersOverSse) {
  StartServer();
  RawClient c(port_);
  RawResponse init = c.Request(http::verb::post, "/mcp", McpHeaders(), kServerInitialize);
  ASSERT_EQ(init.status, 200);
  ExpectOneSseResponse(init);
  std::string session = init.header("mcp-session-id");
  ASSERT_TRUE(IsValidSessionId(session));
  ASSERT_EQ(init.events.size(), 1u);
  EXPECT_NE(init.events[0].data.find(R"("protocolVersion":"2025-06-18")"), std::string::npos);
  EXPECT_NE(init.events[0].data.find(R"("id":1)"), std::string::npos);

  RawResponse note =
      c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion), kInitialized);
  EXPECT_EQ(note.status, 202);
  EXPECT_TRUE(note.body.empty());

  RawResponse call = c.Request(
      http::verb::post, "/mcp", McpHeaders(session, kVersion),
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"n":12345678901234567891}}})");
  ASSERT_EQ(call.status, 200);
  ExpectOneSseResponse(call);
  ASSERT_EQ(call.events.size(), 1u);
  EXPECT_NE(call.events[0].data.find(R"("id":2)"), std::string::npos);
  EXPECT_TRUE(call.header("mcp-session-id").empty()) << "only the initialize answer carries it";
  // The connection is kept alive for the next request.
  EXPECT_EQ(c.Request(http::verb::get, "/healthz", {}).status, 200);

  // The upstream saw the client's bytes unchanged (a number no double holds).
  auto received = echo_.received();
  ASSERT_GE(received.size(), 3u);
  EXPECT_NE(received[2].find("12345678901234567891"), std::string::npos);
  ASSERT_EQ(echo_.infos().size(), 1u);
  EXPECT_EQ(echo_.infos()[0].session_id, session);
  EXPECT_EQ(echo_.infos()[0].tenant, "default");
}

// A held stream whose answer does not come within one keep-alive interval
// opens the SSE stream then, so the client sees the header and the
// keep-alive comments.
TEST_F(HttpServerTest, HeldStreamOpensWhenTheKeepaliveIntervalPasses) {
  StartServer({.sse_keepalive = std::chrono::milliseconds(1)});
  RawClient c(port_);
  RawResponse open = OpenCall(c, Initialize(c), 5, "slow");
  ASSERT_EQ(open.status, 200);
  EXPECT_EQ(open.header("content-type"), "text/event-stream");
  EXPECT_EQ(open.header("transfer-encoding"), "chunked");
  EXPECT_EQ(open.header("content-length"), "");
  server_->Stop();  // answers the waiting call inside the open stream
  std::optional<SseEvent> answer = c.NextEvent();
  ASSERT_TRUE(answer);
  EXPECT_NE(answer->data.find(R"("id":5)"), std::string::npos);
  EXPECT_NE(answer->data.find("server stopping"), std::string::npos);
  EXPECT_FALSE(c.NextEvent());
}

TEST_F(HttpServerTest, ProgressArrivesOnTheCallsStreamBeforeTheResult) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse call = c.Request(
      http::verb::post, "/mcp", McpHeaders(session, kVersion),
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"progress","_meta":{"progressToken":"tok"}}})");
  // The progress notification opened the chunked stream; the answer follows in it.
  EXPECT_EQ(call.header("content-type"), "text/event-stream");
  EXPECT_EQ(call.header("transfer-encoding"), "chunked");
  ASSERT_EQ(call.events.size(), 2u);
  EXPECT_NE(call.events[0].data.find("notifications/progress"), std::string::npos);
  EXPECT_NE(call.events[1].data.find(R"("id":3)"), std::string::npos);
}

TEST_F(HttpServerTest, ServerToClientRequestTravelsOnThePostStream) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse open = OpenCall(c, session, 4, "ask");
  ASSERT_EQ(open.status, 200);
  EXPECT_EQ(open.header("transfer-encoding"), "chunked") << "the request opened the stream";
  std::optional<SseEvent> ask = c.NextEvent();
  ASSERT_TRUE(ask);
  EXPECT_NE(ask->data.find("sampling/createMessage"), std::string::npos);
  // The client answers on another connection.
  RawClient other(port_);
  RawResponse answer = other.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                                     R"({"jsonrpc":"2.0","id":"srv-1","result":{"ok":true}})");
  EXPECT_EQ(answer.status, 202);
  std::optional<SseEvent> result = c.NextEvent();
  ASSERT_TRUE(result);
  EXPECT_NE(result->data.find(R"("id":4)"), std::string::npos);
  EXPECT_NE(result->data.find("asked"), std::string::npos);
  EXPECT_FALSE(c.NextEvent()) << "the stream ends after the response";
}

TEST_F(HttpServerTest, GetStreamCarriesServerInitiatedMessages) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawClient get(port_);
  RawResponse open = get.Open(http::verb::get, "/mcp",
                              {{"Accept", "text/event-stream"},
                               {"Mcp-Session-Id", session},
                               {"MCP-Protocol-Version", kVersion}});
  ASSERT_EQ(open.status, 200);
  EXPECT_EQ(open.header("content-type"), "text/event-stream");
  RawResponse trigger = c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                                  R"({"jsonrpc":"2.0","method":"test/trigger"})");
  EXPECT_EQ(trigger.status, 202);
  std::optional<SseEvent> e = get.NextEvent();
  ASSERT_TRUE(e);
  EXPECT_NE(e->data.find("notifications/message"), std::string::npos);

  RawClient second(port_);
  RawResponse conflict = second.Request(
      http::verb::get, "/mcp", {{"Accept", "text/event-stream"}, {"Mcp-Session-Id", session}});
  EXPECT_EQ(conflict.status, 409);
  RawResponse no_accept = second.Request(http::verb::get, "/mcp", {{"Mcp-Session-Id", session}});
  EXPECT_EQ(no_accept.status, 406);
}

TEST_F(HttpServerTest, DeleteEndsTheSessionAndItsChannel) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse del = c.Request(http::verb::delete_, "/mcp", {{"Mcp-Session-Id", session}});
  EXPECT_EQ(del.status, 200);
  ASSERT_TRUE(echo_.WaitClosed(1));
  EXPECT_NE(echo_.closed_reasons()[0].find("DELETE"), std::string::npos);
  RawResponse after = c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                                R"({"jsonrpc":"2.0","id":9,"method":"ping"})");
  EXPECT_EQ(after.status, 404);
}

TEST_F(HttpServerTest, SessionErrors) {
  StartServer();
  RawClient c(port_);
  std::string ping = R"({"jsonrpc":"2.0","id":9,"method":"ping"})";
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", McpHeaders("", kVersion), ping).status, 400)
      << "missing session id";
  RawResponse unknown =
      c.Request(http::verb::post, "/mcp", McpHeaders("no-such-session", kVersion), ping);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("initialize"), std::string::npos);
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", McpHeaders("bad id", kVersion), ping).status, 400);
  EXPECT_EQ(c.Request(http::verb::delete_, "/mcp", {{"Mcp-Session-Id", "nope"}}).status, 404);
  std::string session = Initialize(c);
  RawResponse reinit =
      c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion), kServerInitialize);
  EXPECT_EQ(reinit.status, 400);
}

TEST_F(HttpServerTest, UnknownProtocolVersionIs400WithTheSupportedList) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse r = c.Request(http::verb::post, "/mcp", McpHeaders(session, "1900-01-01"),
                            R"({"jsonrpc":"2.0","id":9,"method":"ping"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unsupported MCP-Protocol-Version '1900-01-01'"), std::string::npos);
  EXPECT_NE(r.body.find("2026-07-28"), std::string::npos);
  EXPECT_NE(r.body.find("-32022"), std::string::npos);
  for (std::string_view v : kSupportedProtocolVersions) {
    if (v == kStatelessProtocolVersion) continue;  // a different dialect, tested below
    RawResponse ok = c.Request(http::verb::post, "/mcp", McpHeaders(session, std::string(v)),
                               R"({"jsonrpc":"2.0","method":"notifications/x"})");
    EXPECT_EQ(ok.status, 202) << v;
  }
}

TEST_F(HttpServerTest, RequestShapeErrors) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  std::string ping = R"({"jsonrpc":"2.0","id":9,"method":"ping"})";
  Headers text = {{"Content-Type", "text/plain"},
                  {"Accept", "application/json, text/event-stream"},
                  {"Mcp-Session-Id", session}};
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", text, ping).status, 415);
  Headers html = {
      {"Content-Type", "application/json"}, {"Accept", "text/html"}, {"Mcp-Session-Id", session}};
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", html, ping).status, 406);
  RawResponse junk = c.Request(http::verb::post, "/mcp", McpHeaders(session), "{not json");
  EXPECT_EQ(junk.status, 400);
  EXPECT_NE(junk.body.find("-32700"), std::string::npos);
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", McpHeaders(session), R"({"jsonrpc":"2.0"})").status,
            400);
  RawResponse put = c.Request(http::verb::put, "/mcp", McpHeaders(session), ping);
  EXPECT_EQ(put.status, 405);
  EXPECT_EQ(put.header("allow"), "GET, POST, DELETE");
}

TEST_F(HttpServerTest, JsonOnlyClientGetsAJsonAnswer) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  Headers h = {{"Content-Type", "application/json"},
               {"Accept", "application/json"},
               {"Mcp-Session-Id", session},
               {"MCP-Protocol-Version", kVersion}};
  RawResponse r =
      c.Request(http::verb::post, "/mcp", h, R"({"jsonrpc":"2.0","id":"p","method":"ping"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(r.body, R"({"jsonrpc":"2.0","id":"p","result":{}})");
}

TEST_F(HttpServerTest, BatchGetsOneAnswerPerRequest) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse r = c.Request(
      http::verb::post, "/mcp", McpHeaders(session, "2025-03-26"),
      R"([{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":"b","method":"ping"}])");
  ASSERT_EQ(r.status, 200);
  ASSERT_EQ(r.events.size(), 2u);
  std::string both = r.events[0].data + r.events[1].data;
  EXPECT_NE(both.find(R"("id":"a")"), std::string::npos);
  EXPECT_NE(both.find(R"("id":"b")"), std::string::npos);
}

TEST_F(HttpServerTest, OversizedBodyIs413) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  StartServer(options);
  RawClient c(port_);
  std::string big = R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":")" +
                    std::string(4096, 'x') + "\"}}";
  RawResponse r = c.Request(http::verb::post, "/mcp", McpHeaders(), big);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("max_body_bytes"), std::string::npos);
  EXPECT_TRUE(echo_.infos().empty()) << "nothing reached a session";
}

TEST_F(HttpServerTest, OversizedHeaderIs431) {
  HttpServerOptions options;
  options.max_header_bytes = 1024;
  StartServer(options);
  RawClient c(port_);
  RawResponse r = c.Request(http::verb::get, "/healthz", {{"X-Pad", std::string(4096, 'x')}});
  EXPECT_EQ(r.status, 431);
}

// Regression: the MCP listener limited only the header block's size, not the
// number of fields (docs/DESIGN.md §8), unlike the other HTTP fronts.
TEST_F(HttpServerTest, TooManyHeaderFieldsIs431) {
  HttpServerOptions options;
  options.max_header_count = 20;
  StartServer(options);
  Headers many;
  for (int i = 0; i < 30; ++i) many.emplace_back("X-H" + std::to_string(i), "v");
  RawClient c(port_);
  RawResponse r = c.Request(http::verb::get, "/healthz", many);
  EXPECT_EQ(r.status, 431);
  EXPECT_NE(r.body.find("at most 20 are accepted"), std::string::npos) << r.body;
  many.resize(10);
  RawClient c2(port_);
  EXPECT_EQ(c2.Request(http::verb::get, "/healthz", many).status, 200);
}

// Regression: a request that is JSON but not JSON-RPC 2.0 (an object id, a
// string params, another "jsonrpc") reached the upstream, which dropped it
// without answering, and the POST never ended.
TEST_F(HttpServerTest, MessagesThatAreNotJsonRpcAre400AndNeverForwarded) {
  StartServer();
  RawClient c(port_);
  std::string session = Initialize(c);
  ASSERT_TRUE(echo_.WaitReceived("notifications/initialized"));
  size_t forwarded = echo_.received().size();
  const std::pair<std::string, std::string> cases[] = {
      {R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})", "must be a string or a number"},
      {R"({"jsonrpc":"2.0","id":9,"method":"tools/call","params":"x"})", "must be an object"},
      {R"({"jsonrpc":"1.0","id":10,"method":"ping"})", "(JSON-RPC 2.0)"},
      {R"({"jsonrpc":"2.0","id":null,"method":"ping"})", "not null"},
      {R"({"jsonrpc":"2.0","id":11,"method":42})", "must be a string, not a number"},
  };
  for (const auto& [body, says] : cases) {
    RawResponse r = c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion), body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(r.body.find("-32600"), std::string::npos) << r.body;
    EXPECT_NE(r.body.find(says), std::string::npos) << r.body;
  }
  RawResponse bad_utf8 = c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                                   "{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"p\xC3\"}");
  EXPECT_EQ(bad_utf8.status, 400);
  EXPECT_NE(bad_utf8.body.find("at byte 36: invalid UTF-8"), std::string::npos) << bad_utf8.body;
  EXPECT_EQ(echo_.received().size(), forwarded);
}

TEST_F(HttpServerTest, DnsRebindingIsRefused) {
  StartServer();
  RawClient c(port_);
  Headers evil_origin = McpHeaders();
  evil_origin.emplace_back("Origin", "http://evil.example");
  RawResponse r = c.Request(http::verb::post, "/mcp", evil_origin, kServerInitialize);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("Origin"), std::string::npos);
  Headers evil_host = McpHeaders();
  evil_host.emplace_back("Host", "evil.example:8080");
  RawClient c2(port_);
  EXPECT_EQ(c2.Request(http::verb::post, "/mcp", evil_host, kServerInitialize).status, 403);
  Headers local_origin = McpHeaders();
  local_origin.emplace_back("Origin", "http://localhost:6274");
  RawClient c3(port_);
  EXPECT_EQ(c3.Request(http::verb::post, "/mcp", local_origin, kServerInitialize).status, 200);
}

TEST_F(HttpServerTest, StalledClientIsDroppedWhileOthersAreServed) {
  HttpServerOptions options;
  options.read_timeout = std::chrono::milliseconds(200);
  StartServer(options);
  RawClient slow(port_);
  slow.WriteRaw("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le");  // and nothing more
  RawClient fast(port_);
  EXPECT_EQ(fast.Request(http::verb::get, "/healthz", {}).status, 200);
  EXPECT_TRUE(slow.ServerClosed()) << "the stalled request was not dropped";
  RawClient later(port_);
  EXPECT_EQ(later.Request(http::verb::get, "/healthz", {}).status, 200);
}

TEST_F(HttpServerTest, StatelessDialectNeedsNoSession) {
  StartServer();
  RawClient a(port_);
  Headers h = McpHeaders("", "2026-07-28");
  h.emplace_back("Mcp-Method", "server/discover");
  RawResponse r = a.Request(http::verb::post, "/mcp", h,
                            R"({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}})");
  // Nothing was streamed before the answer, so it comes as plain JSON.
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_TRUE(r.header("mcp-session-id").empty());
  EXPECT_NE(r.body.find(R"("id":1,)"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("supportedVersions"), std::string::npos);
  // Another sessionless client with the same id shares the upstream session.
  RawClient b(port_);
  RawResponse r2 = b.Request(
      http::verb::post, "/mcp", McpHeaders("", "2026-07-28"),
      R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"x":1},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})");
  EXPECT_NE(r2.body.find(R"("id":1,)"), std::string::npos);
  EXPECT_NE(r2.body.find(R"({\"x\":1})"), std::string::npos);
  // A notification before the answer opens the SSE stream.
  RawResponse progress = b.Request(
      http::verb::post, "/mcp", McpHeaders("", "2026-07-28"),
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"progress","_meta":{"progressToken":"t2","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})");
  EXPECT_EQ(progress.header("content-type"), "text/event-stream");
  ASSERT_EQ(progress.events.size(), 2u);
  EXPECT_NE(progress.events[0].data.find("notifications/progress"), std::string::npos);
  EXPECT_NE(progress.events[1].data.find(R"("id":2,)"), std::string::npos);
  // An unknown method is 404 with -32601 in this dialect.
  RawResponse unknown = b.Request(http::verb::post, "/mcp", McpHeaders("", "2026-07-28"),
                                  R"({"jsonrpc":"2.0","id":3,"method":"no/such"})");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("-32601"), std::string::npos);
  EXPECT_EQ(echo_.infos().size(), 1u);
  EXPECT_TRUE(echo_.infos()[0].stateless);
  // No GET stream and no DELETE in this dialect.
  EXPECT_EQ(b.Request(http::verb::get, "/mcp",
                      {{"Accept", "text/event-stream"}, {"MCP-Protocol-Version", "2026-07-28"}})
                .status,
            405);
  // Headers that contradict the body are refused.
  Headers wrong = McpHeaders("", "2026-07-28");
  wrong.emplace_back("Mcp-Method", "tools/list");
  RawResponse mismatch = b.Request(http::verb::post, "/mcp", wrong,
                                   R"({"jsonrpc":"2.0","id":2,"method":"server/discover"})");
  EXPECT_EQ(mismatch.status, 400);
  EXPECT_NE(mismatch.body.find("-32020"), std::string::npos);
  RawResponse meta_mismatch = b.Request(
      http::verb::post, "/mcp", McpHeaders("", "2026-07-28"),
      R"({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}})");
  EXPECT_EQ(meta_mismatch.status, 400);
}

TEST_F(HttpServerTest, NonLoopbackNeedsTokensOrInsecureFlag) {
  HttpServerOptions options;
  options.listen = "0.0.0.0:0";
  options.announce = false;
  auto refused = HttpMcpServer::Start(options, echo_.Factory());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("--insecure-no-auth"), std::string::npos);
  options.insecure_no_auth = true;
  auto allowed = HttpMcpServer::Start(options, echo_.Factory());
  EXPECT_TRUE(allowed) << allowed.error().message;
  auto bad = HttpMcpServer::Start(HttpServerOptions{.listen = "nonsense"}, echo_.Factory());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
}

// Tokens of two tenants: t-acme and t-other.
std::optional<std::string> AcmeAndOther(std::string_view token) {
  if (token == "t-acme") return "acme";
  if (token == "t-other") return "other";
  return std::nullopt;
}

TEST_F(HttpServerTest, BearerTokensNameTheTenantAndGuardSessions) {
  HttpServerOptions options;
  options.authenticate = AcmeAndOther;
  StartServer(options);
  RawClient c(port_);
  RawResponse none = c.Request(http::verb::post, "/mcp", McpHeaders(), kServerInitialize);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.header("www-authenticate"), "Bearer");
  Headers acme = McpHeaders();
  acme.emplace_back("Authorization", "Bearer t-acme");
  RawResponse init = c.Request(http::verb::post, "/mcp", acme, kServerInitialize);
  ASSERT_EQ(init.status, 200);
  ASSERT_TRUE(echo_.WaitSessions(1));
  EXPECT_EQ(echo_.infos()[0].tenant, "acme");
  Headers other = McpHeaders(init.header("mcp-session-id"), kVersion);
  other.emplace_back("Authorization", "Bearer t-other");
  EXPECT_EQ(
      c.Request(http::verb::post, "/mcp", other, R"({"jsonrpc":"2.0","id":2,"method":"ping"})")
          .status,
      404)
      << "a session is bound to the tenant that opened it";
  EXPECT_EQ(c.Request(http::verb::get, "/healthz", {}).status, 200) << "admin endpoints stay open";
}

TEST_F(HttpServerTest, IdleSessionExpires) {
  HttpServerOptions options;
  options.session_idle_timeout = std::chrono::milliseconds(100);
  StartServer(options);
  RawClient c(port_);
  std::string session = Initialize(c);
  ASSERT_TRUE(echo_.WaitClosed(1));
  EXPECT_NE(echo_.closed_reasons()[0].find("idle"), std::string::npos);
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                      R"({"jsonrpc":"2.0","id":2,"method":"ping"})")
                .status,
            404);
}

// Security review F6: max_sessions was the only cap, so one tenant could
// open every session and keep them with GET streams (never idle).
TEST_F(HttpServerTest, OneTenantCannotHoldEverySession) {
  HttpServerOptions options;
  options.max_sessions_per_tenant = 2;
  options.authenticate = AcmeAndOther;
  StartServer(options);
  RawClient c(port_);
  Headers acme = McpHeaders();
  acme.emplace_back("Authorization", "Bearer t-acme");
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", acme, kServerInitialize).status, 200);
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", acme, kServerInitialize).status, 200);
  RawResponse third = c.Request(http::verb::post, "/mcp", acme, kServerInitialize);
  EXPECT_EQ(third.status, 503);
  EXPECT_NE(third.body.find("max-sessions-per-tenant"), std::string::npos) << third.body;
  Headers other = McpHeaders();
  other.emplace_back("Authorization", "Bearer t-other");
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", other, kServerInitialize).status, 200)
      << "another tenant still gets a session";
}

TEST_F(HttpServerTest, ASessionWithAnOpenStreamEndsAtItsLifetime) {
  HttpServerOptions options;
  options.session_idle_timeout = std::chrono::milliseconds(0);
  options.session_lifetime = std::chrono::milliseconds(100);
  StartServer(options);
  RawClient c(port_);
  std::string session = Initialize(c);
  RawClient stream(port_);
  ASSERT_EQ(stream.Open(http::verb::get, "/mcp", McpHeaders(session, kVersion), "").status, 200);
  ASSERT_TRUE(echo_.WaitClosed(1));
  EXPECT_NE(echo_.closed_reasons()[0].find("lifetime"), std::string::npos)
      << echo_.closed_reasons()[0];
  EXPECT_EQ(c.Request(http::verb::post, "/mcp", McpHeaders(session, kVersion),
                      R"({"jsonrpc":"2.0","id":2,"method":"ping"})")
                .status,
            404);
}

TEST_F(HttpServerTest, StopEndsSessionsAndAnswersWaitingRequests) {
  // The held answer opens its stream at the first keep-alive (Open waits for
  // its header): at once, not after the default 15 s.
  StartServer({.sse_keepalive = std::chrono::milliseconds(1)});
  RawClient c(port_);
  std::string session = Initialize(c);
  RawResponse open =
      c.Open(http::verb::post, "/mcp", McpHeaders(session, kVersion),
             R"({"jsonrpc":"2.0","id":"w","method":"tools/call","params":{"name":"slow"}})");
  ASSERT_EQ(open.status, 200);
  ASSERT_TRUE(echo_.WaitReceived("slow"));
  std::thread stopper([&] { server_->Stop(); });
  std::optional<SseEvent> answer = c.NextEvent();
  stopper.join();
  ASSERT_TRUE(answer);
  EXPECT_NE(answer->data.find(R"("id":"w")"), std::string::npos);
  EXPECT_NE(answer->data.find("server stopping"), std::string::npos) << answer->data;
  ASSERT_TRUE(echo_.WaitClosed(1));
  EXPECT_EQ(echo_.closed_reasons()[0], "server stopping");
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  HttpServerOptions options;
  options.max_connections = 1;
  StartServer(options);
  RawClient first(port_);
  EXPECT_EQ(first.Request(http::verb::get, "/healthz", {}).status, 200);  // stays open (keep-alive)
  RawClient second(port_);
  RawResponse r = second.Request(http::verb::get, "/healthz", {});
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("too many connections"), std::string::npos);
}

}  // namespace
}  // namespace idem::mcp
