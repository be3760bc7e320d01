// The schema of idemgate.toml: ParseConfig turns TOML text into a Config and
// reports every field it does not know, every wrong type and every invalid
// value, each with file:line:column.
//
// toml++ reports syntax errors by throwing toml::parse_error (the packaged
// library is built with exceptions); that is caught here, at the edge, and
// becomes an Error value like every other problem.
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "idem/config.h"
#include "idem/key.h"
#include "table_reader.h"

namespace idem {
namespace {

using config_internal::Diagnostics;
using config_internal::Quote;
using config_internal::Section;
using config_internal::TableReader;
using config_internal::TypeName;

// ---------------------------------------------------------------------------
// The schema: which keys each table accepts. The parser asks for keys only
// from these lists, and anything else in a table is reported as unknown.

constexpr std::string_view kPolicyKeys[] = {
    "ttl",    "lease",    "wait",          "window",           "on_unknown",
    "errors", "on_drift", "on_store_down", "max_result_bytes", "observe",
};

std::vector<std::string_view> WithPolicyKeys(std::initializer_list<std::string_view> keys) {
  std::vector<std::string_view> out(keys);
  out.insert(out.end(), std::begin(kPolicyKeys), std::end(kPolicyKeys));
  return out;
}

const Section& TopSection() {
  static const Section s{"",
                         {"store", "defaults", "tool", "route", "tenant", "alert", "metrics",
                          "listen", "mcp", "http", "limits", "replay_cache", "console"}};
  return s;
}
const Section& DefaultsSection() {
  static const Section s{"[defaults]", WithPolicyKeys({})};
  return s;
}
const Section& ToolSection() {
  static const Section s{"[[tool]]", WithPolicyKeys({"match", "mode", "fields", "key_argument",
                                                     "gated", "reconcile"})};
  return s;
}
const Section& RouteSection() {
  static const Section s{"[[route]]",
                         WithPolicyKeys({"match", "methods", "mode", "fields", "key_header",
                                         "key_field", "profile", "vendor_window", "reconcile"})};
  return s;
}
const Section& TenantSection() {
  static const Section s{"[[tenant]]", {"name", "tokens", "admin"}};
  return s;
}
const Section& AlertSection() {
  static const Section s{"[alert]", {"window", "min_attempts", "replay_ratio", "webhook"}};
  return s;
}
const Section& MetricsSection() {
  static const Section s{"[metrics]", {"max_hosts", "max_tools", "max_label_bytes"}};
  return s;
}
const Section& ConsoleSection() {
  static const Section s{"[console]",
                         {"enabled", "max_records", "scan_attempts", "max_attempts",
                          "chart_buckets", "chart_tools"}};
  return s;
}
const Section& ListenSection() {
  static const Section s{"[listen]", {"address", "admin"}};
  return s;
}
const Section& McpSection() {
  static const Section s{"[mcp]",
                         {"turn_id", "session_id", "call_id", "max_call_ids", "turn_id_meta",
                          "repeat_nonce", "replay_text", "tenant", "scope", "key", "replan_window",
                          "max_replan_pairs", "max_in_flight", "hook_dir", "hook_max_input_bytes",
                          "stop_grace", "call_timeout"}};
  return s;
}
const Section& HttpSection() {
  static const Section s{"[http]",
                         {"turn_header", "max_key_bytes", "upstream_ca_file", "upstream_verify_tls",
                          "upstream_connect_timeout", "upstream_timeout", "upstream_idle_timeout",
                          "max_idle_connections", "max_response_bytes", "credential_headers",
                          "credential_scope_secret"}};
  return s;
}
const Section& LimitsSection() {
  static const Section s{"[limits]",
                         {"max_body_bytes", "max_depth", "max_audit_backlog", "max_worker_threads",
                          "worker_idle_timeout"}};
  return s;
}

const Section& ReplayCacheSection() {
  static const Section s{"[replay_cache]", {"enabled", "max_bytes"}};
  return s;
}

const std::vector<const Section*>& AllSections() {
  static const std::vector<const Section*> all = {
      &TopSection(),    &DefaultsSection(), &ToolSection(),        &RouteSection(),
      &TenantSection(), &AlertSection(),    &MetricsSection(),     &ListenSection(),
      &McpSection(),
      &HttpSection(),   &LimitsSection(),   &ReplayCacheSection(), &ConsoleSection(),
  };
  return all;
}

TableReader Reader(const toml::table& table, const Section& section, Diagnostics& diag) {
  return TableReader(table, section, AllSections(), diag);
}

// ---------------------------------------------------------------------------
// Sections.

// The policy fields shared by [defaults], [[tool]] and [[route]].
PolicyOverrides ReadPolicy(TableReader& r) {
  PolicyOverrides o;
  o.ttl = r.DurationValue("ttl", /*allow_zero=*/false);
  o.lease = r.DurationValue("lease", /*allow_zero=*/false);
  o.wait = r.DurationValue("wait", /*allow_zero=*/true);
  o.window = r.DurationValue("window", /*allow_zero=*/false);
  o.on_unknown = r.Enum<OnUnknown>("on_unknown", OnUnknownName,
                                   {OnUnknown::kFail, OnUnknown::kRetry, OnUnknown::kReconcile});
  o.errors =
      r.Enum<ErrorPolicy>("errors", ErrorPolicyName, {ErrorPolicy::kStore, ErrorPolicy::kRelease});
  o.on_drift = r.Enum<OnDrift>("on_drift", OnDriftName, {OnDrift::kReject, OnDrift::kReplay});
  o.on_store_down = r.Enum<OnStoreDown>("on_store_down", OnStoreDownName,
                                        {OnStoreDown::kFail, OnStoreDown::kPass});
  o.max_result_bytes = r.Size("max_result_bytes");
  o.observe = r.Bool("observe");
  return o;
}

std::optional<KeyMode> ReadMode(TableReader& r) {
  return r.Enum<KeyMode>(
      "mode", KeyModeName,
      {KeyMode::kTurn, KeyMode::kArgs, KeyMode::kFields, KeyMode::kExplicit, KeyMode::kOff});
}

// RFC 6901: "" (the whole document) or "/" followed by reference tokens in
// which '~' is only ever "~0" or "~1".
bool IsJsonPointer(std::string_view p) {
  if (p.empty() || p[0] != '/') return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '~' && (i + 1 >= p.size() || (p[i + 1] != '0' && p[i + 1] != '1'))) return false;
  }
  return true;
}

