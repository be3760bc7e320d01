// ConnectHttpUpstream: the upstream side of the proxy over Streamable HTTP.
//
// One I/O thread per channel runs every exchange; messages go to McpSession
// through a MessagePump. The HTTP itself (connections, keep-alive reuse, TLS,
// timeouts, not-sent vs maybe-sent) is net::HttpClient's, run on the
// channel's io_context; this file keeps MCP's protocol: JSON or SSE answers,
// the session id, the GET stream, resumption, DELETE, and the synthesised
// delivery failures. Each Send becomes one POST on a keep-alive connection,
// so a long SSE answer never holds up the next request. Requests start in
// order: the next POST starts once the previous one is fully written, and
// nothing starts while an initialize is in flight (its answer carries the
// session id every later request needs).
//
// Every request ends in exactly one of: its response delivered, or a
// synthesised not_sent / maybe_sent error (http_channels.h).
#include "net/http_client.h"

#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_message_pump.h"
#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/log_line.h"
#include "fronts/mcp/sse.h"
#include "json/json_text.h"
#include "net/http_target.h"

namespace idem::mcp {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using ClientResult = net::HttpClientResult;

constexpr int kMaxResumes = 5;
constexpr milliseconds kWriteTimeout{30'000};
constexpr milliseconds kCloseGrace{5'000};
constexpr milliseconds kListenRetryMin{1'000};
constexpr milliseconds kListenRetryMax{30'000};

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

using Target = net::HttpTarget;

// Sets header `name` of `req` to `value`, replacing one of that name.
void SetHeader(net::HttpClientRequest& req, std::string_view name, std::string value) {
  for (http::Header& h : req.headers) {
    if (boost::beast::iequals(h.name, name)) {
      h.value = std::move(value);
      return;
    }
  }
  req.headers.push_back({std::string(name), std::move(value)});
}

// The first header of `res` named `name`, or "".
std::string_view HeaderOf(const http::Response& res, std::string_view name) {
  for (const http::Header& h : res.headers) {
    if (boost::beast::iequals(h.name, name)) return h.value;
  }
  return {};
}

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

  net::HttpClientRequest req;
  net::HttpClient::Call call;                        // the exchange, to cut it
  std::shared_ptr<http::BodySource> body_in_flight;  // the answer's body, once its header came
  bool sent_session = false;
  bool finished = false;
  bool holds_barrier = false;      // later POSTs wait until this one is written
  bool counts_as_request = false;  // holds one of the max_connections request slots
  // A POST's JSON answer must be whole within response_timeout of the write.
  Clock::time_point written_at;
  std::unique_ptr<asio::steady_timer> body_deadline;
  bool timed_out = false;
  int status = 0;
  bool sse = false;
  std::optional<SseParser> sse_parser;
  std::string last_event_id;
  std::optional<milliseconds> retry;
  std::string body_in;
  int resumes = 0;
  bool got_event = false;
};

// The channel's machinery. Everything except Send/Close/Shutdown/MarkDead
// runs on the I/O thread; so do the HTTP client's callbacks (it runs on the
// same single-threaded io_context), hence no locks.
class UpstreamCore : public std::enable_shared_from_this<UpstreamCore> {
 public:
  UpstreamCore(asio::io_context& ioc, net::HttpClient& client, Target target,
               HttpClientOptions options)
      : ioc_(ioc),
        client_(client),
        target_(std::move(target)),
        request_target_(target_.RequestTarget()),
        options_(std::move(options)),
        grace_timer_(ioc),
        listen_timer_(ioc) {}

  MessagePump& pump() { return pump_; }

  bool Send(std::string message) {
    if (closed_.load()) return false;
    asio::post(ioc_, [weak = weak_from_this(), m = std::move(message)]() mutable {
      if (auto self = weak.lock()) self->Enqueue(std::move(m));
    });
    return true;
  }

  void Close() {
    if (closed_.exchange(true)) return;
    asio::post(ioc_, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->BeginClose("closed by the proxy");
    });
  }

  // The owner is going away: drop every exchange and timer now, with no
  // more deliveries.
  void Shutdown() {
    closed_.store(true);
    asio::post(ioc_, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->Die();
    });
  }

  // After the I/O thread was joined: no more deliveries, whatever the HTTP
  // client still reports.
  void MarkDead() { dead_ = true; }

 private:
  void Die() {
    dead_ = true;
    closing_ = true;
    queue_.clear();
    for (auto& op : std::set<std::shared_ptr<Op>>(ops_)) Cut(*op);
    grace_timer_.cancel();
    listen_timer_.cancel();
    if (listen_op_) Cut(*listen_op_);
  }

  // Cuts `op`'s exchange: its connection is closed, and the client reports
  // not_sent or maybe_sent for it, or its body fails.
  static void Cut(Op& op) {
    op.call.Cancel();
    if (op.body_in_flight) op.body_in_flight->Cancel();
  }

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
      LogLine("mcp upstream",
              "sending a message that does not parse as JSON-RPC (" + batch.error().message + ")");
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
      Exchange(op);
    }
  }

