// The reverse proxy's client to its upstream (docs/DESIGN.md §6.2): HTTP/1.1 over
// keep-alive connections, plain or TLS (OpenSSL, certificates verified by
// default against the system store plus an optional CA file, SNI sent for
// names), with connect and response timeouts and a response body limit.
//
// Every exchange ends in exactly one UpstreamResult, and a failure says
// whether the request can have reached the upstream — the distinction the
// ledger needs (§4.7):
//   kNotSent   the request was never written: DNS failure, connection
//              refused, connect timeout, TLS failure, or the write failed
//              before the whole request was handed over. Nothing happened.
//   kMaybeSent the request was written, then the connection broke, closed,
//              or no whole answer came within response_timeout (timed_out),
//              or the answer's body was over max_response_bytes (too_large,
//              status known). The side effect may have happened.
//
// An idle connection is reused only while younger than max_idle and still
// open: a server closes idle connections on its own schedule, and a request
// written into one it is closing would end maybe-sent for nothing.
//
// A streamed answer (UpstreamRequest::stream) keeps its connection until the
// body has been read to its end (then it is pooled) or cancelled (then it is
// closed); a piece that does not come within response_timeout, or a
// connection that breaks, ends the body as failed.
//
// One pool serves one origin (scheme, host, port). Its I/O threads run every
// exchange asynchronously (Boost.Beast); callbacks run on them and must not
// block. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/http_listener.h"
#include "idem/error.h"

namespace idem::proxy {

struct UpstreamOptions {
  // The upstream: "https://api.vendor.example" or "http://127.0.0.1:8080/base".
  // A path is prefixed to every request target. Required.
  std::string url;
  // DNS, TCP connect and the TLS handshake of a new connection must finish
  // within this. Config [http] upstream_connect_timeout. Default 5 s.
  std::chrono::milliseconds connect_timeout{5'000};
  // Writing a request and reading its whole answer must finish within this
  // (a gated call's lease is renewed meanwhile); for a streamed answer, its
  // header and then each piece. Config [http] upstream_timeout. Default 60 s.
  std::chrono::milliseconds response_timeout{60'000};
  // An idle connection is not reused after this long (most servers close
  // idle connections after 5 s; Node's default is 5 s). Config [http]
  // upstream_idle_timeout. Default 2 s.
  std::chrono::milliseconds max_idle{2'000};
  // Idle connections kept for reuse; more are closed. Config [http]
  // max_idle_connections. Default 64.
  size_t max_idle_connections = 64;
  // Largest answer body read whole; a larger one ends kMaybeSent with
  // too_large. Not for a streamed answer. Config [http] max_response_bytes.
  // Default 16 MiB.
  size_t max_response_bytes = 16 << 20;
  // Verify the upstream's certificate chain and host name. Config [http]
  // upstream_verify_tls. Default true.
  bool verify_tls = true;
  // PEM file of extra trusted CAs, added to the system store. Config [http]
  // upstream_ca_file. Default none.
  std::string ca_file;
  // I/O threads. Default 2.
  int threads = 2;
};

struct UpstreamRequest {
  std::string method;  // "POST"
  std::string target;  // "/v1/charges?expand=x", appended to the URL's path
  // Sent as given, in order. The pool sets Host, Content-Length and
  // Connection itself (drop them here).
  std::vector<http::Header> headers;
  std::string body;
  // Hand the answer over as soon as its header is read, its body as a
  // http::BodySource (response.stream) that reads it from the upstream piece
  // by piece as the listener asks: any size, no max_response_bytes, each
  // piece within response_timeout. For pass-through answers, which are
  // relayed and never stored. An answer without a body comes whole.
  bool stream = false;
  // Optional: called once, on an I/O thread, when the whole request has been
  // written and before its answer is read (the reverse proxy's after_send
  // fault point). Not called if the write fails. Must not block.
  std::function<void()> on_written;
};

struct UpstreamResult {
  enum class Kind { kResponse, kNotSent, kMaybeSent };
  Kind kind = Kind::kResponse;
  // kResponse: the whole answer, headers as received (hop-by-hop ones
  // included); with UpstreamRequest::stream its body may come in
  // response.stream instead. kMaybeSent with too_large: the status and
  // headers.
  http::Response response;
  bool timed_out = false;  // kMaybeSent: no whole answer within response_timeout
  bool too_large = false;  // kMaybeSent: the body was over max_response_bytes
  std::string detail;      // failures: what happened, for people
};

using UpstreamCallback = std::function<void(UpstreamResult)>;

class UpstreamPool {
 public:
  // kInvalidArgument for a URL that is not http(s)://HOST[:PORT][/PATH], or
  // a CA file that cannot be loaded; kUnavailable if the system trust store
  // cannot be loaded.
  static Result<std::unique_ptr<UpstreamPool>> Create(const UpstreamOptions& options);
  ~UpstreamPool();  // Stop()s

  // Starts one exchange; `done` is called exactly once, on an I/O thread
  // (inline with kNotSent after Stop). Never blocks. Must not race Stop().
  void Send(UpstreamRequest request, UpstreamCallback done);

  // "api.vendor.example" / "127.0.0.1:8080": the Host header sent.
  const std::string& host_header() const;

  // Joins the I/O threads and closes every connection; exchanges still in
  // flight end there (kMaybeSent once written, kNotSent before), on the
  // calling thread. Idempotent; not from a callback.
  void Stop();

  struct Impl;

 private:
  explicit UpstreamPool(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace idem::proxy
