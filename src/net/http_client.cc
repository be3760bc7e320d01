#include "net/http_client.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "net/http_target.h"
#include "net/tls_client.h"

#ifndef IDEM_VERSION
#define IDEM_VERSION "dev"
#endif

namespace idem::net {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using namespace std::string_view_literals;

// Where requests go: the upstream URL's origin, and the base path that every
// request target is appended to ("" or "/base", no trailing '/').
struct Origin {
  HttpTarget target;
  std::string base_path;
};

Result<Origin> ParseOrigin(const std::string& url) {
  auto target = ParseHttpTarget(url, "upstream URL");
  if (!target) return std::unexpected(target.error());
  if (!target->query.empty()) {
    return MakeError(
        ErrorCode::kInvalidArgument,
        "invalid upstream URL '" + url + "': a query is not allowed (each request brings its own)");
  }
  Origin o{std::move(*target), {}};
  o.base_path = o.target.path;
  while (!o.base_path.empty() && o.base_path.back() == '/') o.base_path.pop_back();
  return o;
}

// One connection to the upstream, plain or TLS. Not thread-safe: each runs
// on its own strand.
struct Conn {
  // Beast reads at most the buffer's free space (at least 512 bytes), and a
  // parser that moves each body byte out keeps the buffer small: without
  // this reserve, a large answer came 512 bytes per recvmsg.
  //
  // The buffer holds at most a header block (header_limit, 64 KiB) and a
  // read's worth more: Beast 1.81 bounds a chunk header line (its extensions)
  // and a trailer by nothing but the buffer, so an upstream sending one with
  // no line end fails the read (buffer_overflow) instead of growing it.
  Conn() {
    buffer.max_size(kHeaderLimit + kReadReserve);
    buffer.reserve(kReadReserve);
  }
  static constexpr size_t kHeaderLimit = 64 * 1024;
  static constexpr size_t kReadReserve = 64 * 1024;

  std::optional<boost::beast::tcp_stream> plain;
  std::optional<boost::beast::ssl_stream<boost::beast::tcp_stream>> tls;
  boost::beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since;