  void BaseRequest(Op& op, std::string method) {
    op.req = {};
    op.req.method = std::move(method);
    op.req.target = request_target_;
    // BuildPost and BuildGet add up to 5 of their own (more only when
    // mirroring tool parameters): no reallocation on the common path.
    op.req.headers.reserve(options_.headers.size() + 6);
    for (const auto& [name, value] : options_.headers) SetHeader(op.req, name, value);
    if (!session_id_.empty()) {
      SetHeader(op.req, "Mcp-Session-Id", session_id_);
      op.sent_session = true;
    }
  }

  void BuildPost(Op& op) {
    BaseRequest(op, "POST");
    SetHeader(op.req, "Content-Type", "application/json");
    SetHeader(op.req, "Accept", "application/json, text/event-stream");
    // The negotiated version; a 2026-07-28 message names its own.
    std::string version = protocol_version_;
    if (op.messages.size() == 1 && !op.messages.front().meta_protocol_version.empty()) {
      version = op.messages.front().meta_protocol_version;
    }
    if (!version.empty() && !op.has_initialize) SetHeader(op.req, "MCP-Protocol-Version", version);
    if (IsStatelessProtocolVersion(version) && op.messages.size() == 1) {
      // MCP 2026-07-28 mirrors the method and name into headers.
      const MessageInfo& m = op.messages.front();
      if (!m.method.empty()) SetHeader(op.req, "Mcp-Method", m.method);
      if (!m.name.empty()) SetHeader(op.req, "Mcp-Name", EncodeMirroredHeaderValue(m.name));
      if (m.method == "tools/call") {
        if (auto it = mirrored_.find(m.name); it != mirrored_.end()) {
          for (auto& [name, value] :
               MirroredParamHeaders(it->second, m.raw, options_.max_json_depth)) {
            SetHeader(op.req, name, value);
          }
        }
      }
    }
    op.req.body = op.body;
  }

  // A GET for an event stream, resuming after `last_event_id` when set.
  void BuildGet(Op& op, const std::string& last_event_id) {
    BaseRequest(op, "GET");
    SetHeader(op.req, "Accept", "text/event-stream");
    if (!protocol_version_.empty()) SetHeader(op.req, "MCP-Protocol-Version", protocol_version_);
    if (!last_event_id.empty()) SetHeader(op.req, "Last-Event-ID", last_event_id);
  }

  // Sends `op`'s request through the HTTP client; its answer's body comes
  // piece by piece (an SSE stream may last as long as a tool runs).
  void Exchange(const std::shared_ptr<Op>& op) {
    net::HttpClientRequest req = op->req;
    req.stream = true;
    req.write_timeout = std::max(kWriteTimeout, options_.connect_timeout);
    switch (op->kind) {
      case Op::Kind::kPost:
        req.response_timeout = options_.response_timeout;
        req.piece_timeout = milliseconds(0);  // an SSE answer; a JSON one has body_deadline
        break;
      case Op::Kind::kDelete:
        req.response_timeout = options_.connect_timeout;
        break;
      case Op::Kind::kResume:
      case Op::Kind::kListen:
        req.response_timeout = milliseconds(0);
        break;
    }
    req.on_written = [weak = weak_from_this(), op] {
      auto self = weak.lock();
      if (!self || op->finished) return;
      op->written_at = Clock::now();
      self->ReleaseWriteBarrier(*op);
    };
    op->call = client_.Send(std::move(req), [weak = weak_from_this(), op](ClientResult r) {
      if (auto self = weak.lock()) self->OnResult(op, std::move(r));
    });
  }

