#include "net/http_server_io.h"

#include <algorithm>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <climits>
#include <functional>

namespace idem::net {

namespace beast = boost::beast;

std::optional<Refusal> TooManyHeaders(size_t count, const RequestLimits& limits) {
  if (count <= limits.max_header_count) return std::nullopt;
  return Refusal{431, "headers-too-large", "Request header fields too large",
                 "idemgate: the request has " + std::to_string(count) + " header fields; at most " +
                     std::to_string(limits.max_header_count) +
                     " are accepted (max_header_count): send fewer"};
}

std::optional<Refusal> ReadRefusal(beast::error_code ec, const RequestLimits& limits) {
  namespace http = beast::http;
  if (ec == http::error::body_limit) {
    return Refusal{413, "body-too-large", "Request body too large",
                   "idemgate: the request body is larger than the limit of " +
                       std::to_string(limits.max_body_bytes) +
                       " bytes (limits.max_body_bytes): send less, or raise the limit"};
  }
  if (ec == http::error::header_limit) {
    return Refusal{431, "headers-too-large", "Request header fields too large",
                   "idemgate: the request header block is larger than " +
                       std::to_string(limits.max_header_bytes) +
                       " bytes (max_header_bytes): send smaller headers"};
  }
  if (ec == http::error::buffer_overflow) {  // ReadBufferLimit: a line that never ends
    return Refusal{431, "headers-too-large", "Request header fields too large",
                   "idemgate: a chunk header (its size and extensions) or trailer line of the "
                   "request is longer than " +
                       std::to_string(limits.max_header_bytes) +
                       " bytes (max_header_bytes): send chunks without extensions"};
  }
  if (ec == http::error::end_of_stream) return std::nullopt;  // the client left
  if (ec.category() == beast::error_code(http::error::end_of_stream).category()) {
    return Refusal{400, "malformed-request", "Malformed HTTP request",
                   "idemgate: the request is not valid HTTP/1.1 (" + ec.message() + ")"};
  }
  return std::nullopt;  // EOF, reset, cancelled, timed out: nothing to answer
}

constexpr size_t kReadReserve = 16 * 1024;

// The most a connection's read buffer holds of bytes the parser has not yet
// consumed: a whole header block, a chunk header line, or a trailer. Beast
// 1.81 bounds the header by header_limit and the body by body_limit, but a
// chunk header line (its extensions) and the trailer by nothing but the
// buffer: past this, the read fails with buffer_overflow (ReadRefusal: 431).
size_t ReadBufferLimit(const RequestLimits& limits) {
  return std::max(limits.max_header_bytes, kReadReserve) + kReadReserve;
}

Refusal TooManyChunkExtensions(const RequestLimits& limits) {
  return Refusal{431, "headers-too-large", "Request header fields too large",
                 "idemgate: the request's chunk extensions add up to more than " +
                     std::to_string(limits.max_header_bytes) +
                     " bytes (max_header_bytes); idemgate reads none of them: send chunks "
                     "without extensions"};
}

Refusal TrailerRefused() {
  return Refusal{400, "malformed-request", "Trailer fields are not accepted",
                 "idemgate: the chunked request ends with trailer fields; idemgate reads no "
                 "trailers (one could add a header the header checks never saw): send every "
                 "field in the header"};
}

Refusal SlowRequest(const RequestLimits& limits) {
  return Refusal{408, "request-timeout", "Request timeout",
                 "idemgate: the whole request must arrive within " +
                     std::to_string(limits.read_timeout.count()) +
                     " ms (read_timeout); send it faster or raise the limit",
                 /*linger=*/false};
}

void ReadRequest(beast::tcp_stream& stream, beast::flat_buffer& buffer, RequestParser& parser,
                 const RequestLimits& limits, std::shared_ptr<void> owner, ReadDone done) {
  namespace http = beast::http;
  parser.header_limit(static_cast<uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser.body_limit(limits.max_body_bytes);
  buffer.max_size(ReadBufferLimit(limits));
  // Beast reads at most the buffer's free space (at least 512 bytes), and the
  // parser moves each body byte out: unreserved, a 1 MB body took 1 959 reads
  // (67 now; strace -c of `idemgate http`).
  buffer.reserve(kReadReserve);
  // The deadline cancels the read; a request cut short by it is answered 408,
  // an idle connection just closes. The chunk-extension budget lives here too:
  // the parser keeps a reference to `on_chunk_header`, and this state outlives
  // every read into `parser` (a new request gets a new parser).
  struct Deadline {
    explicit Deadline(const boost::asio::any_io_executor& ex) : timer(ex) {}
    boost::asio::steady_timer timer;
    bool finished = false;
    bool expired = false;
    size_t extension_bytes = 0;  // of every chunk header so far
    bool extensions_over = false;
    std::function<void(uint64_t, std::string_view, beast::error_code&)> on_chunk_header;
  };
  auto deadline = std::make_shared<Deadline>(stream.get_executor());
  deadline->on_chunk_header = [state = deadline.get(), budget = limits.max_header_bytes](
                                  uint64_t, std::string_view extensions, beast::error_code& ec) {
    state->extension_bytes += extensions.size();
    if (state->extension_bytes <= budget) return;
    state->extensions_over = true;
    ec = http::error::bad_chunk_extension;
  };
  parser.on_chunk_header(deadline->on_chunk_header);
  deadline->timer.expires_after(limits.read_timeout);
  deadline->timer.async_wait([deadline, &stream, owner](beast::error_code ec) {
    if (ec || deadline->finished) return;
    deadline->expired = true;
    beast::error_code ignored;
    stream.socket().cancel(ignored);
  });
  auto finish = [deadline, &buffer, &parser, limits, done](beast::error_code ec,
                                                           std::optional<Refusal> refusal) {
    deadline->finished = true;
    deadline->timer.cancel();
    if (ec && !refusal && deadline->extensions_over) refusal = TooManyChunkExtensions(limits);
    if (ec && !refusal) {
      const bool cut_short = deadline->expired && (buffer.size() > 0 || parser.got_some());
      refusal = cut_short ? SlowRequest(limits) : ReadRefusal(ec, limits);
    }
    done(ec, std::move(refusal));
  };
  http::async_read_header(
      stream, buffer, parser,
      [&stream, &buffer, &parser, limits, owner, finish](beast::error_code ec, size_t) {
        if (ec) return finish(ec, std::nullopt);
        const auto& req = parser.get();
        const size_t count = static_cast<size_t>(std::distance(req.begin(), req.end()));
        if (auto refusal = TooManyHeaders(count, limits)) return finish({}, std::move(refusal));
        auto body = [&stream, &buffer, &parser, owner, finish, count] {
          http::async_read(stream, buffer, parser,
                           [&parser, owner, finish, count](beast::error_code ec, size_t) {
                             // Beast adds trailer fields to the header's.
                             const auto& fields = parser.get();
                             const auto now = std::distance(fields.begin(), fields.end());
                             if (!ec && static_cast<size_t>(now) != count) {
                               return finish({}, TrailerRefused());
                             }
                             finish(ec, std::nullopt);
                           });
        };
        if (!beast::iequals(req[http::field::expect], "100-continue")) return body();
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        boost::asio::async_write(stream, boost::asio::buffer(kContinue.data(), kContinue.size()),
                                 [finish, body](beast::error_code ec, size_t) {
                                   if (ec) return finish(ec, std::nullopt);
                                   body();
                                 });
      });
}

std::string_view BearerToken(std::string_view authorization) {
  if (authorization.size() <= 7 || !beast::iequals(authorization.substr(0, 7), "Bearer ")) {
    return {};
  }
  std::string_view token = authorization.substr(7);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

namespace {

struct Drain : std::enable_shared_from_this<Drain> {
  Drain(beast::tcp_stream& s, std::shared_ptr<void> o, size_t max)
      : stream(s), owner(std::move(o)), max_bytes(max) {}

  void Next() {
    stream.async_read_some(boost::asio::buffer(buffer),
                           [self = shared_from_this()](beast::error_code ec, size_t n) {
                             self->drained += n;
                             if (ec || self->drained > self->max_bytes) {
                               self->stream.close();
                               return;
                             }
                             self->Next();
                           });
  }

  beast::tcp_stream& stream;
  const std::shared_ptr<void> owner;  // keeps `stream` alive
  const size_t max_bytes;
  size_t drained = 0;
  char buffer[16 * 1024];
};

}  // namespace

void LingerThenClose(beast::tcp_stream& stream, std::shared_ptr<void> owner,
                     std::chrono::milliseconds timeout, size_t max_bytes) {
  beast::error_code ignored;
  stream.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
  stream.expires_after(timeout);
  std::make_shared<Drain>(stream, std::move(owner), max_bytes)->Next();
}

}  // namespace idem::net
