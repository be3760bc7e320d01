// MCP's Streamable HTTP transport, both ways, as Channels for McpSession:
//
//   HttpMcpServer       `idemgate mcp --listen HOST:PORT`: clients speak
//                       Streamable HTTP to us at /mcp; every client session
//                       becomes one client Channel handed to a factory.
//   ConnectHttpUpstream `idemgate mcp --upstream-url URL`: we speak
//                       Streamable HTTP to an upstream MCP server; the
//                       upstream Channel POSTs each message.
//
// Protocol revisions 2024-11-05 … 2025-11-25 (initialize, Mcp-Session-Id,
// GET stream, DELETE) and the stateless 2026-07-28 dialect (server/discover,
// no session, per-request metadata headers) are all accepted.
//
// ── Delivery failures on the upstream channel ──────────────────────────────
// The ledger must tell "the request never reached the upstream" (release the
// claim: nothing happened) from "it was sent but no answer came" (outcome
// unknown). The upstream channel reports both, per request, as a JSON-RPC
// error response it synthesises for that request's id and delivers through
// on_message like any other response:
//
//   {"jsonrpc":"2.0","id":<the request's id>,"error":{
//      "code":    -31001 (kNotSentErrorCode) | -31002 (kMaybeSentErrorCode),
//      "message": "idemgate: <what happened, for people>",
//      "data":    {"idemgate":"not_sent" | "maybe_sent",
//                  "detail":"<same, short>", "http_status":<int, when an
//                  HTTP status was received>, "nonce":"<per-process secret>"}}}
//
//   not_sent    the request certainly did not execute: DNS failure, connection
//               refused, TLS failure, the request could not be written, the
//               upstream refused it with a 4xx before processing (including
//               404 for an expired session), or the channel was closed before
//               it was sent.
//   maybe_sent  the request was written but no response came: the connection
//               broke or timed out after the write, an HTTP 5xx without a
//               JSON-RPC answer, or the response stream ended without the
//               response (and could not be resumed).
//
// Codes lie outside JSON-RPC's reserved range, as MCP asks for
// implementation-defined errors. Use ClassifyDeliveryFailure() rather than
// reading data.idemgate yourself: it also checks the nonce, so an upstream
// cannot forge a not_sent answer (which would release a claim whose side
// effect happened) — a forged or relayed marker classifies as nullopt, i.e.
// an ordinary upstream error. Notifications and responses sent upstream get
// no synthesised answer (there is no id to answer); their failures are logged.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "fronts/mcp/channel.h"
#include "net/http_listener.h"

namespace idem::mcp {

// ── Server ──────────────────────────────────────────────────────────────────

// What the server knows about a new client session.
struct HttpSessionInfo {
  std::string session_id;  // Mcp-Session-Id; empty for the stateless (2026-07-28) session
  std::string tenant;      // from the bearer token; "default" when no tokens are configured
  bool stateless = false;  // the shared per-tenant session of sessionless clients
};

// Called once per new client session, on that session's own thread (so it may
// block, e.g. to spawn an upstream child process). It must call
// client->Start(...) — typically by building an McpSession around it — and
// keep `client` alive until its on_closed ran. Messages the client already
// POSTed wait for Start. To refuse the session, call client->Close(): requests
// waiting on it are answered with a JSON-RPC error.
using HttpSessionFactory =
    std::function<void(std::shared_ptr<Channel> client, const HttpSessionInfo& info)>;

// Nesting levels a message adds around a tools/call's arguments (message,
// params, arguments), with room to spare.
inline constexpr size_t kEnvelopeDepth = 8;

// The server runs on idemgate's one HTTP server (net/http_listener.h): the
// fields it shares with ListenerOptions (listen, the limits, the timeouts,
// max_connections, threads, authenticate, allowed_hosts, insecure_no_auth)
// mean the same there, and its own refusals (413, 431, 408, 401, 403, 503)
// come as JSON-RPC error bodies.
struct HttpServerOptions {
  // HOST:PORT to bind. Port 0 picks a free port (see bound_address()).
  // Default: loopback on an OS-chosen port.
  std::string listen = "127.0.0.1:0";
  // The MCP endpoint path. Default "/mcp". /healthz, /readyz and /metrics
  // are served beside it.
  std::string path = "/mcp";

