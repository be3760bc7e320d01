// The one HTTP/1.1 client of idemgate, for its upstreams: the reverse proxy's
// vendor (`idemgate http`, docs/DESIGN.md §6.2) and the MCP server behind
// `idemgate mcp --upstream-url` (§6.1). Keep-alive connections, plain or TLS
// (OpenSSL, certificates verified by default against the system store plus
// an optional CA file, SNI sent for names), connect and response timeouts,
// a response body limit, and answers whose body is read piece by piece.
//
// Every exchange ends in exactly one HttpClientResult, and a failure says
// whether the request can have reached the upstream — the distinction the
// ledger needs (§4.7):
//   kNotSent   the request's head never got out whole: DNS failure,
//              connection refused, connect timeout, TLS failure, the write
//              failed or was cancelled before the head was handed over.
//              Nothing happened.
//   kMaybeSent the head was written (the body perhaps not all: a server may
//              act on the head and answer or reset early), then the
//              connection broke, closed, was cancelled, or no whole answer
//              came within the response timeout (timed_out), or the answer's
//              body was over max_response_bytes (too_large, status known), or
//              a whole-body answer had neither Content-Length nor chunking,
//              so its end cannot be told from a cut (eof_delimited, status
//              known). The side effect may have happened.
//
// An idle connection is reused only while younger than max_idle and still
// open: a server closes idle connections on its own schedule, and a request
// written into one it is closing would end maybe-sent for nothing. A close
// still on its way when the request is written cannot be seen; max_idle
// below the server's own idle timeout is what avoids it.
//
// A streamed answer (HttpClientRequest::stream) keeps its connection until
// the body has been read to its end (then it is pooled) or cancelled (then it
// is closed); a piece that does not come within the piece timeout, or a
// connection that breaks, ends the body as failed.
//
// One client serves one origin (scheme, host, port). Its I/O threads (its
// own, or the caller's io_context) run every exchange asynchronously
// (Boost.Beast); callbacks run on them and must not block. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/error.h"
#include "net/http_listener.h"

namespace boost::asio {
class io_context;
}

