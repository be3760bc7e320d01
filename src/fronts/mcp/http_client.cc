// ConnectHttpUpstream: the upstream side of the proxy over Streamable HTTP.
//
// One I/O thread per channel runs every exchange (Boost.Beast, asynchronous);
// messages go to McpSession through a MessagePump. Each Send becomes one POST
// on a keep-alive connection from a small pool, so a long SSE answer never
// holds up the next request. Requests start in order: the next POST starts
// once the previous one is fully written, and nothing starts while an
// initialize is in flight (its answer carries the session id every later
// request needs).
//
// Every request ends in exactly one of: its response delivered, or a
// synthesised not_sent / maybe_sent error (http_channels.h).
#include <openssl/rand.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/json.hpp>
#include <cerrno>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "net/client_conn.h"
#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_message_pump.h"
#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/sse.h"
#include "net/http_target.h"
#include "net/tls_client.h"

#ifndef IDEM_VERSION
#define IDEM_VERSION "dev"
#endif

namespace idem::mcp {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxResumes = 5;
constexpr milliseconds kWriteTimeout{30'000};
constexpr milliseconds kCloseGrace{5'000};
constexpr milliseconds kListenRetryMin{1'000};
constexpr milliseconds kListenRetryMax{30'000};

void Log(std::string_view message) {
  std::string line = "idemgate: mcp upstream: ";
  line.append(message).push_back('\n');
  std::cerr << line << std::flush;
}

// A secret that marks the delivery failures this process synthesises.
const std::string& ProcessNonce() {
  static const std::string nonce = [] {
    unsigned char bytes[16];
    if (RAND_bytes(bytes, sizeof bytes) != 1) {
      std::random_device rd;
      for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    for (unsigned char b : bytes) {
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
    return out;
  }();
  return nonce;
}

using Target = idem::net::HttpTarget;

using Conn = idem::net::ClientConn;

// One HTTP exchange.
struct Op {
  enum class Kind {
    kPost,    // a message to the upstream
    kResume,  // GET with Last-Event-ID, continuing a POST's stream
    kListen,  // the GET stream for server-initiated messages
    kDelete,  // ending the session
  };
  explicit Op(Kind k) : kind(k) {}

  Kind kind;
  // kPost: the body and what it carries.
  std::string body;
  std::vector<MessageInfo> messages;
  bool has_initialize = false;
  bool has_initialized_notification = false;
  std::map<std::string, std::string> unanswered;  // request id key → id JSON

  std::unique_ptr<Conn> conn;
  bool reused = false;
  bool sent_session = false;
  bool written = false;
  bool finished = false;
  bool holds_barrier = false;      // later POSTs wait until this one is written
  bool counts_as_request = false;  // holds one of the max_connections request slots
  http::request<http::string_body> req;
  std::optional<http::response_parser<http::buffer_body>> parser;
  int status = 0;
  bool sse = false;
  std::optional<SseParser> sse_parser;
  std::string last_event_id;
  std::optional<milliseconds> retry;
  std::string body_in;
  int resumes = 0;
  bool got_event = false;
  char chunk[16 * 1024];
};

// The channel's machinery. Everything except Send/Close/Shutdown runs on the
// I/O thread.
class UpstreamCore : public std::enable_shared_from_this<UpstreamCore> {
 public:
  UpstreamCore(net::io_context& ioc, Target target, HttpClientOptions options,
               std::unique_ptr<ssl::context> tls)
      : ioc_(ioc),
        target_(std::move(target)),
        request_target_(target_.RequestTarget()),
        options_(std::move(options)),
        tls_(std::move(tls)),
        grace_timer_(ioc),
        listen_timer_(ioc) {}

  MessagePump& pump() { return pump_; }

  bool Send(std::string message) {
    if (closed_.load()) return false;
    net::post(ioc_, [weak = weak_from_this(), m = std::move(message)]() mutable {
      if (auto self = weak.lock()) self->Enqueue(std::move(m));
    });
    return true;
  }

  void Close() {
    if (closed_.exchange(true)) return;
    net::post(ioc_, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->BeginClose("closed by the proxy");
    });
  }

  // The owner is going away: drop every connection and timer now, with no
  // more deliveries.
  void Shutdown() {
    closed_.store(true);
    net::post(ioc_, [weak = weak_from_this()] {
      auto self = weak.lock();
      if (!self) return;
      self->dead_ = true;
      self->closing_ = true;
      self->queue_.clear();
      for (auto& op : std::set<std::shared_ptr<Op>>(self->ops_)) {
        if (op->conn) op->conn->Close();
      }
      for (auto& c : self->idle_) c->Close();
      self->idle_.clear();
      self->grace_timer_.cancel();
      self->listen_timer_.cancel();
      if (self->listen_op_ && self->listen_op_->conn) self->listen_op_->conn->Close();
    });
  }

 private:
  // ── Sending ──

  void Enqueue(std::string message) {
    auto op = std::make_shared<Op>(Op::Kind::kPost);
    Result<MessageBatch> batch = InspectBody(message, options_.max_json_depth);
    if (batch) {
      for (const MessageInfo& m : batch->messages) {
        if (m.is_request()) {
          std::optional<std::string_view> id = FindTopLevelMember(m.raw, "id");
          op->unanswered[m.id_key] = std::string(id.value_or("null"));
          if (m.method == "initialize") op->has_initialize = true;
          if (m.method == "tools/list") tools_list_keys_.insert(m.id_key);
        }
        if (m.kind == MessageKind::kNotification && m.method == "notifications/initialized") {
          op->has_initialized_notification = true;
        }
      }
      op->messages = std::move(batch->messages);
    } else {
      // Sent as is: the upstream judges it. Without an id there is nothing
      // to answer if it fails.
      Log("sending a message that does not parse as JSON-RPC (" + batch.error().message + ")");
    }
    op->body = std::move(message);
    if (closing_) {
      ops_.insert(op);
      ++active_posts_;
      Fail(op, DeliveryFailure::kNotSent, "the channel was closed before the request was sent");
      return;
    }
    queue_.push_back(std::move(op));
    StartQueued();
  }

  void StartQueued() {
    while (!queue_.empty() && !closing_ && !write_barrier_ && !init_barrier_) {
      // Requests wait for a free slot; notifications and responses (answers
      // to the upstream's own requests, which a waiting tool call may need)
      // never wait behind them.
      auto next = std::ranges::find_if(queue_, [&](const std::shared_ptr<Op>& op) {
        return op->unanswered.empty() ||
               active_requests_ < std::max<size_t>(1, options_.max_connections);
      });
      if (next == queue_.end()) return;
      std::shared_ptr<Op> op = std::move(*next);
      queue_.erase(next);
      ++active_posts_;
      if (!op->unanswered.empty()) {
        op->counts_as_request = true;
        ++active_requests_;
      }
      // An answer may come on any stream (the GET stream, a resumed one).
      for (const auto& [key, id_json] : op->unanswered) awaiting_[key] = op;
      write_barrier_ = true;
      op->holds_barrier = true;
      if (op->has_initialize) {
        init_barrier_ = true;
        for (const MessageInfo& m : op->messages) {
          if (m.is_request() && m.method == "initialize") initialize_key_ = m.id_key;
        }
      }
      ops_.insert(op);
      BuildPost(*op);
      op->conn = TakeIdle();
      if (op->conn) {
        op->reused = true;
        Write(op);
      } else {
        Connect(op);
      }
    }
  }

  void BaseRequest(Op& op, http::verb verb) {
    op.req = {};
    op.req.method(verb);
    op.req.target(request_target_);
    op.req.version(11);
    op.req.set(http::field::host, target_.host_header);
    op.req.set(http::field::user_agent, "idemgate/" IDEM_VERSION);
    for (const auto& [name, value] : options_.headers) op.req.set(name, value);
    if (!session_id_.empty()) {
      op.req.set("Mcp-Session-Id", session_id_);
      op.sent_session = true;
    }
    op.req.keep_alive(true);
  }

  void BuildPost(Op& op) {
    BaseRequest(op, http::verb::post);
    op.req.set(http::field::content_type, "application/json");
    op.req.set(http::field::accept, "application/json, text/event-stream");
    // The negotiated version; a 2026-07-28 message names its own.
    std::string version = protocol_version_;
    if (op.messages.size() == 1 && !op.messages.front().meta_protocol_version.empty()) {
      version = op.messages.front().meta_protocol_version;
    }
    if (!version.empty() && !op.has_initialize) op.req.set("MCP-Protocol-Version", version);
    if (IsStatelessProtocolVersion(version) && op.messages.size() == 1) {
      // MCP 2026-07-28 mirrors the method and name into headers.
      const MessageInfo& m = op.messages.front();
      if (!m.method.empty()) op.req.set("Mcp-Method", m.method);
      if (!m.name.empty()) op.req.set("Mcp-Name", EncodeMirroredHeaderValue(m.name));
      if (m.method == "tools/call") {
        if (auto it = mirrored_.find(m.name); it != mirrored_.end()) {
          for (auto& [name, value] :
               MirroredParamHeaders(it->second, m.raw, options_.max_json_depth)) {
            op.req.set(name, value);
          }
        }
      }
    }
    op.req.body() = op.body;
    op.req.prepare_payload();
  }

  std::unique_ptr<Conn> TakeIdle() {
    while (!idle_.empty()) {
      std::unique_ptr<Conn> c = std::move(idle_.back());
      idle_.pop_back();
      if (Clock::now() - c->idle_since < options_.max_idle_reuse && c->Alive()) return c;
      c->Close();
    }
    return nullptr;
  }

  std::unique_ptr<Conn> NewConn() {
    auto c = std::make_unique<Conn>();
    if (target_.tls) {
      c->tls.emplace(net::make_strand(ioc_), *tls_);
    } else {
      c->plain.emplace(net::make_strand(ioc_));
    }
    return c;
  }

  // Resolves, connects and (for https) handshakes a new connection for `op`,
  // then writes its request.
  void Connect(const std::shared_ptr<Op>& op) {
    op->conn = NewConn();
    auto resolver = std::make_shared<tcp::resolver>(ioc_);
    auto timer = std::make_shared<net::steady_timer>(ioc_);
    auto timed_out = std::make_shared<bool>(false);
    timer->expires_after(options_.connect_timeout);
    timer->async_wait([resolver, timed_out](beast::error_code ec) {
      if (ec) return;
      *timed_out = true;
      resolver->cancel();
    });
    resolver->async_resolve(
        target_.host, target_.port,
        [self = shared_from_this(), op, resolver, timer, timed_out](
            beast::error_code ec, tcp::resolver::results_type results) {
          if (ec) {
            timer->cancel();
            return self->ConnectFailed(
                op, "cannot resolve host '" + self->target_.host + "' (" +
                        (*timed_out ? std::string("timed out") : ec.message()) + ")");
          }
          if (self->dead_) return self->Finish(op, false);
          op->conn->lowest().expires_at(timer->expiry());
          op->conn->lowest().async_connect(results, [self, op, timer](beast::error_code ec,
                                                                      const tcp::endpoint&) {
            if (ec) {
              timer->cancel();
              return self->ConnectFailed(
                  op, "cannot connect to " + self->target_.host_header + " (" + ec.message() + ")");
            }
            beast::error_code ignored;
            op->conn->lowest().socket().set_option(tcp::no_delay(true), ignored);
            if (!op->conn->tls) {
              timer->cancel();
              op->conn->lowest().expires_never();
              return self->Write(op);
            }
            self->PrepareTls(*op->conn);
            op->conn->tls->async_handshake(ssl::stream_base::client, [self, op,
                                                                      timer](beast::error_code ec) {
              timer->cancel();
              if (ec) {
                return self->ConnectFailed(op, "TLS handshake with " + self->target_.host_header +
                                                   " failed (" + ec.message() + ")");
              }
              op->conn->lowest().expires_never();
              self->Write(op);
            });
          });
        });
  }

  void PrepareTls(Conn& c) {
    idem::net::PrepareTlsClient(c.tls->native_handle(), target_.host, options_.verify_tls);
  }

  void ConnectFailed(const std::shared_ptr<Op>& op, const std::string& detail) {
    switch (op->kind) {
      case Op::Kind::kPost:
        return Fail(op, DeliveryFailure::kNotSent, detail);
      case Op::Kind::kResume:
        return Fail(op, DeliveryFailure::kMaybeSent,
                    "the response stream broke and could not be resumed: " + detail);
      case Op::Kind::kListen:
        return ListenEnded(op, false);
      case Op::Kind::kDelete:
        return Finish(op, false);
    }
  }

  void Write(const std::shared_ptr<Op>& op) {
    if (dead_) return Finish(op, false);
    op->conn->lowest().expires_after(std::max(kWriteTimeout, options_.connect_timeout));
    op->conn->With([&](auto& stream) {
      http::async_write(stream, op->req,
                        [self = shared_from_this(), op](beast::error_code ec, size_t) {
                          self->OnWritten(op, ec);
                        });
    });
  }

  void OnWritten(const std::shared_ptr<Op>& op, beast::error_code ec) {
    ReleaseWriteBarrier(*op);
    if (ec) {
      // The server never received a complete request, so it cannot have
      // acted on it.
      return ConnectFailed(
          op, "could not send the request to " + target_.host_header + " (" + ec.message() + ")");
    }
    op->written = true;
    ReadHeader(op);
  }

  void ReleaseWriteBarrier(Op& op) {
    if (!op.holds_barrier) return;
    op.holds_barrier = false;
    write_barrier_ = false;
    net::post(ioc_, [self = shared_from_this()] { self->StartQueued(); });
  }

  // ── Receiving ──

  void ReadHeader(const std::shared_ptr<Op>& op) {
    op->parser.emplace();
    op->parser->header_limit(64 * 1024);
    op->parser->body_limit(boost::none);  // enforced per message below
    if (op->kind == Op::Kind::kPost && options_.response_timeout.count() > 0) {
      op->conn->lowest().expires_after(options_.response_timeout);
    } else if (op->kind == Op::Kind::kDelete) {
      op->conn->lowest().expires_after(options_.connect_timeout);
    } else {
      op->conn->lowest().expires_never();
    }
    op->conn->With([&](auto& stream) {
      http::async_read_header(stream, op->conn->buffer, *op->parser,
                              [self = shared_from_this(), op](beast::error_code ec, size_t) {
                                self->OnHeader(op, ec);
                              });
    });
  }

  void OnHeader(const std::shared_ptr<Op>& op, beast::error_code ec) {
    if (dead_) return Finish(op, false);
    if (ec) return ReadFailed(op, ec);
    auto& res = op->parser->get();
    op->status = static_cast<int>(res.result_int());
    bool ok = op->status >= 200 && op->status < 300;
    bool event_stream = IsMediaType(std::string_view(res[http::field::content_type].data(),
                                                     res[http::field::content_type].size()),
                                    "text/event-stream");
    switch (op->kind) {
      case Op::Kind::kPost:
        if (op->has_initialize && ok) {
          std::string id(res["Mcp-Session-Id"]);
          if (IsValidSessionId(id)) {
            session_id_ = id;
          } else if (!id.empty()) {
            Log("ignoring a malformed Mcp-Session-Id from the upstream");
          }
        }
        op->sse = ok && event_stream;
        break;
      case Op::Kind::kResume:
        if (!ok || !event_stream) {
          return Fail(op, DeliveryFailure::kMaybeSent,
                      "the response stream broke and the upstream refused to resume it (HTTP " +
                          std::to_string(op->status) + ")",
                      op->status);
        }
        op->sse = true;
        break;
      case Op::Kind::kListen:
        if (op->status == 405) {
          listen_unsupported_ = true;  // the upstream offers no GET stream: fine
          return Finish(op, false);
        }
        if (op->status == 404 && op->sent_session) {
          Finish(op, false);
          return SessionExpired();
        }
        if (!ok || !event_stream) {
          Log("the upstream refused the GET stream (HTTP " + std::to_string(op->status) +
              "); retrying later");
          return ListenEnded(op, false);
        }
        listen_backoff_ = kListenRetryMin;
        op->sse = true;
        break;
      case Op::Kind::kDelete:
        break;
    }
    if (op->sse) {
      op->sse_parser.emplace(options_.max_message_bytes);
      op->conn->lowest().expires_never();
    }
    ReadBody(op);
  }

  void ReadBody(const std::shared_ptr<Op>& op) {
    if (op->parser->is_done()) return BodyDone(op);
    auto& body = op->parser->get().body();
    body.data = op->chunk;
    body.size = sizeof op->chunk;
    op->conn->With([&](auto& stream) {
      http::async_read_some(
          stream, op->conn->buffer, *op->parser,
          [self = shared_from_this(), op](beast::error_code ec, size_t) { self->OnBody(op, ec); });
    });
  }

  void OnBody(const std::shared_ptr<Op>& op, beast::error_code ec) {
    if (dead_) return Finish(op, false);
    if (ec == http::error::need_buffer) ec = {};
    size_t got = sizeof op->chunk - op->parser->get().body().size;
    if (got > 0 && !BodyBytes(op, std::string_view(op->chunk, got))) return;
    if (ec) return ReadFailed(op, ec);
    if (op->parser->is_done()) return BodyDone(op);
    ReadBody(op);
  }

  // False if the op ended (a limit was hit).
  bool BodyBytes(const std::shared_ptr<Op>& op, std::string_view bytes) {
    if (op->sse) {
      std::vector<SseEvent> events;
      Result<void> fed = op->sse_parser->Feed(bytes, events);
      if (!op->sse_parser->last_event_id().empty())
        op->last_event_id = op->sse_parser->last_event_id();
      if (op->sse_parser->retry()) op->retry = op->sse_parser->retry();
      for (SseEvent& e : events) {
        // Only "message" events carry JSON-RPC; an event without data is a
        // priming event (2025-11-25) that only sets the id.
        if ((e.type.empty() || e.type == "message") && !e.data.empty()) {
          op->got_event = true;
          DeliverText(e.data, &op->unanswered);
        }
      }
      if (!fed) {
        ReadFailed(op, beast::error_code(), fed.error().message);
        return false;
      }
      return true;
    }
    if (op->kind != Op::Kind::kPost) return true;  // ignored bodies
    if (op->body_in.size() + bytes.size() > options_.max_message_bytes) {
      Fail(op, DeliveryFailure::kMaybeSent,
           "the upstream's response is larger than " + std::to_string(options_.max_message_bytes) +
               " bytes",
           op->status);
      return false;
    }
    op->body_in.append(bytes);
    return true;
  }

  void BodyDone(const std::shared_ptr<Op>& op) {
    bool reusable = op->parser->keep_alive();
    switch (op->kind) {
      case Op::Kind::kPost:
        if (op->sse) return StreamEnded(op, reusable, "the response stream ended");
        return WholeBody(op, reusable);
      case Op::Kind::kResume:
        return StreamEnded(op, false, "the resumed response stream ended");
      case Op::Kind::kListen:
        return ListenEnded(op, true);
      case Op::Kind::kDelete:
        return Finish(op, false);
    }
  }

  // A complete, non-SSE answer to a POST.
  void WholeBody(const std::shared_ptr<Op>& op, bool reusable) {
    int status = op->status;
    if (status >= 200 && status < 300) {
      if (!op->body_in.empty()) DeliverText(op->body_in, &op->unanswered);
      if (op->has_initialized_notification) OpenListen();
      if (!op->unanswered.empty()) {
        return Fail(op, DeliveryFailure::kMaybeSent,
                    "the upstream answered HTTP " + std::to_string(status) +
                        " without a response for the request",
                    status);
      }
      return Finish(op, reusable);
    }
    // An error status. A JSON-RPC answer for our request in the body is the
    // upstream's own answer: pass it on.
    std::string upstream_message;
    if (!op->body_in.empty()) {
      Result<MessageBatch> batch = InspectBody(op->body_in, options_.max_json_depth);
      if (batch) {
        for (MessageInfo& m : batch->messages) {
          if (m.is_response() && op->unanswered.contains(m.id_key)) {
            DeliverText(m.raw, &op->unanswered);
          } else if (m.is_response()) {
            upstream_message = ErrorMessageOf(m.raw);
          }
        }
      } else {
        upstream_message = PrintableExcerpt(op->body_in, 200);
      }
    }
    std::string detail = "the upstream answered HTTP " + std::to_string(status);
    if (!upstream_message.empty()) detail += ": " + upstream_message;
    if (status == 404 && op->sent_session) {
      SessionExpired();
      return Fail(op, DeliveryFailure::kNotSent, "upstream session expired (HTTP 404)", status);
    }
    if (op->unanswered.empty() && !op->messages.empty()) Log(detail);
    // 5xx: the server may have acted before failing. Anything else (4xx,
    // an unfollowed redirect) refused the request before acting on it.
    Fail(op, status >= 500 ? DeliveryFailure::kMaybeSent : DeliveryFailure::kNotSent, detail,
         status);
  }

  static std::string ErrorMessageOf(std::string_view response) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(response, ec);
    if (ec || !v.is_object()) return {};
    const boost::json::value* error = v.as_object().if_contains("error");
    if (!error || !error->is_object()) return {};
    const boost::json::value* message = error->as_object().if_contains("message");
    if (!message || !message->is_string()) return {};
    return PrintableExcerpt(std::string_view(message->as_string()), 200);
  }

  // An SSE response (POST or resumed) ended cleanly.
  void StreamEnded(const std::shared_ptr<Op>& op, bool reusable, const std::string& what) {
    if (op->unanswered.empty()) {
      if (op->has_initialized_notification) OpenListen();
      return Finish(op, reusable);
    }
    TryResume(op, what + " before the response arrived");
  }

  void ReadFailed(const std::shared_ptr<Op>& op, beast::error_code ec, std::string why = {}) {
    if (why.empty()) {
      why = ec == beast::error::timeout
                ? "no response within " + std::to_string(options_.response_timeout.count()) + " ms"
                : "the connection to the upstream broke (" + ec.message() + ")";
    }
    switch (op->kind) {
      case Op::Kind::kPost:
      case Op::Kind::kResume:
        if (op->sse && ec != beast::error::timeout) return TryResume(op, why);
        return Fail(op, DeliveryFailure::kMaybeSent, why, op->status);
      case Op::Kind::kListen:
        return ListenEnded(op, op->got_event);
      case Op::Kind::kDelete:
        return Finish(op, false);
    }
  }

  // Continues a broken or ended POST stream with GET + Last-Event-ID
  // (2025-11-25 resumability), if the upstream gave event ids.
  void TryResume(const std::shared_ptr<Op>& op, const std::string& why) {
    if (op->last_event_id.empty() || op->resumes >= kMaxResumes || closing_) {
      return Fail(op, DeliveryFailure::kMaybeSent, why, op->status);
    }
    ++op->resumes;
    if (op->conn) op->conn->Close();
    op->conn.reset();
    if (op->kind == Op::Kind::kPost) {
      // The POST's slot is free again; the resumed stream is its own op.
      auto resume = std::make_shared<Op>(Op::Kind::kResume);
      resume->unanswered = std::move(op->unanswered);
      resume->last_event_id = op->last_event_id;
      resume->retry = op->retry;
      resume->resumes = op->resumes;
      resume->written = true;
      for (auto& [key, id] : resume->unanswered) awaiting_[key] = resume;
      op->unanswered.clear();
      Finish(op, false);
      return ScheduleResume(resume);
    }
    ScheduleResume(op);
  }

  void ScheduleResume(const std::shared_ptr<Op>& op) {
    ops_.insert(op);
    auto timer = std::make_shared<net::steady_timer>(ioc_);
    timer->expires_after(op->retry.value_or(milliseconds(1000)));
    timer->async_wait([self = shared_from_this(), op, timer](beast::error_code) {
      if (self->dead_) return self->Finish(op, false);
      self->BaseRequest(*op, http::verb::get);
      op->req.set(http::field::accept, "text/event-stream");
      if (!self->protocol_version_.empty())
        op->req.set("MCP-Protocol-Version", self->protocol_version_);
      op->req.set("Last-Event-ID", op->last_event_id);
      op->req.prepare_payload();
      op->sse = false;
      op->got_event = false;
      self->Connect(op);
    });
  }

  // Delivers one upstream message text (one message or a batch) to the
  // session, in order. The ops waiting for the ids it answers (whatever
  // stream it came on) stop waiting for them; so does `unanswered`.
  void DeliverText(const std::string& text,
                   std::map<std::string, std::string>* unanswered = nullptr) {
    Result<MessageBatch> batch = InspectBody(text, options_.max_json_depth);
    if (!batch) {
      Log("passing on an upstream message that is not JSON-RPC (" + batch.error().message + ")");
      pump_.Push(text);
      return;
    }
    for (MessageInfo& m : batch->messages) {
      if (m.is_response()) {
        if (unanswered) unanswered->erase(m.id_key);
        if (auto it = awaiting_.find(m.id_key); it != awaiting_.end()) {
          if (auto op = it->second.lock()) op->unanswered.erase(m.id_key);
          awaiting_.erase(it);
        }
        if (tools_list_keys_.erase(m.id_key) > 0) {
          // The tools' x-mcp-header annotations, for 2026-07-28 tools/call headers.
          for (auto& [tool, params] : ParseMirroredParams(m.raw, options_.max_json_depth)) {
            mirrored_[tool] = std::move(params);
          }
        }
        if (!initialize_key_.empty() && m.id_key == initialize_key_) {
          if (!m.result_protocol_version.empty()) protocol_version_ = m.result_protocol_version;
          initialize_key_.clear();
        }
      }
      pump_.Push(std::move(m.raw));
    }
  }

  // ── The GET stream ──

  void OpenListen() {
    if (!options_.open_get_stream || listen_op_ || listen_unsupported_ || closing_ ||
        session_id_.empty()) {
      return;
    }
    StartListen();
  }

  void StartListen() {
    auto op = std::make_shared<Op>(Op::Kind::kListen);
    listen_op_ = op;
    ops_.insert(op);
    BaseRequest(*op, http::verb::get);
    op->req.set(http::field::accept, "text/event-stream");
    if (!protocol_version_.empty()) op->req.set("MCP-Protocol-Version", protocol_version_);
    if (!listen_last_event_id_.empty()) op->req.set("Last-Event-ID", listen_last_event_id_);
    op->req.prepare_payload();
    Connect(op);
  }

  void ListenEnded(const std::shared_ptr<Op>& op, bool was_open) {
    if (!op->last_event_id.empty()) listen_last_event_id_ = op->last_event_id;
    std::optional<milliseconds> retry = op->retry;
    Finish(op, false);
    listen_op_.reset();
    if (closing_ || dead_) return;
    milliseconds delay = retry.value_or(listen_backoff_);
    if (!was_open) listen_backoff_ = std::min(listen_backoff_ * 2, kListenRetryMax);
    listen_timer_.expires_after(delay);
    listen_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closing_ || self->listen_op_) return;
      self->StartListen();
    });
  }

  // ── Ending ──

  // Answers every request of `op` still unanswered with a synthesised error
  // and ends the op.
  void Fail(const std::shared_ptr<Op>& op, DeliveryFailure failure, const std::string& detail,
            int status = 0) {
    for (const auto& [key, id_json] : op->unanswered) {
      awaiting_.erase(key);
      tools_list_keys_.erase(key);
      if (!dead_) pump_.Push(MakeDeliveryFailure(id_json, failure, detail, status));
    }
    if (op->unanswered.empty() && op->kind == Op::Kind::kPost && !op->messages.empty()) {
      Log("a message without id could not be delivered: " + detail);
    }
    op->unanswered.clear();
    if (op->has_initialize) init_barrier_ = false;
    Finish(op, false);
  }

  void Finish(const std::shared_ptr<Op>& op, bool reusable) {
    if (op->finished) return;
    op->finished = true;
    ops_.erase(op);
    if (op->kind == Op::Kind::kPost) {
      --active_posts_;
      if (op->counts_as_request) --active_requests_;
      if (op->has_initialize) init_barrier_ = false;
    }
    ReleaseWriteBarrier(*op);
    if (op->conn) {
      if (reusable && op->kind == Op::Kind::kPost && !closing_ && !dead_) {
        op->conn->idle_since = Clock::now();
        idle_.push_back(std::move(op->conn));
      } else {
        op->conn->Close();
        op->conn.reset();
      }
    }
    if (!dead_) {
      StartQueued();
      MaybeFinishClose();
    }
  }

  void BeginClose(std::string reason) {
    if (closing_) return;
    closing_ = true;
    close_reason_ = std::move(reason);
    std::deque<std::shared_ptr<Op>> queued = std::move(queue_);
    queue_.clear();
    // All into ops_ first, so that the close cannot complete between two failures.
    for (auto& op : queued) {
      ops_.insert(op);
      ++active_posts_;
    }
    for (auto& op : queued) {
      Fail(op, DeliveryFailure::kNotSent, "the channel was closed before the request was sent");
    }
    listen_timer_.cancel();
    if (listen_op_ && listen_op_->conn) listen_op_->conn->Close();
    for (auto& c : idle_) c->Close();
    idle_.clear();
    // In-flight requests get a few seconds to finish so their outcomes are
    // not lost; then their connections are cut (they become maybe_sent).
    grace_timer_.expires_after(kCloseGrace);
    grace_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      for (auto& op : std::set<std::shared_ptr<Op>>(self->ops_)) {
        if (op->conn) op->conn->Close();
      }
    });
    MaybeFinishClose();
  }

