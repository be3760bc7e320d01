// The upstream channel (ConnectHttpUpstream): against our own server with an
// echo upstream behind it (the happy paths), and against a scripted raw
// server that misbehaves on purpose (the delivery-failure convention).
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_test_support.h"

namespace idem::mcp {
namespace {

using namespace idem::mcp::testing;

const std::string kClientInitialize = InitializeRequest("2025-11-25");

std::shared_ptr<Channel> Connect(const std::string& url, Inbox& inbox,
                                 HttpClientOptions options = {}) {
  auto channel = ConnectHttpUpstream(url, options);
  EXPECT_TRUE(channel) << channel.error().message;
  (*channel)->Start(inbox.OnMessage(), inbox.OnClosed());
  return *channel;
}

class HttpClientTest : public ::testing::Test {
 protected:
  void StartServer() {
    HttpServerOptions options;
    options.announce = false;
    auto server = HttpMcpServer::Start(options, echo_.Factory());
    ASSERT_TRUE(server) << server.error().message;
    server_ = std::move(*server);
  }
  EchoUpstream echo_;
  std::unique_ptr<HttpMcpServer> server_;
};

TEST_F(HttpClientTest, FullSessionAgainstOurServer) {
  StartServer();
  Inbox inbox;
  auto channel = Connect(server_->url(), inbox);
  ASSERT_TRUE(channel->Send(kClientInitialize));
  EXPECT_NE(inbox.WaitFor(R"("protocolVersion":"2025-11-25")"), "");
  ASSERT_TRUE(channel->Send(kInitialized));
  // A call with progress: both arrive, progress first.
  ASSERT_TRUE(channel->Send(
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"progress","_meta":{"progressToken":"pt"}}})"));
  std::string result = inbox.WaitFor(R"("id":2)");
  ASSERT_NE(result, "");
  auto messages = inbox.messages();
  size_t progress_at = 0, result_at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].find("notifications/progress") != std::string::npos) progress_at = i;
    if (messages[i].find(R"("id":2)") != std::string::npos) result_at = i;
  }
  EXPECT_GT(progress_at, 0u);
  EXPECT_LT(progress_at, result_at);
  // A server-initiated message reaches us (over the GET stream the channel
  // opened after initialization, or buffered until it opens).
  ASSERT_TRUE(channel->Send(R"({"jsonrpc":"2.0","method":"test/trigger"})"));
  EXPECT_NE(inbox.WaitFor("notifications/message"), "");
  // A server-to-client request, answered by us.
  ASSERT_TRUE(
      channel->Send(R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ask"}})"));
  EXPECT_NE(inbox.WaitFor("sampling/createMessage"), "");
  ASSERT_TRUE(channel->Send(R"({"jsonrpc":"2.0","id":"srv-1","result":{"role":"assistant"}})"));
  EXPECT_NE(inbox.WaitFor(R"("id":3)"), "");
  // The upstream saw our protocol version on later requests.
  auto received = echo_.received();
  ASSERT_GE(received.size(), 2u);
  // Close: DELETE ends the server's session; our channel closes.
  channel->Close();
  EXPECT_FALSE(channel->Send(R"({"jsonrpc":"2.0","id":4,"method":"ping"})"));
  ASSERT_TRUE(inbox.WaitClosed());
  EXPECT_EQ(inbox.reason(), "closed by the proxy");
  ASSERT_TRUE(echo_.WaitClosed(1));
  EXPECT_NE(echo_.closed_reasons()[0].find("DELETE"), std::string::npos);
}

TEST_F(HttpClientTest, ConcurrentCallsDoNotWaitForASlowOne) {
  StartServer();
  Inbox inbox;
  auto channel = Connect(server_->url(), inbox);
  channel->Send(kClientInitialize);
  ASSERT_NE(inbox.WaitFor(R"("id":1)"), "");
  channel->Send(kInitialized);
  channel->Send(R"({"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"slow"}})");
  for (int i = 0; i < 20; ++i) {
    channel->Send(R"({"jsonrpc":"2.0","id":)" + std::to_string(100 + i) +
                  R"(,"method":"tools/call","params":{"name":"echo","arguments":{"i":)" +
                  std::to_string(i) + "}}}");
  }
  for (int i = 0; i < 20; ++i) {
    EXPECT_NE(inbox.WaitFor(R"("id":)" + std::to_string(100 + i)), "") << i;
  }
}