  // Largest accepted request body (config limits.max_body_bytes); larger → 413.
  size_t max_body_bytes = 1 << 20;
  // Largest accepted request header block; larger → 431. Default 16 KiB.
  size_t max_header_bytes = 16 * 1024;
  // Most header fields in one request; more → 431. Default 100.
  size_t max_header_count = 100;
  // JSON nesting accepted in a body: config limits.max_depth, plus
  // kEnvelopeDepth for the JSON-RPC envelope. Default 136.
  size_t max_json_depth = 136;
  // A whole request (headers and body) must arrive within this, counted from
  // the first moment the server waits for it, including keep-alive idle time.
  // A slow or stalled client is answered 408 (an idle one is just closed) and
  // disconnected, without holding anyone else up. Default 30 s.
  std::chrono::milliseconds read_timeout{30'000};
  // One write to a client must complete within this, or the connection is
  // dropped (a client that stops reading its SSE stream). Default 30 s.
  std::chrono::milliseconds write_timeout{30'000};
  // An SSE stream with nothing to say gets a comment line this often so that
  // intermediaries keep it open. Zero disables. Default 15 s.
  std::chrono::milliseconds sse_keepalive{15'000};
  // A session with no open stream and no request for this long is ended
  // (its upstream closed). Zero disables. Default 30 min.
  std::chrono::milliseconds session_idle_timeout{30 * 60'000};
  // Concurrent connections; more are answered 503 and closed. Default 256.
  size_t max_connections = 256;
  // Concurrent sessions; an initialize beyond it is answered 503. Default 64.
  size_t max_sessions = 64;
  // Concurrent sessions of one tenant (its stateless session included); an
  // initialize beyond it is answered 503, so that one tenant cannot hold
  // every session (security review F6). Zero: only max_sessions. Default 0.
  size_t max_sessions_per_tenant = 0;
  // A session is ended this long after it began, open GET stream or not (a
  // stream keeps a session from ever being idle); the client starts a new one
  // on its next request's 404. Zero: never. Default 24 h.
  std::chrono::milliseconds session_lifetime{24 * 3'600'000};
  // Server-initiated messages buffered per session while the client has no
  // stream open to receive them; beyond it the oldest are dropped. Default 256.
  size_t max_undelivered = 256;
  // I/O threads. They only parse and write HTTP (handlers run on each
  // session's own thread), which one thread does for thousands of calls a
  // second; a second thread sharing the io_context costs about two extra
  // context switches per call (idle threads woken for each completion),
  // measured by bench/mcp/switches.py --http. Default 1.
  int threads = 1;

  // Origins allowed in addition to loopback ones ("https://app.example"),
  // exact, case-insensitive. A request whose Origin is neither → 403.
  std::vector<std::string> allowed_origins;
  // Host names (no port) allowed in the Host header while bound to loopback,
  // in addition to loopback names (checked with tokens configured too).
  // Default none.
  std::vector<std::string> allowed_hosts;
  // Exact paths served without a token besides /healthz and /readyz (the
  // console's page: console::Console::PublicPaths()). Default none.
  std::vector<std::string> public_paths;

  // Maps a bearer token to its tenant; nullopt for an unknown token. Unset
  // (no tokens configured): no Authorization is required, every session
  // belongs to tenant "default", and only loopback addresses may be bound
  // unless insecure_no_auth.
  std::function<std::optional<std::string>(std::string_view token)> authenticate;
  // Allow binding a non-loopback address without tokens (--insecure-no-auth).
  bool insecure_no_auth = false;

  // Admin endpoints beside /healthz (docs/DESIGN.md §6.4), GET or HEAD,
  // served by http::WithAdmin: both run on its worker thread, never on the
  // I/O threads, and may block briefly.
  // /readyz: 200 when `ready` returns OK, else 503 with its error; no token
  // needed. Unset: 200 like /healthz.
  std::function<Result<void>()> ready;
  // /metrics: `metrics()`, the Prometheus text exposition (format 0.0.4).
  // Unset: 404. With `authenticate` set it needs a bearer token for which
  // `is_admin` is true (an admin tenant's); unset is_admin then refuses all.
  std::function<std::string()> metrics;
  std::function<bool(std::string_view token)> is_admin;
  // Requests for /console and under it (the operator console, which every
  // HTTP front serves: fronts/console/console.h) go to this handler after
  // the Host check (the console checks Origin itself), with the principal of
  // their bearer token (on public_paths, tenant "" without admin rights when
  // the token is missing or unknown; elsewhere such a request is refused 401
  // first). Unset: 404.
  idem::http::Handler console;

  // Request headers handed to the session with each tools/call besides
  // Mcp-Param-* (the header: id sources of [mcp]), case-insensitive.
  // Default none.
  std::vector<std::string> carried_headers;

  // Print "idemgate: listening on http://HOST:PORT/mcp" to stderr once bound.
  bool announce = true;
};

// Serves Streamable HTTP until Stop(). Each client session gets a Channel
// (its POSTed messages arrive through on_message; Send routes answers to the
// waiting POST stream, other messages to the POST stream open or the GET
// stream) handed to the session factory.
//
// Thread-safe. Stop() may be called from any thread but not from a session
// factory or a channel handler.
class HttpMcpServer {
 public:
  // Binds and starts serving. kInvalidArgument for a bad address or a
  // non-loopback address without tokens (unless insecure_no_auth);
  // kUnavailable if the address cannot be bound.
  static Result<std::unique_ptr<HttpMcpServer>> Start(const HttpServerOptions& options,
                                                      HttpSessionFactory on_session);
  // Same, for a factory that needs only the channel.
  static Result<std::unique_ptr<HttpMcpServer>> Start(
      const HttpServerOptions& options, std::function<void(std::shared_ptr<Channel>)> on_session);

  ~HttpMcpServer();  // Stop()s

  // "127.0.0.1:41873": the address actually bound.
  std::string bound_address() const;
  // "http://127.0.0.1:41873/mcp".
  std::string url() const;

  // Stops accepting, ends every session (each channel's on_closed runs with
  // "server stopping"), closes connections and joins the I/O threads.
  // Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpMcpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// ── Client (upstream) ───────────────────────────────────────────────────────

struct HttpClientOptions {
  // Extra request headers sent with every request (e.g. {"Authorization",
  // "Bearer ..."}). Default none.
  std::vector<std::pair<std::string, std::string>> headers;
  // Resolve + connect + TLS handshake must finish within this. Default 10 s.
  std::chrono::milliseconds connect_timeout{10'000};
  // A POST's response must complete within this; zero waits as long as the
  // upstream keeps the connection open (tools may run for minutes; the
  // ledger's lease covers liveness). Timing out makes the request maybe_sent.
  // Default zero.
  std::chrono::milliseconds response_timeout{0};
  // Largest accepted JSON response body or SSE event. Default 64 MiB.
  size_t max_message_bytes = 64 << 20;
  // JSON nesting accepted when inspecting upstream messages. Default 512.
  size_t max_json_depth = 512;
  // Requests in flight at once (each POST on its own keep-alive connection);
  // further requests queue in order. Notifications and responses never wait
  // behind them. Default 32.
  size_t max_connections = 32;
  // An idle keep-alive connection is reused only if it has been idle for less
  // than this (servers close idle connections after a few seconds; a request
  // written into a connection the server is closing would be maybe_sent).
  // Default 1 s, below gunicorn's 2 s.
  std::chrono::milliseconds max_idle_reuse{1'000};
  // Open the GET stream for server-initiated messages once the session is
  // initialised (405 from the upstream is fine). Default true.
  bool open_get_stream = true;
  // Verify the upstream's TLS certificate and host name against the system
  // trust store (and ca_file). Default true; false is for tests only.
  bool verify_tls = true;
  // Extra CA bundle (PEM) to trust. Default none.
  std::string ca_file;
};

// A Channel to the upstream MCP server at `url` (http:// or https://).
// Nothing is connected until the first Send. kInvalidArgument for a URL that
// is not absolute http(s); kUnavailable if the TLS trust store cannot be
// loaded. See the delivery-failure convention at the top of this file.
// Close() sends DELETE for the session (best effort) and ends the channel
// once in-flight requests finish (at most a few seconds). A 404 for our
// session id closes the channel with "upstream session expired".
Result<std::shared_ptr<Channel>> ConnectHttpUpstream(const std::string& url,
                                                     const HttpClientOptions& options = {});

// ── Delivery-failure convention ─────────────────────────────────────────────

inline constexpr int kNotSentErrorCode = -31001;
inline constexpr int kMaybeSentErrorCode = -31002;

enum class DeliveryFailure {
  kNotSent,    // never reached the upstream: release
  kMaybeSent,  // sent, no answer: outcome unknown
};

// If `message` is an error response synthesised by an HTTP upstream channel
// of this process, what it reports; nullopt for anything else (ordinary
// responses, upstream errors, forged markers). Cheap for non-errors.
std::optional<DeliveryFailure> ClassifyDeliveryFailure(std::string_view message);

// The error response an upstream channel synthesises (exposed for tests and
// for other transports that need the same convention). `id_json` is the
// request's id as JSON; `http_status` 0 means none.
std::string MakeDeliveryFailure(std::string_view id_json, DeliveryFailure failure,
                                std::string_view detail, int http_status = 0);

}  // namespace idem::mcp