  boost::beast::tcp_stream& lowest() { return tls ? boost::beast::get_lowest_layer(*tls) : *plain; }
  // Calls `f` with the stream to read and write: the TLS one, or the plain one.
  template <class F>
  void With(F&& f) {
    if (tls) {
      f(*tls);
    } else {
      f(*plain);
    }
  }
  void Close() {
    boost::beast::error_code ignored;
    lowest().socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    lowest().close();
  }
  // True if the peer has not closed an idle connection. A plain connection
  // with unread bytes is also unusable (a stray answer); on TLS they may be
  // session tickets.
  bool Alive() {
    if (!lowest().socket().is_open() || buffer.size() > 0) return false;
    char c;
    ssize_t n = ::recv(lowest().socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return false;
    if (n > 0) return tls.has_value();
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
};

// How much of a streamed body is read at a time.
constexpr size_t kPieceBytes = 64 * 1024;

// Arms the connection's deadline: `timeout` from now, or none for zero.
void Expire(Conn& c, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) {
    c.lowest().expires_after(timeout);
  } else {
    c.lowest().expires_never();
  }
}

// Whether `text` may go into a request line or a header as it is: no CR, LF
// or NUL, which would end the line early or split it into two.
bool OneLine(std::string_view text) {
  // A loop, not find_first_of, which calls memchr once per character.
  for (const char c : text) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

// Writes the request line and header block of `request` into `out`: its
// headers in order, except Host, Connection, Content-Length and
// Transfer-Encoding, which the client sets itself (the body goes whole, with
// its length); User-Agent unless given; Connection: close unless kept alive.
// Formatted directly rather than through Beast's fields and serializer, whose
// buffer sequences cost more than the rest of a relayed call's write. Returns
// why the request cannot be sent (a line break in a header), or nullopt.
std::optional<std::string> FormatRequestHead(const HttpClientRequest& request,
                                             std::string_view base_path,
                                             std::string_view host_header, std::string& out) {
  const auto invalid = [](std::string_view what) {
    return "the request to the upstream was not sent: its " + std::string(what) +
           " holds a line break or a NUL byte, which would end the line early";
  };
  if (request.method.empty() || !OneLine(request.method) ||
      request.method.find(' ') != std::string::npos) {
    return "the request to the upstream was not sent: its method '" + request.method +
           "' is not a method";
  }
  if (!OneLine(request.target) || request.target.find(' ') != std::string::npos) {
    return invalid("target");
  }
  out.reserve(256 + request.target.size());
  out.append(request.method).append(" "sv).append(base_path).append(request.target);
  out.append(" HTTP/1.1\r\nHost: "sv).append(host_header).append("\r\n"sv);
  bool has_user_agent = false;
  for (const http::Header& h : request.headers) {
    if (beast::iequals(h.name, "Host"sv) || beast::iequals(h.name, "Connection"sv) ||
        beast::iequals(h.name, "Content-Length"sv) ||
        beast::iequals(h.name, "Transfer-Encoding"sv)) {
      continue;
    }
    if (h.name.empty() || !OneLine(h.name) || h.name.find_first_of(": \t"sv) != h.name.npos) {
      return "the request to the upstream was not sent: a header's name is empty or holds a "
             "colon, a space or a line break";
    }
    if (!OneLine(h.value)) return invalid("header " + h.name);
    has_user_agent = has_user_agent || beast::iequals(h.name, "User-Agent"sv);
    http::AppendHeaderLine(out, h.name, h.value);
  }
  if (!has_user_agent) out.append("User-Agent: idemgate/" IDEM_VERSION "\r\n"sv);
  if (!request.keep_alive) out.append("Connection: close\r\n"sv);
  const bool has_body = !request.body.empty() || request.method == "POST" ||
                        request.method == "PUT" || request.method == "PATCH";
  if (has_body) {
    http::AppendHeaderLine(out, "Content-Length"sv, std::to_string(request.body.size()));
  }
  out.append("\r\n"sv);
  return std::nullopt;
}

}  // namespace

// One request and its answer.
struct HttpClient::Exchange {
  HttpClientCallback done;
  std::function<void()> on_written;  // HttpClientRequest::on_written
  // The request as it goes on the wire (FormatRequestHead).
  std::string wire_head;
  std::string body;
  bool keep_alive = true;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser;
  // `parser`'s chunk headers: their extensions count against the header
  // limit, and the last one marks where the header's fields end and Beast's
  // merged trailer fields begin (never copied into the answer: idemgate
  // relays and stores no trailers).
  std::function<void(uint64_t, std::string_view, boost::beast::error_code&)> on_chunk_header;
  size_t extension_bytes = 0;
  size_t header_fields = SIZE_MAX;
  std::unique_ptr<Conn> conn;
  bool head = false;
  bool writing = false;  // the write began: some of the request may be out
  bool written = false;
  bool finished = false;  // `done` was called
  // Effective timeouts (HttpClientRequest, else the options).
  std::chrono::milliseconds response_timeout{0};
  std::optional<std::chrono::milliseconds> write_timeout;
  std::chrono::milliseconds piece_timeout{0};
  std::atomic<bool> cancelled{false};  // Call::Cancel()

  // The connection's strand, set (under Impl::mu) while the exchange has a
  // connection: Call::Cancel and the body's reads run there.
  std::optional<asio::any_io_executor> strand;

  // HttpClientRequest::stream. After `done` handed the header over, the body
  // is read through `stream_parser` into `piece`, on `strand`, while `conn`
  // is set; `next` is the BodySource's callback waiting for a read.
  bool stream = false;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> stream_parser;
  std::string piece;
  std::optional<std::string> prefetched;  // read with the header, not yet asked for
  std::function<void(http::BodySource::Piece)> next;
};

namespace {
using Exchange = HttpClient::Exchange;
}  // namespace

struct HttpClient::Impl : std::enable_shared_from_this<HttpClient::Impl> {
  // `external`: the caller's io_context; null: the client's own.
  Impl(Origin o, HttpClientOptions opts, std::unique_ptr<ssl::context> ctx,
       asio::io_context* external)
      : origin(std::move(o)),
        options(std::move(opts)),
        tls(std::move(ctx)),
        ioc_owner(external ? nullptr : std::make_unique<asio::io_context>()),
        ioc(external ? *external : *ioc_owner) {
    if (ioc_owner) work.emplace(asio::make_work_guard(ioc));
  }

