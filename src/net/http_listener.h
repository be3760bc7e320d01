// idemgate's one HTTP/1.1 server, under every HTTP front: `idemgate serve` (the
// ledger API, docs/DESIGN.md §6.3), `idemgate http` (the Idempotency-Key reverse
// proxy, §6.2) and `idemgate mcp --listen` (MCP's Streamable HTTP, §6.1,
// fronts/mcp/http_server.cc). Boost.Beast, asynchronous: a few I/O threads serve every
// connection; the handler gets whole requests (headers and a body within
// max_body_bytes) and answers each exactly once, from any thread, whenever it
// is ready. Keep-alive, one request at a time per connection (no pipelining
// of answers: the next request is read after the answer is written). An
// answer's body may also come piece by piece (Response::stream), written as
// it comes, and may stay open with no deadline while it waits for its source,
// with a keep-alive piece (an SSE comment) written whenever the source is
// quiet for a while. A handler whose answer may wait long (an MCP stream)
// can ask, through Request::hooks, to learn that the client left, and to be
// called back once after a delay while its answer is still pending.
//
// The listener enforces the limits of §8 before a handler sees anything:
// header count and size (431), body size (413), connections (503), a whole
// request within read_timeout (a slow client is disconnected, 408 when part
// of a request had arrived), bearer tokens (401), loopback-only binding
// without tokens. Every refusal is an application/problem+json body
// (RFC 9457) that says what was wrong and what to do.
//
// Thread-safe. The handler runs on an I/O thread and must not block: work
// that may block (Ledger::Begin waits up to policy.wait) goes to a worker
// pool, which answers through the Responder later.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace boost::asio {
class io_context;
}

namespace idem::http {

struct Header {
  std::string name;  // as received or as to be sent
  std::string value;
};

// Appends "name: value\r\n", a header line of a message's head as the
// listener and the HTTP client write them.
void AppendHeaderLine(std::string& out, std::string_view name, std::string_view value);

// Who sent a request, from its bearer token.
struct Principal {
  std::string tenant = "default";
  // May evict, resolve and list records, and read /metrics. Without tokens
  // configured (loopback only) every caller is admin.
  bool admin = true;
};

class RequestHooks;

struct Request {
  std::string method;           // "POST"
  std::string target;           // as received: "/v1/charges?expand=customer"
  std::string path;             // target up to '?', undecoded: "/v1/charges"
  std::string query;            // after '?', undecoded; empty when none
  std::vector<Header> headers;  // in received order
  std::string body;
  std::string remote;  // peer "127.0.0.1:53122"
  Principal principal;
  // The request's line to its connection (see RequestHooks); null for a
  // request that did not come from a listener (tests).
  std::shared_ptr<RequestHooks> hooks;