  void SessionExpired() {
    closed_.store(true);
    session_expired_ = true;
    if (!closing_) {
      BeginClose("upstream session expired");
    } else {
      close_reason_ = "upstream session expired";
    }
    // Whatever is still in flight belongs to a session that is gone.
    for (auto& op : std::set<std::shared_ptr<Op>>(ops_)) {
      if (op->conn) op->conn->Close();
    }
  }

  void MaybeFinishClose() {
    if (!closing_ || close_done_) return;
    for (const auto& op : ops_) {
      if (op->kind != Op::Kind::kListen) return;  // still waiting for it
    }
    if (!session_id_.empty() && !session_expired_ && !delete_sent_) {
      delete_sent_ = true;
      auto op = std::make_shared<Op>(Op::Kind::kDelete);
      ops_.insert(op);
      BaseRequest(*op, http::verb::delete_);
      if (!protocol_version_.empty()) op->req.set("MCP-Protocol-Version", protocol_version_);
      op->req.keep_alive(false);
      op->req.prepare_payload();
      Connect(op);
      return;
    }
    close_done_ = true;
    grace_timer_.cancel();
    pump_.Close(close_reason_);
  }

  net::io_context& ioc_;
  const Target target_;
  const std::string request_target_;  // path and query
  const HttpClientOptions options_;
  std::unique_ptr<ssl::context> tls_;
  MessagePump pump_;
  std::atomic<bool> closed_{false};  // Close() was called or the session expired