  const Origin origin;
  const HttpClientOptions options;
  const std::unique_ptr<ssl::context> tls;
  // The client's own io_context, destroyed by Stop() once the threads are
  // joined: that destroys the handlers never run, and with them their
  // references to this Impl. Null on the caller's io_context.
  std::unique_ptr<asio::io_context> ioc_owner;
  asio::io_context& ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;

  std::mutex mu;
  std::vector<std::unique_ptr<Conn>> idle;        // guarded by mu; newest last
  std::set<std::shared_ptr<Exchange>> in_flight;  // guarded by mu
  bool stopped = false;                           // guarded by mu
  bool aborted = false;                           // guarded by mu: Abort ran
  // Exchanges whose callback has not returned yet (Abort waits for none).
  size_t unanswered = 0;  // guarded by mu
  std::condition_variable answered;

  void Start(const std::shared_ptr<Exchange>& ex) {
    {
      std::lock_guard g(mu);
      if (stopped || aborted) {
        // Inline: the threads are gone, or what they run is ending.
        HttpClientResult r;
        r.kind = HttpClientResult::Kind::kNotSent;
        r.detail = stopped ? "the HTTP client has stopped; the request was not sent"
                           : "the HTTP client is stopping; the request was not sent";
        ex->finished = true;
        ex->done(std::move(r));
        return;
      }
      in_flight.insert(ex);
      ++unanswered;
      ex->conn = TakeIdleLocked();
      if (ex->conn) ex->strand = ex->conn->lowest().get_executor();
    }
    if (ex->conn) {
      asio::dispatch(ex->conn->lowest().get_executor(),
                     [self = shared_from_this(), ex] { self->Write(ex); });
    } else {
      Connect(ex);
    }
  }

  std::unique_ptr<Conn> TakeIdleLocked() {
    const auto now = SteadyClock::now();
    while (!idle.empty()) {
      std::unique_ptr<Conn> c = std::move(idle.back());
      idle.pop_back();
      if (now - c->idle_since < options.max_idle && c->Alive()) return c;
      c->Close();
    }
    return nullptr;
  }

  void Connect(const std::shared_ptr<Exchange>& ex) {
    auto c = std::make_unique<Conn>();
    if (origin.target.tls) {
      c->tls.emplace(asio::make_strand(ioc), *tls);
    } else {
      c->plain.emplace(asio::make_strand(ioc));
    }
    auto strand = c->lowest().get_executor();
    ex->conn = std::move(c);
    {
      std::lock_guard g(mu);
      ex->strand = strand;
    }
    auto resolver = std::make_shared<tcp::resolver>(ex->conn->lowest().get_executor());
    auto timer = std::make_shared<asio::steady_timer>(ex->conn->lowest().get_executor());
    const auto deadline = SteadyClock::now() + options.connect_timeout;
    timer->expires_at(deadline);
    timer->async_wait([resolver](beast::error_code ec) {
      if (!ec) resolver->cancel();
    });
    resolver->async_resolve(
        origin.target.host, origin.target.port,
        [self = shared_from_this(), ex, resolver, timer, deadline](
            beast::error_code ec, tcp::resolver::results_type results) {
          timer->cancel();
          if (ec) {
            return self->Fail(
                ex, HttpClientResult::Kind::kNotSent,
                "cannot resolve upstream host '" + self->origin.target.host + "' (" +
                    (ec == asio::error::operation_aborted ? "timed out" : ec.message()) + ")");
          }
          if (ex->cancelled) {
            return self->Fail(ex, HttpClientResult::Kind::kNotSent,
                              "the request was cancelled before it was sent");
          }
          ex->conn->lowest().expires_at(deadline);
          ex->conn->lowest().async_connect(
              results, [self, ex, deadline](beast::error_code ec, const tcp::endpoint&) {
                if (ec) {
                  return self->Fail(
                      ex, HttpClientResult::Kind::kNotSent,
                      "cannot connect to the upstream " + self->origin.target.host_header + " (" +
                          Describe(ec, "connection", self->options.connect_timeout) + ")");
                }
                beast::error_code ignored;
                ex->conn->lowest().socket().set_option(tcp::no_delay(true), ignored);
                if (!ex->conn->tls) return self->Write(ex);
                self->PrepareTls(*ex->conn);
                ex->conn->tls->async_handshake(
                    ssl::stream_base::client, [self, ex](beast::error_code ec) {
                      if (ec) {
                        return self->Fail(
                            ex, HttpClientResult::Kind::kNotSent,
                            "TLS handshake with the upstream " + self->origin.target.host_header +
                                " failed (" +
                                Describe(ec, "connection", self->options.connect_timeout) + ")");
                      }
                      self->Write(ex);
                    });
              });
        });
  }

