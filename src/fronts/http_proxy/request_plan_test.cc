#include "fronts/http_proxy/request_plan.h"

#include <gtest/gtest.h>

#include "fronts/http_proxy/route_reconcile.h"

namespace idem::proxy {
namespace {

http::Request Post(std::string path, std::string body = R"({"amount":100})",
                   std::vector<http::Header> headers = {}) {
  http::Request r;
  r.method = "POST";
  r.target = path;
  size_t q = path.find('?');
  r.path = path.substr(0, q);
  if (q != std::string::npos) r.query = path.substr(q + 1);
  r.headers = std::move(headers);
  r.headers.push_back({"Content-Type", "application/json"});
  r.body = std::move(body);
  r.remote = "127.0.0.1:5000";
  return r;
}

Config WithRoutes(std::string_view toml) {
  Result<Config> c = ParseConfig(toml, "test.toml");
  EXPECT_TRUE(c) << c.error().message;
  return c.value_or(Config{});
}

TEST(RequestPlanTest, PostWithoutKeyOrTurnPassesThrough) {
  RequestPlan p = PlanRequest(Post("/v1/charges"), Config{}, {});
  EXPECT_EQ(p.kind, RequestPlan::Kind::kPassThrough);
}

TEST(RequestPlanTest, GetIsNeverGatedByDefault) {
  http::Request r = Post("/v1/charges", "", {{"Idempotency-Key", "k1"}});
  r.method = "GET";
  EXPECT_EQ(PlanRequest(r, Config{}, {}).kind, RequestPlan::Kind::kPassThrough);
}

TEST(RequestPlanTest, ClientKeyWinsAndIsForwardedAsSent) {
  RequestPlan p =
      PlanRequest(Post("/v1/charges", "{}", {{"idempotency-key", "\"k-1\""}}), Config{}, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kGated);
  EXPECT_EQ(p.call.id.key, "k-1");
  EXPECT_EQ(p.call.id.tenant, "default");
  EXPECT_EQ(p.forward_key, "\"k-1\"");
  EXPECT_EQ(p.key_header, "Idempotency-Key");
  EXPECT_EQ(p.call.tool, "POST /v1/charges");
  EXPECT_TRUE(p.client_key);
}

// A vendor profile: the key goes where the vendor reads it, bare; a client
// that already speaks the vendor's header is read there.
TEST(RequestPlanTest, AProfileForwardsTheBareKeyWhereTheVendorReadsIt) {
  Config c = WithRoutes(R"([[route]]
match = "/v2/checkout/orders"
profile = "paypal"
[[route]]
match = "/v2/payments"
profile = "square"
)");
  RequestPlan p =
      PlanRequest(Post("/v2/checkout/orders", "{}", {{"Idempotency-Key", "\"k-1\""}}), c, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kGated);
  EXPECT_EQ(p.key_header, "PayPal-Request-Id");
  EXPECT_EQ(p.forward_key, "k-1");
  RequestPlan own = PlanRequest(Post("/v2/checkout/orders", "{}", {{"paypal-request-id", "pp-7"}}), c, {});
  ASSERT_EQ(own.kind, RequestPlan::Kind::kGated) << "the vendor's header is a client key too";
  EXPECT_EQ(own.call.id.key, "pp-7");
  RequestPlan square = PlanRequest(Post("/v2/payments", "{}", {{"Idempotency-Key", "sq-1"}}), c, {});
  EXPECT_EQ(square.key_header, "");
  EXPECT_EQ(square.key_field, "idempotency_key");
}

TEST(RequestPlanTest, TheKeyFieldIsAddedToAJsonObjectThatHasNone) {
  EXPECT_EQ(BodyWithKeyField(R"({"amount":1})", "idempotency_key", "k"),
            R"({"amount":1,"idempotency_key":"k"})");
  EXPECT_EQ(BodyWithKeyField(R"({"idempotency_key":"own"})", "idempotency_key", "k"),
            R"({"idempotency_key":"own"})")
      << "a client's own key is kept";
  EXPECT_EQ(BodyWithKeyField("[1]", "idempotency_key", "k"), "[1]");
  EXPECT_EQ(BodyWithKeyField("a=1", "idempotency_key", "k"), "a=1");
}

TEST(RequestPlanTest, RecordsAreScopedByTenant) {
  http::Request r = Post("/v1/charges", "{}", {{"Idempotency-Key", "k"}});
  r.principal.tenant = "acme";
  EXPECT_EQ(PlanRequest(r, Config{}, {}).call.id.tenant, "acme");
}

// Found by reading: with no tenants, idemgate http forwarded each request's
// Authorization but keyed records without it, so one key sent by two vendor
// accounts behind one proxy answered the second from the first's record.
TEST(RequestPlanTest, WithoutTenantsRecordsAreScopedByTheVendorCredential) {
  auto key_with = [](std::vector<http::Header> headers, const Config& config = Config{}) {
    headers.push_back({"Idempotency-Key", "k"});
    return PlanRequest(Post("/v1/charges", "{}", std::move(headers)), config, {}).call.id.key;
  };
  const std::string alpha = key_with({{"Authorization", "Bearer sk_alpha"}});
  const std::string beta = key_with({{"Authorization", "Bearer sk_beta"}});
  EXPECT_NE(alpha, beta);
  EXPECT_EQ(alpha, key_with({{"Authorization", "Bearer sk_alpha"}}));
  EXPECT_TRUE(alpha.starts_with("c") && alpha.ends_with("/k") && alpha.size() == 35) << alpha;
  EXPECT_NE(key_with({{"X-Api-Key", "sk_alpha"}}), key_with({{"X-Api-Key", "sk_beta"}}));
  EXPECT_EQ(alpha.find("sk_alpha"), std::string::npos) << "the credential itself is never stored";
  EXPECT_EQ(key_with({}), "k");
  Config tenants;
  tenants.tenants.push_back(Tenant{"acme", {"token"}, false});
  EXPECT_EQ(key_with({{"Authorization", "Bearer sk_alpha"}}, tenants), "k")
      << "with tenants, the tenant scopes";
}

// Security review F5: without a credential, a client's key was the record key
// itself, so an Idempotency-Key "c1a2b3…/order-1" (the scope is shown in
// problem bodies and logs) named another vendor account's record.
TEST(RequestPlanTest, AClientKeyCannotNameAnotherCredentialsRecord) {
  auto key_with = [](std::string key, std::vector<http::Header> headers) {
    headers.push_back({"Idempotency-Key", std::move(key)});
    return PlanRequest(Post("/v1/charges", "{}", std::move(headers)), Config{}, {}).call.id.key;
  };
  const std::string victim = key_with("order-1", {{"Authorization", "Bearer sk_victim"}});
  EXPECT_NE(key_with(victim, {}), victim);
  EXPECT_NE(key_with(victim, {{"X-Other", "x"}}), victim);
  EXPECT_EQ(key_with(victim, {}), "c-/" + victim) << "a key shaped like a scoped one is escaped";
  // The escape is escaped too, so no two client keys meet.
  EXPECT_EQ(key_with("c-/" + victim, {}), "c-/c-/" + victim);
  EXPECT_EQ(key_with("order/1", {}), "order/1") << "other keys are kept as sent";
}

// F5: the headers that scope records are configurable ([http]
// credential_headers), for vendors that authenticate otherwise, and the scope
// is keyed with [http] credential_scope_secret when set.
TEST(RequestPlanTest, CredentialHeadersAndScopeSecretAreConfigurable) {
  Config google;
  google.http.credential_headers = {"X-Goog-Api-Key", "Cookie"};
  auto key_with = [](std::vector<http::Header> headers, const Config& config) {
    headers.push_back({"Idempotency-Key", "k"});
    return PlanRequest(Post("/v1/charges", "{}", std::move(headers)), config, {}).call.id.key;
  };
  EXPECT_NE(key_with({{"X-Goog-Api-Key", "a"}}, google), key_with({{"X-Goog-Api-Key", "b"}}, google));
  EXPECT_NE(key_with({{"Cookie", "s=a"}}, google), key_with({{"Cookie", "s=b"}}, google));
  EXPECT_EQ(key_with({{"Authorization", "Bearer a"}}, google), "k")
      << "a header not in the list does not scope";
  Config keyed;
  keyed.http.credential_scope_secret = "install-secret-1";
  Config other = keyed;
  other.http.credential_scope_secret = "install-secret-2";
  const std::vector<http::Header> alpha = {{"Authorization", "Bearer sk_alpha"}};
  EXPECT_NE(key_with(alpha, keyed), key_with(alpha, Config{}));
  EXPECT_NE(key_with(alpha, keyed), key_with(alpha, other));
  EXPECT_EQ(key_with(alpha, keyed), key_with(alpha, keyed));
  const std::vector<http::Header> http_headers = CredentialHeaders(
      Post("/v1/charges", "{}", {{"Authorization", "Bearer a"}, {"X-Goog-Api-Key", "g"}}), google);
  ASSERT_EQ(http_headers.size(), 1u);
  EXPECT_EQ(http_headers[0].name, "X-Goog-Api-Key");
}

TEST(RequestPlanTest, TurnHeaderDerivesAKeyFromTheRequest) {
  auto plan = [](std::string path, std::string body, std::string turn) {
    return PlanRequest(Post(path, body, {{"Idemgate-Turn-Id", turn}}), Config{}, {});
  };
  RequestPlan a = plan("/v1/charges", R"({"amount":100,"currency":"eur"})", "t1");
  ASSERT_EQ(a.kind, RequestPlan::Kind::kGated);
  EXPECT_TRUE(a.call.id.key.starts_with("v1t.t1.")) << a.call.id.key;
  EXPECT_EQ(a.forward_key, a.call.id.key);
  EXPECT_FALSE(a.client_key);
  EXPECT_EQ(a.call.turn, "t1");
  // The same request spelled differently is the same call.
  EXPECT_EQ(plan("/v1/charges", R"({ "currency":"eur", "amount":1e2 })", "t1").call.id.key,
            a.call.id.key);
  EXPECT_NE(plan("/v1/charges", R"({"amount":101,"currency":"eur"})", "t1").call.id.key,
            a.call.id.key);
  EXPECT_NE(plan("/v1/charges?x=1", R"({"amount":100,"currency":"eur"})", "t1").call.id.key,
            a.call.id.key);
  EXPECT_NE(plan("/v1/charges", R"({"amount":100,"currency":"eur"})", "t2").call.id.key,
            a.call.id.key);
}

TEST(RequestPlanTest, ConfiguredTurnHeaderName) {
  Config c = WithRoutes("[http]\nturn_header = \"X-Turn\"\n");
  EXPECT_EQ(PlanRequest(Post("/a", "{}", {{"x-turn", "t"}}), c, {}).kind,
            RequestPlan::Kind::kGated);
  EXPECT_EQ(PlanRequest(Post("/a", "{}", {{"Idemgate-Turn-Id", "t"}}), c, {}).kind,
            RequestPlan::Kind::kPassThrough);
}

TEST(RequestPlanTest, FingerprintCoversMethodPathQueryAndBody) {
  auto fp = [](http::Request r) { return RequestFingerprint(r, {}).value_or(""); };
  const std::string base = fp(Post("/a?x=1", R"({"b":1,"a":2})"));
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(fp(Post("/a?x=1", R"({"a":2,"b":1})")), base) << "canonical JSON";
  EXPECT_NE(fp(Post("/a?x=2", R"({"a":2,"b":1})")), base);
  EXPECT_NE(fp(Post("/b?x=1", R"({"a":2,"b":1})")), base);
  http::Request patch = Post("/a?x=1", R"({"a":2,"b":1})");
  patch.method = "PATCH";
  EXPECT_NE(fp(patch), base);
  // Not JSON: raw bytes, so spacing counts.
  http::Request text = Post("/a", "a=1&b=2");
  text.headers.back().value = "application/x-www-form-urlencoded";
  http::Request text2 = text;
  text2.body = "b=2&a=1";
  EXPECT_NE(fp(text), fp(text2));
  EXPECT_EQ(fp(text), fp(text));
}

TEST(RequestPlanTest, RefusesABadOrRepeatedKey) {
  RequestPlan bad = PlanRequest(Post("/a", "{}", {{"Idempotency-Key", "\"a b\""}}), Config{}, {});
  ASSERT_EQ(bad.kind, RequestPlan::Kind::kRefuse);
  EXPECT_EQ(bad.refusal.status, 400);
  EXPECT_NE(bad.refusal.detail.find("space"), std::string::npos);
  RequestPlan twice = PlanRequest(
      Post("/a", "{}", {{"Idempotency-Key", "a"}, {"Idempotency-Key", "b"}}), Config{}, {});
  ASSERT_EQ(twice.kind, RequestPlan::Kind::kRefuse);
  EXPECT_NE(twice.refusal.detail.find("2 Idempotency-Key headers"), std::string::npos);
  RequestPlan long_key = PlanRequest(Post("/a", "{}", {{"Idempotency-Key", "abcdef"}}), Config{},
                                     {.max_key_bytes = 5});
  EXPECT_EQ(long_key.kind, RequestPlan::Kind::kRefuse);
}

TEST(RequestPlanTest, RefusesInvalidJsonOnlyWhenLabelledJson) {
  RequestPlan p =
      PlanRequest(Post("/a", R"({"a":1,"a":2})", {{"Idempotency-Key", "k"}}), Config{}, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kRefuse);
  EXPECT_EQ(p.refusal.status, 400);
  EXPECT_NE(p.refusal.detail.find("duplicate"), std::string::npos) << p.refusal.detail;
}

// Regression: nesting past max_depth was answered 413 Content Too Large, as
// if the body were too big; it is a body the client must change: 400.
TEST(RequestPlanTest, NestingPastTheLimitIs400AndSaysSo) {
  std::string deep = R"({"a":)" + std::string(10'000, '[') + std::string(10'000, ']') + "}";
  RequestPlan p = PlanRequest(Post("/a", deep, {{"Idempotency-Key", "k"}}), Config{}, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kRefuse);
  EXPECT_EQ(p.refusal.status, 400);
  EXPECT_NE(p.refusal.detail.find("nesting deeper than 128 levels"), std::string::npos)
      << p.refusal.detail;
}

TEST(RequestPlanTest, ExplicitRouteRequiresAKey) {
  Config c = WithRoutes(R"(
[[route]]
match = "/v1/charges"
mode = "explicit"
key_header = "X-Vendor-Key"
)");
  RequestPlan missing = PlanRequest(Post("/v1/charges", "{}", {{"Idemgate-Turn-Id", "t"}}), c, {});
  ASSERT_EQ(missing.kind, RequestPlan::Kind::kRefuse);
  EXPECT_EQ(missing.refusal.status, 400);
  EXPECT_EQ(missing.refusal.type, "idempotency-key-required");
  RequestPlan ok =
      PlanRequest(Post("/v1/charges/ch_1/capture", "{}", {{"Idempotency-Key", "k"}}), c, {});
  ASSERT_EQ(ok.kind, RequestPlan::Kind::kGated);
  EXPECT_EQ(ok.key_header, "X-Vendor-Key");
  // Another path falls to the built-in rule.
  EXPECT_EQ(PlanRequest(Post("/v1/tickets"), c, {}).kind, RequestPlan::Kind::kPassThrough);
}

TEST(RequestPlanTest, ArgsAndFieldsModesGateWithoutKeyOrTurn) {
  Config c = WithRoutes(R"(
[[route]]
match = "/v1/users"
mode = "fields"
fields = ["/email"]
[[route]]
match = "/v1/*"
mode = "args"
ttl = "1h"
)");
  RequestPlan args = PlanRequest(Post("/v1/tickets", R"({"title":"x"})"), c, {});
  ASSERT_EQ(args.kind, RequestPlan::Kind::kGated);
  EXPECT_TRUE(args.call.id.key.starts_with("v1a.")) << args.call.id.key;
  EXPECT_EQ(args.call.policy.ttl, Duration(3600 * 1000));
  RequestPlan a = PlanRequest(Post("/v1/users", R"({"email":"a@b","name":"A"})"), c, {});
  RequestPlan b = PlanRequest(Post("/v1/users", R"({"email":"a@b","name":"B"})"), c, {});
  ASSERT_EQ(a.kind, RequestPlan::Kind::kGated);
  EXPECT_TRUE(a.call.id.key.starts_with("v1f."));
  EXPECT_EQ(a.call.id.key, b.call.id.key) << "same business key";
  EXPECT_NE(a.call.fingerprint, b.call.fingerprint) << "drift is still detected";
}

TEST(RequestPlanTest, OffAndUnlistedMethodsPassThrough) {
  Config c = WithRoutes(R"(
[[route]]
match = "/v1/search"
mode = "off"
[[route]]
match = "/v1/items"
methods = ["PUT", "DELETE"]
)");
  EXPECT_EQ(PlanRequest(Post("/v1/search", "{}", {{"Idempotency-Key", "k"}}), c, {}).kind,
            RequestPlan::Kind::kPassThrough);
  http::Request put = Post("/v1/items/1", "{}", {{"Idempotency-Key", "k"}});
  put.method = "PUT";
  EXPECT_EQ(PlanRequest(put, c, {}).kind, RequestPlan::Kind::kGated);
}

}  // namespace
}  // namespace idem::proxy

namespace idem::proxy {
namespace {

TEST(RouteReconcileTest, TargetReplacesTheKeyPercentEncoded) {
  Config c = WithRoutes(R"(
[[route]]
match = "/v1/charges"
on_unknown = "reconcile"
reconcile = "/v1/charges?idempotency_key={key}"
)");
  RequestPlan p = PlanRequest(Post("/v1/charges", "{}", {{"Idempotency-Key", "k/1&x"}}), c, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kGated);
  EXPECT_EQ(p.call.policy.on_unknown, OnUnknown::kReconcile);
  EXPECT_EQ(ReconcileTarget(c, p.call.tool, p.forward_key),
            "/v1/charges?idempotency_key=k%2F1%26x");
  RequestPlan other = PlanRequest(Post("/v1/tickets", "{}", {{"Idempotency-Key", "k"}}), c, {});
  EXPECT_EQ(ReconcileTarget(c, other.call.tool, other.forward_key), std::nullopt);
}

// The lookup asked for call.id.key, which with a vendor credential is
// "c<hash>/<key>", and unquoted where the vendor got the sf-string with its
// quotes: a key the vendor never saw, so a 404 ran the call again
// (guarantees review F1). It asks for the forwarded key, with the
// request's credentials.
TEST(RouteReconcileTest, TargetAndCredentialsAreWhatTheVendorReceived) {
  Config c = WithRoutes(R"(
[[route]]
match = "/v1/charges"
on_unknown = "reconcile"
reconcile = "/v1/charges?idempotency_key={key}"
)");
  RequestPlan p = PlanRequest(Post("/v1/charges", "{}",
                                   {{"Idempotency-Key", "\"k1\""},
                                    {"Authorization", "Bearer sk_1"},
                                    {"X-Other", "o"}}),
                              c, {});
  ASSERT_EQ(p.kind, RequestPlan::Kind::kGated);
  EXPECT_NE(p.call.id.key, p.forward_key) << "scoped by the credential";
  EXPECT_EQ(ReconcileTarget(c, p.call.tool, p.forward_key),
            "/v1/charges?idempotency_key=%22k1%22");
  std::vector<http::Header> credentials =
      CredentialHeaders(Post("/v1/charges", "{}", {{"Authorization", "Bearer sk_1"}, {"X-Other", "o"}}),
                        Config{});
  ASSERT_EQ(credentials.size(), 1u);
  EXPECT_EQ(credentials[0].value, "Bearer sk_1");
}

}  // namespace
}  // namespace idem::proxy
