// /readyz and /metrics of HttpMcpServer (HttpServerOptions::ready, metrics,
// is_admin) over loopback, with a raw HTTP client.
#include <gtest/gtest.h>

#include <atomic>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_test_support.h"

namespace idem::mcp {
namespace {

using namespace idem::mcp::testing;

class HttpAdminTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options) {
    options.announce = false;
    auto server = HttpMcpServer::Start(options, echo_.Factory());
    ASSERT_TRUE(server) << server.error().message;
    server_ = std::move(*server);
    const std::string bound = server_->bound_address();
    port_ = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  }
  static HttpServerOptions WithTokens() {
    HttpServerOptions o;
    o.authenticate = [](std::string_view token) -> std::optional<std::string> {
      if (token == "ops-token") return "ops";
      if (token == "agent-token") return "agent";
      return std::nullopt;
    };
    o.is_admin = [](std::string_view token) { return token == "ops-token"; };
    o.metrics = [] { return std::string("idemgate_up 1\n"); };
    return o;
  }

  EchoUpstream echo_;
  std::unique_ptr<HttpMcpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(HttpAdminTest, ReadyzFollowsTheReadyHook) {
  std::atomic<bool> ready{true};  // read on the server's admin thread
  HttpServerOptions o;
  o.ready = [&ready]() -> Result<void> {
    if (ready) return {};
    return MakeError(ErrorCode::kUnavailable, "connection refused");
  };
  StartServer(o);
  RawClient c(port_);
  RawResponse up = c.Request(http::verb::get, "/readyz", {});
  EXPECT_EQ(up.status, 200);
  EXPECT_EQ(up.body, "ready\n");
  ready = false;
  RawResponse down = c.Request(http::verb::get, "/readyz", {});  // same keep-alive connection
  EXPECT_EQ(down.status, 503);
  EXPECT_NE(down.body.find("connection refused"), std::string::npos) << down.body;
  EXPECT_EQ(c.Request(http::verb::post, "/readyz", {}).status, 405);
}

TEST_F(HttpAdminTest, ReadyzWithoutAHookIsLikeHealthz) {
  StartServer({});
  RawClient c(port_);
  EXPECT_EQ(c.Request(http::verb::get, "/readyz", {}).status, 200);
  EXPECT_EQ(c.Request(http::verb::get, "/metrics", {}).status, 404);  // no metrics hook
}

TEST_F(HttpAdminTest, MetricsWithoutTokensConfigured) {
  HttpServerOptions o;
  o.metrics = [] { return std::string("idemgate_up 1\n"); };
  StartServer(o);
  RawClient c(port_);
  RawResponse r = c.Request(http::verb::get, "/metrics", {});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, "idemgate_up 1\n");
}

TEST_F(HttpAdminTest, MetricsNeedAnAdminTokenOnceTokensAreConfigured) {
  StartServer(WithTokens());
  RawClient c(port_);
  EXPECT_EQ(c.Request(http::verb::get, "/metrics", {}).status, 401);
  EXPECT_EQ(c.Request(http::verb::get, "/metrics", {{"Authorization", "Bearer nope"}}).status, 401);
  EXPECT_EQ(
      c.Request(http::verb::get, "/metrics", {{"Authorization", "Bearer agent-token"}}).status,
      403);
  RawResponse ok = c.Request(http::verb::get, "/metrics", {{"Authorization", "Bearer ops-token"}});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "idemgate_up 1\n");
  // /healthz and /readyz need no token.
  EXPECT_EQ(c.Request(http::verb::get, "/healthz", {}).status, 200);
  EXPECT_EQ(c.Request(http::verb::get, "/readyz", {}).status, 200);
}

}  // namespace
}  // namespace idem::mcp