  void PrepareTls(Conn& c) {
    PrepareTlsClient(c.tls->native_handle(), origin.target.host, options.verify_tls);
  }

  // `timeout`: what expired if `ec` says it did.
  static std::string Describe(const beast::error_code& ec, const char* what,
                              std::chrono::milliseconds timeout) {
    if (ec == beast::error::timeout) {
      return "no " + std::string(what) + " within " + std::to_string(timeout.count()) + " ms";
    }
    return ec.message();
  }

  void Write(const std::shared_ptr<Exchange>& ex) {
    if (ex->cancelled) {
      return Fail(ex, HttpClientResult::Kind::kNotSent,
                  "the request was cancelled before it was sent");
    }
    Expire(*ex->conn, ex->write_timeout.value_or(ex->response_timeout));
    const std::array<asio::const_buffer, 2> request{asio::buffer(ex->wire_head),
                                                    asio::buffer(ex->body)};
    ex->writing = true;
    ex->conn->With([&](auto& stream) {
      asio::async_write(
          stream, request, [self = shared_from_this(), ex](beast::error_code ec, size_t out) {
            if (ec) {
              // Before its head is whole no server can dispatch a request
              // (and what was handed to the socket bounds what arrived).
              // After it, a server may act on the head and answer early or
              // reset while the body is still on its way (review H9).
              const bool head_out = out >= ex->wire_head.size();
              return self->Fail(
                  ex,
                  head_out ? HttpClientResult::Kind::kMaybeSent : HttpClientResult::Kind::kNotSent,
                  (head_out ? "the request's head was sent, then sending its body failed ("
                            : "could not send the request to the upstream (") +
                      Describe(ec, "answer", ex->write_timeout.value_or(ex->response_timeout)) +
                      ")");
            }
            if (ex->write_timeout) Expire(*ex->conn, ex->response_timeout);
            ex->written = true;
            if (ex->on_written) ex->on_written();
            self->Read(ex);
          });
    });
  }

  void Read(const std::shared_ptr<Exchange>& ex) {
    if (ex->stream) return ReadStreamHeader(ex);
    ex->parser.emplace();
    ex->parser->header_limit(Conn::kHeaderLimit);
    ex->parser->body_limit(options.max_response_bytes);
    ex->extension_bytes = 0;
    ex->header_fields = SIZE_MAX;
    ex->on_chunk_header = [x = ex.get()](uint64_t size, std::string_view extensions,
                                         beast::error_code& ec) {
      x->extension_bytes += extensions.size();
      if (x->extension_bytes > Conn::kHeaderLimit) ec = bhttp::error::bad_chunk_extension;
      const auto& fields = x->parser->get();
      if (size == 0)
        x->header_fields = static_cast<size_t>(std::distance(fields.begin(), fields.end()));
    };
    ex->parser->on_chunk_header(ex->on_chunk_header);
    if (ex->head) ex->parser->skip(true);
    ex->conn->With([&](auto& stream) {
      bhttp::async_read(
          stream, ex->conn->buffer, *ex->parser,
          [self = shared_from_this(), ex](beast::error_code ec, size_t) { self->OnRead(ex, ec); });
    });
  }