// `fields` goes with mode = "fields" and nothing else.
std::vector<std::string> ReadFields(TableReader& r, std::optional<KeyMode> mode) {
  std::optional<std::vector<std::string>> fields = r.StringArray("fields");
  const toml::node* node = r.Find("fields");
  bool fields_mode = mode == KeyMode::kFields;
  if (!mode && r.Find("mode")) return fields.value_or(std::vector<std::string>{});  // reported
  if (fields && !fields_mode) {
    r.Error(*node, "fields",
            "is used only with mode = \"fields\"; set mode = \"fields\" or remove it");
    return {};
  }
  if (fields_mode && !node) {
    r.Error(*r.Find("mode"), "mode",
            "= \"fields\" needs fields = [\"/json/pointer\", ...] naming the arguments that form "
            "the key");
    return {};
  }
  if (!fields) return {};
  if (fields->empty()) {
    r.Error(*node, "fields", "must name at least one JSON Pointer such as \"/email\"");
    return {};
  }
  for (size_t i = 0; i < fields->size(); ++i) {
    if (!IsJsonPointer((*fields)[i])) {
      r.Error(*node->as_array()->get(i), "fields",
              "must hold JSON Pointers (RFC 6901) such as \"/email\" or \"/customer/id\"; got " +
                  Quote((*fields)[i]));
    }
  }
  return *fields;
}

// on_unknown = "reconcile" and `reconcile` go together.
void CheckReconcile(TableReader& r, const PolicyOverrides& o,
                    const std::optional<std::string>& reconcile, std::string_view what) {
  if (!o.on_unknown && r.Find("on_unknown")) return;  // invalid value, already reported
  bool reconciles = o.on_unknown == OnUnknown::kReconcile;
  if (reconciles && !reconcile) {
    r.Error(*r.Find("on_unknown"), "on_unknown",
            "= \"reconcile\" needs reconcile = \"<" + std::string(what) +
                ">\": the read-only lookup that finds out whether the call happened");
  }
  if (reconcile && !reconciles) {
    r.Error(*r.Find("reconcile"), "reconcile",
            "is used only with on_unknown = \"reconcile\"; set it or remove reconcile");
  }
}

