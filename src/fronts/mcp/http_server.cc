// HttpMcpServer: MCP's Streamable HTTP endpoint (docs/DESIGN.md §6.1) as a
// handler on idemgate's one HTTP server (net/http_listener.h), which does the
// connections, limits, timeouts, bearer tokens, Host checks and /healthz
// /readyz /metrics (WithAdmin). This file is the endpoint: the MCP checks,
// status codes and JSON-RPC error bodies, and the session registry; the
// routing of messages lives in ServerSession, the answers' framing in
// HttpReply.
#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/http_reply.h"
#include "fronts/mcp/http_server_session.h"
#include "json/json_text.h"

namespace idem::mcp {
namespace {

using Clock = std::chrono::steady_clock;

// How long Stop lets answers already given (the sessions' "server stopping"
// errors) reach their clients before it closes every connection.
constexpr std::chrono::milliseconds kStopGrace{2'000};

// A refusal of the MCP endpoint: a JSON-RPC error body without an id.
http::Response RpcError(int status, int code, std::string_view message,
                        std::string_view allow = {}, std::string_view data_json = {}) {
  http::Response r;
  r.status = status;
  r.headers.push_back({"Content-Type", "application/json"});
  if (!allow.empty()) r.headers.push_back({"Allow", std::string(allow)});
  r.body = JsonRpcError("null", code, message, data_json);
  return r;
}

// True if `text` equals `lower` (lowercase) but for the case of ASCII letters.
bool EqualsLowercase(std::string_view text, std::string_view lower) {
  return std::equal(text.begin(), text.end(), lower.begin(), lower.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
}

std::string_view HeaderOr(const http::Request& request, std::string_view name) {
  return request.FindHeader(name).value_or(std::string_view());
}

// What the listener needs of the options: the limits, timeouts and checks
// every HTTP front shares.
http::ListenerOptions ListenerOptionsOf(const HttpServerOptions& o) {
  http::ListenerOptions l;
  l.listen = o.listen;
  l.max_body_bytes = o.max_body_bytes;
  l.max_header_bytes = o.max_header_bytes;
  l.max_header_count = o.max_header_count;
  l.max_connections = o.max_connections;
  l.read_timeout = o.read_timeout;
  l.write_timeout = o.write_timeout;
  l.threads = o.threads;
  if (o.authenticate) {
    l.authenticate = [authenticate = o.authenticate,
                      is_admin = o.is_admin](std::string_view token) -> std::optional<http::Principal> {
      std::optional<std::string> tenant = authenticate(token);
      if (!tenant) return std::nullopt;
      return http::Principal{*tenant, is_admin && is_admin(token)};
    };
  }
  for (const std::string& path : o.public_paths) l.public_paths.push_back(path);
  l.insecure_no_auth = o.insecure_no_auth;
  l.allowed_hosts = o.allowed_hosts;
  l.check_host_with_tokens = true;
  l.render_refusal = [](int status, std::string_view type, std::string_view detail) {
    return RpcError(status, type == "too-many-connections" ? kJsonRpcInternalError
                                                           : kJsonRpcInvalidRequest,
                    detail);
  };
  l.name = "mcp";
  l.announce = false;  // HttpMcpServer::Start prints its own line
  return l;
}

}  // namespace

// ── The server's shared state ───────────────────────────────────────────────

struct HttpMcpServer::Impl : std::enable_shared_from_this<HttpMcpServer::Impl> {
  Impl(const HttpServerOptions& o, HttpSessionFactory f) : options(o), factory(std::move(f)) {}

  // The MCP endpoint and /console (the listener's handler, behind WithAdmin).
  void Handle(http::Request&& request, http::Responder respond);
  void SweepLoop();
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

  std::mutex mu;  // guards everything below up to `listener`
  std::condition_variable sweep_cv;
  bool stopping = false;
  std::map<std::string, std::shared_ptr<ServerSession>> sessions;   // by session id
  std::map<std::string, std::shared_ptr<ServerSession>> stateless;  // by tenant
  // When each session in the maps above began (session_lifetime).
  std::map<const ServerSession*, std::chrono::steady_clock::time_point> began;
  // Whether `tenant` may open one more session (max_sessions_per_tenant).
  bool TenantHasRoom(const std::string& tenant) const {
    if (options.max_sessions_per_tenant == 0) return true;
    size_t held = 0;
    for (const auto* map : {&sessions, &stateless}) {
      for (const auto& [_, s] : *map) held += s->info().tenant == tenant ? 1 : 0;
    }
    return held < options.max_sessions_per_tenant;
  }

  std::unique_ptr<http::HttpListener> listener;
  std::thread sweeper;  // ends idle sessions (session_idle_timeout)
};

namespace {

// One request to the MCP endpoint, on an I/O thread: checks it, finds or
// makes its session, and hands its answer over to an HttpReply.
class EndpointCall {
 public:
  EndpointCall(HttpMcpServer::Impl& server, http::Request request, http::Responder respond)
      : server_(server),
        options_(server.options),
        request_(std::move(request)),
        respond_(std::move(respond)) {}

  void Run();

 private:
  void HandlePost();
  void HandleGet();
  void HandleDelete();
  // Starts the exchange of a POST with requests in it.
  void BeginExchange(const std::shared_ptr<ServerSession>& session, MessageBatch& batch,
                     bool new_session, bool accepts_sse, bool accepts_json);
  std::shared_ptr<ServerSession> SessionFromHeader(std::string_view id);
  // The session a GET or DELETE names in Mcp-Session-Id; answers the error
  // itself (`stateless_lacks`: what the 2026-07-28 dialect has not) and
  // returns null when there is none.
  std::shared_ptr<ServerSession> NamedSession(std::string_view stateless_lacks);
  std::vector<std::pair<std::string, std::string>> CarriedHeaders() const;
  // The reply's hooks: it learns of a client that leaves, and a held
  // stream opens after one keep-alive interval.
  void Watch(const std::shared_ptr<HttpReply>& reply, bool held);

  void Error(int status, int code, std::string_view message, std::string_view allow = {},
             std::string_view data_json = {}) {
    respond_(RpcError(status, code, message, allow, data_json));
  }

  HttpMcpServer::Impl& server_;
  const HttpServerOptions& options_;
  http::Request request_;
  http::Responder respond_;
  std::string tenant_;
  std::string version_;
};

void EndpointCall::Run() {
  // DNS-rebinding protection (the listener checked Host): a page sends its
  // own origin in Origin.
  if (auto origin = request_.FindHeader("Origin")) {
    if (!IsOriginAllowed(*origin, options_.allowed_origins)) {
      return Error(403, kJsonRpcInvalidRequest,
                   "idemgate: Origin '" + PrintableExcerpt(*origin, 100) +
                       "' is not allowed (only loopback origins and those configured)");
    }
  }
  tenant_ = request_.principal.tenant;
  version_ = std::string(HeaderOr(request_, "MCP-Protocol-Version"));
  if (!version_.empty() && !IsSupportedProtocolVersion(version_)) {
    std::string data = R"({"supported":[)";
    bool first = true;
    for (std::string_view v : kSupportedProtocolVersions) {
      if (!first) data.push_back(',');
      first = false;
      data.append(json_text::Quote(v));
    }
    data.append(R"(],"requested":)")
        .append(json_text::Quote(PrintableExcerpt(version_, 64)))
        .append("}");
    return Error(400, kMcpUnsupportedProtocolVersion,
                 "idemgate: unsupported MCP-Protocol-Version '" + PrintableExcerpt(version_, 64) +
                     "'; supported: " + SupportedProtocolVersionList(),
                 {}, data);
  }
  if (request_.method == "POST") return HandlePost();
  if (request_.method == "GET") return HandleGet();
  if (request_.method == "DELETE") return HandleDelete();
  Error(405, kJsonRpcInvalidRequest, "idemgate: the MCP endpoint answers POST, GET and DELETE",
        "GET, POST, DELETE");
}

// The request's Mcp-Param-* headers and those options_.carried_headers
// names, lowercase, the first of each name.
std::vector<std::pair<std::string, std::string>> EndpointCall::CarriedHeaders() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const http::Header& field : request_.headers) {
    std::string name = field.name;
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool wanted =
        name.starts_with("mcp-param-") ||
        std::any_of(options_.carried_headers.begin(), options_.carried_headers.end(),
                    [&](const std::string& h) { return EqualsLowercase(h, name); });
    const bool seen =
        std::any_of(out.begin(), out.end(), [&](const auto& kv) { return kv.first == name; });
    if (wanted && !seen) out.emplace_back(std::move(name), field.value);
  }
  return out;
}

// Looks up the session named by Mcp-Session-Id; answers the error itself
// and returns null when there is none.
std::shared_ptr<ServerSession> EndpointCall::SessionFromHeader(std::string_view id) {
  if (!IsValidSessionId(id)) {
    Error(400, kJsonRpcInvalidRequest, "idemgate: malformed Mcp-Session-Id header");
    return nullptr;
  }
  std::shared_ptr<ServerSession> session = server_.FindSession(std::string(id));
  if (!session || session->info().tenant != tenant_) {
    Error(404, kJsonRpcInvalidRequest,
          "idemgate: unknown or expired session; start a new one with initialize");
    return nullptr;
  }
  return session;
}

std::shared_ptr<ServerSession> EndpointCall::NamedSession(std::string_view stateless_lacks) {
  const std::string_view session_header = HeaderOr(request_, "Mcp-Session-Id");
  if (!session_header.empty()) return SessionFromHeader(session_header);
  if (IsStatelessProtocolVersion(version_)) {
    Error(405, kJsonRpcInvalidRequest,
          "idemgate: protocol version 2026-07-28 " + std::string(stateless_lacks), "POST");
  } else {
    Error(400, kJsonRpcInvalidRequest, "idemgate: missing Mcp-Session-Id header");
  }
  return nullptr;
}

void EndpointCall::HandlePost() {
  if (!IsMediaType(HeaderOr(request_, "Content-Type"), "application/json")) {
    return Error(415, kJsonRpcInvalidRequest,
                 "idemgate: POST a JSON-RPC message with Content-Type: application/json");
  }
  const std::string_view accept = HeaderOr(request_, "Accept");
  const bool accepts_sse = AcceptsMediaType(accept, "text/event-stream");
  const bool accepts_json = AcceptsMediaType(accept, "application/json");
  if (!accepts_sse && !accepts_json) {
    return Error(406, kJsonRpcInvalidRequest,
                 "idemgate: the client must accept application/json and text/event-stream");
  }
  Result<MessageBatch> batch = InspectBody(request_.body, options_.max_json_depth);
  if (!batch) {
    std::string why = "idemgate: " + batch.error().message;
    if (batch.error().code == ErrorCode::kResourceExhausted) {
      why += " (tool arguments may nest limits.max_depth levels; the JSON-RPC envelope adds " +
             std::to_string(kEnvelopeDepth) + ")";
    }
    return Error(400, kJsonRpcParseError, why);
  }
  bool has_initialize = false;
  bool has_discover = false;
  bool has_request = false;
  std::string meta_version;
  for (const MessageInfo& m : batch->messages) {
    // A peer drops a message that is not JSON-RPC without answering: the
    // POST would wait for ever.
    if (!m.problem.empty()) {
      return Error(400, kJsonRpcInvalidRequest,
                   "idemgate: not a JSON-RPC 2.0 message: " + m.problem);
    }
    has_request = has_request || m.is_request();
    has_initialize = has_initialize || (m.is_request() && m.method == "initialize");
    has_discover = has_discover || m.method == "server/discover";
    if (!m.meta_protocol_version.empty()) meta_version = m.meta_protocol_version;
  }
  if (has_initialize && batch->messages.size() > 1) {
    return Error(400, kJsonRpcInvalidRequest,
                 "idemgate: initialize must be sent alone, not in a batch");
  }
  const std::string_view session_header = HeaderOr(request_, "Mcp-Session-Id");
  const bool stateless_dialect = IsStatelessProtocolVersion(version_) ||
                                 IsStatelessProtocolVersion(meta_version) || has_discover;
  bool new_session = false;
  std::shared_ptr<ServerSession> session;
  if (stateless_dialect && !has_initialize) {
    // MCP 2026-07-28: sessions are gone; a session id is ignored.
    if (!meta_version.empty() && !version_.empty() && meta_version != version_) {
      return Error(400, kMcpHeaderMismatch,
                   "idemgate: header mismatch: MCP-Protocol-Version '" +
                       PrintableExcerpt(version_, 64) + "' does not match the body's '" +
                       PrintableExcerpt(meta_version, 64) + "'");
    }
    if (!batch->is_batch) {
      const MessageInfo& m = batch->messages.front();
      const std::string_view method_header = HeaderOr(request_, "Mcp-Method");
      if (!method_header.empty() && method_header != m.method) {
        return Error(400, kMcpHeaderMismatch,
                     "idemgate: header mismatch: Mcp-Method '" +
                         PrintableExcerpt(method_header, 100) + "' does not match the body's '" +
                         PrintableExcerpt(m.method, 100) + "'");
      }
      const std::string_view name_header = HeaderOr(request_, "Mcp-Name");
      if (!name_header.empty()) {
        Result<std::string> name = DecodeMirroredHeaderValue(name_header);
        if (!name || *name != m.name) {
          return Error(400, kMcpHeaderMismatch,
                       "idemgate: header mismatch: Mcp-Name does not match the body");
        }
      }
    }
    Result<std::shared_ptr<ServerSession>> s = server_.StatelessSession(tenant_);
    if (!s) return Error(503, kJsonRpcInternalError, s.error().message);
    session = *s;
  } else if (!session_header.empty()) {
    if (has_initialize) {
      return Error(400, kJsonRpcInvalidRequest,
                   "idemgate: initialize starts a new session; send it without Mcp-Session-Id");
    }
    session = SessionFromHeader(session_header);
    if (!session) return;
  } else if (has_initialize) {
    Result<std::shared_ptr<ServerSession>> s = server_.CreateSession(tenant_);
    if (!s) return Error(503, kJsonRpcInternalError, s.error().message);
    session = *s;
    new_session = true;
  } else {
    return Error(400, kJsonRpcInvalidRequest,
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
      return Error(404, kJsonRpcInvalidRequest,
                   "idemgate: the session has ended; start a new one with initialize");
    }
    http::Response accepted;
    accepted.status = 202;
    return respond_(std::move(accepted));
  }
  BeginExchange(session, *batch, new_session, accepts_sse, accepts_json);
}

void EndpointCall::BeginExchange(const std::shared_ptr<ServerSession>& session,
                                 MessageBatch& batch, bool new_session, bool accepts_sse,
                                 bool accepts_json) {
  // The header goes out before any event (a held stream: at the first one).
  const bool hold = accepts_sse && !batch.is_batch;
  HttpReply::Mode mode = HttpReply::Mode::kJson;
  if (hold) {
    mode = accepts_json && session->info().stateless ? HttpReply::Mode::kHeldJson
                                                     : HttpReply::Mode::kHeld;
  } else if (accepts_sse) {
    mode = HttpReply::Mode::kStream;
  }
  auto reply = std::make_shared<HttpReply>(std::move(respond_), mode, options_.sse_keepalive,
                                           new_session ? session->info().session_id : "");
  auto exchange = std::make_shared<Exchange>();
  exchange->kind = accepts_sse ? Exchange::Kind::kPostSse : Exchange::Kind::kPostJson;
  exchange->sink = reply;
  reply->Bind(session, exchange);
  if (mode == HttpReply::Mode::kStream) reply->Open();
  ServerSession::Outcome outcome = session->BeginPost(exchange, batch);
  if (outcome == ServerSession::Outcome::kOk) return Watch(reply, hold);
  session->Detach(exchange);
  const bool duplicate = outcome == ServerSession::Outcome::kDuplicateId;
  if (accepts_sse) {
    // Answer inside the stream.
    reply->Open();
    for (const MessageInfo& m : batch.messages) {
      if (!m.is_request()) continue;
      std::string id(FindTopLevelMember(m.raw, "id").value_or("null"));
      reply->Event(JsonRpcError(
          id, kJsonRpcInvalidRequest,
          duplicate ? "idemgate: request id " + PrintableExcerpt(id, 80) +
                          " is already waiting for an answer in this session"
                    : "idemgate: the session has ended; start a new one with initialize"));
    }
    return reply->End();
  }
  reply->Refuse(
      duplicate
          ? RpcError(409, kJsonRpcInvalidRequest,
                     "idemgate: a request id is already waiting for an answer in this session")
          : RpcError(404, kJsonRpcInvalidRequest,
                     "idemgate: the session has ended; start a new one with initialize"));
}

void EndpointCall::Watch(const std::shared_ptr<HttpReply>& reply, bool held) {
  if (!request_.hooks) return;
  request_.hooks->OnClientGone([reply] { reply->ClientGone(); });
  if (held && options_.sse_keepalive.count() > 0) {
    request_.hooks->After(options_.sse_keepalive, [reply] { reply->Open(); });
  }
}

void EndpointCall::HandleGet() {
  const std::string_view accept = HeaderOr(request_, "Accept");
  if (accept.empty() || !AcceptsMediaType(accept, "text/event-stream")) {
    return Error(406, kJsonRpcInvalidRequest,
                 "idemgate: GET opens an SSE stream; send Accept: text/event-stream");
  }
  std::shared_ptr<ServerSession> session = NamedSession("has no GET stream");
  if (!session) return;
  auto exchange = std::make_shared<Exchange>();
  exchange->kind = Exchange::Kind::kGet;
  // The reply takes the Responder only once the stream is attached.
  http::Responder respond = respond_;
  auto reply = std::make_shared<HttpReply>(std::move(respond), HttpReply::Mode::kStream,
                                           options_.sse_keepalive, "");
  exchange->sink = reply;
  reply->Bind(session, exchange);
  switch (session->AttachGet(exchange)) {
    case ServerSession::AttachOutcome::kOk:
      break;
    case ServerSession::AttachOutcome::kConflict:
      return Error(409, kJsonRpcInvalidRequest,
                   "idemgate: this session already has a GET stream open");
    case ServerSession::AttachOutcome::kClosed:
      return Error(404, kJsonRpcInvalidRequest,
                   "idemgate: the session has ended; start a new one with initialize");
  }
  // Events AttachGet flushed to the reply opened its stream already.
  reply->Open();
  Watch(reply, false);
}

void EndpointCall::HandleDelete() {
  std::shared_ptr<ServerSession> session = NamedSession("has no sessions to delete");
  if (!session) return;
  server_.EndSession(session, "the client ended the session (HTTP DELETE)");
  respond_(http::Response{});
}

}  // namespace

// ── Impl ────────────────────────────────────────────────────────────────────

void HttpMcpServer::Impl::Handle(http::Request&& request, http::Responder respond) {
  const std::string& path = request.path;
  if (options.console && (path == "/console" || path.starts_with("/console/"))) {
    return options.console(std::move(request), std::move(respond));
  }
  if (path != options.path) {
    return respond(RpcError(404, kJsonRpcInvalidRequest,
                            "idemgate: no such endpoint; the MCP endpoint is " + options.path));
  }
  EndpointCall(*this, std::move(request), std::move(respond)).Run();
}

void HttpMcpServer::Impl::SweepLoop() {
  const auto idle = options.session_idle_timeout;
  const auto lifetime = options.session_lifetime;
  // The shorter of the two that is set decides how often to look.
  std::chrono::milliseconds shortest = idle.count() > 0 ? idle : lifetime;
  if (lifetime.count() > 0) shortest = std::min(shortest, lifetime);
  const auto period = std::clamp<std::chrono::milliseconds>(
      shortest / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(30'000));
  std::unique_lock lock(mu);
  while (!stopping) {
    if (sweep_cv.wait_for(lock, period, [&] { return stopping; })) return;
    std::vector<std::shared_ptr<ServerSession>> expired;
    std::vector<std::shared_ptr<ServerSession>> aged;
    const auto now = Clock::now();
    for (auto* map : {&sessions, &stateless}) {
      for (auto it = map->begin(); it != map->end();) {
        auto born = began.find(it->second.get());
        const bool too_old = lifetime.count() > 0 && born != began.end() &&
                             now - born->second >= lifetime;
        if (too_old || (idle.count() > 0 && it->second->IdleFor(idle, now))) {
          (too_old ? aged : expired).push_back(it->second);
          if (born != began.end()) began.erase(born);
          it = map->erase(it);
        } else {
          ++it;
        }
      }
    }
    lock.unlock();
    for (auto& s : expired) s->Shutdown("the session expired after being idle");
    for (auto& s : aged) s->Shutdown("the session reached its lifetime (--session-lifetime)");
    expired.clear();
    aged.clear();
    lock.lock();
  }
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
  if (!TenantHasRoom(tenant)) {
    return MakeError(ErrorCode::kResourceExhausted,
                     "idemgate: too many sessions of this tenant (--max-sessions-per-tenant " +
                         std::to_string(options.max_sessions_per_tenant) +
                         "); end unused ones with DELETE or retry later");
  }
  auto session = NewSession(HttpSessionInfo{*id, tenant, false});
  sessions.emplace(*id, session);
  began[session.get()] = std::chrono::steady_clock::now();
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
  if (it == stateless.end() && !TenantHasRoom(tenant)) {
    return MakeError(ErrorCode::kResourceExhausted,
                     "idemgate: too many sessions of this tenant (--max-sessions-per-tenant " +
                         std::to_string(options.max_sessions_per_tenant) + ")");
  }
  if (it != stateless.end()) began.erase(it->second.get());
  auto session = NewSession(HttpSessionInfo{"", tenant, true});
  stateless[tenant] = session;
  began[session.get()] = std::chrono::steady_clock::now();
  return session;
}

void HttpMcpServer::Impl::Forget(ServerSession* session) {
  std::lock_guard lock(mu);
  for (auto* map : {&sessions, &stateless}) {
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (it->second.get() == session) {
        map->erase(it);
        began.erase(session);
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
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    stopping = true;
    for (auto& [id, s] : sessions) all.push_back(s);
    for (auto& [tenant, s] : stateless) all.push_back(s);
    sessions.clear();
    stateless.clear();
  }
  sweep_cv.notify_all();
  if (sweeper.joinable()) sweeper.join();
  // Every waiting request is answered ("server stopping") and every stream
  // ends; the listener lets those answers out, then closes.
  for (auto& s : all) s->Shutdown("server stopping");
  all.clear();
  if (listener) {
    listener->Drain(kStopGrace);
    listener->Stop();
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
  http::AdminEndpoints admin;
  admin.ready = options.ready;
  admin.metrics = options.metrics;
  // The handler holds the state by pointer: Stop() joins the I/O threads
  // before the state goes.
  Impl* state = impl.get();
  auto listener = http::HttpListener::Start(
      ListenerOptionsOf(options),
      http::WithAdmin(std::move(admin), [state](http::Request&& request, http::Responder respond) {
        state->Handle(std::move(request), std::move(respond));
      }));
  if (!listener) return std::unexpected(listener.error());
  impl->listener = std::move(*listener);
  if (options.session_idle_timeout.count() > 0 || options.session_lifetime.count() > 0) {
    impl->sweeper = std::thread([state] { state->SweepLoop(); });
  }
  auto server = std::unique_ptr<HttpMcpServer>(new HttpMcpServer(impl));
  if (options.announce) {
    std::cerr << "idemgate: listening on " + server->url() + "\n" << std::flush;
  }
  return server;
}

std::string HttpMcpServer::bound_address() const { return impl_->listener->bound_address(); }

std::string HttpMcpServer::url() const { return impl_->listener->url() + impl_->options.path; }

void HttpMcpServer::Stop() {
  if (impl_) impl_->StopAll();
}

}  // namespace idem::mcp
