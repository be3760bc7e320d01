// HttpMcpServer: the Streamable HTTP listener (Boost.Beast, asynchronous).
//
// One io_context with a few threads; each connection runs on its own strand.
// A connection reads one request at a time under a whole-request deadline,
// answers it, and either streams SSE (a POST waiting for answers, or the GET
// stream) or returns to reading (keep-alive). Sessions and routing live in
// ServerSession; this file is HTTP: limits, checks, status codes, framing.
#include <algorithm>
#include <boost/asio.hpp>
#include <cctype>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/http_server_session.h"
#include "net/listen_socket.h"
#include "fronts/mcp/sse.h"
#include "net/http_server_io.h"

namespace idem::mcp {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

void Log(std::string_view message) {
  std::string line = "idemgate: mcp http: ";
  line.append(message).push_back('\n');
  std::cerr << line << std::flush;
}

std::string Chunk(std::string_view payload) {
  std::ostringstream os;
  os << std::hex << payload.size() << "\r\n";
  std::string out = os.str();
  out.append(payload).append("\r\n");
  return out;
}

constexpr std::string_view kLastChunk = "0\r\n\r\n";

class Connection;

}  // namespace

// ── The server's shared state ───────────────────────────────────────────────

struct HttpMcpServer::Impl : std::enable_shared_from_this<HttpMcpServer::Impl> {
  Impl(const HttpServerOptions& o, HttpSessionFactory f)
      : options(o),
        factory(std::move(f)),
        acceptor(net::make_strand(ioc)),
        sweep_timer(acceptor.get_executor()) {}

  void Accept();
  void Sweep();
  void StopAll();

  // Session registry.
  std::shared_ptr<ServerSession> FindSession(const std::string& id);
  Result<std::shared_ptr<ServerSession>> CreateSession(const std::string& tenant);
  Result<std::shared_ptr<ServerSession>> StatelessSession(const std::string& tenant);
  void Forget(ServerSession* session);
  void EndSession(const std::shared_ptr<ServerSession>& session, const std::string& reason);
  std::shared_ptr<ServerSession> NewSession(HttpSessionInfo info);

  const HttpServerOptions options;
  const HttpSessionFactory factory;
  std::string bound;  // "127.0.0.1:41873"
  bool bound_loopback = true;

  std::mutex mu;  // guards everything below up to `ioc`
  bool stopping = false;
  std::map<std::string, std::shared_ptr<ServerSession>> sessions;   // by session id
  std::map<std::string, std::shared_ptr<ServerSession>> stateless;  // by tenant
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;

  // Declared after the state above so that handlers destroyed with the
  // io_context still find it alive.
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  // The acceptor and the sweep timer share one strand: their handlers run
  // on any io thread, and StopAll closes them from yet another.
  tcp::acceptor acceptor;
  net::steady_timer sweep_timer;
  std::vector<std::thread> threads;
  // Runs /readyz and /metrics off the I/O threads (they may block briefly).
  net::thread_pool admin_pool{1};
};

