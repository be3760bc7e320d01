// The configuration file, idemgate.toml (docs/DESIGN.md §9).
//
// Every field is optional and documents its default here; a Config built by
// `Config{}` is exactly the behaviour with no file at all. A field idemgate
// does not know is an error, never silently ignored: ParseConfig reports it
// with file:line:column and, for a near miss, "did you mean ...?".
//
// Per-tool rules ([[tool]]) and per-route rules ([[route]]) are matched in
// file order and the FIRST rule that matches wins; later rules are not merged
// in. Put specific rules before general globs:
//
//   [[tool]]
//   match = "search_orders_and_refund"   # specific first
//   mode = "turn"
//   [[tool]]
//   match = "search_*"                   # then the general rule
//   mode = "off"
//
// A Config is a plain value: immutable after loading and safe to read from
// any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/key.h"
#include "idem/policy.h"

namespace idem {

// Optional overrides of every Policy field; an unset field keeps the value of
// [defaults]. The keys in a [[tool]] or [[route]] table are the same as in
// [defaults].
struct PolicyOverrides {
  std::optional<Duration> ttl;
  std::optional<Duration> lease;
  std::optional<Duration> wait;
  std::optional<Duration> window;
  std::optional<OnUnknown> on_unknown;
  std::optional<ErrorPolicy> errors;
  std::optional<OnDrift> on_drift;
  std::optional<OnStoreDown> on_store_down;
  std::optional<size_t> max_result_bytes;
  std::optional<bool> observe;

