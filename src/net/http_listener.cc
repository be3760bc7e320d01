// HttpListener: Boost.Beast, asynchronous.
//
// One io_context with `threads` threads; each connection runs on its own
// strand. A connection reads one request under a whole-request deadline (a
// timer of its own, so that a request cut off half-way can still be answered
// 408 before the socket closes), hands it to the handler and waits for the
// Responder, writes the answer under write_timeout, and reads the next
// request (keep-alive) or closes. A streamed answer (Response::stream) is
// written piece by piece, each under write_timeout, the next piece asked for
// once the last is written; a closed connection cancels its source. While
// the source is quiet, the hold timer doubles as the idle timer that writes
// the answer's keep-alive piece. A request whose handler asked for
// RequestHooks::OnClientGone has its socket watched (one read) while its
// answer is pending; RequestHooks::After also runs on the hold timer.
//
// Lifetimes: the listener's state (Server) is shared. A connection lives as
// long as an operation of its own is pending (while a handler works, a timer
// wait holds it). A Responder holds only weak references to the Server and
// the connection, and locks the Server first: the io_context it posts to is
// then alive for the duration of the post. Handlers still queued when the io_context is destroyed
// destroy their connections, which still find the Server's bookkeeping alive (it is declared before
// the io_context).
#include "net/http_listener.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "net/http_rules.h"  // FormatHostPort, IsHostAllowedOnLoopback, PrintableExcerpt
#include "net/listen_socket.h"
#include "net/request_target.h"
#include "net/http_server_io.h"

namespace idem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::literals;

class Connection;

// The Date header's value, "Mon, 30 Nov 2026 13:55:13 GMT" (RFC 9110
// IMF-fixdate), formatted at most once per second per listener: every
// answer carries it, and strftime on each was a visible share of an answer's
// cost. Thread-safe (the I/O threads share it).
class DateCache {
 public:
  // Appends the current second's date to `out`.
  void AppendTo(std::string& out) {
    const std::time_t now = std::time(nullptr);
    std::lock_guard lock(mu_);
    if (now != second_ || length_ == 0) {
      std::tm tm{};
      gmtime_r(&now, &tm);
      length_ = std::strftime(text_, sizeof text_, "%a, %d %b %Y %H:%M:%S GMT", &tm);
      second_ = now;
    }
    out.append(text_, length_);
  }

 private:
  std::mutex mu_;
  std::time_t second_ = 0;
  size_t length_ = 0;
  char text_[64] = {};
};

// How an answer's body is delimited (the listener's own framing headers).
struct Framing {
  std::optional<uint64_t> content_length;  // Content-Length, when set
  bool chunked = false;                    // Transfer-Encoding: chunked
};

bool IsManagedHeader(std::string_view name) {
  return beast::iequals(name, "Content-Length") || beast::iequals(name, "Date") ||
         beast::iequals(name, "Connection") || beast::iequals(name, "Transfer-Encoding") ||
         beast::iequals(name, "Keep-Alive");
}

// 1xx, 204 and 304 answers have no body and no Content-Length (RFC 9110 §8.6).
bool IsBodiless(int status) {
  return (status >= 100 && status < 200) || status == 204 || status == 304;
}

// Appends an answer's status line and header block: the handler's headers
// in order without the ones the listener manages, Server (unless the handler
// set one), Date, Connection: close when the connection closes after it, and
// the framing. Formatted directly instead of through Beast's fields and
// serializer: one string, reused per connection, no allocation per field.
void FormatHead(const Response& r, bool keep_alive, const Framing& framing, DateCache& date,
                std::string& out) {
  out.append("HTTP/1.1 "sv).append(std::to_string(r.status)).append(" "sv);
  beast::string_view reason = bhttp::obsolete_reason(static_cast<bhttp::status>(r.status));
  out.append(reason.data(), reason.size()).append("\r\n"sv);
  bool has_server = false;
  for (const Header& h : r.headers) {
    if (IsManagedHeader(h.name)) continue;
    has_server = has_server || beast::iequals(h.name, "Server");
    AppendHeaderLine(out, h.name, h.value);
  }
  if (!has_server) out.append("Server: idemgate\r\n"sv);
  out.append("Date: "sv);
  date.AppendTo(out);
  out.append("\r\n"sv);
  if (!keep_alive) out.append("Connection: close\r\n"sv);
  if (framing.content_length) {
    AppendHeaderLine(out, "Content-Length"sv, std::to_string(*framing.content_length));
  }
  if (framing.chunked) out.append("Transfer-Encoding: chunked\r\n"sv);
  out.append("\r\n"sv);
}

}  // namespace