  void OnRead(const std::shared_ptr<Exchange>& ex, beast::error_code ec) {
    if (ec == bhttp::error::body_limit && ex->parser->is_header_done()) {
      HttpClientResult r;
      r.kind = HttpClientResult::Kind::kMaybeSent;
      r.too_large = true;
      r.response.status = static_cast<int>(ex->parser->get().result_int());
      CopyHeaders(ex->parser->get(), r.response);
      r.detail = "the upstream's answer is larger than " +
                 std::to_string(options.max_response_bytes) + " bytes";
      return Finish(ex, std::move(r), false);
    }
    if (ec) return FailAfterSend(ex, ec);
    if (IsInterim(ex->parser->get().result_int())) return Read(ex);
    if (ex->parser->need_eof()) {
      // Neither Content-Length nor chunked: the body ended when the
      // connection did, which is also what an upstream dying mid-body
      // looks like (review F10). Not a whole answer to store.
      HttpClientResult r;
      r.kind = HttpClientResult::Kind::kMaybeSent;
      r.eof_delimited = true;
      r.response.status = static_cast<int>(ex->parser->get().result_int());
      CopyHeaders(ex->parser->get(), r.response);
      r.detail =
          "the upstream's answer (HTTP " + std::to_string(r.response.status) +
          ") has neither Content-Length nor chunked framing, so its body ended with the "
          "connection and cannot be told from one cut short";
      return Finish(ex, std::move(r), false);
    }
    const bool reusable = ex->parser->keep_alive();
    bhttp::response<bhttp::string_body> res = ex->parser->release();
    HttpClientResult r;
    r.response.status = static_cast<int>(res.result_int());
    CopyHeaders(res, r.response, ex->header_fields);
    r.response.body = std::move(res.body());
    Finish(ex, std::move(r), reusable);
  }

  void FailAfterSend(const std::shared_ptr<Exchange>& ex, const beast::error_code& ec) {
    HttpClientResult r;
    r.kind = HttpClientResult::Kind::kMaybeSent;
    r.timed_out = ec == beast::error::timeout;
    r.detail = ec == beast::error::timeout
                   ? "the request was sent but no answer came within " +
                         std::to_string(ex->response_timeout.count()) + " ms"
                   : "the request was sent but the connection broke before a whole answer (" +
                         ec.message() + ")";
    Finish(ex, std::move(r), false);
  }

  // An interim answer (102 Processing, 103 Early Hints, an unasked-for 100):
  // the final one follows on the same connection. 101 is final, and never
  // asked for: Upgrade is not forwarded.
  static bool IsInterim(unsigned status) { return status >= 100 && status < 200 && status != 101; }

  // ── Streamed answers ──

  void ReadStreamHeader(const std::shared_ptr<Exchange>& ex) {
    ex->stream_parser.emplace();
    ex->stream_parser->header_limit(Conn::kHeaderLimit);
    ex->stream_parser->body_limit(boost::none);
    if (ex->head) ex->stream_parser->skip(true);
    ex->conn->With([&](auto& stream) {
      bhttp::async_read_header(stream, ex->conn->buffer, *ex->stream_parser,
                               [self = shared_from_this(), ex](beast::error_code ec, size_t) {
                                 self->OnStreamHeader(ex, ec);
                               });
    });
  }

  void OnStreamHeader(const std::shared_ptr<Exchange>& ex, beast::error_code ec);

  // Reads what has arrived of the body into ex->piece, then `then`.
  // read_some, not a full piece: an event stream's event is relayed when it
  // comes.
  using PieceHandler = void (Impl::*)(const std::shared_ptr<Exchange>&, beast::error_code);
  void ReadSome(const std::shared_ptr<Exchange>& ex, PieceHandler then) {
    PreparePiece(ex, kPieceBytes);
    Expire(*ex->conn, ex->piece_timeout);
    ex->conn->With([&](auto& stream) {
      bhttp::async_read_some(stream, ex->conn->buffer, *ex->stream_parser,
                             [self = shared_from_this(), ex, then](beast::error_code ec, size_t) {
                               if (ec == bhttp::error::need_buffer) ec = {};  // the piece is full
                               if (!ec) TrimPiece(*ex);
                               ((*self).*then)(ex, ec);
                             });
    });
  }

  // On the strand: the next piece for ex->next.
  void ReadPiece(const std::shared_ptr<Exchange>& ex) {
    if (!ex->conn) return EndPiece(ex, {.failed = true});  // cancelled meanwhile
    if (ex->prefetched) {
      http::BodySource::Piece p{.data = std::move(*ex->prefetched)};
      ex->prefetched.reset();
      return EndPiece(ex, std::move(p));
    }
    ReadSome(ex, &Impl::OnPiece);
  }

  void OnPiece(const std::shared_ptr<Exchange>& ex, beast::error_code ec) {
    if (ec || !ex->conn) {
      EndStream(ex, false);
      return EndPiece(ex, {.failed = true});
    }
    if (ex->piece.empty() && !ex->stream_parser->is_done()) return ReadPiece(ex);  // framing only
    http::BodySource::Piece p{.data = std::move(ex->piece)};
    if (ex->stream_parser->is_done()) {
      p.last = true;
      EndStream(ex, ex->stream_parser->keep_alive());
    }
    EndPiece(ex, std::move(p));
  }