  // Returns `base` with every set field replaced.
  Policy ApplyTo(Policy base) const;
};

// One [[tool]] table: how calls to the MCP tools it matches are keyed.
struct ToolRule {
  // Required. An exact tool name, or a glob where '*' matches any run of
  // characters (also none) and '?' exactly one byte.
  std::string match;
  // Key mode (docs/DESIGN.md §3). Unset: `turn` for gated tools, `off` otherwise.
  std::optional<KeyMode> mode;
  // JSON Pointers (RFC 6901) selected by mode = "fields". Required there and
  // allowed nowhere else.
  std::vector<std::string> fields;
  // Name of one of the tool's own arguments (such as "client_token") into
  // which idemgate also writes the key before forwarding. Unset: none.
  std::optional<std::string> key_argument;
  // Overrides the tool's annotations: true gates it even if it says
  // readOnlyHint, false passes it through. Unset: gated unless the
  // annotations say readOnlyHint: true (MCP's defaults make an unannotated
  // tool destructive).
  std::optional<bool> gated;
  // The read-only tool that looks an outcome up when on_unknown = "reconcile"
  // (called with the same arguments). Required with on_unknown = "reconcile".
  std::optional<std::string> reconcile;
  PolicyOverrides overrides;
};

// What one vendor's public documentation says of its idempotency: where it
// reads the key and how long it keeps one ([[route]] profile; README,
// "Vendor profiles").
struct VendorProfile {
  std::string_view name;        // as written in profile = "..."
  std::string_view vendor;      // for people: "Checkout.com"
  std::string_view key_header;  // the request header it dedupes on; empty: a body field
  std::string_view key_field;   // the top-level JSON body member it dedupes on; empty: a header
  // How long it keeps a key, as documented; nullopt where no period is published.
  std::optional<Duration> window;
  std::string_view source;  // the documentation it is read from
};
// Every profile, by name.
const std::vector<VendorProfile>& VendorProfiles();
// The profile called `name`, or nullptr.
const VendorProfile* FindVendorProfile(std::string_view name);

// One [[route]] table: how requests through the HTTP reverse proxy are keyed.
struct RouteRule {
  // Required. A path prefix ("/v1/charges" matches "/v1/charges" and
  // "/v1/charges/ch_1/capture", not "/v1/chargesx") or a glob with '*' / '?'
  // matched against the whole path.
  std::string match;
  // Methods gated on this route. Default POST and PATCH.
  std::vector<std::string> methods = {"POST", "PATCH"};
  // Key mode. Unset: a request with an Idempotency-Key or the turn header is
  // gated, one with neither passes through (IETF draft). "explicit" requires
  // the Idempotency-Key header (missing → 400); "args" gates every request.
  std::optional<KeyMode> mode;
  // JSON Pointers into the request body for mode = "fields".
  std::vector<std::string> fields;
  // The header in which the key is forwarded upstream; a client may also send
  // its key in it. Default "Idempotency-Key"; empty (profile "square"): no
  // header.
  std::string key_header = "Idempotency-Key";
  // The top-level member of a JSON object body in which the key is forwarded
  // when the body has none (Square's "idempotency_key"). Empty: none.
  std::string key_field;
  // The vendor profile (VendorProfiles: "adyen", "checkout", "paypal",
  // "square", "stripe") that set key_header or key_field, and vendor_window,
  // from the vendor's documentation. Unset: none.
  std::optional<std::string> profile;
  // How long the vendor keeps a key: after it, a retry idemgate forwards
  // again (an unknown outcome under on_unknown = "retry", a dead owner's
  // takeover) runs again at the vendor, so a ttl longer than this is warned
  // about at start. Unset: the profile's documented window, if any.
  std::optional<Duration> vendor_window;
  // A read-only route (path, GET) that looks an outcome up when
  // on_unknown = "reconcile". Required with on_unknown = "reconcile". Its
  // contract (route_reconcile.h): 2xx found, the answer stored; 404/410 not
  // found; else cannot tell. So it must answer 404 for a key it does not
  // know: "/v1/charges/by-key/{key}", not a search such as
  // "/v1/charges/search?query={key}", whose 200 and empty list for nothing
  // (and whose index may lag the write) names no outcome.
  std::optional<std::string> reconcile;
  PolicyOverrides overrides;
};

// One [[tenant]]: the principal that records belong to (docs/DESIGN.md §8).
struct Tenant {
  std::string name;                 // required, unique
  std::vector<std::string> tokens;  // bearer tokens; each names exactly one tenant
  bool admin = false;               // its tokens may evict, resolve and list records
};

// [alert]: replay-ratio alerting (docs/DESIGN.md §7).
struct AlertConfig {
  Duration window{5 * 60 * 1000};  // sliding window: 5 min
  uint64_t min_attempts = 20;      // no alert below this many attempts in the window
  double replay_ratio = 0.5;       // alert when (replayed + attached) / attempts exceeds this
  std::string webhook;             // http(s) URL POSTed on an alert; empty: none
};

// [metrics]: the /metrics exposition (docs/DESIGN.md §7).
struct MetricsConfig {
  // Distinct agent hosts (MCP clientInfo names) given a host label of their
  // own; later ones are counted as "other", so that clients cannot grow the
  // series without bound. Default 16.
  size_t max_hosts = 16;
  // Distinct tool labels; later tools are counted as "other". Tool names
  // come from clients (an MCP tools/call, a ledger API begin, an HTTP
  // request's method and path). Default 1000.
  size_t max_tools = 1000;
  // Longest tool label in bytes: a longer name is labelled by its start and
  // a hash of the whole ("~" and 16 hex digits). Default 128.
  size_t max_label_bytes = 128;
};

// [console]: the operator console at /console on `serve`, `http` and
// `mcp --listen` (docs/DESIGN.md §6.4). Every list it shows is bounded here.
struct ConsoleConfig {
  bool enabled = true;  // false: /console answers 404
  // Records waiting as unknown listed at most. Default 100.
  size_t max_records = 100;
  // The list is found from the audit log's `unknown` entries, newest first:
  // at most this many are read to find them. Default 5000.
  size_t scan_attempts = 5000;
  // Most attempts the attempt log page may ask for at once (its limit;
  // the page asks 100 unless told). Default 1000.
  size_t max_attempts = 1000;
  // Points of the replay-ratio chart per tool (the period is cut in this
  // many buckets, one audit log summary each). Default 24.
  size_t chart_buckets = 24;
  // Most tools the chart draws (those with the most attempts). Default 8.
  size_t chart_tools = 8;
};

// [listen]: HTTP listeners of `serve`, `http` and `mcp --listen`.
struct ListenConfig {
  // HOST:PORT of the front. Empty: the command's flag or its default.
  std::string address;
  // HOST:PORT of a separate admin listener (/healthz, /readyz, /metrics).
  // Empty: the admin endpoints are served on every HTTP listener.
  std::string admin;
};

// Where an id that scopes a tools/call (a turn, a session, a call) is read
// (docs/DESIGN.md §6.1), written in the config as
//   "meta:NAME"           the _meta member NAME, a string
//   "meta:NAME#POINTER"   inside the _meta member NAME, a JSON object or JSON
//                         text, the RFC 6901 POINTER: a string or a number
//   "env:VAR"             the proxy's environment variable VAR
//   "header:NAME"         the request header NAME of a Streamable HTTP client
//                         (`idemgate mcp --listen`), such as
//                         "header:Mcp-Param-TurnId": the tool argument a
//                         tool marks with x-mcp-header "TurnId", which the
//                         client mirrors (MCP 2026-07-28, SEP-2243); never
//                         present over stdio
//   "hook:turn"           the turn the agent host's prompt hook (`idemgate
//                         hook`) recorded last for the host that started
//                         this proxy, read when the call is planned
//                         (docs/hosts.md, "Prompt hook"); `turn` is the only
//                         name
struct IdSource {
  enum class Kind { kMeta, kEnv, kHeader, kHook };
  Kind kind = Kind::kMeta;
  std::string name;     // the _meta member, the environment variable, the header or "turn"
  std::string pointer;  // kMeta: into the member's value; empty: the member itself
  std::string text;     // as written, for logs and the attempt log
  bool operator==(const IdSource&) const = default;
};
// kInvalidArgument naming what is wrong with `text`.
Result<IdSource> ParseIdSource(std::string_view text);
// The values `env:` id sources read (the proxy's environment, read once).
using SourceEnvironment = std::map<std::string, std::string, std::less<>>;

// [mcp]: the MCP proxy (docs/DESIGN.md §6.1).
struct McpConfig {
  // Where the turn id is read, first present wins (docs/hosts.md). Default:
  // idemgate's own member, then what VS Code / Copilot chat and Codex send,
  // then the turn of the host's prompt hook (Claude Code, Gemini CLI), last
  // so that a host's own turn id wins.
  // (`turn_id_meta = "NAME"`, the older form, is turn_id = ["meta:NAME"].)
  std::vector<IdSource> turn_id = {
      {IdSource::Kind::kMeta, "dev.idemgate/turnId", "", "meta:dev.idemgate/turnId"},
      {IdSource::Kind::kMeta, "vscode.requestId", "", "meta:vscode.requestId"},
      {IdSource::Kind::kMeta, "x-codex-turn-metadata", "/turn_id",
       "meta:x-codex-turn-metadata#/turn_id"},
      {IdSource::Kind::kHook, "turn", "", "hook:turn"},
  };
  // Where a session id is read when no turn id came: the call is keyed
  // within the session, kept for `window` as a turn fallback, so the same
  // call in another chat session is a new call. Default: VS Code's chat
  // session, Codex's thread, OpenCode's session, Claude Code's session (the
  // environment it gives the servers it starts).
  std::vector<IdSource> session_id = {
      {IdSource::Kind::kMeta, "vscode.conversationId", "", "meta:vscode.conversationId"},
      {IdSource::Kind::kMeta, "x-codex-turn-metadata", "/thread_id",
       "meta:x-codex-turn-metadata#/thread_id"},
      {IdSource::Kind::kMeta, "threadId", "", "meta:threadId"},
      {IdSource::Kind::kMeta, "ai.opencode/sessionID", "", "meta:ai.opencode/sessionID"},
      {IdSource::Kind::kEnv, "CLAUDE_CODE_SESSION_ID", "", "env:CLAUDE_CODE_SESSION_ID"},
  };
  // Where a per-call id is read: a request that repeats a call id the proxy
  // has seen is the same call (a transport re-send), whatever else changed.
  // A call id only ever joins two requests into one call; a new call id
  // never makes a request a new call. Default: Claude Code's tool-use id,
  // Codex's call id, Goose's tool-call request id.
  std::vector<IdSource> call_id = {
      {IdSource::Kind::kMeta, "claudecode/toolUseId", "", "meta:claudecode/toolUseId"},
      {IdSource::Kind::kMeta, "callId", "", "meta:callId"},
      {IdSource::Kind::kMeta, "agent-tool-call-request-id", "",
       "meta:agent-tool-call-request-id"},
  };
  // Where a caller's own idempotency key is read, first present wins; it
  // wins over every derived key. Default idemgate's _meta member; add
  // "header:Mcp-Param-NAME" for a tool whose key argument is marked
  // x-mcp-header "NAME".
  std::vector<IdSource> key = {
      {IdSource::Kind::kMeta, "dev.idemgate/idempotencyKey", "", "meta:dev.idemgate/idempotencyKey"},
  };
  // Call ids remembered per session, oldest forgotten first. Default 4096.
  size_t max_call_ids = 4096;
  // Where `idemgate hook` writes each host's current turn and `hook:turn`
  // reads it (one small file per host process). Created mode 0700 if
  // missing (its parent must exist); refused when it is a symbolic link,
  // not owned by this user, or writable by group or others. Empty (the
  // default): $XDG_RUNTIME_DIR/idemgate when XDG_RUNTIME_DIR is a
  // directory, else /tmp/idemgate-UID.
  std::string hook_dir;
  // Most bytes of the host's JSON `idemgate hook` reads from stdin (it
  // carries the prompt's text); the rest is read and discarded, and a cut
  // input still starts a new turn, without a session. Default 1 MiB.
  size_t hook_max_input_bytes = 1 << 20;
  // Gated calls one process runs at once, across its sessions; past it a
  // call is refused with a retryable error. Default 256.
  size_t max_in_flight = 256;
  // Once the proxy stops (SIGINT, SIGTERM, SIGHUP, or the client's end of
  // input), how long the calls in flight have to settle; one still running
  // after it is marked outcome unknown. Shorter than the hosts wait before
  // they kill their MCP servers: Claude Code sends SIGKILL 500 ms after its
  // SIGINT, Codex 2 s after its SIGTERM (docs/hosts.md). Default 300 ms;
  // zero: none.
  Duration stop_grace{300};
  // How long a forwarded gated call waits for its upstream's answer; none
  // by then and the record is marked outcome unknown (the tool may still be
  // running), the client told so, and a late answer still stored at the
  // call's fence. It frees the call's budget slot and lets retries see
  // `unknown` instead of `in progress` for ever. By the ledger's clock.
  // Default 10 min; zero: no limit.
  Duration call_timeout{10 * 60 * 1000};
  // A gated call in turn mode whose turn (or session) called the same tool
  // with other arguments at most this long before is a re-planned retry:
  // it runs, and its attempt is logged executed_again naming the earlier
  // key (docs/hosts.md). Default 5 min; zero switches it off.
  Duration replan_window{5 * 60 * 1000};
  // (turn, tool) pairs remembered per session for replan_window, oldest
  // forgotten first. Default 1024.
  size_t max_replan_pairs = 1024;
  // The extra optional argument gated tools get for deliberate repeats.
  // Default "repeat_nonce"; nullopt (repeat_nonce = false) switches it off.
  std::optional<std::string> repeat_nonce = "repeat_nonce";
  // Add a text content block to replayed results saying that the action was
  // not performed again. Default true.
  bool replay_text = true;
  // The tenant of records made through stdio (no bearer token there).
  // Default "default".
  std::string tenant = "default";
  // What the records of this proxy are scoped to (docs/DESIGN.md §3): a
  // call is only ever answered from a record made through the same
  // upstream. Unset: derived from the upstream, "u" + 12 hex of the SHA-256
  // of the server's command line (or of --upstream-url), so two servers
  // behind one host never share records. Set it to name the upstream
  // yourself (1..64 of A-Za-z0-9_-.:), e.g. to keep records when the
  // server's command line changes; "" shares one scope between every
  // upstream of the store (the behaviour before scopes).
  std::optional<std::string> scope;
};

// [http]: the HTTP reverse proxy (docs/DESIGN.md §6.2).
struct HttpConfig {
  // The request header that carries the turn id. Default "Idemgate-Turn-Id".
  std::string turn_header = "Idemgate-Turn-Id";
  // Longest Idempotency-Key accepted, 1..255 bytes; longer → 400. Default 255.
  size_t max_key_bytes = 255;
  // PEM file of CAs trusted for an https upstream, in addition to the system
  // store. Empty: the system store only. Default empty.
  std::string upstream_ca_file;
  // Verify the upstream's certificate and host name. Default true.
  bool upstream_verify_tls = true;
  // DNS + TCP connect + TLS handshake of a new upstream connection. Default 5 s.
  Duration upstream_connect_timeout{5'000};
  // Sending a request and receiving its whole answer; after that the outcome
  // is unknown (504). A pass-through answer, streamed: its header, then each
  // piece of its body. With upstream_connect_timeout, it must stay below
  // every route's lease (`idemgate http` refuses to start otherwise), so a
  // lease never runs out while the vendor may still act. Default 20 s.
  Duration upstream_timeout{20'000};
  // An idle upstream connection is not reused after this long: below the
  // server's own idle timeout (gunicorn's is 2 s), else a request written
  // into a connection the server is closing ends unknown. Default 1 s.
  Duration upstream_idle_timeout{1'000};
  // Idle upstream connections kept for reuse. Default 64.
  size_t max_idle_connections = 64;
  // Largest answer body to a gated request (read whole, since it is stored);
  // a larger one is not relayed (502) and the record keeps a too-large
  // marker. Pass-through answers are streamed, whatever their size.
  // Default 16 MiB.
  size_t max_response_bytes = 16 << 20;
  // Without [[tenant]] tokens, records are scoped by the vendor credential a
  // request carries: the first of these headers present (case-insensitive).
  // List every header the vendor authenticates with ("X-Goog-Api-Key",
  // "Cookie", ...): requests without one share one scope. Default
  // Authorization, X-Api-Key, Api-Key.
  std::vector<std::string> credential_headers = {"Authorization", "X-Api-Key", "Api-Key"};
  // Key of the HMAC-SHA-256 that turns a credential into its scope. Empty:
  // plain SHA-256 (a weak credential can then be checked offline against a
  // scope seen in a log). Changing it changes every scoped record key.
  // Default empty.
  std::string credential_scope_secret;
};

// [limits]: request limits (docs/DESIGN.md §8).
struct LimitsConfig {
  size_t max_body_bytes = 1 << 20;  // request body / tool arguments: 1 MiB
  size_t max_depth = 128;           // JSON nesting
  // Audit entries waiting for a store that writes more slowly than calls
  // arrive; past it new ones are dropped and reported (AttemptLog).
  size_t max_audit_backlog = 100'000;
  // Threads of each worker pool (blocking ledger and store work of a front,
  // the console, /readyz, lease heartbeats); past it tasks queue until a
  // thread is free. Default 256.
  size_t max_worker_threads = 256;
  // A pool thread idle this long exits. Default 60 s.
  Duration worker_idle_timeout{60'000};
};

// [replay_cache]: completed records kept in memory so that retries skip the
// store (CachingStore). Only above a store that announces evictions to every
// instance, which every store does (SQLite by its eviction bell, given an
// inotify instance).
struct ReplayCacheConfig {
  bool enabled = true;
  size_t max_bytes = 64 << 20;  // 64 MiB, least recently used out first
};

struct Config {
  // Store URL. Empty: DefaultStoreUrl() (the user's state directory).
  // The --store flag overrides it.
  std::string store;
  Policy defaults;                // [defaults]
  std::vector<ToolRule> tools;    // [[tool]], in file order
  std::vector<RouteRule> routes;  // [[route]], in file order
  std::vector<Tenant> tenants;    // [[tenant]]; none: one "default" tenant, loopback only
  AlertConfig alert;
  MetricsConfig metrics;
  ConsoleConfig console;
  ListenConfig listen;
  McpConfig mcp;
  HttpConfig http;
  LimitsConfig limits;
  ReplayCacheConfig replay_cache;
  std::string source;  // where it was loaded from ("" when built in code)

  // The first [[tool]] rule whose `match` matches `tool`, or nullptr.
  const ToolRule* RuleFor(std::string_view tool) const;
  // The policy for `tool`: [defaults] with the first matching rule's
  // overrides applied on top.
  Policy PolicyFor(std::string_view tool) const;
  // The key mode for `tool`. `mutating` is what the tool's annotations say
  // (not readOnlyHint). The first matching rule's `mode` wins; else its
  // `gated`; else turn for mutating tools and off for read-only ones.
  KeyMode ModeFor(std::string_view tool, bool mutating) const;

  // The first [[route]] rule matching `path` whose methods include `method`
  // (case-insensitive), or nullptr: the request passes through ungated.
  const RouteRule* RouteFor(std::string_view method, std::string_view path) const;
  Policy PolicyForRoute(std::string_view method, std::string_view path) const;

  // The tenant whose tokens include `token`, or nullptr.
  const Tenant* TenantForToken(std::string_view token) const;
};

// Reads and parses the file at `path`. kNotFound if it does not exist,
// kUnavailable if it cannot be read, otherwise as ParseConfig.
Result<Config> LoadConfig(const std::string& path);

// Parses TOML text. `source_name` names it in messages ("idemgate.toml").
// kInvalidArgument with every problem found, one per line, each as
// "<source>:<line>:<column>: <what is wrong and what is accepted>".
Result<Config> ParseConfig(std::string_view toml_text, std::string_view source_name);

// Glob match over bytes: '*' any run (also empty), '?' exactly one byte;
// every other byte matches itself. A pattern without '*' or '?' is an exact
// name.
bool GlobMatch(std::string_view pattern, std::string_view name);

// "24h", "30s", "500ms", "1h30m", "5m", "2d": one or more <digits><unit>
// with units d, h, m, s, ms, largest first, each at most once.
// kInvalidArgument otherwise (the message names the accepted forms).
Result<Duration> ParseDuration(std::string_view text);
// Formats the largest-first form ParseDuration accepts ("1h30m", "500ms", "0s").
std::string FormatDuration(Duration d);

// "1048576", "512KiB", "1MiB", "1GiB", "1KB", "1MB", "1GB", "10B".
// kInvalidArgument otherwise.
Result<size_t> ParseSize(std::string_view text);

}  // namespace idem