  // I/O thread only.
  std::deque<std::shared_ptr<Op>> queue_;
  std::set<std::shared_ptr<Op>> ops_;                  // started and not finished
  std::map<std::string, std::weak_ptr<Op>> awaiting_;  // request id key → the op waiting for it
  std::vector<std::unique_ptr<Conn>> idle_;
  size_t active_posts_ = 0;
  size_t active_requests_ = 0;
  bool write_barrier_ = false;
  bool init_barrier_ = false;
  std::string initialize_key_;
  std::set<std::string> tools_list_keys_;  // tools/list requests waiting for their answer
  std::map<std::string, std::vector<MirroredParam>> mirrored_;  // tool → x-mcp-header params
  std::string session_id_;
  std::string protocol_version_;
  std::shared_ptr<Op> listen_op_;
  bool listen_unsupported_ = false;
  milliseconds listen_backoff_ = kListenRetryMin;
  std::string listen_last_event_id_;
  net::steady_timer grace_timer_;
  net::steady_timer listen_timer_;
  bool closing_ = false;
  bool close_done_ = false;
  bool delete_sent_ = false;
  bool session_expired_ = false;
  bool dead_ = false;
  std::string close_reason_;
};

// The Channel handed to McpSession. Owns the I/O thread; the core lives as
// long as a handler still refers to it.
class HttpUpstreamChannel : public Channel {
 public:
  HttpUpstreamChannel(Target target, HttpClientOptions options, std::unique_ptr<ssl::context> tls)
      : work_(ioc_.get_executor()),
        core_(std::make_shared<UpstreamCore>(ioc_, std::move(target), std::move(options),
                                             std::move(tls))) {
    thread_ = std::thread([this] { ioc_.run(); });
  }