TEST_F(HttpClientTest, ExpiredSessionClosesTheChannel) {
  StartServer();
  Inbox inbox;
  auto channel = Connect(server_->url(), inbox);
  channel->Send(kClientInitialize);
  ASSERT_NE(inbox.WaitFor(R"("id":1)"), "");
  ASSERT_TRUE(echo_.WaitSessions(1));
  // The server forgets the session (as after a restart or an idle expiry).
  RawClient admin(static_cast<uint16_t>(
      std::stoi(server_->bound_address().substr(server_->bound_address().rfind(':') + 1))));
  ASSERT_EQ(
      admin.Request(http::verb::delete_, "/mcp", {{"Mcp-Session-Id", echo_.infos()[0].session_id}})
          .status,
      200);
  channel->Send(R"({"jsonrpc":"2.0","id":7,"method":"ping"})");
  std::string failure = inbox.WaitFor(R"("id":7)");
  ASSERT_NE(failure, "");
  EXPECT_EQ(ClassifyDeliveryFailure(failure), DeliveryFailure::kNotSent);
  EXPECT_NE(failure.find("upstream session expired"), std::string::npos);
  ASSERT_TRUE(inbox.WaitClosed());
  EXPECT_EQ(inbox.reason(), "upstream session expired");
}

TEST(HttpClient, RefusedConnectionIsNotSent) {
  Inbox inbox;
  auto channel = Connect("http://127.0.0.1:" + std::to_string(UnusedPort()) + "/mcp", inbox);
  channel->Send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  channel->Send(R"({"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"charge"}})");
  std::string failure = inbox.WaitFor(R"("id":"c1")");
  ASSERT_NE(failure, "");
  EXPECT_EQ(ClassifyDeliveryFailure(failure), DeliveryFailure::kNotSent);
  EXPECT_NE(failure.find("refused"), std::string::npos);
  EXPECT_EQ(inbox.messages().size(), 1u) << "a notification gets no synthesised answer";
}

TEST(HttpClient, UnresolvableHostIsNotSent) {
  Inbox inbox;
  auto channel = Connect("http://no-such-host.invalid/mcp", inbox);
  channel->Send(R"({"jsonrpc":"2.0","id":1,"method":"ping"})");
  std::string failure = inbox.WaitFor(R"("id":1)");
  ASSERT_NE(failure, "");
  EXPECT_EQ(ClassifyDeliveryFailure(failure), DeliveryFailure::kNotSent);
  EXPECT_NE(failure.find("cannot resolve"), std::string::npos);
}

TEST(HttpClient, ConnectionLostAfterTheRequestIsMaybeSent) {
  ScriptedServer upstream([](const auto&, int) { return ScriptedServer::Reply{"", true}; });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Send(R"({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"deploy"}})");
  std::string failure = inbox.WaitFor(R"("id":5)");
  ASSERT_NE(failure, "");
  EXPECT_EQ(ClassifyDeliveryFailure(failure), DeliveryFailure::kMaybeSent);
}

TEST(HttpClient, StatusCodesMapToTheConvention) {
  ScriptedServer upstream([](const http::request<http::string_body>& req, int) {
    std::string body = req.body();
    if (body.find(R"("id":1)") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(503, "text/plain", "overloaded")};
    }
    if (body.find(R"("id":2)") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(
          400, "application/json",
          R"({"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Server not initialized"}})")};
    }
    if (body.find(R"("id":3)") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(
          400, "application/json",
          R"({"jsonrpc":"2.0","id":3,"error":{"code":-32020,"message":"Header mismatch"}})")};
    }
    if (body.find(R"("id":4)") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(200, "application/json", "")};
    }
    return ScriptedServer::Reply{
        HttpReply(500, "application/json", R"({"jsonrpc":"2.0","id":5,"result":{"ok":1}})")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  for (int id = 1; id <= 5; ++id) {
    channel->Send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"method":"tools/call"})");
  }
  std::string five03 = inbox.WaitFor(R"("id":1)");
  EXPECT_EQ(ClassifyDeliveryFailure(five03), DeliveryFailure::kMaybeSent);
  EXPECT_NE(five03.find(R"("http_status":503)"), std::string::npos);
  std::string four00 = inbox.WaitFor(R"("id":2)");
  EXPECT_EQ(ClassifyDeliveryFailure(four00), DeliveryFailure::kNotSent);
  EXPECT_NE(four00.find("Server not initialized"), std::string::npos);
  std::string own = inbox.WaitFor(R"("id":3)");
  EXPECT_EQ(own, R"({"jsonrpc":"2.0","id":3,"error":{"code":-32020,"message":"Header mismatch"}})")
      << "the upstream's own JSON-RPC answer passes through";
  EXPECT_EQ(ClassifyDeliveryFailure(own), std::nullopt);
  EXPECT_EQ(ClassifyDeliveryFailure(inbox.WaitFor(R"("id":4)")), DeliveryFailure::kMaybeSent)
      << "200 without an answer";
  EXPECT_EQ(inbox.WaitFor(R"("id":5)"), R"({"jsonrpc":"2.0","id":5,"result":{"ok":1}})");
}

