#include "idem/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace idem {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

Config Parse(std::string_view text) {
  Result<Config> c = ParseConfig(text, "test.toml");
  EXPECT_TRUE(c.has_value()) << c.error().message;
  return c.value_or(Config{});
}

std::string ParseError(std::string_view text) {
  Result<Config> c = ParseConfig(text, "test.toml");
  EXPECT_FALSE(c.has_value()) << "expected an error for:\n" << text;
  if (c) return "";
  EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument);
  return c.error().message;
}

TEST(ConfigTest, EmptyFileGivesDocumentedDefaults) {
  Config c = Parse("");
  Policy p;
  EXPECT_EQ(c.store, "");
  EXPECT_EQ(c.defaults.ttl, hours(24));
  EXPECT_EQ(c.defaults.lease, seconds(30));
  EXPECT_EQ(c.defaults.wait, seconds(10));
  EXPECT_EQ(c.defaults.window, hours(1));
  EXPECT_EQ(c.defaults.on_unknown, OnUnknown::kFail);
  EXPECT_EQ(c.defaults.errors, ErrorPolicy::kStore);
  EXPECT_EQ(c.defaults.on_drift, OnDrift::kReject);
  EXPECT_EQ(c.defaults.on_store_down, OnStoreDown::kFail);
  EXPECT_EQ(c.defaults.max_result_bytes, size_t{1} << 20);
  EXPECT_TRUE(c.tools.empty());
  EXPECT_TRUE(c.routes.empty());
  EXPECT_TRUE(c.tenants.empty());
  EXPECT_EQ(c.alert.window, minutes(5));
  EXPECT_EQ(c.alert.min_attempts, 20u);
  EXPECT_DOUBLE_EQ(c.alert.replay_ratio, 0.5);
  EXPECT_EQ(c.alert.webhook, "");
  ASSERT_EQ(c.mcp.turn_id.size(), 4u);
  EXPECT_EQ(c.mcp.turn_id[0].text, "meta:dev.idemgate/turnId");
  EXPECT_EQ(c.mcp.turn_id[1].text, "meta:vscode.requestId");
  EXPECT_EQ(c.mcp.turn_id[2], *ParseIdSource("meta:x-codex-turn-metadata#/turn_id"));
  // The prompt hook's turn comes last: a host's own turn id wins.
  EXPECT_EQ(c.mcp.turn_id[3], *ParseIdSource("hook:turn"));
  EXPECT_EQ(c.mcp.session_id.back(), *ParseIdSource("env:CLAUDE_CODE_SESSION_ID"));
  ASSERT_EQ(c.mcp.call_id.size(), 3u);
  EXPECT_EQ(c.mcp.call_id[0], *ParseIdSource("meta:claudecode/toolUseId"));
  EXPECT_EQ(c.mcp.call_id[1], *ParseIdSource("meta:callId"));
  EXPECT_EQ(c.mcp.call_id[2], *ParseIdSource("meta:agent-tool-call-request-id"));
  EXPECT_EQ(c.mcp.hook_dir, "");
  EXPECT_EQ(c.mcp.hook_max_input_bytes, size_t{1} << 20);
  EXPECT_EQ(c.mcp.repeat_nonce, "repeat_nonce");
  EXPECT_TRUE(c.mcp.replay_text);
  EXPECT_EQ(c.mcp.tenant, "default");
  EXPECT_EQ(c.http.turn_header, "Idemgate-Turn-Id");
  EXPECT_EQ(c.limits.max_body_bytes, size_t{1} << 20);
  EXPECT_EQ(c.limits.max_depth, 128u);
  EXPECT_EQ(c.limits.max_audit_backlog, 100'000u);
  EXPECT_EQ(c.source, "test.toml");
}

TEST(ConfigTest, ObserveIsAPolicyKey) {
  auto c = ParseConfig("[defaults]\nobserve = true\n[[tool]]\nmatch = \"charge\"\nobserve = false\n",
                       "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->defaults.observe);
  EXPECT_FALSE(c->PolicyFor("charge").observe);
  EXPECT_TRUE(c->PolicyFor("other").observe);
  EXPECT_FALSE(Config{}.defaults.observe);
}

TEST(ConfigTest, AVendorProfileSetsWhereTheKeyGoesAndTheVendorsWindow) {
  auto c = ParseConfig(R"([[route]]
match = "/v1/orders"
profile = "paypal"
[[route]]
match = "/v2/payments"
profile = "square"
vendor_window = "30d"
[[route]]
match = "/v1/charges"
profile = "stripe"
key_header = "Idempotency-Key"
)",
                       "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->routes[0].key_header, "PayPal-Request-Id");
  EXPECT_EQ(c->routes[0].vendor_window, Duration(6 * 3'600'000));
  EXPECT_EQ(c->routes[1].key_header, "");
  EXPECT_EQ(c->routes[1].key_field, "idempotency_key");
  EXPECT_EQ(c->routes[1].vendor_window, Duration(30LL * 24 * 3'600'000)) << "explicit wins";
  EXPECT_EQ(c->routes[2].profile, "stripe");
  EXPECT_FALSE(Config{}.routes.size());
  for (const VendorProfile& p : VendorProfiles()) {
    EXPECT_TRUE(p.source.starts_with("https://")) << p.name;
    EXPECT_NE(p.key_header.empty(), p.key_field.empty()) << p.name << ": a header or a field";
  }
  auto unknown = ParseConfig("[[route]]\nmatch = \"/x\"\nprofile = \"strip\"\n", "t.toml");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("\"stripe\""), std::string::npos)
      << unknown.error().message;
  auto clash = ParseConfig(
      "[[route]]\nmatch = \"/x\"\nprofile = \"checkout\"\nkey_header = \"X-Key\"\n", "t.toml");
  ASSERT_FALSE(clash);
  EXPECT_NE(clash.error().message.find("Cko-Idempotency-Key"), std::string::npos)
      << clash.error().message;
}

TEST(ConfigTest, MetricsMaxHosts) {
  EXPECT_EQ(Config{}.metrics.max_hosts, 16u);
  auto c = ParseConfig("[metrics]\nmax_hosts = 3\n", "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->metrics.max_hosts, 3u);
  EXPECT_FALSE(ParseConfig("[metrics]\nmax_hosts = -1\n", "t.toml"));
}

TEST(ConfigTest, ConsoleLimits) {
  EXPECT_TRUE(Config{}.console.enabled);
  EXPECT_EQ(Config{}.console.max_records, 100u);
  auto c = ParseConfig(
      "[console]\nenabled = false\nmax_records = 5\nscan_attempts = 50\nmax_attempts = 20\n"
      "chart_buckets = 12\nchart_tools = 3\n",
      "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_FALSE(c->console.enabled);
  EXPECT_EQ(c->console.max_records, 5u);
  EXPECT_EQ(c->console.scan_attempts, 50u);
  EXPECT_EQ(c->console.max_attempts, 20u);
  EXPECT_EQ(c->console.chart_buckets, 12u);
  EXPECT_EQ(c->console.chart_tools, 3u);
  EXPECT_FALSE(ParseConfig("[console]\nmax_records = 0\n", "t.toml"));
  EXPECT_FALSE(ParseConfig("[console]\nmax_rows = 3\n", "t.toml"));
}

TEST(ConfigTest, IdSourcesAreReadInOrderAndBadOnesNamed) {
  auto c = ParseConfig(R"([mcp]
turn_id = ["meta:acme/turn", "meta:acme/meta#/turn/id", "env:ACME_TURN"]
session_id = []
call_id = ["meta:acme/call"]
key = ["header:Mcp-Param-Key", "meta:dev.idemgate/idempotencyKey"]
max_call_ids = 10
max_in_flight = 7
replan_window = "90s"
max_replan_pairs = 7
stop_grace = "1s500ms"
call_timeout = "2m"
)",
                       "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->mcp.turn_id.size(), 3u);
  EXPECT_EQ(c->mcp.turn_id[1].name, "acme/meta");
  EXPECT_EQ(c->mcp.turn_id[1].pointer, "/turn/id");
  EXPECT_EQ(c->mcp.turn_id[2].kind, IdSource::Kind::kEnv);
  EXPECT_EQ(c->mcp.turn_id[2].name, "ACME_TURN");
  EXPECT_TRUE(c->mcp.session_id.empty());
  ASSERT_EQ(c->mcp.key.size(), 2u);
  EXPECT_EQ(c->mcp.key[0].kind, IdSource::Kind::kHeader);
  EXPECT_EQ(c->mcp.key[0].name, "Mcp-Param-Key");
  EXPECT_EQ(c->mcp.max_call_ids, 10u);
  EXPECT_EQ(c->mcp.max_in_flight, 7u);
  EXPECT_EQ(c->mcp.replan_window, Duration(90'000));
  EXPECT_EQ(c->mcp.max_replan_pairs, 7u);
  EXPECT_EQ(Config{}.mcp.replan_window, Duration(5 * 60'000));
  EXPECT_EQ(c->mcp.stop_grace, Duration(1'500));
  EXPECT_EQ(Config{}.mcp.stop_grace, Duration(300));
  EXPECT_EQ(c->mcp.call_timeout, Duration(120'000));
  EXPECT_EQ(Config{}.mcp.call_timeout, Duration(600'000));
  for (const char* bad : {"cookie:x", "header:", "header:a b", "meta:", "env:", "meta:a#b"}) {
    auto r = ParseConfig(std::string("[mcp]\nturn_id = [\"") + bad + "\"]\n", "t.toml");
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("turn_id"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("meta:NAME"), std::string::npos) << r.error().message;
  }
  auto both = ParseConfig("[mcp]\nturn_id = []\nturn_id_meta = \"x\"\n", "t.toml");
  ASSERT_FALSE(both);
  EXPECT_NE(both.error().message.find("not both"), std::string::npos);
}

TEST(ConfigTest, HookTurnIsTheOneHookSource) {
  auto c = ParseConfig(
      "[mcp]\nturn_id = [\"hook:turn\"]\nhook_dir = \"/run/me/idem\"\n"
      "hook_max_input_bytes = \"64KiB\"\n",
      "t.toml");
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->mcp.turn_id.size(), 1u);
  EXPECT_EQ(c->mcp.turn_id[0].kind, IdSource::Kind::kHook);
  EXPECT_EQ(c->mcp.turn_id[0].name, "turn");
  EXPECT_EQ(c->mcp.turn_id[0].text, "hook:turn");
  EXPECT_EQ(c->mcp.hook_dir, "/run/me/idem");
  EXPECT_EQ(c->mcp.hook_max_input_bytes, size_t{64} << 10);
  for (const char* bad : {"hook:other", "hook:", "hook:Turn"}) {
    auto r = ParseConfig(std::string("[mcp]\nturn_id = [\"") + bad + "\"]\n", "t.toml");
    ASSERT_FALSE(r) << bad;
    // Says what is wrong, where, and the one name there is.
    EXPECT_NE(r.error().message.find(std::string("\"") + bad + "\""), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find("only one is \"hook:turn\""), std::string::npos)
        << r.error().message;
  }
  // Every refusal lists the kinds, the hook's among them.
  auto unknown = ParseIdSource("cookie:x");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("or \"hook:turn\""), std::string::npos)
      << unknown.error().message;
  EXPECT_FALSE(ParseConfig("[mcp]\nhook_dir = \"\"\n", "t.toml"));
  EXPECT_FALSE(ParseConfig("[mcp]\nhook_max_input_bytes = 10\n", "t.toml"));
}

TEST(ConfigTest, DesignExampleParses) {
  // The example of docs/DESIGN.md §9, verbatim.
  Config c = Parse(R"(
store = "sqlite:/var/lib/idemgate/idemgate.db"   # default: the user's state directory

[defaults]
ttl = "24h"              # retention of completed records
lease = "30s"            # owner presumed dead after this without a heartbeat
wait = "10s"             # how long a duplicate waits for the owner's outcome
window = "1h"            # retention in args mode when no turn id came
on_unknown = "fail"      # fail | retry | reconcile
errors = "store"         # store | release
on_drift = "reject"      # reject | replay
max_result_bytes = "1MiB"

[[tool]]
match = "create_user"
mode = "fields"
fields = ["/email"]

[[tool]]
match = "search_*"
mode = "off"
)");
  EXPECT_EQ(c.store, "sqlite:/var/lib/idemgate/idemgate.db");
  ASSERT_EQ(c.tools.size(), 2u);
  EXPECT_EQ(c.tools[0].match, "create_user");
  EXPECT_EQ(c.tools[0].mode, KeyMode::kFields);
  EXPECT_EQ(c.tools[0].fields, std::vector<std::string>{"/email"});
  EXPECT_EQ(c.ModeFor("search_orders", true), KeyMode::kOff);
}

TEST(ConfigTest, EveryFieldRoundTrips) {
  Config c = Parse(R"(
store = "memory:"

[defaults]
ttl = "2d"
lease = "45s"
wait = "0s"
window = "1h30m"
on_unknown = "retry"
errors = "release"
on_drift = "replay"
on_store_down = "pass"
max_result_bytes = 2048

[[tool]]
match = "charge_*"
mode = "explicit"
key_argument = "client_token"
gated = true
ttl = "7d"
lease = "2m"
wait = "500ms"
window = "10m"
on_unknown = "reconcile"
reconcile = "get_charge"
errors = "store"
on_drift = "reject"
on_store_down = "fail"
max_result_bytes = "512KiB"

[[tool]]
match = "create_user"
mode = "fields"
fields = ["/email", "/org/id", "/a~1b"]

[[route]]
match = "/v1/charges"
methods = ["post", "PUT"]
mode = "args"
key_header = "Stripe-Idempotency"
on_unknown = "reconcile"
reconcile = "/v1/charges/lookup"
ttl = "1h"

[[route]]
match = "/v1/*/refunds"
mode = "fields"
fields = ["/charge"]

[[tenant]]
name = "acme"
tokens = ["tok-acme-1", "tok-acme-2"]

[[tenant]]
name = "ops"
tokens = ["tok-ops"]
admin = true

[alert]
window = "10m"
min_attempts = 5
replay_ratio = 0.25
webhook = "https://hooks.example/idem"

[listen]
address = "0.0.0.0:8080"
admin = "127.0.0.1:9090"

[mcp]
turn_id_meta = "acme/turn"
repeat_nonce = "again"
replay_text = false
tenant = "acme"

[http]
turn_header = "X-Turn"

[limits]
max_body_bytes = "1MB"
max_depth = 64
max_audit_backlog = 5000
)");
  EXPECT_EQ(c.store, "memory:");
  EXPECT_EQ(c.defaults.ttl, hours(48));
  EXPECT_EQ(c.defaults.lease, seconds(45));
  EXPECT_EQ(c.defaults.wait, Duration(0));
  EXPECT_EQ(c.defaults.window, minutes(90));
  EXPECT_EQ(c.defaults.on_unknown, OnUnknown::kRetry);
  EXPECT_EQ(c.defaults.errors, ErrorPolicy::kRelease);
  EXPECT_EQ(c.defaults.on_drift, OnDrift::kReplay);
  EXPECT_EQ(c.defaults.on_store_down, OnStoreDown::kPass);
  EXPECT_EQ(c.defaults.max_result_bytes, 2048u);

  ASSERT_EQ(c.tools.size(), 2u);
  const ToolRule& charge = c.tools[0];
  EXPECT_EQ(charge.match, "charge_*");
  EXPECT_EQ(charge.mode, KeyMode::kExplicit);
  EXPECT_EQ(charge.key_argument, "client_token");
  EXPECT_EQ(charge.gated, true);
  EXPECT_EQ(charge.reconcile, "get_charge");
  EXPECT_EQ(charge.overrides.ttl, hours(7 * 24));
  EXPECT_EQ(charge.overrides.lease, minutes(2));
  EXPECT_EQ(charge.overrides.wait, Duration(500));
  EXPECT_EQ(charge.overrides.window, minutes(10));
  EXPECT_EQ(charge.overrides.on_unknown, OnUnknown::kReconcile);
  EXPECT_EQ(charge.overrides.errors, ErrorPolicy::kStore);
  EXPECT_EQ(charge.overrides.on_drift, OnDrift::kReject);
  EXPECT_EQ(charge.overrides.on_store_down, OnStoreDown::kFail);
  EXPECT_EQ(charge.overrides.max_result_bytes, 512u * 1024);
  EXPECT_EQ(c.tools[1].fields, (std::vector<std::string>{"/email", "/org/id", "/a~1b"}));
  EXPECT_FALSE(c.tools[1].gated.has_value());
  EXPECT_FALSE(c.tools[1].overrides.ttl.has_value());

  ASSERT_EQ(c.routes.size(), 2u);
  EXPECT_EQ(c.routes[0].match, "/v1/charges");
  EXPECT_EQ(c.routes[0].methods, (std::vector<std::string>{"POST", "PUT"}));
  EXPECT_EQ(c.routes[0].mode, KeyMode::kArgs);
  EXPECT_EQ(c.routes[0].key_header, "Stripe-Idempotency");
  EXPECT_EQ(c.routes[0].reconcile, "/v1/charges/lookup");
  EXPECT_EQ(c.routes[0].overrides.ttl, hours(1));
  EXPECT_EQ(c.routes[1].methods, (std::vector<std::string>{"POST", "PATCH"}));
  EXPECT_EQ(c.routes[1].key_header, "Idempotency-Key");
  EXPECT_EQ(c.routes[1].fields, std::vector<std::string>{"/charge"});

  ASSERT_EQ(c.tenants.size(), 2u);
  EXPECT_EQ(c.tenants[0].name, "acme");
  EXPECT_EQ(c.tenants[0].tokens, (std::vector<std::string>{"tok-acme-1", "tok-acme-2"}));
  EXPECT_FALSE(c.tenants[0].admin);
  EXPECT_TRUE(c.tenants[1].admin);

  EXPECT_EQ(c.alert.window, minutes(10));
  EXPECT_EQ(c.alert.min_attempts, 5u);
  EXPECT_DOUBLE_EQ(c.alert.replay_ratio, 0.25);
  EXPECT_EQ(c.alert.webhook, "https://hooks.example/idem");
  EXPECT_EQ(c.listen.address, "0.0.0.0:8080");
  EXPECT_EQ(c.listen.admin, "127.0.0.1:9090");
  ASSERT_EQ(c.mcp.turn_id.size(), 1u);
  EXPECT_EQ(c.mcp.turn_id[0], *ParseIdSource("meta:acme/turn"));
  EXPECT_EQ(c.mcp.repeat_nonce, "again");
  EXPECT_FALSE(c.mcp.replay_text);
  EXPECT_EQ(c.mcp.tenant, "acme");
  EXPECT_EQ(c.http.turn_header, "X-Turn");
  EXPECT_EQ(c.limits.max_body_bytes, 1'000'000u);
  EXPECT_EQ(c.limits.max_depth, 64u);
  EXPECT_EQ(c.limits.max_audit_backlog, 5000u);
}

TEST(ConfigTest, ReplayCacheIsOnWithABoundUnlessSwitchedOff) {
  const Config defaults = Parse("");
  EXPECT_TRUE(defaults.replay_cache.enabled);
  EXPECT_EQ(defaults.replay_cache.max_bytes, size_t{64} << 20);
  const Config c = Parse("[replay_cache]\nenabled = false\nmax_bytes = \"8MiB\"\n");
  EXPECT_FALSE(c.replay_cache.enabled);
  EXPECT_EQ(c.replay_cache.max_bytes, size_t{8} << 20);
  EXPECT_NE(ParseError("[replay_cache]\nmax_bytes = 0\n").find("at least 1 byte"),
            std::string::npos);
  EXPECT_NE(ParseError("[replay_cache]\nmax_records = 5\n").find("max_records"), std::string::npos);
}

TEST(ConfigTest, AnAuditBacklogOfNoneIsRefused) {
  const std::string msg = ParseError("[limits]\nmax_audit_backlog = 0\n");
  EXPECT_NE(msg.find("max_audit_backlog"), std::string::npos) << msg;
}

// Security review F5 and F16: the settings they added.
TEST(ConfigTest, CredentialScopeAndWorkerPoolSettings) {
  const Config defaults;
  EXPECT_EQ(defaults.http.credential_headers,
            (std::vector<std::string>{"Authorization", "X-Api-Key", "Api-Key"}));
  EXPECT_EQ(defaults.limits.max_worker_threads, 256u);
  const Config c = Parse(
      "[http]\ncredential_headers = [\"X-Goog-Api-Key\", \"Cookie\"]\n"
      "credential_scope_secret = \"s3\"\n[limits]\nmax_worker_threads = 8\n"
      "worker_idle_timeout = \"5s\"\n");
  EXPECT_EQ(c.http.credential_headers, (std::vector<std::string>{"X-Goog-Api-Key", "Cookie"}));
  EXPECT_EQ(c.http.credential_scope_secret, "s3");
  EXPECT_EQ(c.limits.max_worker_threads, 8u);
  EXPECT_EQ(c.limits.worker_idle_timeout, Duration{5'000});
  const std::string bad = ParseError("[http]\ncredential_headers = [\"X Api Key\"]\n");
  EXPECT_NE(bad.find("credential_headers"), std::string::npos) << bad;
  EXPECT_NE(ParseError("[limits]\nmax_worker_threads = 0\n").find("max_worker_threads"),
            std::string::npos);
}

TEST(ConfigTest, RepeatNonceFalseSwitchesItOff) {
  EXPECT_FALSE(Parse("[mcp]\nrepeat_nonce = false\n").mcp.repeat_nonce.has_value());
  EXPECT_EQ(Parse("[mcp]\nrepeat_nonce = true\n").mcp.repeat_nonce, "repeat_nonce");
  EXPECT_NE(ParseError("[mcp]\nrepeat_nonce = 3\n").find("or false"), std::string::npos);
}

TEST(ConfigTest, UnknownFieldNamesLineColumnAndSuggestion) {
  std::string msg = ParseError("[defaults]\nttl = \"1h\"\ntll = \"2h\"\n");
  EXPECT_NE(msg.find("test.toml:3:1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown field 'tll' in [defaults]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'ttl'?"), std::string::npos) << msg;
}

TEST(ConfigTest, UnknownFieldInsideToolTable) {
  std::string msg =
      ParseError("[[tool]]\nmatch = \"a\"\n\n[[tool]]\nmatch = \"b\"\n  key_arguemnt = \"x\"\n");
  EXPECT_NE(msg.find("test.toml:6:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'key_arguemnt' in [[tool]]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'key_argument'?"), std::string::npos) << msg;
}

TEST(ConfigTest, UnknownSectionAndFieldWithoutCloseMatch) {
  std::string msg = ParseError("[default]\nttl = \"1h\"\n");
  EXPECT_NE(msg.find("test.toml:1:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean [defaults]?"), std::string::npos) << msg;

  msg = ParseError("[alert]\nfrobnicate = 1\n");
  EXPECT_NE(msg.find("unknown field 'frobnicate' in [alert]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("known fields: window, min_attempts"), std::string::npos) << msg;
}

TEST(ConfigTest, FieldInTheWrongSectionSaysWhereItBelongs) {
  std::string msg = ParseError("[defaults]\nmode = \"args\"\n");
  EXPECT_NE(msg.find("it is a field of [[tool]], [[route]]"), std::string::npos) << msg;
}

TEST(ConfigTest, EveryProblemIsReportedInFileOrder) {
  std::string msg = ParseError("[defaults]\nzz_wait = \"1s\"\nttl = 5\n[mcp]\nreplay_txt = true\n");
  size_t a = msg.find(":2:1:"), b = msg.find(":3:7:"), c = msg.find(":5:1:");
  ASSERT_NE(a, std::string::npos) << msg;
  ASSERT_NE(b, std::string::npos) << msg;
  ASSERT_NE(c, std::string::npos) << msg;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

TEST(ConfigTest, WrongTypesNameTheExpectedType) {
  std::string msg = ParseError("[defaults]\nttl = 86400\n");
  EXPECT_NE(msg.find("test.toml:2:7:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'ttl' in [defaults] must be a duration string"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got an integer"), std::string::npos) << msg;

  msg = ParseError("store = 5\n");
  EXPECT_NE(msg.find("'store' at the top level must be a string; got an integer"),
            std::string::npos)
      << msg;
  msg = ParseError("[[tool]]\nmatch = \"x\"\ngated = \"yes\"\n");
  EXPECT_NE(msg.find("must be a boolean"), std::string::npos) << msg;
  msg = ParseError("[[tool]]\nmatch = \"x\"\nmode = \"fields\"\nfields = \"/email\"\n");
  EXPECT_NE(msg.find("must be an array of strings; got a string"), std::string::npos) << msg;
  msg = ParseError("[tool]\nmatch = \"x\"\n");
  EXPECT_NE(msg.find("must be an array of tables ([[tool]])"), std::string::npos) << msg;
  msg = ParseError("defaults = 1\n");
  EXPECT_NE(msg.find("must be a table ([defaults])"), std::string::npos) << msg;
  msg = ParseError("[alert]\nmin_attempts = 0\n");
  EXPECT_NE(msg.find("must be between 1 and"), std::string::npos) << msg;
  msg = ParseError("[alert]\nreplay_ratio = 1.5\n");
  EXPECT_NE(msg.find("must be between 0 and 1"), std::string::npos) << msg;
}

TEST(ConfigTest, InvalidEnumListsTheValidValues) {
  std::string msg = ParseError("[defaults]\non_unknown = \"fial\"\n");
  EXPECT_NE(msg.find("must be one of \"fail\", \"retry\", \"reconcile\"; got \"fial\""),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did you mean \"fail\"?"), std::string::npos) << msg;
  msg = ParseError("[[tool]]\nmatch = \"x\"\nmode = \"always\"\n");
  EXPECT_NE(msg.find("\"turn\", \"args\", \"fields\", \"explicit\", \"off\""), std::string::npos)
      << msg;
}

TEST(ConfigTest, BadDurationNamesFieldAndAcceptedForms) {
  for (std::string_view bad : {"24", "1x", "h", "1h 30m", "30m1h", "1.5h", "-5s", "", "1hh"}) {
    std::string msg = ParseError("[defaults]\nlease = \"" + std::string(bad) + "\"\n");
    EXPECT_NE(msg.find("'lease' in [defaults]"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("\"1h30m\""), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(ParseError("[defaults]\nttl = \"0s\"\n").find("longer than zero"), std::string::npos);
}

TEST(ConfigTest, BadSize) {
  std::string msg = ParseError("[defaults]\nmax_result_bytes = \"1 megabyte\"\n");
  EXPECT_NE(msg.find("'max_result_bytes' in [defaults] is not valid"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MiB"), std::string::npos) << msg;
  EXPECT_NE(ParseError("[limits]\nmax_body_bytes = -1\n").find("at least 1 byte"),
            std::string::npos);
}

TEST(ConfigTest, SyntaxErrorHasPosition) {
  std::string msg = ParseError("[defaults]\nttl = \"24h\n");
  EXPECT_NE(msg.find("test.toml:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid TOML"), std::string::npos) << msg;
}

TEST(ConfigTest, RuleConsistencyChecks) {
  EXPECT_NE(ParseError("[[tool]]\nmode = \"off\"\n").find("needs match"), std::string::npos);
  EXPECT_NE(ParseError("[[tool]]\nmatch = \"x\"\nmode = \"fields\"\n").find("needs fields"),
            std::string::npos);
  EXPECT_NE(ParseError("[[tool]]\nmatch = \"x\"\nfields = [\"/a\"]\n")
                .find("used only with mode = \"fields\""),
            std::string::npos);
  EXPECT_NE(ParseError("[[tool]]\nmatch = \"x\"\nmode = \"fields\"\nfields = [\"email\"]\n")
                .find("JSON Pointers"),
            std::string::npos);
  EXPECT_NE(
      ParseError("[[tool]]\nmatch = \"x\"\nmode = \"off\"\ngated = true\n").find("contradicts"),
      std::string::npos);
  EXPECT_NE(
      ParseError("[[tool]]\nmatch = \"x\"\non_unknown = \"reconcile\"\n").find("needs reconcile"),
      std::string::npos);
  EXPECT_NE(ParseError("[defaults]\non_unknown = \"reconcile\"\n").find("cannot be \"reconcile\""),
            std::string::npos);
  EXPECT_NE(ParseError("[[route]]\nmatch = \"v1/charges\"\n").find("starting with '/'"),
            std::string::npos);
}

TEST(ConfigTest, TenantChecks) {
  EXPECT_NE(ParseError("[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n").find("repeats"),
            std::string::npos);
  std::string msg = ParseError(
      "[[tenant]]\nname = \"a\"\ntokens = [\"secret-1\"]\n[[tenant]]\nname = \"b\"\n"
      "tokens = [\"secret-1\"]\n");
  EXPECT_NE(msg.find("each token names exactly one tenant"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("secret-1"), std::string::npos) << "a token leaked into: " << msg;
  EXPECT_NE(ParseError("[[tenant]]\nadmin = true\n").find("needs name"), std::string::npos);
}

// Security review F14: the packaged config's placeholder tokens, uncommented
// as they are, are known to everyone who read the package.
TEST(ConfigTest, ThePackagedPlaceholderTokenIsRefused) {
  const std::string err = ParseError(
      "[[tenant]]\nname = \"ops\"\ntokens = [\"REPLACE-WITH-A-RANDOM-TOKEN\"]\nadmin = true\n");
  EXPECT_NE(err.find("packaged placeholder"), std::string::npos) << err;
  EXPECT_NE(err.find("openssl rand -hex 32"), std::string::npos) << err;
}

TEST(ConfigTest, TenantForToken) {
  Config c = Parse(
      "[[tenant]]\nname = \"a\"\ntokens = [\"t1\", \"t2\"]\n[[tenant]]\nname = \"b\"\n"
      "tokens = [\"t3\"]\nadmin = true\n");
  ASSERT_NE(c.TenantForToken("t2"), nullptr);
  EXPECT_EQ(c.TenantForToken("t2")->name, "a");
  EXPECT_EQ(c.TenantForToken("t3")->name, "b");
  EXPECT_EQ(c.TenantForToken("t"), nullptr);
  EXPECT_EQ(c.TenantForToken(""), nullptr);
  // Compared through digests (no length shortcut): a longer or a prefixed
  // candidate is still refused.
  EXPECT_EQ(c.TenantForToken("t3x"), nullptr);
  EXPECT_EQ(c.TenantForToken(std::string("t3\0", 3)), nullptr);
  EXPECT_EQ(c.TenantForToken(std::string(10000, 't')), nullptr);
}

TEST(ConfigTest, FirstMatchingToolRuleWins) {
  Config c = Parse(R"(
[defaults]
ttl = "1h"
lease = "20s"

[[tool]]
match = "search_and_refund"
mode = "turn"
ttl = "3h"

[[tool]]
match = "search_*"
mode = "off"
ttl = "5h"
wait = "1s"
)");
  ASSERT_NE(c.RuleFor("search_and_refund"), nullptr);
  EXPECT_EQ(c.RuleFor("search_and_refund")->match, "search_and_refund");
  EXPECT_EQ(c.ModeFor("search_and_refund", true), KeyMode::kTurn);
  EXPECT_EQ(c.ModeFor("search_orders", true), KeyMode::kOff);

  // Overrides of the first match only, on top of [defaults]; the later rule's
  // `wait` is not merged in.
  Policy p = c.PolicyFor("search_and_refund");
  EXPECT_EQ(p.ttl, hours(3));
  EXPECT_EQ(p.lease, seconds(20));
  EXPECT_EQ(p.wait, seconds(10));
  Policy q = c.PolicyFor("search_orders");
  EXPECT_EQ(q.ttl, hours(5));
  EXPECT_EQ(q.wait, seconds(1));
  Policy none = c.PolicyFor("create_ticket");
  EXPECT_EQ(none.ttl, hours(1));
  EXPECT_EQ(c.RuleFor("create_ticket"), nullptr);
}

TEST(ConfigTest, ModeForFollowsAnnotationsUnlessOverridden) {
  Config c = Parse(R"(
[[tool]]
match = "list_*"
gated = true
[[tool]]
match = "delete_*"
gated = false
[[tool]]
match = "lookup"
ttl = "1h"
)");
  EXPECT_EQ(c.ModeFor("create_ticket", true), KeyMode::kTurn);
  EXPECT_EQ(c.ModeFor("get_ticket", false), KeyMode::kOff);
  EXPECT_EQ(c.ModeFor("list_tickets", false), KeyMode::kTurn);
  EXPECT_EQ(c.ModeFor("delete_ticket", true), KeyMode::kOff);
  EXPECT_EQ(c.ModeFor("lookup", false), KeyMode::kOff);  // a rule without mode/gated
  EXPECT_EQ(c.ModeFor("lookup", true), KeyMode::kTurn);
}

TEST(ConfigTest, RouteMatching) {
  Config c = Parse(R"(
[[route]]
match = "/v1/charges"
[[route]]
match = "/v2/*/refunds"
methods = ["POST"]
mode = "explicit"
)");
  ASSERT_NE(c.RouteFor("POST", "/v1/charges"), nullptr);
  EXPECT_NE(c.RouteFor("post", "/v1/charges/ch_1/capture?x=1"), nullptr);
  EXPECT_NE(c.RouteFor("PATCH", "/v1/charges"), nullptr);
  EXPECT_EQ(c.RouteFor("GET", "/v1/charges"), nullptr);
  EXPECT_EQ(c.RouteFor("POST", "/v1/chargesx"), nullptr);
  ASSERT_NE(c.RouteFor("POST", "/v2/ch_1/refunds"), nullptr);
  EXPECT_EQ(c.RouteFor("POST", "/v2/ch_1/refunds")->mode, KeyMode::kExplicit);
  EXPECT_EQ(c.RouteFor("PATCH", "/v2/ch_1/refunds"), nullptr);
}

TEST(GlobTest, Matching) {
  EXPECT_TRUE(GlobMatch("create_user", "create_user"));
  EXPECT_FALSE(GlobMatch("create_user", "create_users"));
  EXPECT_TRUE(GlobMatch("search_*", "search_"));
  EXPECT_TRUE(GlobMatch("search_*", "search_orders"));
  EXPECT_FALSE(GlobMatch("search_*", "research_orders"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("*_user", "create_user"));
  EXPECT_TRUE(GlobMatch("c?eate", "create"));
  EXPECT_FALSE(GlobMatch("c?eate", "ceate"));
  EXPECT_TRUE(GlobMatch("a*b*c", "a_x_b_y_c"));
  EXPECT_FALSE(GlobMatch("a*b*c", "a_x_c_y_b"));
  EXPECT_TRUE(GlobMatch("*a*a*a*", "banana_a"));
  EXPECT_FALSE(GlobMatch("?", ""));
  EXPECT_TRUE(GlobMatch("**", "anything"));
  EXPECT_TRUE(GlobMatch("a*", "a*literal"));
  // A long hostile pattern still finishes quickly (no exponential backtracking).
  EXPECT_FALSE(GlobMatch("*a*a*a*a*a*a*a*a*b", std::string(2000, 'a')));
}

TEST(UnitsTest, Durations) {
  EXPECT_EQ(ParseDuration("24h").value(), hours(24));
  EXPECT_EQ(ParseDuration("30s").value(), seconds(30));
  EXPECT_EQ(ParseDuration("500ms").value(), Duration(500));
  EXPECT_EQ(ParseDuration("1h30m").value(), minutes(90));
  EXPECT_EQ(ParseDuration("5m").value(), minutes(5));
  EXPECT_EQ(ParseDuration("2d").value(), hours(48));
  EXPECT_EQ(ParseDuration("1d2h3m4s5ms").value(), Duration(93'784'005));
  EXPECT_EQ(ParseDuration("0s").value(), Duration(0));
  for (std::string_view bad : {"", "5", "m", "1h30", "30m1h", "1s1s", "1.5s", "-1s", " 1s", "1S",
                               "1 s", "1w", "99999999999999999999s", "9999999999999999d"}) {
    Result<Duration> d = ParseDuration(bad);
    ASSERT_FALSE(d.has_value()) << bad;
    EXPECT_EQ(d.error().code, ErrorCode::kInvalidArgument);
  }
  EXPECT_NE(ParseDuration("1x").error().message.find("ms"), std::string::npos);
  EXPECT_EQ(FormatDuration(minutes(90)), "1h30m");
  EXPECT_EQ(FormatDuration(Duration(1500)), "1s500ms");
  EXPECT_EQ(FormatDuration(Duration(0)), "0s");
  EXPECT_EQ(FormatDuration(hours(48)), "2d");
}

TEST(UnitsTest, Sizes) {
  EXPECT_EQ(ParseSize("1048576").value(), 1048576u);
  EXPECT_EQ(ParseSize("1MiB").value(), 1048576u);
  EXPECT_EQ(ParseSize("512KiB").value(), 524288u);
  EXPECT_EQ(ParseSize("1MB").value(), 1'000'000u);
  EXPECT_EQ(ParseSize("1GiB").value(), size_t{1} << 30);
  EXPECT_EQ(ParseSize("10B").value(), 10u);
  EXPECT_EQ(ParseSize("2 KiB").value(), 2048u);
  for (std::string_view bad :
       {"", "MiB", "1.5MiB", "1mib", "1TiB", "-1", "1 megabyte", "99999999999999999999"}) {
    EXPECT_FALSE(ParseSize(bad).has_value()) << bad;
  }
}

TEST(ConfigTest, LoadConfigFromFile) {
  char path[] = "/tmp/idem_config_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string text = "[defaults]\nttl = \"2h\"\nbogus = 1\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  Result<Config> c = LoadConfig(path);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message.find(std::string(path) + ":3:1:"), std::string::npos)
      << c.error().message;
  std::remove(path);

  Result<Config> missing = LoadConfig("/nonexistent/idemgate.toml");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

}  // namespace
}  // namespace idem
