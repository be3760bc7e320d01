#include <gtest/gtest.h>

#include <boost/asio/error.hpp>

#include "net/http_server_io.h"
#include "net/http_target.h"
#include "net/request_target.h"
#include "net/tls_client.h"
#include "net/url_text.h"

namespace idem::net {
namespace {

TEST(HttpTargetTest, ParsesWhatTheClientsNeed) {
  auto t = ParseHttpTarget("https://api.example.com:8443/v1/mcp?key=a%20b", "upstream URL");
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->tls);
  EXPECT_EQ(t->host, "api.example.com");
  EXPECT_EQ(t->port, "8443");
  EXPECT_EQ(t->host_header, "api.example.com:8443");
  EXPECT_EQ(t->path, "/v1/mcp");
  EXPECT_EQ(t->query, "key=a%20b");
  EXPECT_EQ(t->RequestTarget(), "/v1/mcp?key=a%20b");
  EXPECT_EQ(t->Display(), "https://api.example.com:8443/v1/mcp?key=a%20b");

  auto v6 = ParseHttpTarget("http://[::1]", "upstream URL");
  ASSERT_TRUE(v6) << v6.error().message;
  EXPECT_FALSE(v6->tls);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, "80");
  EXPECT_EQ(v6->host_header, "[::1]");
  EXPECT_EQ(v6->path, "");
  EXPECT_EQ(v6->RequestTarget(), "/");
}

TEST(HttpTargetTest, MistakesAreRefusedNamingTheOptionAndTheFix) {
  const std::pair<const char*, const char*> cases[] = {
      {"api.example.com/v1", "not an absolute URL"},
      {"ftp://api.example.com", "the scheme must be http or https"},
      {"https://api.example.com/#frag", "a fragment"},
      {"http:///path", "no host"},
  };
  for (const auto& [url, why] : cases) {
    auto t = ParseHttpTarget(url, "alert.webhook");
    ASSERT_FALSE(t) << url;
    EXPECT_EQ(t.error().code, ErrorCode::kInvalidArgument) << url;
    EXPECT_NE(t.error().message.find("invalid alert.webhook '" + std::string(url) + "'"),
              std::string::npos)
        << t.error().message;
    EXPECT_NE(t.error().message.find(why), std::string::npos) << url << ": " << t.error().message;
  }
}

TEST(HttpTargetTest, APasswordInTheUrlIsNotRepeated) {
  auto t = ParseHttpTarget("https://alice:s3cret@api.example.com/v1", "upstream URL");
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().message.find("s3cret"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("'https://api.example.com/v1'"), std::string::npos)
      << t.error().message;
}

// Security review F10: one path, one spelling, before routes are matched.
TEST(RequestTargetTest, PathsAreNormalisedBeforeRoutesSeeThem) {
  auto n = [](std::string_view target, std::string_view host = "127.0.0.1:8788") {
    Result<std::string> r = NormalizeTarget(target, host);
    return r ? *r : "error: " + r.error().message;
  };
  EXPECT_EQ(n("/v1/charges?expand=customer"), "/v1/charges?expand=customer");
  EXPECT_EQ(n("/v1//charges"), "/v1/charges");
  EXPECT_EQ(n("//v1///charges//"), "/v1/charges/");
  EXPECT_EQ(n("/v1/%63harges"), "/v1/charges");
  EXPECT_EQ(n("/v1/%7e%2d%2E%5F"), "/v1/~-._");
  EXPECT_EQ(n("/v1/a%2fb%3a"), "/v1/a%2Fb%3A") << "reserved escapes stay, upper-cased";
  EXPECT_EQ(n("/v1/./x/../charges"), "/v1/charges");
  EXPECT_EQ(n("/v1/%2e%2e/admin"), "/admin");
  EXPECT_EQ(n("/../../admin"), "/admin") << "above the root stays at the root";
  EXPECT_EQ(n("/v1/charges/.."), "/v1/");
  EXPECT_EQ(n("/v1/charges/."), "/v1/charges/");
  EXPECT_EQ(n("/"), "/");
  EXPECT_EQ(n("/V1/Charges"), "/V1/Charges") << "paths are case-sensitive";
  EXPECT_EQ(n("/x?a=//b/../%63"), "/x?a=//b/../%63") << "the query is not a path";
  EXPECT_EQ(n("http://127.0.0.1:8788/v1//charges?x"), "/v1/charges?x");
  EXPECT_EQ(n("HTTP://127.0.0.1:8788"), "/");
  EXPECT_NE(n("http://internal.example/x").find("another host"), std::string::npos);
  EXPECT_NE(n("http://127.0.0.1:8788/x", "").find("another host"), std::string::npos);
  EXPECT_NE(n("*").find("origin-form"), std::string::npos);
  EXPECT_NE(n("example.com:443").find("origin-form"), std::string::npos);
  EXPECT_NE(n("/v1/%6").find("percent-escape at byte 4"), std::string::npos);
  EXPECT_NE(n("/v1/%zz").find("two hex digits"), std::string::npos);
}