void AppendHeaderLine(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": "sv).append(value).append("\r\n"sv);
}

// ── The listener's shared state ─────────────────────────────────────────────

struct Server : std::enable_shared_from_this<Server> {
  Server(const ListenerOptions& o, Handler h)
      : options(o),
        handler(std::move(h)),
        ioc(o.io ? *o.io : own_ioc.emplace()),
        acceptor(net::make_strand(ioc)) {}

  void Accept();
  void Forget(Connection* c);
  std::vector<std::shared_ptr<Connection>> Live();

  const ListenerOptions options;
  Handler handler;  // reset after the I/O threads are joined (see Stop)
  std::string bound;
  bool loopback = true;  // bound to a loopback address

  std::mutex mu;  // guards everything below up to `ioc`
  std::condition_variable cv;
  bool stopping = false;
  bool draining = false;
  // Accepting stopped at the hard cap (max_connections + kOverLimitReserve);
  // Forget resumes it.
  bool accept_paused = false;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;

  DateCache date;  // thread-safe on its own

  // After the state above: handlers destroyed with the io_context still
  // find it alive. On the caller's io_context (options.io), Stop waits for
  // every connection to be gone instead.
  std::optional<net::io_context> own_ioc;
  net::io_context& ioc;  // own_ioc's or the caller's
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor;  // on its own strand
  // On the acceptor's strand: the pause after running out of descriptors,
  // and whether the current run of such errors has been logged.
  net::steady_timer accept_pause{acceptor.get_executor()};
  bool out_of_descriptors = false;
  std::vector<std::thread> threads;
  std::once_flag stopped;
};

struct HttpListener::Impl {
  std::shared_ptr<Server> server;
};

namespace {

// Delivers a handler's answer to its connection, once.
struct ResponderState {
  std::weak_ptr<Server> server;
  std::weak_ptr<Connection> connection;
  uint64_t serial = 0;
  std::atomic<bool> answered{false};

  void Answer(Response&& response);
  // A handler that drops its Responder unanswered is a bug; the client
  // still gets an answer instead of waiting for read_timeout.
  ~ResponderState() {
    if (!answered.load()) {
      Answer(Problem(500, "unanswered", "Internal error",
                     "idemgate: the request was dropped without an answer; retry it"));
    }
  }
};

// RequestHooks for one handler call: valid only during it (Detach after).
class Hooks : public RequestHooks {
 public:
  explicit Hooks(Connection* connection) : connection_(connection) {}
  void OnClientGone(std::function<void()> on_gone) override;
  void After(std::chrono::milliseconds delay, std::function<void()> fn) override;
  void Detach() { connection_ = nullptr; }