  void OnResult(const std::shared_ptr<Op>& op, ClientResult r) {
    if (op->finished) return;
    if (dead_) return Finish(op);
    switch (r.kind) {
      case ClientResult::Kind::kNotSent:
        return ConnectFailed(op, r.detail);
      case ClientResult::Kind::kMaybeSent:
        return ReadFailed(op, r.timed_out, r.timed_out ? std::string() : r.detail);
      case ClientResult::Kind::kResponse:
        return OnHeader(op, std::move(r.response));
    }
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
        return Finish(op);
    }
  }

  void ReleaseWriteBarrier(Op& op) {
    if (!op.holds_barrier) return;
    op.holds_barrier = false;
    write_barrier_ = false;
    asio::post(ioc_, [self = shared_from_this()] { self->StartQueued(); });
  }

  // ── Receiving ──

  void OnHeader(const std::shared_ptr<Op>& op, http::Response res) {
    op->status = res.status;
    bool ok = op->status >= 200 && op->status < 300;
    bool event_stream = IsMediaType(HeaderOf(res, "Content-Type"), "text/event-stream");
    switch (op->kind) {
      case Op::Kind::kPost:
        if (op->has_initialize && ok) {
          std::string id(HeaderOf(res, "Mcp-Session-Id"));
          if (IsValidSessionId(id)) {
            session_id_ = id;
          } else if (!id.empty()) {
            LogLine("mcp upstream", "ignoring a malformed Mcp-Session-Id from the upstream");
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
          return Finish(op);
        }
        if (op->status == 404 && op->sent_session) {
          Finish(op);
          return SessionExpired();
        }
        if (!ok || !event_stream) {
          LogLine("mcp upstream", "the upstream refused the GET stream (HTTP " +
                                      std::to_string(op->status) + "); retrying later");
          return ListenEnded(op, false);
        }
        listen_backoff_ = kListenRetryMin;
        op->sse = true;
        break;
      case Op::Kind::kDelete:
        break;
    }
    if (op->sse) op->sse_parser.emplace(options_.max_message_bytes);
    if (!res.stream) {  // the whole answer came with its header
      if (!res.body.empty() && !BodyBytes(op, res.body)) return;
      return BodyDone(op);
    }
    op->body_in_flight = std::move(res.stream);
    if (op->kind == Op::Kind::kPost && !op->sse) ArmBodyDeadline(op);
    ReadBody(op);
  }

  // A POST's JSON answer must be whole within response_timeout of the write,
  // as its header had to be.
  void ArmBodyDeadline(const std::shared_ptr<Op>& op) {
    if (options_.response_timeout.count() <= 0) return;
    op->body_deadline = std::make_unique<asio::steady_timer>(ioc_);
    op->body_deadline->expires_at(op->written_at + options_.response_timeout);
    op->body_deadline->async_wait([op](boost::system::error_code ec) {
      if (ec || op->finished) return;
      op->timed_out = true;
      if (op->body_in_flight) op->body_in_flight->Cancel();  // the read fails
    });
  }

  void ReadBody(const std::shared_ptr<Op>& op) {
    op->body_in_flight->Next([weak = weak_from_this(), op](http::BodySource::Piece piece) {
      // On the I/O thread (or inline, failed, once the client stopped).
      if (auto self = weak.lock()) self->OnBody(op, std::move(piece));
    });
  }

  void OnBody(const std::shared_ptr<Op>& op, http::BodySource::Piece piece) {
    if (op->finished) return;
    if (dead_) return Finish(op);
    if (!piece.data.empty() && !BodyBytes(op, piece.data)) return;
    if (piece.failed) {
      return ReadFailed(op, op->timed_out,
                        op->timed_out ? std::string() : "the connection to the upstream broke");
    }
    if (piece.last) return BodyDone(op);
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
        ReadFailed(op, false, fed.error().message);
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
    op->body_in_flight.reset();
    switch (op->kind) {
      case Op::Kind::kPost:
        if (op->sse) return StreamEnded(op, "the response stream ended");
        return WholeBody(op);
      case Op::Kind::kResume:
        return StreamEnded(op, "the resumed response stream ended");
      case Op::Kind::kListen:
        return ListenEnded(op, true);
      case Op::Kind::kDelete:
        return Finish(op);
    }
  }

  // A complete, non-SSE answer to a POST.
  void WholeBody(const std::shared_ptr<Op>& op) {
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
      return Finish(op);
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
    if (op->unanswered.empty() && !op->messages.empty()) LogLine("mcp upstream", detail);
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
  void StreamEnded(const std::shared_ptr<Op>& op, const std::string& what) {
    if (op->unanswered.empty()) {
      if (op->has_initialized_notification) OpenListen();
      return Finish(op);
    }
    TryResume(op, what + " before the response arrived");
  }

  // After the request was written: no whole answer came. `why` says what
  // broke; empty when it timed out.
  void ReadFailed(const std::shared_ptr<Op>& op, bool timed_out, std::string why) {
    if (timed_out) {
      why = "no response within " + std::to_string(options_.response_timeout.count()) + " ms";
    }
    switch (op->kind) {
      case Op::Kind::kPost:
      case Op::Kind::kResume:
        if (op->sse && !timed_out) return TryResume(op, why);
        return Fail(op, DeliveryFailure::kMaybeSent, why, op->status);
      case Op::Kind::kListen:
        return ListenEnded(op, op->got_event);
      case Op::Kind::kDelete:
        return Finish(op);
    }
  }

  // Continues a broken or ended POST stream with GET + Last-Event-ID
  // (2025-11-25 resumability), if the upstream gave event ids.
  void TryResume(const std::shared_ptr<Op>& op, const std::string& why) {
    if (op->last_event_id.empty() || op->resumes >= kMaxResumes || closing_) {
      return Fail(op, DeliveryFailure::kMaybeSent, why, op->status);
    }
    ++op->resumes;
    Cut(*op);
    op->body_in_flight.reset();
    if (op->kind == Op::Kind::kPost) {
      // The POST's slot is free again; the resumed stream is its own op.
      auto resume = std::make_shared<Op>(Op::Kind::kResume);
      resume->unanswered = std::move(op->unanswered);
      resume->last_event_id = op->last_event_id;
      resume->retry = op->retry;
      resume->resumes = op->resumes;
      for (auto& [key, id] : resume->unanswered) awaiting_[key] = resume;
      op->unanswered.clear();
      Finish(op);
      return ScheduleResume(resume);
    }
    ScheduleResume(op);
  }

  void ScheduleResume(const std::shared_ptr<Op>& op) {
    ops_.insert(op);
    auto timer = std::make_shared<asio::steady_timer>(ioc_);
    timer->expires_after(op->retry.value_or(milliseconds(1000)));
    timer->async_wait([self = shared_from_this(), op, timer](boost::system::error_code) {
      if (self->dead_) return self->Finish(op);
      self->BuildGet(*op, op->last_event_id);
      op->sse = false;
      op->got_event = false;
      self->Exchange(op);
    });
  }

  // Delivers one upstream message text (one message or a batch) to the
  // session, in order. The ops waiting for the ids it answers (whatever
  // stream it came on) stop waiting for them; so does `unanswered`.
  void DeliverText(const std::string& text,
                   std::map<std::string, std::string>* unanswered = nullptr) {
    Result<MessageBatch> batch = InspectBody(text, options_.max_json_depth);
    if (!batch) {
      LogLine("mcp upstream", "passing on an upstream message that is not JSON-RPC (" +
                                  batch.error().message + ")");
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
    BuildGet(*op, listen_last_event_id_);
    Exchange(op);
  }

  void ListenEnded(const std::shared_ptr<Op>& op, bool was_open) {
    if (!op->last_event_id.empty()) listen_last_event_id_ = op->last_event_id;
    std::optional<milliseconds> retry = op->retry;
    Finish(op);
    listen_op_.reset();
    if (closing_ || dead_) return;
    milliseconds delay = retry.value_or(listen_backoff_);
    if (!was_open) listen_backoff_ = std::min(listen_backoff_ * 2, kListenRetryMax);
    listen_timer_.expires_after(delay);
    listen_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
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
      LogLine("mcp upstream", "a message without id could not be delivered: " + detail);
    }
    op->unanswered.clear();
    if (op->has_initialize) init_barrier_ = false;
    Finish(op);
  }

  // Ends `op`; an exchange or body still in flight is cut (the HTTP client
  // pools a connection whose answer was read to its end).
  void Finish(const std::shared_ptr<Op>& op) {
    if (op->finished) return;
    op->finished = true;
    ops_.erase(op);
    if (op->kind == Op::Kind::kPost) {
      --active_posts_;
      if (op->counts_as_request) --active_requests_;
      if (op->has_initialize) init_barrier_ = false;
    }
    ReleaseWriteBarrier(*op);
    Cut(*op);
    op->body_in_flight.reset();
    op->body_deadline.reset();
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
    if (listen_op_) Cut(*listen_op_);
    // In-flight requests get a few seconds to finish so their outcomes are
    // not lost; then their connections are cut (they become maybe_sent).
    grace_timer_.expires_after(kCloseGrace);
    grace_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;
      for (auto& op : std::set<std::shared_ptr<Op>>(self->ops_)) Cut(*op);
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
    for (auto& op : std::set<std::shared_ptr<Op>>(ops_)) Cut(*op);
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
      BaseRequest(*op, "DELETE");
      if (!protocol_version_.empty()) SetHeader(op->req, "MCP-Protocol-Version", protocol_version_);
      op->req.keep_alive = false;
      Exchange(op);
      return;
    }
    close_done_ = true;
    grace_timer_.cancel();
    pump_.Close(close_reason_);
  }

  asio::io_context& ioc_;
  net::HttpClient& client_;
  const Target target_;
  const std::string request_target_;  // path and query
  const HttpClientOptions options_;
  MessagePump pump_;
  std::atomic<bool> closed_{false};  // Close() was called or the session expired

  // I/O thread only.
  std::deque<std::shared_ptr<Op>> queue_;
  std::set<std::shared_ptr<Op>> ops_;                  // started and not finished
  std::map<std::string, std::weak_ptr<Op>> awaiting_;  // request id key → the op waiting for it
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
  asio::steady_timer grace_timer_;
  asio::steady_timer listen_timer_;
  bool closing_ = false;
  bool close_done_ = false;
  bool delete_sent_ = false;
  bool session_expired_ = false;
  bool dead_ = false;
  std::string close_reason_;
};