  // ex->piece, `size` bytes (not zero-filled: what the parser does not
  // write is cut by TrimPiece), as the parser's body buffer.
  static void PreparePiece(const std::shared_ptr<Exchange>& ex, size_t size) {
    ex->piece.resize_and_overwrite(size, [](char*, size_t n) { return n; });
    auto& body = ex->stream_parser->get().body();
    body.data = ex->piece.data();
    body.size = ex->piece.size();
    body.more = true;
  }
  static void TrimPiece(Exchange& ex) {
    ex.piece.resize(ex.piece.size() - ex.stream_parser->get().body().size);
  }

  // The body bytes that came with the header, parsed at once, without
  // waiting for more: an answer they complete is handed over whole (one
  // write to the client, as without streaming), else they are the stream's
  // first piece.
  void TakeBuffered(const std::shared_ptr<Exchange>& ex) {
    auto& parser = *ex->stream_parser;
    auto& buffer = ex->conn->buffer;
    PreparePiece(ex, std::min(buffer.size(), kPieceBytes));
    parser.eager(true);  // the body too, not only the next chunk header
    beast::error_code ec;
    while (buffer.size() > 0 && !parser.is_done()) {
      size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec == bhttp::error::need_more || ec == bhttp::error::need_buffer) {
        ec = {};  // the rest is still to come, or the piece is full
        break;
      }
      if (ec || used == 0) break;
    }
    if (ec) return FailAfterSend(ex, ec);
    TrimPiece(*ex);
    if (parser.is_done()) {
      HttpClientResult r = HeaderOf(parser.get());
      r.response.body = std::move(ex->piece);
      return Finish(ex, std::move(r), parser.keep_alive());
    }
    if (!ex->piece.empty()) ex->prefetched = std::move(ex->piece);
    HandOver(ex);
  }

  // Hands the header over, the body to follow through a StreamedBody.
  void HandOver(const std::shared_ptr<Exchange>& ex);

  static HttpClientResult HeaderOf(const bhttp::response_header<>& header) {
    HttpClientResult r;
    r.response.status = static_cast<int>(header.result_int());
    CopyHeaders(header, r.response);
    return r;
  }

  static void EndPiece(const std::shared_ptr<Exchange>& ex, http::BodySource::Piece p) {
    auto next = std::move(ex->next);
    ex->next = nullptr;
    if (next) next(std::move(p));
  }

  // On the strand (or after Stop): the body is over or abandoned; its
  // connection goes back to the pool or is closed.
  void EndStream(const std::shared_ptr<Exchange>& ex, bool reusable) {
    if (!ex->conn) return;
    Release(ex, reusable);
  }

  // Runs `f` on the exchange's strand, or returns false once the pool has
  // stopped (its io_context may be gone) or the body has ended.
  template <class F>
  bool OnStrand(const std::shared_ptr<Exchange>& ex, F&& f) {
    std::lock_guard g(mu);
    if (stopped || !ex->strand) return false;
    asio::post(*ex->strand, std::forward<F>(f));
    return true;
  }

  // The first `count` fields of `res` (all by default) into `out`.
  static void CopyHeaders(const bhttp::response_header<>& res, http::Response& out,
                          size_t count = SIZE_MAX) {
    count = std::min(count, static_cast<size_t>(std::distance(res.begin(), res.end())));
    out.headers.reserve(out.headers.size() + count);
    for (auto it = res.begin(); count > 0; ++it, --count) {
      out.headers.push_back({std::string(it->name_string()), std::string(it->value())});
    }
  }

  void Fail(const std::shared_ptr<Exchange>& ex, HttpClientResult::Kind kind, std::string detail) {
    HttpClientResult r;
    r.kind = kind;
    r.detail = std::move(detail);
    Finish(ex, std::move(r), false);
  }

  void Finish(const std::shared_ptr<Exchange>& ex, HttpClientResult result, bool reusable) {
    if (ex->finished) return;
    ex->finished = true;
    Release(ex, reusable);
    Answer(ex, std::move(result));
  }

