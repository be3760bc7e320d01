// How idemgate's HTTP server (http_listener.cc) reads a request and closes a
// connection: the limits and the answers that refuse a request before it is
// handled, the bearer token, and the lingering close after an error answer.
// A front words the refusal in its own body (ListenerOptions::render_refusal:
// problem+json, JSON-RPC).
#pragma once

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace idem::net {

struct RequestLimits {
  size_t max_header_bytes = 16 * 1024;
  size_t max_header_count = 100;
  size_t max_body_bytes = 1 << 20;
  std::chrono::milliseconds read_timeout{30'000};
};

// An answer that refuses a request before it is handled.
struct Refusal {
  int status = 400;
  std::string type;    // "body-too-large"
  std::string title;   // "Request body too large"
  std::string detail;  // what was wrong and what to do
  // After the answer, read and discard what the client still sends before
  // closing (LingerThenClose), so that it sees the answer; not for a client
  // too slow to be worth waiting for.
  bool linger = true;
};

// A request with `count` header fields, over the limit: 431.
std::optional<Refusal> TooManyHeaders(size_t count, const RequestLimits& limits);
// Why reading a request failed, as the answer (413, 431, 400), or nullopt
// when the connection just closes (the client left, the read was cancelled).
std::optional<Refusal> ReadRefusal(boost::beast::error_code ec, const RequestLimits& limits);
// Part of a request arrived, the rest not within read_timeout: 408.
Refusal SlowRequest(const RequestLimits& limits);

// Reads one request into `parser`, whose limits it sets: the header, the
// header count, "100 Continue" if the client waits for it, then the body,
// all within read_timeout (idle keep-alive time included). `done` gets a
// refusal to answer (ReadRefusal, TooManyHeaders, SlowRequest), or else the
// read's error (the connection just closes), or neither: the whole request is
// in `parser`. `owner` (which owns the stream, buffer and parser) is kept
// alive until `done` has run. Call on the stream's executor.
using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
using ReadDone = std::function<void(boost::beast::error_code, std::optional<Refusal>)>;
void ReadRequest(boost::beast::tcp_stream& stream, boost::beast::flat_buffer& buffer,
                 RequestParser& parser, const RequestLimits& limits, std::shared_ptr<void> owner,
                 ReadDone done);

// The token of an "Authorization: Bearer <token>" value, without surrounding
// spaces; empty if there is none.
std::string_view BearerToken(std::string_view authorization);

// After an error answer on a connection that will not be reused: stops
// sending, then reads and discards what the client still sends until it
// closes, so that it sees the answer instead of a reset. Bounded by `timeout`
// and by `max_bytes`; `owner` (which owns `stream`) is kept alive until then.
void LingerThenClose(boost::beast::tcp_stream& stream, std::shared_ptr<void> owner,
                     std::chrono::milliseconds timeout, size_t max_bytes);

}  // namespace idem::net