 private:
  Connection* connection_;
};

// ── One connection ──────────────────────────────────────────────────────────

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server* server, tcp::socket socket)
      : server_(server),
        options_(server->options),
        limits_{options_.max_header_bytes, options_.max_header_count, options_.max_body_bytes,
                options_.read_timeout},
        stream_(std::move(socket)),
        hold_(stream_.get_executor()) {}

  ~Connection() { server_->Forget(this); }

  void Start(bool over_limit) {
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), over_limit] {
      beast::error_code ec;
      self->remote_ = "";
      auto ep = self->stream_.socket().remote_endpoint(ec);
      if (!ec) self->remote_ = idem::net::FormatHostPort(ep.address().to_string(), ep.port());
      self->stream_.socket().set_option(tcp::no_delay(true), ec);
      if (over_limit) {
        // Answered and closed promptly: an over-limit connection holds its
        // descriptor for at most kOverLimitLinger after its 503.
        self->keep_alive_ = false;
        self->linger_ = true;
        self->linger_timeout_ = std::min(self->linger_timeout_, idem::net::kOverLimitLinger);
        self->linger_bytes_ = 64 * 1024;
        return self->SendProblem(503, "too-many-connections", "Too many connections",
                                 "idemgate: too many connections: this listener already serves " +
                                     std::to_string(self->options_.max_connections) +
                                     " (max_connections); retry shortly",
                                 {{"Retry-After", "1"}});
      }
      self->DoRead();
    });
  }

  // From any thread (the Responder). Deferred: from a thread of this
  // io_context (a handler answering at once, or a store's callback on a
  // shared one) the answer is written on that thread once it is free,
  // without waking another.
  void PostResponse(uint64_t serial, Response&& response) {
    net::defer(stream_.get_executor(),
               [self = shared_from_this(), serial, r = std::move(response)]() mutable {
                 if (serial != self->serial_ || self->state_ != State::kHandling) {
                   if (r.stream) r.stream->Cancel();
                   return;
                 }
                 self->SendResponse(std::move(r));
               });
  }

  // From any thread: stop reading new requests; an idle connection closes
  // now, a busy one after its answer.
  void PostDrain() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->keep_alive_ = false;
      if (self->state_ == State::kReading && self->buffer_.size() == 0 &&
          !(self->parser_ && self->parser_->got_some())) {
        self->CloseNow();
      }
    });
  }

  // From any thread: close now; an answer not yet written is dropped.
  void PostClose() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->CloseNow(); });
  }

  // RequestHooks, on the strand during the handler's call.
  void SetClientGone(std::function<void()> on_gone) {
    gone_ = std::move(on_gone);
    watch_ = true;
    Watch();
  }
  void SetAfter(std::chrono::milliseconds delay, std::function<void()> fn) {
    after_ = std::move(fn);
    hold_.expires_after(delay);
    hold_.async_wait([self = shared_from_this(), serial = serial_](beast::error_code ec) {
      if (!ec) self->OnAfter(serial);
    });
  }

 private:
  enum class State { kReading, kHandling, kWriting, kClosed };

  // ── Reading ──

  void DoRead() {
    state_ = State::kReading;
    ++serial_;
    gone_ = nullptr;
    after_ = nullptr;
    watch_ = false;
    parser_.emplace();
    stream_.expires_never();
    idem::net::ReadRequest(stream_, buffer_, *parser_, limits_, shared_from_this(),
                           beast::bind_front_handler(&Connection::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, std::optional<idem::net::Refusal> refusal) {
    if (refusal) {
      keep_alive_ = false;
      linger_ = refusal->linger;
      return SendRefusal(*refusal);
    }
    if (ec) return CloseNow();  // the client left, was stopped, or sat idle too long
    bhttp::request<bhttp::string_body> req = parser_->release();
    keep_alive_ = keep_alive_ && req.keep_alive();
    head_ = req.method() == bhttp::verb::head;
    version_ = req.version();
    Request request;
    request.method = std::string(req.method_string());
    // Normalised once for every front: routes are matched on, and the
    // upstream is sent, the same path (security review F10).
    Result<std::string> target = idem::net::NormalizeTarget(req.target(), req[bhttp::field::host]);
    if (!target) {
      keep_alive_ = false;
      return SendProblem(400, "bad-target", "Bad request target",
                         "idemgate: " + target.error().message);
    }
    request.target = std::move(*target);
    size_t q = request.target.find('?');
    request.path.assign(request.target, 0, q);
    if (q != std::string::npos) request.query.assign(request.target, q + 1);
    request.headers.reserve(static_cast<size_t>(std::distance(req.begin(), req.end())));
    for (const auto& field : req) {  // built in place: no temporary Header to move
      Header& h = request.headers.emplace_back();
      h.name.assign(field.name_string().data(), field.name_string().size());
      h.value.assign(field.value().data(), field.value().size());
    }
    request.body = std::move(req.body());
    request.remote = remote_;
    Handle(std::move(request));
  }

  // ── Handling ──

  void Handle(Request&& request) {
    state_ = State::kHandling;
    if (server_->loopback && (!options_.authenticate || options_.check_host_with_tokens)) {
      // A page that rebinds its own name to our address sends that name.
      auto host = request.FindHeader("Host");
      if (host && !host->empty() && !idem::net::IsHostAllowedOnLoopback(*host, options_.allowed_hosts)) {
        return SendProblem(403, "host-not-allowed", "Host not allowed",
                           "idemgate: Host '" + idem::net::PrintableExcerpt(*host, 100) +
                               "' is not allowed on a loopback listener without tokens; use "
                               "127.0.0.1 or localhost, or configure [[tenant]] tokens");
      }
    }
    Principal principal;
    if (options_.authenticate) {
      std::optional<Principal> who;
      std::string_view token;
      if (auto auth = request.FindHeader("Authorization")) token = idem::net::BearerToken(*auth);
      if (!token.empty()) who = options_.authenticate(token);
      bool is_public = std::find(options_.public_paths.begin(), options_.public_paths.end(),
                                 request.path) != options_.public_paths.end();
      if (who) {
        principal = *who;
      } else if (is_public) {
        principal = Principal{"", false};  // anonymous: no tenant, no admin rights
      } else {
        return SendProblem(401, "unauthorized", "Unauthorized",
                           token.empty() ? "idemgate: a bearer token is required: send "
                                           "Authorization: Bearer <token> (a [[tenant]] token)"
                                         : "idemgate: the bearer token is not known; use a token "
                                           "listed under [[tenant]] in the config",
                           {{"WWW-Authenticate", "Bearer"}});
      }
    }
    request.principal = std::move(principal);

    HoldWhileHandling();
    auto state = std::make_shared<ResponderState>();
    state->server = server_->weak_from_this();
    state->connection = weak_from_this();
    state->serial = serial_;
    // Response&& (here and on to SendResponse): std::function passes its
    // argument on as an rvalue; taking it by reference saves a move per step.
    Responder respond = [state](Response&& r) { state->Answer(std::move(r)); };
    auto hooks = std::make_shared<Hooks>(this);
    request.hooks = hooks;
    try {
      server_->handler(std::move(request), std::move(respond));
      hooks->Detach();
    } catch (const std::exception& e) {
      hooks->Detach();
      // The handler threw before answering (a bug): answer 500 ourselves.
      if (!state->answered.exchange(true)) {
        SendResponse(Problem(500, "internal", "Internal error",
                             std::string("idemgate: internal error: ") + e.what()));
      }
    }
  }

  // The handler's RequestHooks::After is due (on the hold timer).
  void OnAfter(uint64_t serial) {
    if (serial != serial_ || state_ != State::kHandling || !after_) return;
    std::function<void()> fn = std::move(after_);
    after_ = nullptr;
    HoldWhileHandling();
    fn();
  }

  // Nothing else holds the connection while the handler works: this wait
  // does, until the answer is sent or the connection is closed (Stop).
  void HoldWhileHandling() {
    hold_.expires_at(net::steady_timer::time_point::max());
    hold_.async_wait([self = shared_from_this()](beast::error_code) {});
  }

  // While an answer is pending for a handler that asked (OnClientGone):
  // one read, so that a client that leaves is noticed even when nothing is
  // being written. Bytes that arrive (a pipelined next request) stay in the
  // buffer for the next read.
  void Watch() {
    if (watching_ || state_ == State::kClosed || buffer_.size() >= options_.max_header_bytes) {
      return;
    }
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (resume_after_watch_) {  // the answer is written: read the next request
      resume_after_watch_ = false;
      if (state_ != State::kClosed) DoRead();
      return;
    }
    if (state_ == State::kClosed) return;
    if (ec) return CloseNow();  // the client left: CloseNow tells the handler
    if (watch_ && (state_ == State::kHandling || state_ == State::kWriting)) Watch();
  }

  // ── Writing ──

  void SendRefusal(const idem::net::Refusal& r) {
    SendProblem(r.status, r.type, r.title, r.detail);
  }

  void SendProblem(int status, std::string_view type, std::string_view title,
                   const std::string& detail, std::vector<Header> extra = {}) {
    state_ = State::kHandling;
    Response r = options_.render_refusal ? options_.render_refusal(status, type, detail)
                                         : Problem(status, type, title, detail);
    for (Header& h : extra) r.headers.push_back(std::move(h));
    SendResponse(std::move(r));
  }

  // Starts a new head for the answer in out_head_ (its capacity is reused).
  void StartHead(const Response& r, const Framing& framing) {
    if (out_head_.capacity() > 4 * options_.max_header_bytes) out_head_ = std::string();
    out_head_.clear();
    FormatHead(r, keep_alive_, framing, server_->date, out_head_);
  }

  void SendResponse(Response&& r) {
    if (state_ == State::kClosed) {
      if (r.stream) r.stream->Cancel();
      return;
    }
    state_ = State::kWriting;
    hold_.cancel();  // the hold set in Handle
    if (r.stream) return SendStreamed(std::move(r));
    // A HEAD answer gets the length a GET would get, without the body.
    const bool bodiless = IsBodiless(r.status);
    Framing framing;
    if (head_ || !bodiless) framing.content_length = r.body.size();
    StartHead(r, framing);
    if (!head_ && !bodiless) out_body_ = std::move(r.body);
    std::array<net::const_buffer, 2> buffers{net::buffer(out_head_), net::buffer(out_body_)};
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, buffers, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWrite(ec);
    });
  }

  // A body from a BodySource: the header, then each piece as the source
  // hands it over, the next asked for once the last is written.
  void SendStreamed(Response&& r) {
    Framing framing;
    if (r.stream_length) {
      framing.content_length = *r.stream_length;
    } else if (version_ >= 11) {
      framing.chunked = true;
      chunked_ = true;
    } else {
      keep_alive_ = false;  // an HTTP/1.0 client reads the body to the close
    }
    // Keep-alive pieces only between chunks: never inside a counted body.
    idle_interval_ = chunked_ && !r.idle_piece.empty() ? r.idle_interval
                                                       : std::chrono::milliseconds(0);
    idle_piece_ = std::move(r.idle_piece);
    StartHead(r, framing);
    if (head_) {
      r.stream->Cancel();  // a HEAD answer has no body to wait for
    } else {
      source_ = std::move(r.stream);
    }
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, net::buffer(out_head_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec || !self->source_) return self->OnWrite(ec);
                       self->NextPiece();
                     });
  }

  void NextPiece() {
    stream_.expires_never();
    waiting_piece_ = true;
    ArmIdle();
    std::weak_ptr<Server> server = server_->weak_from_this();
    std::weak_ptr<Connection> weak = weak_from_this();
    const uint64_t serial = serial_;
    source_->Next([server, weak, serial](BodySource::Piece piece) {
      std::shared_ptr<Server> s = server.lock();  // first: keeps the io_context alive
      if (!s) return;
      std::shared_ptr<Connection> c = weak.lock();
      if (!c) return;
      net::post(c->stream_.get_executor(), [c, serial, p = std::move(piece)]() mutable {
        if (serial != c->serial_ || c->state_ != State::kWriting || !c->source_) return;
        if (c->writing_idle_) {
          c->pending_piece_ = std::move(p);  // written once the keep-alive piece is
          return;
        }
        c->WritePiece(std::move(p));
      });
    });
  }

  // As in Handle, the hold timer's wait holds the connection while the
  // source works; with an idle interval it also writes the keep-alive piece.
  void ArmIdle() {
    const uint64_t generation = ++idle_generation_;
    if (idle_interval_.count() <= 0) {
      hold_.expires_at(net::steady_timer::time_point::max());
    } else {
      hold_.expires_after(idle_interval_);
    }
    hold_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
      if (!ec && generation == self->idle_generation_) self->WriteIdle();
    });
  }

  void WriteIdle() {
    if (!waiting_piece_ || state_ != State::kWriting || !source_ || writing_idle_) return;
    writing_idle_ = true;
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, bhttp::make_chunk(net::buffer(idle_piece_)),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_idle_ = false;
                       if (ec) return self->OnWrite(ec);
                       self->stream_.expires_never();
                       if (self->state_ != State::kWriting || !self->source_) return;
                       if (!self->pending_piece_) return self->ArmIdle();
                       BodySource::Piece p = std::move(*self->pending_piece_);
                       self->pending_piece_.reset();
                       self->WritePiece(std::move(p));
                     });
  }

  void WritePiece(BodySource::Piece p) {
    waiting_piece_ = false;
    ++idle_generation_;
    hold_.cancel();
    if (p.failed) return CloseNow();  // the client sees the body cut off, as it was
    if (p.data.empty()) return p.last ? WriteEnd() : NextPiece();
    piece_ = std::move(p.data);
    auto done = [self = shared_from_this(), last = p.last](beast::error_code ec, size_t) {
      if (ec) return self->OnWrite(ec);
      if (last) return self->WriteEnd();
      self->NextPiece();
    };
    stream_.expires_after(options_.write_timeout);
    if (chunked_) {
      net::async_write(stream_, bhttp::make_chunk(net::buffer(piece_)), std::move(done));
    } else {
      net::async_write(stream_, net::buffer(piece_), std::move(done));
    }
  }

  void WriteEnd() {
    source_.reset();
    piece_.clear();
    if (!chunked_) return OnWrite({});
    chunked_ = false;
    stream_.expires_after(options_.write_timeout);
    net::async_write(
        stream_, bhttp::make_chunk_last(),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    if (!ec) gone_ = nullptr;  // the answer is out in full
    out_body_ = std::string();
    stream_.expires_never();
    if (source_) {  // a streamed answer's write failed
      source_->Cancel();
      source_.reset();
    }
    chunked_ = false;
    if (ec) return CloseNow();
    if (state_ == State::kClosed) return;
    if (keep_alive_) {
      bool draining;
      {
        std::lock_guard lock(server_->mu);
        draining = server_->draining || server_->stopping;
      }
      if (!draining && watching_) {
        // The watch read goes first; its handler then reads the next request.
        resume_after_watch_ = true;
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
        return;
      }
      if (!draining) return DoRead();
    }
    if (linger_) return LingerClose();
    CloseNow();
  }

  void CloseNow() {
    if (state_ == State::kClosed && !stream_.socket().is_open()) return;
    state_ = State::kClosed;
    hold_.cancel();
    pending_piece_.reset();
    if (source_) {
      source_->Cancel();
      source_.reset();
    }
    if (gone_) {
      std::function<void()> gone = std::move(gone_);
      gone_ = nullptr;
      gone();
    }
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // After an error answer sent before the whole request was read: stop
  // sending and read (and discard) what the client still sends until it
  // closes, so it sees the answer instead of a reset. Bounded in time by
  // read_timeout and in bytes.
  void LingerClose() {
    {
      std::lock_guard lock(server_->mu);
      if (server_->stopping) return CloseNow();
    }
    state_ = State::kClosed;
    idem::net::LingerThenClose(stream_, shared_from_this(), linger_timeout_, linger_bytes_);
  }

  Server* server_;
  const ListenerOptions& options_;
  const idem::net::RequestLimits limits_;
  beast::tcp_stream stream_;
  net::steady_timer hold_;  // keeps the connection alive while a handler works (Handle)
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string out_head_;  // the answer's status line and headers being written
  std::string out_body_;  // the answer's body being written (not streamed)
  std::shared_ptr<BodySource> source_;  // a streamed body being written
  std::string piece_;                   // the piece being written
  bool chunked_ = false;                // source_ is written chunked
  unsigned version_ = 11;               // the request's HTTP version
  std::string remote_;
  State state_ = State::kReading;
  uint64_t serial_ = 0;
  bool keep_alive_ = true;
  bool head_ = false;
  bool linger_ = false;
  // How long and how much LingerClose reads before closing.
  std::chrono::milliseconds linger_timeout_ = options_.read_timeout;
  size_t linger_bytes_ = 4 * options_.max_body_bytes + (1 << 20);
  // RequestHooks of the request being handled.
  std::function<void()> gone_;   // OnClientGone
  std::function<void()> after_;  // After
  bool watch_ = false;           // watch the socket while the answer is pending
  bool watching_ = false;        // the watch read is pending
  bool resume_after_watch_ = false;
  // Keep-alive pieces of a streamed answer (Response::idle_piece).
  std::chrono::milliseconds idle_interval_{0};
  std::string idle_piece_;
  bool waiting_piece_ = false;  // source_->Next is pending
  bool writing_idle_ = false;   // idle_piece_ is being written
  std::optional<BodySource::Piece> pending_piece_;  // arrived during that write
  uint64_t idle_generation_ = 0;                    // which idle wait is current
};

void Hooks::OnClientGone(std::function<void()> on_gone) {
  if (connection_) connection_->SetClientGone(std::move(on_gone));
}

void Hooks::After(std::chrono::milliseconds delay, std::function<void()> fn) {
  if (connection_) connection_->SetAfter(delay, std::move(fn));
}

void ResponderState::Answer(Response&& response) {
  if (answered.exchange(true)) return;        // exactly once; later calls are ignored
  std::shared_ptr<Server> s = server.lock();  // first: keeps the io_context alive
  if (!s) return;
  std::shared_ptr<Connection> c = connection.lock();
  if (!c) return;
  c->PostResponse(serial, std::move(response));
}

}  // namespace