TEST(UrlTextTest, PasswordsAreReplaced) {
  EXPECT_EQ(WithoutPassword("redis://alice:s3cret@h:6379/0?prefix=a"),
            "redis://alice:***@h:6379/0?prefix=a");
  EXPECT_EQ(WithoutPassword("redis://:s3cret@h"), "redis://:***@h");
  EXPECT_EQ(WithoutPassword("redis://s3cret@h"), "redis://***@h");
  EXPECT_EQ(WithoutPassword("redis+cluster://u:p%40ss@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
  EXPECT_EQ(WithoutPassword("postgres://u:pw@db/x?sslmode=require"),
            "postgres://u:***@db/x?sslmode=require");
  EXPECT_EQ(WithoutPassword("redis://h:6379/0?prefix=a@b"), "redis://h:6379/0?prefix=a@b");
  EXPECT_EQ(WithoutPassword("sqlite:/var/lib/idemgate.db"), "sqlite:/var/lib/idemgate.db");
  EXPECT_EQ(WithoutPassword("memory:"), "memory:");
  // Security review F14: libpq also takes the password in the query.
  EXPECT_EQ(WithoutPassword("postgres://db/idem?password=s3cret"),
            "postgres://db/idem?password=***");
  EXPECT_EQ(WithoutPassword("postgres://db/idem?sslmode=verify-full&SSLPassword=k3y&x=1#f"),
            "postgres://db/idem?sslmode=verify-full&SSLPassword=***&x=1#f");
  EXPECT_EQ(WithoutPassword("postgres://u:pw@db/x?password=again"),
            "postgres://u:***@db/x?password=***");
  EXPECT_EQ(WithoutPassword("redis://h/0?prefix=password"), "redis://h/0?prefix=password");
}

TEST(HttpServerIoTest, BearerTokens) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic YWxhZGRpbjpvcGVu"), "");
  EXPECT_EQ(BearerToken("Bearer "), "");
  EXPECT_EQ(BearerToken(""), "");
}

TEST(HttpServerIoTest, RefusalsNameTheLimitAndAClientThatLeftGetsNone) {
  namespace http = boost::beast::http;
  const RequestLimits limits{
      .max_header_bytes = 8192, .max_header_count = 20, .max_body_bytes = 1000};
  auto body = ReadRefusal(http::error::body_limit, limits);
  ASSERT_TRUE(body);
  EXPECT_EQ(body->status, 413);
  EXPECT_NE(body->detail.find("1000 bytes (limits.max_body_bytes)"), std::string::npos);
  auto headers = ReadRefusal(http::error::header_limit, limits);
  ASSERT_TRUE(headers);
  EXPECT_EQ(headers->status, 431);
  EXPECT_NE(headers->detail.find("8192 bytes (max_header_bytes)"), std::string::npos);
  auto malformed = ReadRefusal(http::error::bad_method, limits);
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);
  EXPECT_FALSE(ReadRefusal(http::error::end_of_stream, limits));
  EXPECT_FALSE(ReadRefusal(boost::asio::error::connection_reset, limits));
  EXPECT_FALSE(ReadRefusal(boost::asio::error::operation_aborted, limits));

  EXPECT_FALSE(TooManyHeaders(20, limits));
  auto many = TooManyHeaders(21, limits);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->status, 431);
  EXPECT_NE(many->detail.find("at most 20 are accepted"), std::string::npos);
  EXPECT_EQ(SlowRequest(limits).status, 408);
}

TEST(TlsClientTest, UnreadableFilesAreNamedByTheirOption) {
  auto ctx = NewTlsClientContext({.ca_file = "/nonexistent/ca.pem", .ca_option = "tls_ca"});
  ASSERT_FALSE(ctx);
  EXPECT_EQ(ctx.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(ctx.error().message.find("cannot load tls_ca '/nonexistent/ca.pem'"), std::string::npos)
      << ctx.error().message;

  ctx = NewTlsClientContext({.cert_file = "/nonexistent/client.pem",
                             .key_file = "/nonexistent/client.key",
                             .cert_option = "tls_cert"});
  ASSERT_FALSE(ctx);
  EXPECT_NE(ctx.error().message.find("cannot load tls_cert '/nonexistent/client.pem'"),
            std::string::npos)
      << ctx.error().message;

  EXPECT_TRUE(NewTlsClientContext({}));
  EXPECT_TRUE(NewTlsClientContext({.verify = false}));
}

}  // namespace
}  // namespace idem::net