  // Calls the exchange's callback: once per exchange started (Finish,
  // HandOver and Stop each end an exchange once).
  void Answer(const std::shared_ptr<Exchange>& ex, HttpClientResult result) {
    HttpClientCallback done = std::move(ex->done);
    ex->done = nullptr;
    if (done) done(std::move(result));
    std::lock_guard g(mu);
    if (--unanswered == 0) answered.notify_all();
  }

  // The exchange is over: its connection goes back to the pool or is closed.
  void Release(const std::shared_ptr<Exchange>& ex, bool reusable) {
    reusable = reusable && ex->keep_alive && !ex->cancelled;
    std::unique_ptr<Conn> conn = std::move(ex->conn);
    {
      std::lock_guard g(mu);
      in_flight.erase(ex);
      ex->strand.reset();  // no strand may outlive the io_context (Stop)
      if (conn && reusable && !stopped && idle.size() < options.max_idle_connections) {
        conn->lowest().expires_never();
        conn->idle_since = SteadyClock::now();
        idle.push_back(std::move(conn));
      }
    }
    if (conn) conn->Close();
  }

  // Call::Cancel and StreamedBody::Cancel: on the strand, closes the
  // connection; a read or write in flight ends with operation_aborted and
  // settles the exchange (or answers `next`). A handed-over body with no
  // read in flight ends here.
  void Cancel(const std::shared_ptr<Exchange>& ex) {
    ex->cancelled = true;
    OnStrand(ex, [self = shared_from_this(), ex] {
      if (ex->conn) ex->conn->Close();
      if (ex->finished && !ex->next) self->EndStream(ex, false);
    });
  }

  void Abort() {
    std::vector<std::shared_ptr<Exchange>> active;
    {
      std::lock_guard g(mu);
      aborted = true;  // no exchange starts after these
      active.assign(in_flight.begin(), in_flight.end());
    }
    for (const auto& ex : active) Cancel(ex);
    std::unique_lock g(mu);
    answered.wait(g, [&] { return unanswered == 0; });
  }

  void Stop() {
    std::vector<std::unique_ptr<Conn>> idle_now;
    std::set<std::shared_ptr<Exchange>> active;
    {
      std::lock_guard g(mu);
      if (stopped) return;
      stopped = true;
      idle_now = std::move(idle);
      idle.clear();
    }
    for (auto& c : idle_now) c->Close();
    idle_now.clear();
    if (ioc_owner) {
      work.reset();
      ioc.stop();
      for (std::thread& t : threads) {
        if (t.joinable()) t.join();
      }
    }
    {
      std::lock_guard g(mu);
      active = std::move(in_flight);
      in_flight.clear();
    }
    // The threads are gone: what is left in flight ends here.
    for (const auto& ex : active) {
      if (ex->finished) {  // a streamed body
        if (ex->conn) ex->conn->Close();
        ex->conn.reset();
        {
          std::lock_guard g(mu);
          ex->strand.reset();
        }
        EndPiece(ex, {.failed = true});
        continue;
      }
      ex->finished = true;
      if (ex->conn) ex->conn->Close();
      ex->conn.reset();
      HttpClientResult r;
      r.kind = ex->writing ? HttpClientResult::Kind::kMaybeSent : HttpClientResult::Kind::kNotSent;
      r.detail = ex->writing ? "the HTTP client stopped before the upstream answered"
                             : "the HTTP client stopped before the request was sent";
      Answer(ex, std::move(r));
    }
    ioc_owner.reset();
  }
};

namespace {

// The body of a streamed answer, read from the upstream as the listener asks.
class StreamedBody : public http::BodySource {
 public:
  StreamedBody(std::shared_ptr<HttpClient::Impl> pool, std::shared_ptr<Exchange> ex)
      : pool_(std::move(pool)), ex_(std::move(ex)) {}
  ~StreamedBody() override { Cancel(); }

  void Next(std::function<void(Piece)> next) override {
    auto shared_next = std::make_shared<std::function<void(Piece)>>(std::move(next));
    bool posted = pool_->OnStrand(ex_, [pool = pool_, ex = ex_, shared_next] {
      ex->next = std::move(*shared_next);
      pool->ReadPiece(ex);
    });
    if (!posted) (*shared_next)(Piece{.failed = true});
  }

