#include "fronts/http_proxy/route_summary.h"

#include <gtest/gtest.h>

namespace idem::proxy {
namespace {

Config Parse(std::string_view toml) {
  Result<Config> c = ParseConfig(toml, "test.toml");
  EXPECT_TRUE(c) << c.error().message;
  return c.value_or(Config{});
}

TEST(RouteSummaryTest, EachRouteItsKeyAndWhatIsLeftUngated) {
  Config c = Parse(R"([[route]]
match = "/v1/charges"
profile = "stripe"
mode = "explicit"
[[route]]
match = "/v1/search"
mode = "off"
)");
  EXPECT_EQ(DescribeRoutes(c),
            (std::vector<std::string>{
                "route POST,PATCH /v1/charges: mode explicit, key in the header "
                "Idempotency-Key, results kept 1d, profile stripe",
                "NOT gated: POST,PATCH /v1/search (mode = \"off\"): its retries run again",
                "other POST and PATCH requests: gated with Idempotency-Key or Idemgate-Turn-Id, "
                "else passed through; key in the header Idempotency-Key, results kept 1d",
                "NOT gated: PUT and DELETE (no [[route]] lists them in methods)",
            }));
}

// A ttl that outlives the vendor's window is warned about: after it, a
// retry idemgate forwards again runs again at the vendor.
TEST(RouteSummaryTest, ATtlLongerThanTheVendorKeepsKeysIsWarnedAbout) {
  Config c = Parse(R"([[route]]
match = "/v2/checkout/orders"
profile = "paypal"
[[route]]
match = "/v1/charges"
profile = "stripe"
ttl = "12h"
[[route]]
match = "/v2/payments"
profile = "square"
[[route]]
match = "/v1/tickets"
vendor_window = "1h"
ttl = "2h"
)");
  std::vector<std::string> warnings, notes;
  for (const std::string& line : DescribeRoutes(c)) {
    if (line.starts_with("warning: ")) warnings.push_back(line);
    if (line.starts_with("note: ")) notes.push_back(line);
  }
  ASSERT_EQ(warnings.size(), 2u) << "stripe's 12h is within its 24h";
  EXPECT_NE(warnings[0].find("route /v2/checkout/orders keeps records for 1d, but PayPal keeps "
                             "a key for 6h"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("https://developer.paypal.com/"), std::string::npos);
  EXPECT_NE(warnings[1].find("route /v1/tickets keeps records for 2h, but the vendor keeps a key "
                             "for 1h"),
            std::string::npos)
      << warnings[1];
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("Square publishes no period"), std::string::npos) << notes[0];
}

// A lease that can run out while the vendor may still act on the request is
// refused (guarantees review F3): the defaults pass; a route whose lease is
// not longer than connect + upstream timeout is named with both figures.
TEST(RouteSummaryTest, ALeaseNotLongerThanARequestCanStayOpenIsRefused) {
  EXPECT_TRUE(CheckLeasesOutliveRequests(Parse("")));
  Config c = Parse(R"([http]
upstream_timeout = "60s"
[[route]]
match = "/v1/slow"
lease = "2m"
[[route]]
match = "/v1/charges"
)");
  Result<void> refused = CheckLeasesOutliveRequests(c);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("[defaults] has lease = \"30s\""), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("upstream_timeout 1m"), std::string::npos)
      << refused.error().message;
  c = Parse(R"([defaults]
lease = "70s"
[http]
upstream_timeout = "60s"
[[route]]
match = "/v1/charges"
lease = "30s"
)");
  refused = CheckLeasesOutliveRequests(c);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("route /v1/charges has lease"), std::string::npos)
      << refused.error().message;
}

}  // namespace
}  // namespace idem::proxy