namespace idem::net {

struct HttpClientOptions {
  // The upstream: "https://api.vendor.example" or "http://127.0.0.1:8080/base".
  // A path is prefixed to every request target; a query is refused (each
  // request brings its own). Required.
  std::string url;
  // DNS, TCP connect and the TLS handshake of a new connection must finish
  // within this. Default 5 s.
  std::chrono::milliseconds connect_timeout{5'000};
  // Writing a request and reading its whole answer must finish within this;
  // for a streamed answer, its header and then each piece. Zero: no limit.
  // A request may override it. Default 60 s.
  std::chrono::milliseconds response_timeout{60'000};
  // An idle connection is not reused after this long. Below the idle
  // timeouts of common servers (gunicorn 2 s, Node, Apache and uvicorn 5 s,
  // nginx 75 s): a request written into a connection the server is closing
  // ends maybe-sent for nothing. Default 1 s.
  std::chrono::milliseconds max_idle{1'000};
  // Idle connections kept for reuse; more are closed. Default 64.
  size_t max_idle_connections = 64;
  // Largest answer body read whole; a larger one ends kMaybeSent with
  // too_large. Not for a streamed answer. Default 16 MiB.
  size_t max_response_bytes = 16 << 20;
  // Verify the upstream's certificate chain and host name. Default true;
  // false is for tests only.
  bool verify_tls = true;
  // PEM file of extra trusted CAs, added to the system store. Default none.
  std::string ca_file;
  // I/O threads of the client's own io_context (not used with the caller's).
  // Default 2.
  int threads = 2;
  // What the user calls ca_file, for messages. Default "ca_file".
  std::string ca_option = "ca_file";
};

struct HttpClientRequest {
  std::string method;  // "POST"
  std::string target;  // "/v1/charges?expand=x", appended to the URL's path
  // Sent as given, in order. The client sets Host, Content-Length and
  // Connection itself (given ones, and Transfer-Encoding, are left out), and
  // User-Agent unless given. A request whose method, target or headers hold
  // a line break is not sent (kNotSent): it would smuggle in lines of its own.
  std::vector<http::Header> headers;
  std::string body;
  // Hand the answer over as soon as its header is read, its body as a
  // http::BodySource (response.stream) that reads it from the upstream piece
  // by piece as asked: any size, no max_response_bytes, each piece within
  // piece_timeout. An answer without a body, or whose body came with its
  // header, comes whole.
  bool stream = false;
  // Optional: called once, on an I/O thread, when the whole request has been
  // written and before its answer is read (the reverse proxy's after_send
  // fault point). Not called if the write fails. Must not block.
  std::function<void()> on_written;
  // Overrides HttpClientOptions::response_timeout for this request (zero: no
  // limit). Default: the option.
  std::optional<std::chrono::milliseconds> response_timeout;
  // The write alone must finish within this, and the response timeout counts
  // from its end. Default: the write counts in the response timeout.
  std::optional<std::chrono::milliseconds> write_timeout;
  // Each piece of a streamed body must come within this (zero: no limit; an
  // event stream may be quiet for minutes). Default: the response timeout.
  std::optional<std::chrono::milliseconds> piece_timeout;
  // false: Connection: close, and the connection is not pooled afterwards.
  bool keep_alive = true;
};

struct HttpClientResult {
  enum class Kind { kResponse, kNotSent, kMaybeSent };
  Kind kind = Kind::kResponse;
  // kResponse: the whole answer, headers as received (hop-by-hop ones
  // included); with HttpClientRequest::stream its body may come in
  // response.stream instead. kMaybeSent with too_large: the status and
  // headers.
  http::Response response;
  bool timed_out = false;  // kMaybeSent: no whole answer within the response timeout
  bool too_large = false;  // kMaybeSent: the body was over max_response_bytes
  // kMaybeSent: a whole-body answer framed only by the connection's end
  // (no Content-Length, not chunked). A streamed answer may end so.
  bool eof_delimited = false;
  std::string detail;      // failures: what happened, for people
};

using HttpClientCallback = std::function<void(HttpClientResult)>;

class HttpClient {
 public:
  struct Impl;
  struct Exchange;

  // One exchange started by Send, to cancel it. Empty when default-built.
  class Call {
   public:
    Call() = default;
    // Closes the exchange's connection: `done` gets kNotSent if the request
    // was not yet written, kMaybeSent once it was; a streamed body already
    // handed over fails. No effect once the exchange is over. Any thread.
    void Cancel() const;

   private:
    friend class HttpClient;
    std::weak_ptr<Impl> client_;
    std::weak_ptr<Exchange> exchange_;
  };

  // With its own I/O threads (options.threads). kInvalidArgument for a URL
  // that is not http(s)://HOST[:PORT][/PATH], or a CA file that cannot be
  // loaded; kUnavailable if the system trust store cannot be loaded.
  static Result<std::unique_ptr<HttpClient>> Create(const HttpClientOptions& options);
  // Same, on the caller's io_context, whose threads the caller runs; they
  // must have stopped (joined) before Stop() or the destructor.
  static Result<std::unique_ptr<HttpClient>> Create(const HttpClientOptions& options,
                                                    boost::asio::io_context& ioc);
  ~HttpClient();  // Stop()s

  // Starts one exchange; `done` is called exactly once, on an I/O thread
  // (inline with kNotSent after Stop, or for a request that cannot be sent as
  // HttpClientRequest::headers says). Never blocks. Must not race Stop().
  Call Send(HttpClientRequest request, HttpClientCallback done);

  // "api.vendor.example" / "127.0.0.1:8080": the Host header sent.
  const std::string& host_header() const;

  // Cancels every exchange in flight (as Call::Cancel) and waits until each
  // has ended and its callback has returned: a front's last requests end
  // while the threads that run their callbacks still do. Later Sends end at
  // once, kNotSent. For a client on the caller's io_context, whose threads
  // must be running; Stop() after they have stopped. Not from a callback.
  void Abort();

  // Joins the client's own I/O threads and closes every connection;
  // exchanges still in flight end there (kMaybeSent once written, kNotSent
  // before), on the calling thread. Idempotent; not from a callback.
  void Stop();

 private:
  explicit HttpClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace idem::net