// ── Server ──────────────────────────────────────────────────────────────────

void Server::Accept() {
  acceptor.async_accept(
      net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !self->acceptor.is_open()) {
          return;
        }
        if (!ec) {
          if (self->out_of_descriptors) {
            self->out_of_descriptors = false;
            std::cerr << "idemgate " + self->options.name + ": accepting connections again\n";
          }
          auto conn = std::make_shared<Connection>(self.get(), std::move(socket));
          bool over;
          bool full;
          {
            std::lock_guard lock(self->mu);
            if (self->stopping || self->draining) return;
            over = self->connections.size() >= self->options.max_connections;
            self->connections.emplace(conn.get(), conn);
            full = self->connections.size() >=
                   self->options.max_connections + idem::net::kOverLimitReserve;
            self->accept_paused = full;
          }
          conn->Start(over);
          if (full) return;  // the hard cap: Forget accepts again
        } else if (idem::net::IsOutOfDescriptors(ec)) {
          // The connection stays in the backlog: accepting again at once
          // would fail at once, a busy loop. Pause, and log once per run.
          if (!self->out_of_descriptors) {
            self->out_of_descriptors = true;
            std::cerr << "idemgate " + self->options.name + ": accept failed: " + ec.message() +
                             "; pausing new connections until descriptors free up (raise "
                             "LimitNOFILE= or ulimit -n, or lower max_connections)\n";
          }
          self->accept_pause.expires_after(idem::net::kAcceptPause);
          self->accept_pause.async_wait([self](beast::error_code wait_ec) {
            if (!wait_ec) self->Accept();
          });
          return;
        } else {
          std::cerr << "idemgate " + self->options.name + ": accept failed: " + ec.message() + "\n";
        }
        self->Accept();
      });
}