// The Channel handed to McpSession. Owns the I/O thread and the HTTP client
// running on it; the core lives as long as a handler still refers to it.
class HttpUpstreamChannel : public Channel {
 public:
  HttpUpstreamChannel(std::unique_ptr<asio::io_context> ioc,
                      std::unique_ptr<net::HttpClient> client, Target target,
                      HttpClientOptions options)
      : ioc_(std::move(ioc)),
        work_(ioc_->get_executor()),
        client_(std::move(client)),
        core_(std::make_shared<UpstreamCore>(*ioc_, *client_, std::move(target),
                                             std::move(options))) {
    thread_ = std::thread([this] { ioc_->run(); });
  }

  ~HttpUpstreamChannel() override {
    core_->Shutdown();
    work_.reset();
    ioc_->stop();
    if (thread_.joinable()) thread_.join();
    // Exchanges still in flight end in Stop, on this thread, and find the
    // core dead.
    core_->MarkDead();
    client_->Stop();
    // Destroying the io_context (last) destroys pending handlers and with
    // them the last references to the core and the client's exchanges.
    core_.reset();
    client_.reset();
  }

  void Start(std::function<void(std::string message)> on_message,
             std::function<void(std::string reason)> on_closed) override {
    core_->pump().Start(std::move(on_message), std::move(on_closed));
  }
  bool Send(std::string message) override { return core_->Send(std::move(message)); }
  void Close() override { core_->Close(); }