  void Cancel() override {
    if (cancelled_.exchange(true)) return;
    pool_->Cancel(ex_);
  }

 private:
  const std::shared_ptr<HttpClient::Impl> pool_;
  const std::shared_ptr<Exchange> ex_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

void HttpClient::Impl::OnStreamHeader(const std::shared_ptr<Exchange>& ex, beast::error_code ec) {
  if (ec) return FailAfterSend(ex, ec);
  auto& parser = *ex->stream_parser;
  if (IsInterim(parser.get().result_int())) return ReadStreamHeader(ex);
  if (parser.is_done()) return Finish(ex, HeaderOf(parser.get()), parser.keep_alive());
  if (ex->conn->buffer.size() > 0) return TakeBuffered(ex);
  HandOver(ex);
}

void HttpClient::Impl::HandOver(const std::shared_ptr<Exchange>& ex) {
  auto& parser = *ex->stream_parser;
  HttpClientResult r = HeaderOf(parser.get());
  if (auto length = parser.content_length()) r.response.stream_length = *length;
  ex->conn->lowest().expires_never();  // until the listener asks for a piece
  r.response.stream = std::make_shared<StreamedBody>(shared_from_this(), ex);
  ex->finished = true;  // the header is handed over; the body follows (in_flight until its end)
  Answer(ex, std::move(r));
}

namespace {

Result<std::shared_ptr<HttpClient::Impl>> NewImpl(const HttpClientOptions& options,
                                                  asio::io_context* external) {
  Result<Origin> origin = ParseOrigin(options.url);
  if (!origin) return std::unexpected(origin.error());
  std::unique_ptr<ssl::context> tls;
  if (origin->target.tls) {
    auto ctx = NewTlsClientContext(
        {.verify = options.verify_tls, .ca_file = options.ca_file, .ca_option = options.ca_option});
    if (!ctx) return std::unexpected(ctx.error());
    tls = std::make_unique<ssl::context>(ctx->release());
  }
  return std::make_shared<HttpClient::Impl>(std::move(*origin), options, std::move(tls), external);
}

}  // namespace

Result<std::unique_ptr<HttpClient>> HttpClient::Create(const HttpClientOptions& options) {
  auto impl = NewImpl(options, nullptr);
  if (!impl) return std::unexpected(impl.error());
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    (*impl)->threads.emplace_back([io = &(*impl)->ioc] { io->run(); });
  }
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(*impl)));
}

Result<std::unique_ptr<HttpClient>> HttpClient::Create(const HttpClientOptions& options,
                                                       asio::io_context& ioc) {
  auto impl = NewImpl(options, &ioc);
  if (!impl) return std::unexpected(impl.error());
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(*impl)));
}

void HttpClient::Call::Cancel() const {
  auto client = client_.lock();
  auto ex = exchange_.lock();
  if (client && ex) client->Cancel(ex);
}

HttpClient::HttpClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpClient::~HttpClient() { Stop(); }

void HttpClient::Stop() { impl_->Stop(); }

void HttpClient::Abort() { impl_->Abort(); }

const std::string& HttpClient::host_header() const { return impl_->origin.target.host_header; }

HttpClient::Call HttpClient::Send(HttpClientRequest request, HttpClientCallback done) {
  auto ex = std::make_shared<Exchange>();
  ex->done = std::move(done);
  ex->on_written = std::move(request.on_written);
  ex->stream = request.stream;
  ex->response_timeout = request.response_timeout.value_or(impl_->options.response_timeout);
  ex->write_timeout = request.write_timeout;
  ex->piece_timeout = request.piece_timeout.value_or(ex->response_timeout);
  ex->head = request.method == "HEAD";
  ex->keep_alive = request.keep_alive;
  if (std::optional<std::string> refusal = FormatRequestHead(
          request, impl_->origin.base_path, impl_->origin.target.host_header, ex->wire_head)) {
    // Answered at once, as a request after Stop is; no exchange starts.
    HttpClientResult r;
    r.kind = HttpClientResult::Kind::kNotSent;
    r.detail = *std::move(refusal);
    ex->done(std::move(r));
    return Call{};
  }
  ex->body = std::move(request.body);
  Call call;
  call.client_ = impl_;
  call.exchange_ = ex;
  impl_->Start(ex);
  return call;
}

}  // namespace idem::net