void ReadDefaults(const toml::table& t, Diagnostics& diag, Policy& defaults) {
  TableReader r = Reader(t, DefaultsSection(), diag);
  PolicyOverrides o = ReadPolicy(r);
  if (o.on_unknown == OnUnknown::kReconcile) {
    // A reconcile lookup is specific to a tool or route, so it cannot be a default.
    r.Error(*r.Find("on_unknown"), "on_unknown",
            "cannot be \"reconcile\" here: the lookup is specific to a tool; set on_unknown = "
            "\"reconcile\" with reconcile = \"<read-only tool>\" in a [[tool]] or [[route]] rule");
    o.on_unknown.reset();
  }
  defaults = o.ApplyTo(defaults);
  r.CheckUnknown();
}

std::optional<ToolRule> ReadToolRule(const toml::table& t, Diagnostics& diag) {
  TableReader r = Reader(t, ToolSection(), diag);
  ToolRule rule;
  std::optional<std::string> match = r.String("match", /*allow_empty=*/false);
  if (!match && !r.Find("match")) {
    r.ErrorAtTable("[[tool]] needs match = \"<tool name or glob>\"");
  }
  rule.match = match.value_or("");
  rule.mode = ReadMode(r);
  rule.fields = ReadFields(r, rule.mode);
  rule.key_argument = r.String("key_argument", /*allow_empty=*/false);
  rule.gated = r.Bool("gated");
  if (rule.gated && rule.mode) {
    bool mode_gates = *rule.mode != KeyMode::kOff;
    if (*rule.gated != mode_gates) {
      r.Error(*r.Find("gated"), "gated",
              std::string("= ") + (*rule.gated ? "true" : "false") +
                  " contradicts mode = " + Quote(KeyModeName(*rule.mode)) + "; keep one of them");
    }
  }
  rule.reconcile = r.String("reconcile", /*allow_empty=*/false);
  rule.overrides = ReadPolicy(r);
  CheckReconcile(r, rule.overrides, rule.reconcile, "read-only tool");
  r.CheckUnknown();
  if (!match) return std::nullopt;
  return rule;
}

bool IsHttpToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) ||
              std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

// profile, key_field and vendor_window of a [[route]]. A profile sets where
// the key goes and the vendor's window; key_header or key_field beside it
// must agree with it (one place for the vendor to find the key).
void ReadProfile(TableReader& r, RouteRule& rule) {
  if (std::optional<std::string> field = r.String("key_field", /*allow_empty=*/false)) {
    rule.key_field = *field;
  }
  if (std::optional<std::string> name = r.String("profile", /*allow_empty=*/false)) {
    const VendorProfile* profile = FindVendorProfile(*name);
    if (profile == nullptr) {
      std::string names;
      for (const VendorProfile& p : VendorProfiles()) {
        names += (names.empty() ? "" : ", ") + Quote(p.name);
      }
      r.Error(*r.Find("profile"), "profile", "must be one of " + names + "; got " + Quote(*name));
    } else {
      const bool header_differs = r.Find("key_header") && rule.key_header != profile->key_header;
      const bool field_differs = r.Find("key_field") && rule.key_field != profile->key_field;
      if (header_differs || field_differs) {
        const std::string where = profile->key_header.empty()
                                      ? "the body field " + Quote(profile->key_field)
                                      : "the header " + Quote(profile->key_header);
        r.Error(*r.Find(header_differs ? "key_header" : "key_field"),
                header_differs ? "key_header" : "key_field",
                "disagrees with profile " + Quote(*name) + ", which sends the key in " + where +
                    "; remove it or the profile");
      }
      rule.profile = *name;
      rule.key_header = std::string(profile->key_header);
      rule.key_field = std::string(profile->key_field);
      rule.vendor_window = profile->window;
    }
  }
  if (auto window = r.DurationValue("vendor_window", /*allow_zero=*/false)) {
    rule.vendor_window = *window;
  }
}