namespace {

// ── One connection ──────────────────────────────────────────────────────────

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpMcpServer::Impl* server, tcp::socket socket)
      : server_(server),
        options_(server->options),
        limits_{options_.max_header_bytes, options_.max_header_count, options_.max_body_bytes,
                options_.read_timeout},
        stream_(std::move(socket)),
        keepalive_timer_(stream_.get_executor()) {}

  ~Connection() {
    std::lock_guard lock(server_->mu);
    server_->connections.erase(this);
  }

  void Start(bool over_limit) {
    {
      std::lock_guard lock(server_->mu);
      if (server_->stopping) return;
      server_->connections.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), over_limit] {
      beast::error_code ec;
      self->stream_.socket().set_option(tcp::no_delay(true), ec);
      if (over_limit) {
        self->keep_alive_ = false;
        self->SendError(http::status::service_unavailable, kJsonRpcInternalError,
                        "idemgate: too many connections; retry shortly");
        return;
      }
      self->DoRead();
    });
  }

  // From any thread: the sink of the exchange numbered `serial`.
  void PostEvent(uint64_t serial, std::string message) {
    net::post(stream_.get_executor(), [self = shared_from_this(), serial, m = std::move(message)] {
      if (serial != self->serial_) return;
      if (self->state_ == State::kHeldStream) self->OpenStream();
      if (self->state_ != State::kStreaming) return;
      self->Write(Chunk(FormatSseEvent(m)));
    });
  }
  void PostEnd(uint64_t serial) {
    net::post(stream_.get_executor(), [self = shared_from_this(), serial] {
      if (serial != self->serial_) return;
      if (self->state_ == State::kHeldStream) self->OpenStream();
      if (self->state_ != State::kStreaming) return;
      self->EndStream();
    });
  }
  void PostFinal(uint64_t serial, std::string message) {
    net::post(stream_.get_executor(), [self = shared_from_this(), serial, m = std::move(message)] {
      if (serial != self->serial_) return;
      if (self->state_ == State::kHeldStream) return self->SendHeldAnswer(m);
      if (self->state_ != State::kStreaming) return;
      self->Write(Chunk(FormatSseEvent(m)));
      self->EndStream();
    });
  }
  void PostJson(uint64_t serial, std::string body) {
    net::post(stream_.get_executor(), [self = shared_from_this(), serial, b = std::move(body)] {
      if (serial != self->serial_ || self->state_ != State::kWaitingJson) return;
      self->state_ = State::kFinishing;
      // A header that does not match the body is a 400 in every dialect
      // (SEP-2243); other errors keep 200 outside 2026-07-28.
      const bool mismatch = StatelessHttpStatus(b) == 400;
      http::response<http::string_body> res{
          mismatch ? http::status::bad_request : http::status::ok, 11};
      res.set(http::field::content_type, "application/json");
      self->AddCommonHeaders(res);
      res.body() = b;
      self->SendResponse(std::move(res));
    });
  }
  // From any thread (server stop): close the connection as soon as what is
  // already queued for it (e.g. the answers of an ending session) is written.
  void PostClose() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->stopping_ = true;
      self->keep_alive_ = false;
      if (self->state_ == State::kClosed) {
        self->stream_.close();  // a lingering close: stop draining
      } else if (!self->writing_) {
        self->CloseNow();
      }
      // Otherwise OnWrite finishes the response and closes.
    });
  }

 private:
  enum class State {
    kReading,      // waiting for / reading a request
    kResponding,   // writing a complete response
    kWaitingJson,  // a POST waits for its answers to send them as JSON
    kHeldStream,   // an SSE response is chosen but its header not yet sent
    kStreaming,    // an SSE response is open
    kFinishing,    // the last bytes of a response are being written
    kClosed,
  };

  class Sink : public StreamSink {
   public:
    Sink(std::weak_ptr<Connection> conn, uint64_t serial)
        : conn_(std::move(conn)), serial_(serial) {}
    void Event(std::string message) override {
      if (auto c = conn_.lock()) c->PostEvent(serial_, std::move(message));
    }
    void End() override {
      if (auto c = conn_.lock()) c->PostEnd(serial_);
    }
    void Final(std::string message) override {
      if (auto c = conn_.lock()) c->PostFinal(serial_, std::move(message));
    }
    void Json(std::string body) override {
      if (auto c = conn_.lock()) c->PostJson(serial_, std::move(body));
    }

   private:
    std::weak_ptr<Connection> conn_;
    uint64_t serial_;
  };

  // ── Reading ──

  void DoRead() {
    state_ = State::kReading;
    ++serial_;
    exchange_.reset();
    session_.reset();
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
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    Handle();
  }

  // ── Handling ──

  void Handle() {
    state_ = State::kResponding;
    std::string_view target(request_.target().data(), request_.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    if (path == "/healthz") {
      if (request_.method() != http::verb::get && request_.method() != http::verb::head) {
        return SendError(http::status::method_not_allowed, kJsonRpcInvalidRequest,
                         "idemgate: /healthz answers GET", "GET, HEAD");
      }
      http::response<http::string_body> res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain");
      res.body() = "ok\n";
      return SendResponse(std::move(res));
    }
    if (path == "/readyz" || path == "/metrics") return HandleAdmin(path == "/metrics");
    const bool console = options_.console && (path == "/console" || path.starts_with("/console/"));
    if (path != options_.path && !console) {
      return SendError(http::status::not_found, kJsonRpcInvalidRequest,
                       "idemgate: no such endpoint; the MCP endpoint is " + options_.path);
    }
    // DNS-rebinding protection: a page that rebinds its name to our address
    // sends its own name in Host and its own origin in Origin.
    std::string_view host(request_[http::field::host].data(), request_[http::field::host].size());
    if (server_->bound_loopback && !host.empty() &&
        !IsHostAllowedOnLoopback(host, options_.allowed_hosts)) {
      return SendError(http::status::forbidden, kJsonRpcInvalidRequest,
                       "idemgate: Host '" + PrintableExcerpt(host, 100) +
                           "' is not allowed on a loopback listener");
    }
    // The console checks that its actions come from its own origin itself.
    if (console) return HandleConsole(target, path);
    if (auto origin = request_.find(http::field::origin); origin != request_.end()) {
      std::string_view value(origin->value().data(), origin->value().size());
      if (!IsOriginAllowed(value, options_.allowed_origins)) {
        return SendError(http::status::forbidden, kJsonRpcInvalidRequest,
                         "idemgate: Origin '" + PrintableExcerpt(value, 100) +
                             "' is not allowed (only loopback origins and those configured)");
      }
    }
    tenant_ = "default";
    if (options_.authenticate) {
      const std::string_view token = Token();
      std::optional<std::string> tenant;
      if (!token.empty()) tenant = options_.authenticate(token);
      if (!tenant) {
        return SendError(http::status::unauthorized, kJsonRpcInvalidRequest,
                         "idemgate: a valid bearer token is required (Authorization: Bearer ...)");
      }
      tenant_ = *tenant;
    }
    version_ = std::string(request_["MCP-Protocol-Version"]);
    if (!version_.empty() && !IsSupportedProtocolVersion(version_)) {
      std::string data = R"({"supported":[)";
      bool first = true;
      for (std::string_view v : kSupportedProtocolVersions) {
        if (!first) data.push_back(',');
        first = false;
        data.append(JsonQuote(v));
      }
      data.append(R"(],"requested":)")
          .append(JsonQuote(PrintableExcerpt(version_, 64)))
          .append("}");
      return SendError(http::status::bad_request, kMcpUnsupportedProtocolVersion,
                       "idemgate: unsupported MCP-Protocol-Version '" +
                           PrintableExcerpt(version_, 64) +
                           "'; supported: " + SupportedProtocolVersionList(),
                       {}, data);
    }
    switch (request_.method()) {
      case http::verb::post:
        return HandlePost();
      case http::verb::get:
        return HandleGet();
      case http::verb::delete_:
        return HandleDelete();
      default:
        return SendError(http::status::method_not_allowed, kJsonRpcInvalidRequest,
                         "idemgate: the MCP endpoint answers POST, GET and DELETE",
                         "GET, POST, DELETE");
    }
  }

  // /readyz and /metrics (HttpServerOptions::ready, metrics): checked here,
  // answered from the admin thread.
  void HandleAdmin(bool metrics) {
    if (request_.method() != http::verb::get && request_.method() != http::verb::head) {
      return SendError(http::status::method_not_allowed, kJsonRpcInvalidRequest,
                       "idemgate: the admin endpoints answer GET", "GET, HEAD");
    }
    if (metrics && !options_.metrics) {
      return SendError(http::status::not_found, kJsonRpcInvalidRequest,
                       "idemgate: this listener does not serve metrics");
    }
    if (metrics && options_.authenticate) {
      const std::string_view token = Token();
      if (token.empty() || !options_.authenticate(token)) {
        return SendError(http::status::unauthorized, kJsonRpcInvalidRequest,
                         "idemgate: /metrics needs an admin tenant's bearer token");
      }
      if (!options_.is_admin || !options_.is_admin(token)) {
        return SendError(http::status::forbidden, kJsonRpcInvalidRequest,
                         "idemgate: /metrics needs an admin tenant's token ([[tenant]] admin = "
                         "true)");
      }
    }
    const bool head = request_.method() == http::verb::head;
    net::post(server_->admin_pool, [self = shared_from_this(), metrics, head, serial = serial_] {
      http::response<http::string_body> res{http::status::ok, 11};
      if (metrics) {
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        res.body() = self->options_.metrics();
      } else {
        res.set(http::field::content_type, "text/plain");
        Result<void> ready = self->options_.ready ? self->options_.ready() : Result<void>();
        if (ready) {
          res.body() = "ready\n";
        } else {
          res.result(http::status::service_unavailable);
          res.body() = "not ready: the store is unreachable (" + ready.error().ToString() + ")\n";
        }
      }
      if (head) res.body().clear();  // the status is the answer; no body may follow
      net::post(self->stream_.get_executor(), [self, serial, res = std::move(res)]() mutable {
        if (serial != self->serial_ || self->state_ != State::kResponding) return;
        self->SendResponse(std::move(res));
      });
    });
  }

  // /console (HttpServerOptions::console): the request as the HTTP fronts'
  // handlers take it; the answer written whole, on this connection's strand.
  void HandleConsole(std::string_view target, std::string_view path) {
    idem::http::Request r;
    r.method = std::string(request_.method_string());
    r.target = std::string(target);
    r.path = std::string(path);
    if (size_t q = target.find('?'); q != std::string_view::npos) {
      r.query = std::string(target.substr(q + 1));
    }
    for (const auto& field : request_) {
      r.headers.push_back({std::string(field.name_string()), std::string(field.value())});
    }
    r.body = request_.body();
    beast::error_code ec;
    const auto peer = stream_.socket().remote_endpoint(ec);
    if (!ec) r.remote = peer.address().to_string() + ":" + std::to_string(peer.port());
    if (options_.authenticate) {
      const std::string_view token = Token();
      std::optional<std::string> tenant;
      if (!token.empty()) tenant = options_.authenticate(token);
      r.principal.tenant = tenant.value_or("");
      r.principal.admin = tenant && options_.is_admin && options_.is_admin(token);
    }
    const bool head = request_.method() == http::verb::head;
    options_.console(std::move(r), [self = shared_from_this(), head,
                                    serial = serial_](idem::http::Response answer) {
      http::response<http::string_body> res{static_cast<http::status>(answer.status), 11};
      for (const auto& h : answer.headers) res.insert(h.name, h.value);
      res.body() = head ? std::string() : std::move(answer.body);
      net::post(self->stream_.get_executor(), [self, serial, res = std::move(res)]() mutable {
        if (serial != self->serial_ || self->state_ != State::kResponding) return;
        self->SendResponse(std::move(res));
      });
    });
  }

  // The request's Mcp-Param-* headers and those options_.carried_headers
  // names, lowercase, the first of each name.
  std::vector<std::pair<std::string, std::string>> CarriedHeaders() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& field : request_) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool wanted =
          name.starts_with("mcp-param-") ||
          std::any_of(options_.carried_headers.begin(), options_.carried_headers.end(),
                      [&](const std::string& h) { return beast::iequals(h, name); });
      const bool seen = std::any_of(out.begin(), out.end(),
                                    [&](const auto& kv) { return kv.first == name; });
      if (wanted && !seen) out.emplace_back(std::move(name), std::string(field.value()));
    }
    return out;
  }

  // Looks up the session named by Mcp-Session-Id; answers the error itself
  // and returns null when there is none.
  std::shared_ptr<ServerSession> SessionFromHeader(std::string_view id) {
    if (!IsValidSessionId(id)) {
      SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                "idemgate: malformed Mcp-Session-Id header");
      return nullptr;
    }
    std::shared_ptr<ServerSession> session = server_->FindSession(std::string(id));
    if (!session || session->info().tenant != tenant_) {
      SendError(http::status::not_found, kJsonRpcInvalidRequest,
                "idemgate: unknown or expired session; start a new one with initialize");
      return nullptr;
    }
    return session;
  }

  void HandlePost() {
    std::string_view content_type(request_[http::field::content_type].data(),
                                  request_[http::field::content_type].size());
    if (!IsMediaType(content_type, "application/json")) {
      return SendError(http::status::unsupported_media_type, kJsonRpcInvalidRequest,
                       "idemgate: POST a JSON-RPC message with Content-Type: application/json");
    }
    std::string_view accept(request_[http::field::accept].data(),
                            request_[http::field::accept].size());
    bool accepts_sse = AcceptsMediaType(accept, "text/event-stream");
    bool accepts_json = AcceptsMediaType(accept, "application/json");
    if (!accepts_sse && !accepts_json) {
      return SendError(http::status::not_acceptable, kJsonRpcInvalidRequest,
                       "idemgate: the client must accept application/json and text/event-stream");
    }
    Result<MessageBatch> batch = InspectBody(request_.body(), options_.max_json_depth);
    if (!batch) {
      std::string why = "idemgate: " + batch.error().message;
      if (batch.error().code == ErrorCode::kResourceExhausted) {
        why += " (tool arguments may nest limits.max_depth levels; the JSON-RPC envelope adds " +
               std::to_string(kEnvelopeDepth) + ")";
      }
      return SendError(http::status::bad_request, kJsonRpcParseError, why);
    }
    bool has_initialize = false;
    bool has_discover = false;
    bool has_request = false;
    std::string meta_version;
    for (const MessageInfo& m : batch->messages) {
      // A peer drops a message that is not JSON-RPC without answering: the
      // POST would wait for ever.
      if (!m.problem.empty()) {
        return SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                         "idemgate: not a JSON-RPC 2.0 message: " + m.problem);
      }
      has_request = has_request || m.is_request();
      has_initialize = has_initialize || (m.is_request() && m.method == "initialize");
      has_discover = has_discover || m.method == "server/discover";
      if (!m.meta_protocol_version.empty()) meta_version = m.meta_protocol_version;
    }
    if (has_initialize && batch->messages.size() > 1) {
      return SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                       "idemgate: initialize must be sent alone, not in a batch");
    }
    std::string_view session_header(request_["Mcp-Session-Id"].data(),
                                    request_["Mcp-Session-Id"].size());
    bool stateless_dialect = IsStatelessProtocolVersion(version_) ||
                             IsStatelessProtocolVersion(meta_version) || has_discover;
    bool new_session = false;
    std::shared_ptr<ServerSession> session;
    if (stateless_dialect && !has_initialize) {
      // MCP 2026-07-28: sessions are gone; a session id is ignored.
      if (!meta_version.empty() && !version_.empty() && meta_version != version_) {
        return SendError(http::status::bad_request, kMcpHeaderMismatch,
                         "idemgate: header mismatch: MCP-Protocol-Version '" +
                             PrintableExcerpt(version_, 64) + "' does not match the body's '" +
                             PrintableExcerpt(meta_version, 64) + "'");
      }
      if (!batch->is_batch) {
        const MessageInfo& m = batch->messages.front();
        std::string_view method_header(request_["Mcp-Method"].data(),
                                       request_["Mcp-Method"].size());
        if (!method_header.empty() && method_header != m.method) {
          return SendError(
              http::status::bad_request, kMcpHeaderMismatch,
              "idemgate: header mismatch: Mcp-Method '" + PrintableExcerpt(method_header, 100) +
                  "' does not match the body's '" + PrintableExcerpt(m.method, 100) + "'");
        }
        std::string_view name_header(request_["Mcp-Name"].data(), request_["Mcp-Name"].size());
        if (!name_header.empty()) {
          Result<std::string> name = DecodeMirroredHeaderValue(name_header);
          if (!name || *name != m.name) {
            return SendError(http::status::bad_request, kMcpHeaderMismatch,
                             "idemgate: header mismatch: Mcp-Name does not match the body");
          }
        }
      }
      Result<std::shared_ptr<ServerSession>> s = server_->StatelessSession(tenant_);
      if (!s)
        return SendError(http::status::service_unavailable, kJsonRpcInternalError,
                         s.error().message);
      session = *s;
    } else if (!session_header.empty()) {
      if (has_initialize) {
        return SendError(
            http::status::bad_request, kJsonRpcInvalidRequest,
            "idemgate: initialize starts a new session; send it without Mcp-Session-Id");
      }
      session = SessionFromHeader(session_header);
      if (!session) return;
    } else if (has_initialize) {
      Result<std::shared_ptr<ServerSession>> s = server_->CreateSession(tenant_);
      if (!s)
        return SendError(http::status::service_unavailable, kJsonRpcInternalError,
                         s.error().message);
      session = *s;
      new_session = true;
    } else {
      return SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                       "idemgate: missing Mcp-Session-Id header; start a session with initialize "
                       "(or speak protocol version 2026-07-28, which has no sessions)");
    }
    // The headers the session reads (SEP-2243's Mcp-Param-*, header: id
    // sources) ride with each tools/call; in the 2026-07-28 dialect always,
    // so that a mirror header the client left out is noticed.
    const std::vector<std::pair<std::string, std::string>> carried = CarriedHeaders();
    for (MessageInfo& m : batch->messages) {
      if (!m.is_request() || m.method != "tools/call") continue;
      if (carried.empty() && !stateless_dialect) continue;
      if (Result<std::string> with = WithRequestHeaders(m.raw, carried)) m.raw = std::move(*with);
    }
    if (!has_request) {
      if (!session->Deliver(*batch)) {
        return SendError(http::status::not_found, kJsonRpcInvalidRequest,
                         "idemgate: the session has ended; start a new one with initialize");
      }
      http::response<http::empty_body> res{http::status::accepted, 11};
      return SendResponse(std::move(res));
    }
    session_ = session;
    if (new_session) session_id_header_ = session->info().session_id;
    exchange_ = std::make_shared<Exchange>();
    exchange_->kind = accepts_sse ? Exchange::Kind::kPostSse : Exchange::Kind::kPostJson;
    exchange_->sink = std::make_shared<Sink>(weak_from_this(), serial_);
    // The header goes out before any event (a held stream: at the first one).
    bool hold = accepts_sse && !batch->is_batch;
    if (hold) {
      HoldStream(accepts_json && session->info().stateless);
    } else if (accepts_sse) {
      OpenStream();
    }
    ServerSession::Outcome outcome = session->BeginPost(exchange_, *batch);
    if (outcome != ServerSession::Outcome::kOk) {
      if (hold) OpenStream();
      if (accepts_sse) {
        // The stream is open: answer inside it.
        for (const MessageInfo& m : batch->messages) {
          if (!m.is_request()) continue;
          std::string id(FindTopLevelMember(m.raw, "id").value_or("null"));
          std::string why =
              outcome == ServerSession::Outcome::kDuplicateId
                  ? "idemgate: request id " + PrintableExcerpt(id, 80) +
                        " is already waiting for an answer in this session"
                  : "idemgate: the session has ended; start a new one with initialize";
          Write(Chunk(FormatSseEvent(JsonRpcError(id, kJsonRpcInvalidRequest, why))));
        }
        state_ = State::kFinishing;
        Write(std::string(kLastChunk));
        FinishAfterWrite();
        return;
      }
      if (outcome == ServerSession::Outcome::kDuplicateId) {
        return SendError(http::status::conflict, kJsonRpcInvalidRequest,
                         "idemgate: a request id is already waiting for an answer in this session");
      }
      return SendError(http::status::not_found, kJsonRpcInvalidRequest,
                       "idemgate: the session has ended; start a new one with initialize");
    }
    if (!accepts_sse) state_ = State::kWaitingJson;
    Watch();
  }

  void HandleGet() {
    std::string_view accept(request_[http::field::accept].data(),
                            request_[http::field::accept].size());
    if (accept.empty() || !AcceptsMediaType(accept, "text/event-stream")) {
      return SendError(http::status::not_acceptable, kJsonRpcInvalidRequest,
                       "idemgate: GET opens an SSE stream; send Accept: text/event-stream");
    }
    std::string_view session_header(request_["Mcp-Session-Id"].data(),
                                    request_["Mcp-Session-Id"].size());
    if (session_header.empty()) {
      if (IsStatelessProtocolVersion(version_)) {
        return SendError(http::status::method_not_allowed, kJsonRpcInvalidRequest,
                         "idemgate: protocol version 2026-07-28 has no GET stream", "POST");
      }
      return SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                       "idemgate: missing Mcp-Session-Id header");
    }
    std::shared_ptr<ServerSession> session = SessionFromHeader(session_header);
    if (!session) return;
    session_ = session;
    exchange_ = std::make_shared<Exchange>();
    exchange_->kind = Exchange::Kind::kGet;
    exchange_->sink = std::make_shared<Sink>(weak_from_this(), serial_);
    switch (session->AttachGet(exchange_)) {
      case ServerSession::AttachOutcome::kOk:
        break;
      case ServerSession::AttachOutcome::kConflict:
        exchange_.reset();
        return SendError(http::status::conflict, kJsonRpcInvalidRequest,
                         "idemgate: this session already has a GET stream open");
      case ServerSession::AttachOutcome::kClosed:
        exchange_.reset();
        return SendError(http::status::not_found, kJsonRpcInvalidRequest,
                         "idemgate: the session has ended; start a new one with initialize");
    }
    // AttachGet may already have queued buffered events behind this header:
    // they are posted, so they run after this handler.
    OpenStream();
    Watch();
  }

  void HandleDelete() {
    std::string_view session_header(request_["Mcp-Session-Id"].data(),
                                    request_["Mcp-Session-Id"].size());
    if (session_header.empty()) {
      if (IsStatelessProtocolVersion(version_)) {
        return SendError(http::status::method_not_allowed, kJsonRpcInvalidRequest,
                         "idemgate: protocol version 2026-07-28 has no sessions to delete", "POST");
      }
      return SendError(http::status::bad_request, kJsonRpcInvalidRequest,
                       "idemgate: missing Mcp-Session-Id header");
    }
    std::shared_ptr<ServerSession> session = SessionFromHeader(session_header);
    if (!session) return;
    server_->EndSession(session, "the client ended the session (HTTP DELETE)");
    http::response<http::empty_body> res{http::status::ok, 11};
    SendResponse(std::move(res));
  }

  // ── Writing ──

  template <class Body>
  void AddCommonHeaders(http::response<Body>& res) {
    res.set(http::field::server, "idemgate");
    if (!session_id_header_.empty()) res.set("Mcp-Session-Id", session_id_header_);
  }

  // The request's bearer token, or empty.
  std::string_view Token() const {
    const auto auth = request_[http::field::authorization];
    return idem::net::BearerToken(std::string_view(auth.data(), auth.size()));
  }

  void SendRefusal(const idem::net::Refusal& r) {
    SendError(static_cast<http::status>(r.status), kJsonRpcInvalidRequest, r.detail);
  }

  void SendError(http::status status, int code, const std::string& message,
                 std::string_view allow = {}, std::string_view data_json = {}) {
    http::response<http::string_body> res{status, 11};
    res.set(http::field::content_type, "application/json");
    if (!allow.empty()) res.set(http::field::allow, allow);
    if (status == http::status::unauthorized) res.set(http::field::www_authenticate, "Bearer");
    res.body() = JsonRpcError("null", code, message, data_json);
    SendResponse(std::move(res));
  }

  template <class Body>
  void SendResponse(http::response<Body>&& res) {
    state_ = State::kFinishing;
    AddCommonHeaders(res);
    res.keep_alive(keep_alive_);
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    Write(os.str());
    FinishAfterWrite();
  }

  void OpenStream() {
    state_ = State::kStreaming;
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.set("X-Accel-Buffering", "no");
    AddCommonHeaders(res);
    res.keep_alive(keep_alive_);
    res.chunked(true);
    std::ostringstream os;
    os << res.base();
    Write(os.str());
    ArmKeepalive();
  }

  // A POST of one request holds its SSE stream until it has something to
  // say. If that is the final answer, the whole response goes out in one
  // write (see SendHeldAnswer); otherwise (a progress notification, a
  // server-to-client request), or after one keep-alive interval, the
  // chunked SSE stream opens. `as_json`: the held answer is sent as plain
  // JSON (stateless dialect, client accepts JSON).
  void HoldStream(bool as_json) {
    state_ = State::kHeldStream;
    held_as_json_ = as_json;
    ArmKeepalive();
  }

  // The final answer of a held stream, nothing streamed before it: one
  // response with a Content-Length, so the client gets it in one segment.
  // Stateless dialect: plain JSON, with the status MCP 2026-07-28 gives some
  // errors (404 for an unknown method). Otherwise: text/event-stream with
  // the answer as its one event, as the SDK's own server answers.
  void SendHeldAnswer(const std::string& message) {
    keepalive_timer_.cancel();
    if (held_as_json_) {
      http::response<http::string_body> res{static_cast<http::status>(StatelessHttpStatus(message)),
                                            11};
      res.set(http::field::content_type, "application/json");
      res.body() = message;
      return SendResponse(std::move(res));
    }
    http::response<http::string_body> res{http::status::ok, 11};
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.body() = FormatSseEvent(message);
    SendResponse(std::move(res));
  }

  void EndStream() {
    state_ = State::kFinishing;
    keepalive_timer_.cancel();
    Write(std::string(kLastChunk));
    FinishAfterWrite();
  }

  void ArmKeepalive() {
    if (options_.sse_keepalive.count() <= 0) return;
    keepalive_timer_.expires_after(options_.sse_keepalive);
    keepalive_timer_.async_wait(
        [self = shared_from_this(), serial = serial_](beast::error_code ec) {
          if (ec || serial != self->serial_) return;
          if (self->state_ == State::kHeldStream) return self->OpenStream();
          if (self->state_ != State::kStreaming) return;
          if (!self->writing_) self->Write(Chunk(FormatSseComment("keep-alive")));
          self->ArmKeepalive();
        });
  }

  void Write(std::string bytes) {
    if (state_ == State::kClosed) return;
    outq_.push_back(std::move(bytes));
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, net::buffer(outq_.front()),
                     beast::bind_front_handler(&Connection::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, size_t) {
    writing_ = false;
    if (ec) return ClientGone();
    outq_.pop_front();
    if (!outq_.empty()) return DoWrite();
    stream_.expires_never();
    if (finish_after_write_) {
      finish_after_write_ = false;
      ResponseDone();
    } else if (stopping_) {
      CloseNow();
    }
  }

  void FinishAfterWrite() {
    if (!writing_ && outq_.empty()) {
      ResponseDone();
    } else {
      finish_after_write_ = true;
    }
  }

  // The response is on the wire: read the next request, or close.
  void ResponseDone() {
    if (exchange_ && session_) {
      // A finished exchange is already forgotten by its session; an
      // unfinished one (e.g. refused) must be.
      if (!exchange_->finished) session_->Detach(exchange_);
    }
    exchange_.reset();
    session_.reset();
    session_id_header_.clear();
    if (!keep_alive_) return linger_ ? LingerClose() : CloseNow();
    if (watching_) {
      // Stop watching for a disconnect first; its handler continues.
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    DoRead();
  }

  // While a response is pending, watch the socket so that a client that goes
  // away is noticed even when nothing is being written. Bytes that arrive
  // (a pipelined next request) are kept for the next read.
  void Watch() {
    if (watching_ || buffer_.size() >= options_.max_header_bytes) return;
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      if (state_ != State::kClosed) DoRead();
      return;
    }
    if (state_ == State::kClosed) return;
    if (ec) return ClientGone();
    if (state_ == State::kStreaming || state_ == State::kHeldStream ||
        state_ == State::kWaitingJson) {
      Watch();
    }
  }

  void ClientGone() {
    if (state_ == State::kClosed) return;
    if (exchange_ && session_) session_->Detach(exchange_);
    exchange_.reset();
    session_.reset();
    CloseNow();
  }

  void CloseNow() {
    if (state_ == State::kClosed) return;
    if (exchange_ && session_) session_->Detach(exchange_);
    exchange_.reset();
    session_.reset();
    state_ = State::kClosed;
    keepalive_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // After an error answer on a connection we will not reuse: stop sending,
  // and read (and discard) what the client still sends until it closes, so
  // it sees our answer instead of a reset. Bounded by read_timeout.
  void LingerClose() {
    if (stopping_) return CloseNow();
    state_ = State::kClosed;
    keepalive_timer_.cancel();
    idem::net::LingerThenClose(stream_, shared_from_this(), options_.read_timeout,
                               4 * options_.max_body_bytes + (1 << 20));
  }

  HttpMcpServer::Impl* server_;
  const HttpServerOptions& options_;
  const idem::net::RequestLimits limits_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  net::steady_timer keepalive_timer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  State state_ = State::kReading;
  bool keep_alive_ = true;
  bool held_as_json_ = false;  // kHeldStream: the final answer goes out as plain JSON
  bool stopping_ = false;  // the server is stopping: no more requests, no lingering
  bool linger_ = true;     // a connection that closes after an answer drains first
  uint64_t serial_ = 0;
  std::string tenant_;
  std::string version_;
  std::string session_id_header_;
  std::shared_ptr<ServerSession> session_;
  std::shared_ptr<Exchange> exchange_;
  std::deque<std::string> outq_;
  bool writing_ = false;
  bool finish_after_write_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
};

}  // namespace