void Server::Forget(Connection* c) {
  bool resume = false;
  {
    std::lock_guard lock(mu);
    connections.erase(c);
    if (accept_paused && !stopping && !draining &&
        connections.size() < options.max_connections + idem::net::kOverLimitReserve) {
      accept_paused = false;
      resume = true;
    }
    cv.notify_all();
  }
  // Null while the Server is being destroyed (its io_context's queued
  // handlers destroy their connections).
  std::shared_ptr<Server> self = resume ? weak_from_this().lock() : nullptr;
  if (self) net::post(acceptor.get_executor(), [self] { self->Accept(); });
}

std::vector<std::shared_ptr<Connection>> Server::Live() {
  std::vector<std::shared_ptr<Connection>> out;
  std::lock_guard lock(mu);
  for (auto& [ptr, weak] : connections) {
    if (auto c = weak.lock()) out.push_back(std::move(c));
  }
  return out;
}

// ── HttpListener ────────────────────────────────────────────────────────────

HttpListener::HttpListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpListener::~HttpListener() { Stop(); }

Result<std::unique_ptr<HttpListener>> HttpListener::Start(const ListenerOptions& options,
                                                          Handler handler) {
  if (!handler) return MakeError(ErrorCode::kInvalidArgument, "no request handler");
  auto server = std::make_shared<Server>(options, std::move(handler));

  Result<idem::net::ListeningSocket> socket = idem::net::OpenListeningSocket(
      server->acceptor, options.listen, bool(options.authenticate), options.insecure_no_auth);
  if (!socket) return std::unexpected(socket.error());
  server->bound = socket->bound;
  server->loopback = socket->loopback;
  if (auto warning = idem::net::DescriptorLimitWarning(options.name, options.max_connections)) {
    std::cerr << *warning << std::flush;
  }
  server->Accept();
  if (server->own_ioc) {
    server->work.emplace(server->ioc.get_executor());
    for (int i = 0; i < std::max(1, options.threads); ++i) {
      server->threads.emplace_back([s = server.get()] { s->ioc.run(); });
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->server = std::move(server);
  auto listener = std::unique_ptr<HttpListener>(new HttpListener(std::move(impl)));
  if (options.announce) {
    std::cerr << "idemgate " + options.name + ": listening on " + listener->url() + "\n"
              << std::flush;
  }
  return listener;
}

std::string HttpListener::bound_address() const { return impl_->server->bound; }

std::string HttpListener::url() const { return "http://" + impl_->server->bound; }

bool HttpListener::Drain(std::chrono::milliseconds grace) {
  Server& s = *impl_->server;
  {
    std::lock_guard lock(s.mu);
    if (s.stopping) return true;
    s.draining = true;
  }
  net::post(s.acceptor.get_executor(), [server = impl_->server] {
    beast::error_code ignored;
    server->acceptor.close(ignored);
    server->accept_pause.cancel();
  });
  for (auto& c : s.Live()) c->PostDrain();
  std::unique_lock lock(s.mu);
  return s.cv.wait_for(lock, grace, [&] { return s.connections.empty(); });
}

void HttpListener::Stop() {
  if (!impl_) return;
  std::shared_ptr<Server> server = impl_->server;
  std::call_once(server->stopped, [&] {
    {
      std::lock_guard lock(server->mu);
      server->stopping = true;
    }
    net::post(server->acceptor.get_executor(), [server] {
      beast::error_code ignored;
      server->acceptor.close(ignored);
      server->accept_pause.cancel();
    });
    for (auto& c : server->Live()) c->PostClose();
    if (server->own_ioc) {
      server->work.reset();
      for (std::thread& t : server->threads) {
        if (t.joinable()) t.join();
      }
    } else {
      // The threads go on: no connection may call the handler, or find the
      // Server gone, once Stop returns.
      std::unique_lock lock(server->mu);
      server->cv.wait(lock, [&] { return server->connections.empty(); });
    }
    // Destroy the handler here, in the caller's thread: it may own a worker
    // pool whose threads hold Responders (that could otherwise drop the last
    // reference to the Server on one of those threads).
    Handler handler = std::move(server->handler);
    handler = nullptr;
  });
}

}  // namespace idem::http