  ~HttpUpstreamChannel() override {
    core_->Shutdown();
    work_.reset();
    ioc_.stop();
    if (thread_.joinable()) thread_.join();
    // Destroying the io_context (after core_) destroys pending handlers and
    // with them the last references to the core.
    core_.reset();
  }

  void Start(std::function<void(std::string message)> on_message,
             std::function<void(std::string reason)> on_closed) override {
    core_->pump().Start(std::move(on_message), std::move(on_closed));
  }
  bool Send(std::string message) override { return core_->Send(std::move(message)); }
  void Close() override { core_->Close(); }

 private:
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  std::shared_ptr<UpstreamCore> core_;
  std::thread thread_;
};

}  // namespace

Result<std::shared_ptr<Channel>> ConnectHttpUpstream(const std::string& url,
                                                     const HttpClientOptions& options) {
  Result<Target> target = idem::net::ParseHttpTarget(url, "upstream URL");
  if (!target) return std::unexpected(target.error());
  std::unique_ptr<ssl::context> tls;
  if (target->tls) {
    auto ctx = idem::net::NewTlsClientContext(
        {.verify = options.verify_tls, .ca_file = options.ca_file, .ca_option = "CA file"});
    if (!ctx) return std::unexpected(ctx.error());
    tls = std::make_unique<ssl::context>(ctx->release());
  }
  return std::shared_ptr<Channel>(
      std::make_shared<HttpUpstreamChannel>(std::move(*target), options, std::move(tls)));
}