 private:
  std::unique_ptr<asio::io_context> ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::unique_ptr<net::HttpClient> client_;
  std::shared_ptr<UpstreamCore> core_;
  std::thread thread_;
};

}  // namespace

Result<std::shared_ptr<Channel>> ConnectHttpUpstream(const std::string& url,
                                                     const HttpClientOptions& options) {
  Result<Target> target = net::ParseHttpTarget(url, "upstream URL");
  if (!target) return std::unexpected(target.error());
  // The client gets the origin only: every request names the URL's path and
  // query itself (a query is part of an MCP endpoint's URL).
  auto ioc = std::make_unique<asio::io_context>();
  auto client =
      net::HttpClient::Create({.url = (target->tls ? "https://" : "http://") + target->host_header,
                               .connect_timeout = options.connect_timeout,
                               .response_timeout = options.response_timeout,
                               .max_idle = options.max_idle_reuse,
                               .max_idle_connections = std::max<size_t>(1, options.max_connections),
                               .verify_tls = options.verify_tls,
                               .ca_file = options.ca_file,
                               .ca_option = "CA file"},
                              *ioc);
  if (!client) return std::unexpected(client.error());
  return std::shared_ptr<Channel>(std::make_shared<HttpUpstreamChannel>(
      std::move(ioc), std::move(*client), std::move(*target), options));
}

std::string MakeDeliveryFailure(std::string_view id_json, DeliveryFailure failure,
                                std::string_view detail, int http_status) {
  bool not_sent = failure == DeliveryFailure::kNotSent;
  std::string clean = PrintableExcerpt(detail, 500);
  std::string data = R"({"idemgate":)";
  data.append(not_sent ? R"("not_sent")" : R"("maybe_sent")");
  data.append(R"(,"detail":)").append(json_text::Quote(clean));
  if (http_status != 0) data.append(R"(,"http_status":)").append(std::to_string(http_status));
  data.append(R"(,"nonce":)").append(json_text::Quote(ProcessNonce())).append("}");
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
