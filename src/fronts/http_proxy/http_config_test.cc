// The [http] section of idemgate.toml that `idemgate http` reads.
#include <gtest/gtest.h>

#include "idem/config.h"

namespace idem {
namespace {

TEST(HttpConfigTest, DefaultsAreDocumented) {
  const HttpConfig http;
  EXPECT_EQ(http.turn_header, "Idemgate-Turn-Id");
  EXPECT_EQ(http.max_key_bytes, 255u);
  EXPECT_TRUE(http.upstream_ca_file.empty());
  EXPECT_TRUE(http.upstream_verify_tls);
  EXPECT_EQ(http.upstream_connect_timeout, Duration(5'000));
  EXPECT_EQ(http.upstream_timeout, Duration(20'000));
  // Below gunicorn's 2 s keep-alive, the shortest common server default
  // (review F10): a POST written into a connection it is closing was unknown.
  EXPECT_EQ(http.upstream_idle_timeout, Duration(1'000));
  EXPECT_EQ(http.max_idle_connections, 64u);
  EXPECT_EQ(http.max_response_bytes, size_t{16} << 20);
}

TEST(HttpConfigTest, ReadsEveryField) {
  Result<Config> c = ParseConfig(R"(
[http]
turn_header = "X-Turn"
max_key_bytes = 64
upstream_ca_file = "/etc/ca.pem"
upstream_verify_tls = false
upstream_connect_timeout = "1s"
upstream_timeout = "2m"
upstream_idle_timeout = "0s"
max_idle_connections = 8
max_response_bytes = "2MiB"
)",
                                 "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->http.turn_header, "X-Turn");
  EXPECT_EQ(c->http.max_key_bytes, 64u);
  EXPECT_EQ(c->http.upstream_ca_file, "/etc/ca.pem");
  EXPECT_FALSE(c->http.upstream_verify_tls);
  EXPECT_EQ(c->http.upstream_connect_timeout, Duration(1'000));
  EXPECT_EQ(c->http.upstream_timeout, Duration(120'000));
  EXPECT_EQ(c->http.upstream_idle_timeout, Duration(0));
  EXPECT_EQ(c->http.max_idle_connections, 8u);
  EXPECT_EQ(c->http.max_response_bytes, size_t{2} << 20);
}

TEST(HttpConfigTest, RefusesBadValuesWithTheirPlace) {
  for (std::string_view bad :
       {"max_key_bytes = 256", "max_key_bytes = 0", "upstream_timeout = \"0s\"",
        "upstream_verify_tls = \"yes\"", "upstream_timeout = \"soon\"", "upstream_ca = \"x\""}) {
    Result<Config> c = ParseConfig("[http]\n" + std::string(bad) + "\n", "t.toml");
    ASSERT_FALSE(c) << bad;
    EXPECT_TRUE(c.error().message.starts_with("t.toml:2:")) << c.error().message;
  }
}

}  // namespace
}  // namespace idem