std::optional<RouteRule> ReadRouteRule(const toml::table& t, Diagnostics& diag) {
  TableReader r = Reader(t, RouteSection(), diag);
  RouteRule rule;
  std::optional<std::string> match = r.String("match", /*allow_empty=*/false);
  if (!match && !r.Find("match")) {
    r.ErrorAtTable("[[route]] needs match = \"<path prefix or glob>\", e.g. \"/v1/charges\"");
  }
  if (match && !match->starts_with('/') && !match->starts_with('*')) {
    r.Error(*r.Find("match"), "match",
            "must be a path starting with '/' (a prefix such as \"/v1/charges\" or a glob such "
            "as \"/v1/*/refunds\"); got " +
                Quote(*match));
  }
  rule.match = match.value_or("");
  if (std::optional<std::vector<std::string>> methods = r.StringArray("methods")) {
    const toml::node* node = r.Find("methods");
    if (methods->empty()) {
      r.Error(*node, "methods", "must name at least one HTTP method such as \"POST\"");
    }
    for (std::string& m : *methods) {
      if (!IsHttpToken(m)) {
        r.Error(*node, "methods", "must hold HTTP method names such as \"POST\"; got " + Quote(m));
      }
      for (char& c : m) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    rule.methods = std::move(*methods);
  }
  rule.mode = ReadMode(r);
  rule.fields = ReadFields(r, rule.mode);
  if (std::optional<std::string> header = r.String("key_header", /*allow_empty=*/false)) {
    if (!IsHttpToken(*header)) {
      r.Error(*r.Find("key_header"), "key_header",
              "must be an HTTP header name such as \"Idempotency-Key\"; got " + Quote(*header));
    }
    rule.key_header = *header;
  }
  ReadProfile(r, rule);
  rule.reconcile = r.String("reconcile", /*allow_empty=*/false);
  if (rule.reconcile && !rule.reconcile->starts_with('/')) {
    r.Error(*r.Find("reconcile"), "reconcile",
            "must be a path starting with '/'; got " + Quote(*rule.reconcile));
  }
  rule.overrides = ReadPolicy(r);
  CheckReconcile(r, rule.overrides, rule.reconcile, "read-only route");
  r.CheckUnknown();
  if (!match) return std::nullopt;
  return rule;
}

bool IsTenantName(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// Reads every [[tenant]] and checks what spans them: unique names, and each
// token naming exactly one tenant.
void ReadTenants(TableReader& top, Diagnostics& diag, std::vector<Tenant>& tenants) {
  std::set<std::string> names;
  std::set<std::string> tokens;
  for (const toml::table* t : top.Tables("tenant")) {
    TableReader r = Reader(*t, TenantSection(), diag);
    Tenant tenant;
    std::optional<std::string> name = r.String("name", /*allow_empty=*/false);
    if (!name && !r.Find("name")) r.ErrorAtTable("[[tenant]] needs name = \"<tenant name>\"");
    if (name) {
      if (!IsTenantName(*name)) {
        r.Error(*r.Find("name"), "name",
                "must be 1 to 64 letters, digits, '.', '_' or '-'; got " + Quote(*name));
      } else if (!names.insert(*name).second) {
        r.Error(*r.Find("name"), "name", "repeats tenant " + Quote(*name) + "; names are unique");
      }
      tenant.name = *name;
    }
    if (std::optional<std::vector<std::string>> list = r.StringArray("tokens")) {
      const toml::array& array = *r.Find("tokens")->as_array();
      for (size_t i = 0; i < list->size(); ++i) {
        const std::string& token = (*list)[i];
        bool printable =
            std::all_of(token.begin(), token.end(), [](char c) { return c > 0x20 && c < 0x7f; });
        if (!printable) {
          // The token itself is a secret: never echo it.
          r.Error(*array.get(i), "tokens", "must hold visible ASCII without spaces");
        } else if (token.starts_with("REPLACE-WITH-")) {
          // The packaged config's placeholders, uncommented as they are:
          // public text, so every reader of the package knows them.
          r.Error(*array.get(i), "tokens",
                  "is the packaged placeholder; replace it with a random token (for example "
                  "`openssl rand -hex 32`)");
        } else if (!tokens.insert(token).second) {
          r.Error(*array.get(i), "tokens",
                  "repeats a token already given; each token names exactly one tenant");
        }
      }
      tenant.tokens = std::move(*list);
    }
    tenant.admin = r.Bool("admin").value_or(false);
    r.CheckUnknown();
    tenants.push_back(std::move(tenant));
  }
}

void ReadAlert(const toml::table& t, Diagnostics& diag, AlertConfig& alert) {
  TableReader r = Reader(t, AlertSection(), diag);
  if (auto v = r.DurationValue("window", /*allow_zero=*/false)) alert.window = *v;
  if (auto v = r.Integer("min_attempts", 1, INT64_MAX))
    alert.min_attempts = static_cast<uint64_t>(*v);
  if (auto v = r.Number("replay_ratio", 0.0, 1.0)) alert.replay_ratio = *v;
  if (auto v = r.String("webhook")) {
    if (!v->empty() && !v->starts_with("http://") && !v->starts_with("https://")) {
      r.Error(*r.Find("webhook"), "webhook",
              "must be an http:// or https:// URL (or empty for none); got " + Quote(*v));
    }
    alert.webhook = *v;
  }
  r.CheckUnknown();
}

void ReadMetrics(const toml::table& t, Diagnostics& diag, MetricsConfig& metrics) {
  TableReader r = Reader(t, MetricsSection(), diag);
  if (auto v = r.Integer("max_hosts", 0, 1024)) metrics.max_hosts = static_cast<size_t>(*v);
  if (auto v = r.Integer("max_tools", 0, 100'000)) metrics.max_tools = static_cast<size_t>(*v);
  if (auto v = r.Integer("max_label_bytes", 32, 4096)) {
    metrics.max_label_bytes = static_cast<size_t>(*v);
  }
  r.CheckUnknown();
}

void ReadConsole(const toml::table& t, Diagnostics& diag, ConsoleConfig& console) {
  TableReader r = Reader(t, ConsoleSection(), diag);
  if (auto v = r.Bool("enabled")) console.enabled = *v;
  auto size = [&](std::string_view key, int64_t max, size_t& out) {
    if (auto v = r.Integer(key, 1, max)) out = static_cast<size_t>(*v);
  };
  size("max_records", 10'000, console.max_records);
  size("scan_attempts", 1'000'000, console.scan_attempts);
  size("max_attempts", 10'000, console.max_attempts);
  size("chart_buckets", 240, console.chart_buckets);
  size("chart_tools", 64, console.chart_tools);
  r.CheckUnknown();
}

void ReadListen(const toml::table& t, Diagnostics& diag, ListenConfig& listen) {
  TableReader r = Reader(t, ListenSection(), diag);
  auto host_port = [&](std::string_view key, std::string& out) {
    std::optional<std::string> v = r.String(key);
    if (!v) return;
    size_t colon = v->rfind(':');
    bool ok = v->empty() || (colon != std::string::npos && colon + 1 < v->size() &&
                             std::all_of(v->begin() + colon + 1, v->end(),
                                         [](char c) { return c >= '0' && c <= '9'; }));
    if (!ok) {
      r.Error(*r.Find(key), key,
              "must be HOST:PORT such as \"127.0.0.1:8080\" or \"[::1]:8080\"; got " + Quote(*v));
    }
    out = *v;
  };
  host_port("address", listen.address);
  host_port("admin", listen.admin);
  r.CheckUnknown();
}

void ReadMcp(const toml::table& t, Diagnostics& diag, McpConfig& mcp) {
  TableReader r = Reader(t, McpSection(), diag);
  // Each list of id sources, in order; an empty list reads nothing.
  auto sources = [&r](std::string_view key, std::vector<IdSource>& out) {
    std::optional<std::vector<std::string>> list = r.StringArray(key);
    if (!list) return;
    out.clear();
    for (const std::string& text : *list) {
      Result<IdSource> source = ParseIdSource(text);
      if (!source) {
        r.Error(*r.Find(key), key, source.error().message);
        continue;
      }
      out.push_back(std::move(*source));
    }
  };
  sources("turn_id", mcp.turn_id);
  sources("session_id", mcp.session_id);
  sources("call_id", mcp.call_id);
  sources("key", mcp.key);
  if (auto v = r.String("turn_id_meta", /*allow_empty=*/false)) {
    if (r.Find("turn_id")) {
      r.Error(*r.Find("turn_id_meta"), "turn_id_meta",
              "is the older form of turn_id; give one of them, not both");
    }
    mcp.turn_id = {IdSource{IdSource::Kind::kMeta, *v, "", "meta:" + *v}};
  }
  if (auto v = r.Integer("max_call_ids", 0, 1 << 20)) mcp.max_call_ids = static_cast<size_t>(*v);
  if (auto v = r.Integer("max_in_flight", 1, 1 << 20)) mcp.max_in_flight = static_cast<size_t>(*v);
  if (auto v = r.String("hook_dir", /*allow_empty=*/false)) mcp.hook_dir = *v;
  if (auto v = r.Size("hook_max_input_bytes")) {
    if (*v < 1024) {
      r.Error(*r.Find("hook_max_input_bytes"), "hook_max_input_bytes",
              "must be at least 1KiB (the host's JSON without its prompt); got " +
                  std::to_string(*v));
    }
    mcp.hook_max_input_bytes = *v;
  }
  if (auto v = r.DurationValue("replan_window", /*allow_zero=*/true)) mcp.replan_window = *v;
  if (auto v = r.DurationValue("stop_grace", /*allow_zero=*/true)) mcp.stop_grace = *v;
  if (auto v = r.DurationValue("call_timeout", /*allow_zero=*/true)) mcp.call_timeout = *v;
  if (auto v = r.Integer("max_replan_pairs", 0, 1 << 20)) {
    mcp.max_replan_pairs = static_cast<size_t>(*v);
  }
  if (const toml::node* node = r.Find("repeat_nonce")) {
    if (node->is_boolean()) {
      // false switches the argument off; true keeps the default name.
      if (!node->as_boolean()->get()) mcp.repeat_nonce.reset();
    } else if (auto v = r.String("repeat_nonce", /*allow_empty=*/false)) {
      mcp.repeat_nonce = *v;
    } else if (!node->is_string()) {
      r.Error(*node, "repeat_nonce",
              "must be an argument name (a string) or false to switch it off; got " +
                  std::string(TypeName(*node)));
    }
  }
  if (auto v = r.Bool("replay_text")) mcp.replay_text = *v;
  if (auto v = r.String("tenant", /*allow_empty=*/false)) {
    if (!IsTenantName(*v)) {
      r.Error(*r.Find("tenant"), "tenant",
              "must be 1 to 64 letters, digits, '.', '_' or '-'; got " + Quote(*v));
    }
    mcp.tenant = *v;
  }
  if (auto v = r.String("scope", /*allow_empty=*/true)) {
    if (!v->empty()) {
      if (auto ok = ValidateScope(*v); !ok) r.Error(*r.Find("scope"), "scope", ok.error().message);
    }
    mcp.scope = *v;
  }
  r.CheckUnknown();
}

void ReadHttp(const toml::table& t, Diagnostics& diag, HttpConfig& http) {
  TableReader r = Reader(t, HttpSection(), diag);
  if (auto v = r.String("turn_header", /*allow_empty=*/false)) {
    if (!IsHttpToken(*v)) {
      r.Error(*r.Find("turn_header"), "turn_header",
              "must be an HTTP header name such as \"Idemgate-Turn-Id\"; got " + Quote(*v));
    }
    http.turn_header = *v;
  }
  if (auto v = r.Integer("max_key_bytes", 1, 255)) http.max_key_bytes = static_cast<size_t>(*v);
  if (auto v = r.String("upstream_ca_file")) http.upstream_ca_file = *v;
  if (auto v = r.Bool("upstream_verify_tls")) http.upstream_verify_tls = *v;
  if (auto v = r.DurationValue("upstream_connect_timeout", /*allow_zero=*/false)) {
    http.upstream_connect_timeout = *v;
  }
  if (auto v = r.DurationValue("upstream_timeout", /*allow_zero=*/false)) {
    http.upstream_timeout = *v;
  }
  if (auto v = r.DurationValue("upstream_idle_timeout", /*allow_zero=*/true)) {
    http.upstream_idle_timeout = *v;
  }
  if (auto v = r.Integer("max_idle_connections", 0, 1 << 20)) {
    http.max_idle_connections = static_cast<size_t>(*v);
  }
  if (auto v = r.Size("max_response_bytes")) http.max_response_bytes = *v;
  if (auto v = r.StringArray("credential_headers")) {
    for (const std::string& name : *v) {
      if (!IsHttpToken(name)) {
        r.Error(*r.Find("credential_headers"), "credential_headers",
                "must list HTTP header names such as \"X-Api-Key\"; got " + Quote(name));
      }
    }
    http.credential_headers = *v;
  }
  if (auto v = r.String("credential_scope_secret")) http.credential_scope_secret = *v;
  r.CheckUnknown();
}

void ReadLimits(const toml::table& t, Diagnostics& diag, LimitsConfig& limits) {
  TableReader r = Reader(t, LimitsSection(), diag);
  if (auto v = r.Size("max_body_bytes")) limits.max_body_bytes = *v;
  // Bounded so that a nesting limit can never exhaust the stack of a
  // recursive parser.
  if (auto v = r.Integer("max_depth", 1, 1024)) limits.max_depth = static_cast<size_t>(*v);
  if (auto v = r.Integer("max_audit_backlog", 1, int64_t{1} << 30)) {
    limits.max_audit_backlog = static_cast<size_t>(*v);
  }
  if (auto v = r.Integer("max_worker_threads", 1, 1 << 16)) {
    limits.max_worker_threads = static_cast<size_t>(*v);
  }
  if (auto v = r.DurationValue("worker_idle_timeout", /*allow_zero=*/true)) {
    limits.worker_idle_timeout = *v;
  }
  r.CheckUnknown();
}

void ReadReplayCache(const toml::table& t, Diagnostics& diag, ReplayCacheConfig& cache) {
  TableReader r = Reader(t, ReplayCacheSection(), diag);
  if (auto v = r.Bool("enabled")) cache.enabled = *v;
  if (auto v = r.Size("max_bytes")) cache.max_bytes = *v;
  r.CheckUnknown();
}

}  // namespace

Result<Config> ParseConfig(std::string_view toml_text, std::string_view source_name) {
  Diagnostics diag(source_name);
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    diag.Add(e.source(), "invalid TOML: " + std::string(e.description()));
    return MakeError(ErrorCode::kInvalidArgument, diag.Join());
  }

  Config config;
  config.source = std::string(source_name);
  TableReader top = Reader(root, TopSection(), diag);
  if (auto v = top.String("store")) config.store = *v;
  if (const toml::table* t = top.Table("defaults")) ReadDefaults(*t, diag, config.defaults);
  for (const toml::table* t : top.Tables("tool")) {
    if (std::optional<ToolRule> rule = ReadToolRule(*t, diag)) {
      config.tools.push_back(std::move(*rule));
    }
  }
  for (const toml::table* t : top.Tables("route")) {
    if (std::optional<RouteRule> rule = ReadRouteRule(*t, diag)) {
      config.routes.push_back(std::move(*rule));
    }
  }
  ReadTenants(top, diag, config.tenants);
  if (const toml::table* t = top.Table("alert")) ReadAlert(*t, diag, config.alert);
  if (const toml::table* t = top.Table("metrics")) ReadMetrics(*t, diag, config.metrics);
  if (const toml::table* t = top.Table("console")) ReadConsole(*t, diag, config.console);
  if (const toml::table* t = top.Table("listen")) ReadListen(*t, diag, config.listen);
  if (const toml::table* t = top.Table("mcp")) ReadMcp(*t, diag, config.mcp);
  if (const toml::table* t = top.Table("http")) ReadHttp(*t, diag, config.http);
  if (const toml::table* t = top.Table("limits")) ReadLimits(*t, diag, config.limits);
  if (const toml::table* t = top.Table("replay_cache")) {
    ReadReplayCache(*t, diag, config.replay_cache);
  }
  top.CheckUnknown();

  if (!diag.empty()) return MakeError(ErrorCode::kInvalidArgument, diag.Join());
  return config;
}

}  // namespace idem