// ── Impl ────────────────────────────────────────────────────────────────────

void HttpMcpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                          if (ec == net::error::operation_aborted || !self->acceptor.is_open())
                            return;
                          if (!ec) {
                            size_t open;
                            {
                              std::lock_guard lock(self->mu);
                              open = self->connections.size();
                            }
                            auto conn = std::make_shared<Connection>(self.get(), std::move(socket));
                            conn->Start(open >= self->options.max_connections);
                          } else {
                            Log("accept failed: " + ec.message());
                          }
                          self->Accept();
                        });
}

void HttpMcpServer::Impl::Sweep() {
  auto idle = options.session_idle_timeout;
  if (idle.count() <= 0) return;
  auto period = std::clamp<std::chrono::milliseconds>(idle / 4, std::chrono::milliseconds(10),
                                                      std::chrono::milliseconds(30'000));
  sweep_timer.expires_after(period);
  sweep_timer.async_wait([self = shared_from_this(), idle](beast::error_code ec) {
    if (ec) return;
    std::vector<std::shared_ptr<ServerSession>> expired;
    auto now = Clock::now();
    {
      std::lock_guard lock(self->mu);
      if (self->stopping) return;
      for (auto* map : {&self->sessions, &self->stateless}) {
        for (auto it = map->begin(); it != map->end();) {
          if (it->second->IdleFor(idle, now)) {
            expired.push_back(it->second);
            it = map->erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (auto& s : expired) s->Shutdown("the session expired after being idle");
    self->Sweep();
  });
}

std::shared_ptr<ServerSession> HttpMcpServer::Impl::FindSession(const std::string& id) {
  std::lock_guard lock(mu);
  auto it = sessions.find(id);
  return it == sessions.end() ? nullptr : it->second;
}

std::shared_ptr<ServerSession> HttpMcpServer::Impl::NewSession(HttpSessionInfo info) {
  std::weak_ptr<Impl> weak = weak_from_this();
  auto session = std::make_shared<ServerSession>(std::move(info), options.max_json_depth,
                                                 options.max_undelivered, [weak](ServerSession* s) {
                                                   if (auto self = weak.lock()) self->Forget(s);
                                                 });
  // The factory runs on the session's own thread: it may spawn a process or
  // block without stalling the I/O threads.
  session->RunOnSessionThread([factory = factory, weak_session = std::weak_ptr(session)] {
    std::shared_ptr<ServerSession> s = weak_session.lock();
    if (!s || s->ended()) return;
    HttpSessionInfo info = s->info();
    factory(s, info);
  });
  return session;
}

Result<std::shared_ptr<ServerSession>> HttpMcpServer::Impl::CreateSession(
    const std::string& tenant) {
  Result<std::string> id = NewSessionId();
  if (!id) return std::unexpected(id.error());
  std::lock_guard lock(mu);
  if (stopping) return MakeError(ErrorCode::kUnavailable, "idemgate: the server is stopping");
  if (sessions.size() + stateless.size() >= options.max_sessions) {
    return MakeError(ErrorCode::kResourceExhausted,
                     "idemgate: too many sessions (" + std::to_string(options.max_sessions) +
                         "); end unused ones with DELETE or retry later");
  }
  auto session = NewSession(HttpSessionInfo{*id, tenant, false});
  sessions.emplace(*id, session);
  return session;
}

Result<std::shared_ptr<ServerSession>> HttpMcpServer::Impl::StatelessSession(
    const std::string& tenant) {
  std::lock_guard lock(mu);
  if (stopping) return MakeError(ErrorCode::kUnavailable, "idemgate: the server is stopping");
  auto it = stateless.find(tenant);
  if (it != stateless.end() && !it->second->ended()) return it->second;
  if (it == stateless.end() && sessions.size() + stateless.size() >= options.max_sessions) {
    return MakeError(ErrorCode::kResourceExhausted,
                     "idemgate: too many sessions (" + std::to_string(options.max_sessions) + ")");
  }
  auto session = NewSession(HttpSessionInfo{"", tenant, true});
  stateless[tenant] = session;
  return session;
}

void HttpMcpServer::Impl::Forget(ServerSession* session) {
  std::lock_guard lock(mu);
  for (auto* map : {&sessions, &stateless}) {
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (it->second.get() == session) {
        map->erase(it);
        return;
      }
    }
  }
}

void HttpMcpServer::Impl::EndSession(const std::shared_ptr<ServerSession>& session,
                                     const std::string& reason) {
  Forget(session.get());
  session->Shutdown(reason);
}

void HttpMcpServer::Impl::StopAll() {
  std::vector<std::shared_ptr<ServerSession>> all;
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    stopping = true;
    for (auto& [id, s] : sessions) all.push_back(s);
    for (auto& [tenant, s] : stateless) all.push_back(s);
    sessions.clear();
    stateless.clear();
  }
  net::post(acceptor.get_executor(), [self = shared_from_this()] {
    beast::error_code ignored;
    self->acceptor.close(ignored);
    self->sweep_timer.cancel();
  });
  for (auto& s : all) s->Shutdown("server stopping");
  {
    std::lock_guard lock(mu);
    for (auto& [ptr, weak] : connections) {
      if (auto c = weak.lock()) conns.push_back(c);
    }
  }
  admin_pool.join();  // answers of admin requests in progress are posted first
  for (auto& c : conns) c->PostClose();
  conns.clear();
  work.reset();
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

// ── HttpMcpServer ───────────────────────────────────────────────────────────

HttpMcpServer::HttpMcpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpMcpServer::~HttpMcpServer() { Stop(); }

Result<std::unique_ptr<HttpMcpServer>> HttpMcpServer::Start(
    const HttpServerOptions& options, std::function<void(std::shared_ptr<Channel>)> on_session) {
  return Start(options, HttpSessionFactory([f = std::move(on_session)](std::shared_ptr<Channel> c,
                                                                       const HttpSessionInfo&) {
                 f(std::move(c));
               }));
}

Result<std::unique_ptr<HttpMcpServer>> HttpMcpServer::Start(const HttpServerOptions& options,
                                                            HttpSessionFactory on_session) {
  if (!on_session) return MakeError(ErrorCode::kInvalidArgument, "no session factory");
  if (options.path.empty() || options.path.front() != '/') {
    return MakeError(ErrorCode::kInvalidArgument, "the MCP endpoint path must start with '/'");
  }
  auto impl = std::make_shared<Impl>(options, std::move(on_session));

  Result<idem::net::ListeningSocket> socket = idem::net::OpenListeningSocket(
      impl->acceptor, options.listen, bool(options.authenticate), options.insecure_no_auth);
  if (!socket) return std::unexpected(socket.error());
  impl->bound = socket->bound;
  impl->bound_loopback = socket->loopback;
  impl->work.emplace(impl->ioc.get_executor());
  impl->Accept();
  impl->Sweep();
  int threads = std::max(1, options.threads);
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([impl = impl.get()] { impl->ioc.run(); });
  }
  auto server = std::unique_ptr<HttpMcpServer>(new HttpMcpServer(impl));
  if (options.announce) {
    std::cerr << "idemgate: listening on " + server->url() + "\n" << std::flush;
  }
  return server;
}

std::string HttpMcpServer::bound_address() const { return impl_->bound; }

std::string HttpMcpServer::url() const { return "http://" + impl_->bound + impl_->options.path; }

void HttpMcpServer::Stop() {
  if (impl_) impl_->StopAll();
}

}  // namespace idem::mcp