std::string MakeDeliveryFailure(std::string_view id_json, DeliveryFailure failure,
                                std::string_view detail, int http_status) {
  bool not_sent = failure == DeliveryFailure::kNotSent;
  std::string clean = PrintableExcerpt(detail, 500);
  std::string data = R"({"idemgate":)";
  data.append(not_sent ? R"("not_sent")" : R"("maybe_sent")");
  data.append(R"(,"detail":)").append(JsonQuote(clean));
  if (http_status != 0) data.append(R"(,"http_status":)").append(std::to_string(http_status));
  data.append(R"(,"nonce":)").append(JsonQuote(ProcessNonce())).append("}");
  std::string message = not_sent ? "idemgate: the request did not reach the upstream: "
                                 : "idemgate: the request was sent to the upstream but no answer "
                                   "came (it may have been carried out): ";
  message.append(clean);
  return JsonRpcError(id_json.empty() ? "null" : id_json,
                      not_sent ? kNotSentErrorCode : kMaybeSentErrorCode, message, data);
}

std::optional<DeliveryFailure> ClassifyDeliveryFailure(std::string_view message) {
  if (message.find(ProcessNonce()) == std::string_view::npos) return std::nullopt;
  boost::system::error_code ec;
  boost::json::parse_options po;
  po.max_depth = 64;
  boost::json::value v = boost::json::parse(message, ec, boost::json::storage_ptr(), po);
  if (ec || !v.is_object()) return std::nullopt;
  const boost::json::value* error = v.as_object().if_contains("error");
  if (!error || !error->is_object()) return std::nullopt;
  const boost::json::value* code = error->as_object().if_contains("code");
  const boost::json::value* data = error->as_object().if_contains("data");
  if (!code || !code->is_int64() || !data || !data->is_object()) return std::nullopt;
  const boost::json::value* marker = data->as_object().if_contains("idemgate");
  const boost::json::value* nonce = data->as_object().if_contains("nonce");
  if (!marker || !marker->is_string() || !nonce || !nonce->is_string() ||
      nonce->as_string() != ProcessNonce()) {
    return std::nullopt;
  }
  if (code->as_int64() == kNotSentErrorCode && marker->as_string() == "not_sent") {
    return DeliveryFailure::kNotSent;
  }
  if (code->as_int64() == kMaybeSentErrorCode && marker->as_string() == "maybe_sent") {
    return DeliveryFailure::kMaybeSent;
  }
  return std::nullopt;
}

}  // namespace idem::mcp