TEST(HttpClient, JsonBatchAnswerIsDeliveredMessageByMessage) {
  ScriptedServer upstream([](const auto&, int) {
    return ScriptedServer::Reply{HttpReply(
        200, "application/json",
        R"([{"jsonrpc":"2.0","id":"a","result":1},{"jsonrpc":"2.0","id":"b","result":2}])")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Send(
      R"([{"jsonrpc":"2.0","id":"a","method":"x"},{"jsonrpc":"2.0","id":"b","method":"y"}])");
  EXPECT_EQ(inbox.WaitFor(R"("id":"b")"), R"({"jsonrpc":"2.0","id":"b","result":2})");
  EXPECT_EQ(inbox.messages().front(), R"({"jsonrpc":"2.0","id":"a","result":1})");
}

TEST(HttpClient, BrokenStreamResumesWithLastEventId) {
  ScriptedServer upstream([](const http::request<http::string_body>& req, int n) {
    if (n == 0) {
      // Primes the stream with an id, asks for a quick retry, and ends the
      // stream before the answer (2025-11-25 polling).
      return ScriptedServer::Reply{SseReply("id: ev-1\nretry: 5\ndata:\n\n"), true};
    }
    EXPECT_EQ(req.method(), http::verb::get);
    EXPECT_EQ(req["Last-Event-ID"], "ev-1");
    return ScriptedServer::Reply{
        SseReply("id: ev-2\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"done\":true}}\n\n"),
        true};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Send(R"({"jsonrpc":"2.0","id":9,"method":"tools/call"})");
  EXPECT_EQ(inbox.WaitFor(R"("id":9)"), R"({"jsonrpc":"2.0","id":9,"result":{"done":true}})");
  EXPECT_EQ(upstream.requests().size(), 2u);
}

TEST(HttpClient, StreamEndingWithoutAnswerOrIdIsMaybeSent) {
  ScriptedServer upstream([](const auto&, int) {
    return ScriptedServer::Reply{SseReply(
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Send(R"({"jsonrpc":"2.0","id":"z","method":"tools/call"})");
  std::string failure = inbox.WaitFor(R"("id":"z")");
  EXPECT_EQ(ClassifyDeliveryFailure(failure), DeliveryFailure::kMaybeSent);
  EXPECT_NE(inbox.messages().front().find("notifications/progress"), std::string::npos)
      << "what did arrive is delivered first";
}

TEST(HttpClient, SessionHeadersFollowTheInitializeAnswer) {
  ScriptedServer upstream([](const http::request<http::string_body>& req, int) {
    if (req.method() == http::verb::get) {
      return ScriptedServer::Reply{HttpReply(405, "", "")};
    }
    if (req.method() == http::verb::delete_) return ScriptedServer::Reply{HttpReply(200, "", "")};
    if (req.body().find("initialize\"") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(
          200, "application/json",
          R"({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{}}})",
          "Mcp-Session-Id: sess-123\r\n")};
    }
    if (req.body().find(R"("id")") == std::string::npos)
      return ScriptedServer::Reply{HttpReply(202, "", "")};
    return ScriptedServer::Reply{
        SseReply("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox,
                         HttpClientOptions{.headers = {{"Authorization", "Bearer up"}}});
  channel->Send(kClientInitialize);
  ASSERT_NE(inbox.WaitFor(R"("id":1)"), "");
  channel->Send(kInitialized);
  channel->Send(R"({"jsonrpc":"2.0","id":2,"method":"ping"})");
  ASSERT_NE(inbox.WaitFor(R"("id":2)"), "");
  ASSERT_TRUE(upstream.WaitRequests(4));  // initialize, initialized, ping, GET (405)
  channel->Close();
  ASSERT_TRUE(inbox.WaitClosed());
  auto requests = upstream.requests();
  ASSERT_GE(requests.size(), 5u);
  EXPECT_EQ(requests[0]["Mcp-Session-Id"], "");
  EXPECT_EQ(requests[0]["MCP-Protocol-Version"], "");
  EXPECT_EQ(requests[0]["Accept"], "application/json, text/event-stream");
  EXPECT_EQ(requests[0]["Content-Type"], "application/json");
  EXPECT_EQ(requests[0]["Authorization"], "Bearer up");
  bool saw_get = false, saw_delete = false;
  for (size_t i = 1; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i]["Mcp-Session-Id"], "sess-123") << i;
    EXPECT_EQ(requests[i]["MCP-Protocol-Version"], "2025-06-18") << i;
    saw_get = saw_get || requests[i].method() == http::verb::get;
    saw_delete = saw_delete || requests[i].method() == http::verb::delete_;
  }
  EXPECT_TRUE(saw_get);
  EXPECT_TRUE(saw_delete);
}

TEST(HttpClient, StatelessMessagesCarryMirroredHeaders) {
  ScriptedServer upstream([](const auto&, int) {
    return ScriptedServer::Reply{
        HttpReply(200, "application/json", R"({"jsonrpc":"2.0","id":1,"result":{}})")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Send(
      R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"Grüße","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})");
  ASSERT_NE(inbox.WaitFor(R"("id":1)"), "");
  auto requests = upstream.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["MCP-Protocol-Version"], "2026-07-28");
  EXPECT_EQ(requests[0]["Mcp-Method"], "tools/call");
  EXPECT_EQ(requests[0]["Mcp-Name"], "=?base64?R3LDvMOfZQ==?=");
  EXPECT_EQ(requests[0]["Mcp-Session-Id"], "");
}

TEST(HttpClient, StatelessToolsCallMirrorsAnnotatedParameters) {
  ScriptedServer upstream([](const http::request<http::string_body>& req, int) {
    if (req.body().find("tools/list") != std::string::npos) {
      return ScriptedServer::Reply{HttpReply(
          200, "application/json",
          R"({"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","tools":[{"name":"execute_sql","inputSchema":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}]}})")};
    }
    return ScriptedServer::Reply{HttpReply(
        200, "application/json", R"({"jsonrpc":"2.0","id":2,"result":{"resultType":"complete"}})")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  const std::string meta = R"("_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"})";
  channel->Send(R"({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{)" + meta + "}}");
  ASSERT_NE(inbox.WaitFor(R"("id":1)"), "");
  channel->Send(
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_sql","arguments":{"region":"us-west1"},)" +
      meta + "}}");
  ASSERT_NE(inbox.WaitFor(R"("id":2)"), "");
  auto requests = upstream.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1]["Mcp-Param-Region"], "us-west1");
  EXPECT_EQ(requests[1]["Mcp-Name"], "execute_sql");
}

// Regression: with every request slot taken by calls that wait for the
// client (sampling), the client's answer must not queue behind them.
TEST(HttpClient, AnswerToTheUpstreamIsNotQueuedBehindWaitingRequests) {
  std::mutex mu;
  std::condition_variable cv;
  bool answered = false;
  ScriptedServer upstream([&](const http::request<http::string_body>& req, int) {
    if (req.body().find(R"("id":"a")") != std::string::npos) {
      std::unique_lock lock(mu);
      cv.wait_for(lock, kSafetyTimeout, [&] { return answered; });
      return ScriptedServer::Reply{
          HttpReply(200, "application/json",
                    answered ? R"({"jsonrpc":"2.0","id":"a","result":{"ok":true}})"
                             : R"({"jsonrpc":"2.0","id":"a","result":{"ok":false}})")};
    }
    if (req.body().find(R"("id":"srv-1")") != std::string::npos) {
      std::lock_guard lock(mu);
      answered = true;
      cv.notify_all();
      return ScriptedServer::Reply{HttpReply(202, "", "")};
    }
    return ScriptedServer::Reply{
        HttpReply(200, "application/json", R"({"jsonrpc":"2.0","id":"b","result":{}})")};
  });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox, HttpClientOptions{.max_connections = 1});
  channel->Send(R"({"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"ask"}})");
  channel->Send(R"({"jsonrpc":"2.0","id":"b","method":"ping"})");
  channel->Send(R"({"jsonrpc":"2.0","id":"srv-1","result":{"role":"assistant"}})");
  EXPECT_EQ(inbox.WaitFor(R"("id":"a")"), R"({"jsonrpc":"2.0","id":"a","result":{"ok":true}})");
  EXPECT_NE(inbox.WaitFor(R"("id":"b")"), "");
}

TEST(HttpClient, RequestsQueuedAtCloseAreNotSent) {
  ScriptedServer upstream(
      [](const auto&, int) { return ScriptedServer::Reply{HttpReply(202, "", "")}; });
  Inbox inbox;
  auto channel = Connect(upstream.url(), inbox);
  channel->Close();
  EXPECT_FALSE(channel->Send(R"({"jsonrpc":"2.0","id":1,"method":"ping"})"));
  ASSERT_TRUE(inbox.WaitClosed());
}

TEST(HttpClient, BadUrlsAreRefused) {
  for (std::string url : {"ftp://x/mcp", "not a url", "http:///mcp", "http://user:pw@host/mcp"}) {
    auto c = ConnectHttpUpstream(url, {});
    ASSERT_FALSE(c) << url;
    EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(ConnectHttpUpstream("https://example.com/mcp", {}));
}

}  // namespace
}  // namespace idem::mcp