  // The first header named `name` (ASCII case-insensitive), or nullopt.
  std::optional<std::string_view> FindHeader(std::string_view name) const;
  // How many headers are named `name` (a repeated Idempotency-Key is an error).
  size_t CountHeader(std::string_view name) const;
};

// A response body that arrives piece by piece (a pass-through answer relayed
// while the upstream still sends it: a download, a text/event-stream).
class BodySource {
 public:
  struct Piece {
    std::string data;     // the next bytes; may be empty
    bool last = false;    // the body ends after `data`
    bool failed = false;  // the body broke off: the listener closes the connection
  };
  virtual ~BodySource() = default;
  // Asks for the next piece. `next` is called exactly once, from any thread,
  // possibly before Next returns. The listener asks again only once it has
  // written the piece to the client: a slow client slows the source down.
  virtual void Next(std::function<void(Piece)> next) = 0;
  // The client is gone or the listener stops: the source lets go of what it
  // holds. At most once; a Next still pending may still call back, or not.
  virtual void Cancel() = 0;
};

struct Response {
  int status = 200;
  // Sent as given, in order. The listener sets Content-Length, Date,
  // Connection and Transfer-Encoding itself and drops any the handler set.
  std::vector<Header> headers;
  std::string body;
  // Set: the body is read from here instead of `body`, and written as it
  // comes, with Content-Length `stream_length` when known, else chunked (or,
  // to an HTTP/1.0 client, delimited by closing the connection). Each piece
  // is written within write_timeout; waiting for the source has no deadline
  // of the listener's (the source has its own).
  std::shared_ptr<BodySource> stream;
  std::optional<uint64_t> stream_length;
  // A streamed answer whose source has given nothing for `idle_interval`
  // gets `idle_piece` written (an SSE keep-alive comment, so that
  // intermediaries keep the stream open), and again after each further
  // interval of silence. Zero or an empty piece: never.
  std::chrono::milliseconds idle_interval{0};
  std::string idle_piece;
};

// What a handler may ask of the connection while its answer is pending: for
// answers that wait long (MCP's streams, docs/DESIGN.md §6.1). Call only
// during the handler's own call (on the I/O thread, before it returns);
// later calls are ignored. The callbacks run on the connection's I/O thread
// and must not block.
class RequestHooks {
 public:
  virtual ~RequestHooks() = default;
  // Runs `on_gone` once if the connection closes before the answer has been
  // written in full: the client left (the listener then watches the socket
  // while the answer is pending, keeping bytes of a next request for later),
  // a write failed, or the listener stopped. Not called once the answer is
  // written.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
  // Runs `fn` once after `delay` if the handler has not answered by then
  // (the Responder may be called from it). At most one per request; a later
  // call replaces the earlier one.
  virtual void After(std::chrono::milliseconds delay, std::function<void()> fn) = 0;
};

// An RFC 9457 problem: Content-Type application/problem+json, body
// {"type": "https://idemgate.dev/problems/<type>", "title", "status",
//  "detail", ...extra members}. `extra_json` is a JSON object's members
// without the braces ("\"key\":\"v1t...\",\"retry_after\":3"), or empty.
Response Problem(int status, std::string_view type, std::string_view title, std::string_view detail,
                 std::string_view extra_json = {});

// Answers a request. Call exactly once, from any thread; calls after the
// connection closed are ignored (cheap).
using Responder = std::function<void(Response)>;
// Handles one request. Runs on an I/O thread: must not block.
using Handler = std::function<void(Request request, Responder respond)>;

struct ListenerOptions {
  // HOST:PORT to bind; port 0 picks a free one (see bound_address()).
  std::string listen = "127.0.0.1:0";
  // Largest request body; larger → 413 (Content-Length checked before
  // reading; chunked bodies as they arrive). Config limits.max_body_bytes.
  size_t max_body_bytes = 1 << 20;
  // Largest request header block → 431. Default 16 KiB.
  size_t max_header_bytes = 16 * 1024;
  // Most header fields in one request → 431. Default 100.
  size_t max_header_count = 100;
  // Concurrent connections; more are answered 503 and closed. Default 1024.
  size_t max_connections = 1024;
  // A whole request (headers and body) must arrive within this, counted from
  // when the listener starts waiting for it (keep-alive idle time included).
  // Default 30 s.
  std::chrono::milliseconds read_timeout{30'000};
  // Writing one answer must finish within this, or the connection is
  // dropped. Default 30 s.
  std::chrono::milliseconds write_timeout{30'000};
  // I/O threads. Default 2.
  int threads = 2;
  // Run on this io_context's threads (net::IoThreads) instead of `threads`
  // of the listener's own: `idemgate http` shares them with its upstream
  // client and its store. It must outlive the listener, and its threads
  // must run until Stop() has returned. Default: none.
  boost::asio::io_context* io = nullptr;

  // Maps a bearer token to its principal; nullopt for an unknown token
  // (→ 401). Unset (no tokens configured): no Authorization is needed, every
  // request is tenant "default" with admin rights, and only loopback
  // addresses may be bound unless insecure_no_auth.
  std::function<std::optional<Principal>(std::string_view token)> authenticate;
  // Exact paths served without a token even when tokens are configured.
  // Without a valid token such a request's principal is tenant "" without
  // admin rights.
  std::vector<std::string> public_paths = {"/healthz", "/readyz"};
  // Allow binding a non-loopback address without tokens (--insecure-no-auth).
  bool insecure_no_auth = false;
  // DNS-rebinding protection: on a loopback listener without tokens, a
  // request whose Host is neither a loopback name (localhost, 127.0.0.1,
  // [::1]) nor one of these host names (case-insensitive, no port) gets 403.
  // Default none.
  std::vector<std::string> allowed_hosts;
  // Check Host as above on a loopback listener with tokens too (the MCP
  // endpoint does: its bearer tokens are often configured in the very
  // clients a rebinding page could reach). Default false.
  bool check_host_with_tokens = false;
  // Renders the listener's own refusals (400 malformed, 401, 403 for a
  // foreign Host, 408, 413, 431, 503 for too many connections) in a front's
  // dialect (MCP: a JSON-RPC error body). Gets the status, the problem type
  // ("body-too-large") and the detail (what was wrong and what to do); the
  // listener adds Retry-After or WWW-Authenticate where they belong. Unset:
  // application/problem+json (Problem()).
  std::function<Response(int status, std::string_view type, std::string_view detail)>
      render_refusal;
  // Names the front in log lines and the "listening on" line ("serve").
  std::string name = "http";
  // Print "idemgate <name>: listening on http://HOST:PORT" to stderr once bound.
  bool announce = true;
};

class HttpListener {
 public:
  // Binds and starts serving. kInvalidArgument for a bad address or a
  // non-loopback address without tokens (unless insecure_no_auth);
  // kUnavailable if the address cannot be bound.
  static Result<std::unique_ptr<HttpListener>> Start(const ListenerOptions& options,
                                                     Handler handler);
  ~HttpListener();  // Stop()s

  // "127.0.0.1:41873": the address actually bound.
  std::string bound_address() const;
  // "http://127.0.0.1:41873".
  std::string url() const;

  // Graceful stop, first half: stops accepting, closes idle keep-alive
  // connections, and lets each request in flight get its answer, after which
  // its connection closes. Returns true once every connection has closed,
  // false if some were still open after `grace` (Stop() then drops them).
  // Not from a handler.
  bool Drain(std::chrono::milliseconds grace);

  // Stops accepting, closes every connection (answers not yet sent are
  // dropped) and joins the I/O threads, or, on the caller's io_context,
  // waits until every connection is gone. Idempotent. Not from a handler,
  // nor from a thread of that io_context.
  void Stop();

  struct Impl;

 private:
  explicit HttpListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// /healthz, /readyz and /metrics (docs/DESIGN.md §6.4) in front of another handler.
struct AdminEndpoints {
  // /readyz: 200 when this returns OK (the store answered), else 503: with
  // the error for an admin principal, a generic reason for anyone else. Unset: /readyz is 200 like /healthz.
  std::function<Result<void>()> ready;
  // /metrics: Prometheus text exposition format 0.0.4. Unset: 404.
  // Needs an admin principal.
  std::function<std::string()> metrics;
  // How long /readyz waits for `ready` before answering 503. A check still
  // running is not started again: later probes wait for the same one.
  // Default 2 s.
  std::chrono::milliseconds ready_timeout{2'000};
  // Where /readyz writes why the store is not ready (once per change of
  // reason): the public 503 names no host, path or store message, only an
  // admin caller's does (security review F15). Unset: not logged.
  std::function<void(std::string_view)> log;
};
// A handler that answers the admin paths (GET or HEAD) itself and passes
// every other request to `next`. `ready` and `metrics` may block briefly;
// they run off the I/O thread.
Handler WithAdmin(AdminEndpoints admin, Handler next);

}  // namespace idem::http
