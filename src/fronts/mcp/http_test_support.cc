#include "fronts/mcp/http_test_support.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>

namespace idem::mcp::testing {
namespace {

namespace json = boost::json;

void SetReceiveTimeout(tcp::socket& socket) {
  timeval tv{};
  tv.tv_sec = kSafetyTimeout.count();
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string Lower(std::string s) {
  std::ranges::transform(s, s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

RawResponse FromParser(const http::response<http::string_body>& res) {
  RawResponse out;
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    out.headers[Lower(std::string(field.name_string()))] = std::string(field.value());
  }
  out.body = res.body();
  return out;
}

}  // namespace

// ── RawClient ───────────────────────────────────────────────────────────────

RawClient::RawClient(uint16_t port) : socket_(ioc_) {
  socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  SetReceiveTimeout(socket_);
}

void RawClient::WriteRaw(std::string_view bytes) { net::write(socket_, net::buffer(bytes)); }

void RawClient::Send(http::verb verb, const std::string& target, const Headers& headers,
                     const std::string& body) {
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  if (!body.empty() || verb == http::verb::post) req.prepare_payload();
  http::write(socket_, req);
}

RawResponse RawClient::Request(http::verb verb, const std::string& target, const Headers& headers,
                               const std::string& body) {
  Send(verb, target, headers, body);
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  beast::error_code ec;
  http::read(socket_, buffer_, parser, ec);
  if (ec) return RawResponse{.status = -1, .body = ec.message()};
  RawResponse out = FromParser(parser.get());
  if (out.header("content-type").starts_with("text/event-stream")) {
    SseParser sse;
    (void)sse.Feed(out.body, out.events);
  }
  return out;
}

RawResponse RawClient::Open(http::verb verb, const std::string& target, const Headers& headers,
                            const std::string& body) {
  Send(verb, target, headers, body);
  parser_.emplace();
  parser_->body_limit(boost::none);
  consumed_ = 0;
  sse_ = SseParser();
  pending_.clear();
  beast::error_code ec;
  http::read_header(socket_, buffer_, *parser_, ec);
  if (ec) return RawResponse{.status = -1, .body = ec.message()};
  return FromParser(parser_->get());
}

std::optional<SseEvent> RawClient::NextEvent() {
  while (pending_.empty()) {
    if (!parser_ || parser_->is_done()) return std::nullopt;
    beast::error_code ec;
    http::read_some(socket_, buffer_, *parser_, ec);
    if (ec) return std::nullopt;
    const std::string& body = parser_->get().body();
    (void)sse_.Feed(std::string_view(body).substr(consumed_), pending_);
    consumed_ = body.size();
  }
  SseEvent e = std::move(pending_.front());
  pending_.erase(pending_.begin());
  return e;
}

bool RawClient::ServerClosed() {
  char c;
  beast::error_code ec;
  while (true) {
    socket_.read_some(net::buffer(&c, 1), ec);
    if (ec == net::error::eof || ec == net::error::connection_reset) return true;
    if (ec) return false;  // the safety timeout: the server did not close
  }
}

Headers McpHeaders(const std::string& session_id, const std::string& version) {
  Headers h = {{"Content-Type", "application/json"},
               {"Accept", "application/json, text/event-stream"}};
  if (!session_id.empty()) h.emplace_back("Mcp-Session-Id", session_id);
  if (!version.empty()) h.emplace_back("MCP-Protocol-Version", version);
  return h;
}

// ── EchoUpstream ────────────────────────────────────────────────────────────

EchoUpstream::~EchoUpstream() {
  std::vector<std::shared_ptr<Channel>> channels;
  {
    std::lock_guard lock(mu_);
    channels.swap(channels_);
  }
  channels.clear();
}

HttpSessionFactory EchoUpstream::Factory() {
  return [this](std::shared_ptr<Channel> channel, const HttpSessionInfo& info) {
    {
      std::lock_guard lock(mu_);
      channels_.push_back(channel);
      infos_.push_back(info);
      cv_.notify_all();
    }
    std::weak_ptr<Channel> weak = channel;
    channel->Start(
        [this, weak](std::string message) {
          if (auto c = weak.lock()) OnMessage(c, message);
        },
        [this](std::string reason) {
          std::lock_guard lock(mu_);
          closed_.push_back(std::move(reason));
          cv_.notify_all();
        });
  };
}

void EchoUpstream::OnMessage(const std::shared_ptr<Channel>& channel, const std::string& message) {
  {
    std::lock_guard lock(mu_);
    received_.push_back(message);
    cv_.notify_all();
  }
  boost::system::error_code ec;
  json::value v = json::parse(message, ec);
  if (ec || !v.is_object()) return;
  json::object& o = v.as_object();
  auto answer = [&](const json::value& id, json::value result) {
    json::object r;
    r["jsonrpc"] = "2.0";
    r["id"] = id;
    r["result"] = std::move(result);
    channel->Send(json::serialize(r));
  };
  const json::value* method = o.if_contains("method");
  const json::value* id = o.if_contains("id");
  if (!method) {
    // A response from the client: the answer to the "ask" sampling request.
    std::string pending;
    {
      std::lock_guard lock(mu_);
      pending = pending_ask_[channel.get()];
    }
    if (!pending.empty()) {
      json::object result{
          {"content", json::array{json::object{{"type", "text"}, {"text", "asked"}}}},
          {"answer", o.contains("result") ? o.at("result") : json::value()}};
      answer(json::parse(pending), std::move(result));
    }
    return;
  }
  std::string m(method->as_string());
  // Never operator[] on `o`: it may reallocate and invalidate `id`.
  json::object params = o.contains("params") && o.at("params").is_object()
                            ? o.at("params").as_object()
                            : json::object();
  if (!id) {
    if (m == "test/trigger") {
      channel->Send(
          R"({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hello"}})");
    }
    return;
  }
  if (m == "initialize") {
    json::value version = params.contains("protocolVersion") ? params.at("protocolVersion")
                                                             : json::value("2025-06-18");
    answer(*id, json::object{{"protocolVersion", version},
                             {"capabilities", json::object{{"tools", json::object{}}}},
                             {"serverInfo", json::object{{"name", "echo"}, {"version", "1"}}}});
  } else if (m == "server/discover") {
    answer(*id, json::object{{"resultType", "complete"},
                             {"supportedVersions", json::array{"2026-07-28"}},
                             {"serverInfo", json::object{{"name", "echo"}, {"version", "1"}}}});
  } else if (m == "ping") {
    answer(*id, json::object{});
  } else if (m == "tools/call") {
    std::string name = params.contains("name") ? std::string(params.at("name").as_string()) : "";
    if (name == "slow") return;
    if (name == "progress") {
      json::value token = 0;
      if (params.contains("_meta") && params.at("_meta").is_object() &&
          params.at("_meta").as_object().contains("progressToken")) {
        token = params.at("_meta").as_object().at("progressToken");
      }
      json::object note{
          {"jsonrpc", "2.0"},
          {"method", "notifications/progress"},
          {"params", json::object{{"progressToken", token}, {"progress", 50}, {"total", 100}}}};
      channel->Send(json::serialize(note));
    }
    if (name == "ask") {
      {
        std::lock_guard lock(mu_);
        pending_ask_[channel.get()] = json::serialize(*id);
      }
      channel->Send(
          R"({"jsonrpc":"2.0","id":"srv-1","method":"sampling/createMessage","params":{"messages":[],"maxTokens":5}})");
      return;
    }
    json::value args = params.contains("arguments") ? params.at("arguments") : json::object();
    answer(*id, json::object{{"content", json::array{json::object{
                                             {"type", "text"}, {"text", json::serialize(args)}}}}});
  } else {
    json::object r;
    r["jsonrpc"] = "2.0";
    r["id"] = *id;
    r["error"] = json::object{{"code", -32601}, {"message", "no such method: " + m}};
    channel->Send(json::serialize(r));
  }
}

bool EchoUpstream::WaitSessions(size_t n) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, kSafetyTimeout, [&] { return infos_.size() >= n; });
}

bool EchoUpstream::WaitClosed(size_t n) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, kSafetyTimeout, [&] { return closed_.size() >= n; });
}

bool EchoUpstream::WaitReceived(const std::string& needle) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, kSafetyTimeout, [&] {
    return std::ranges::any_of(
        received_, [&](const std::string& m) { return m.find(needle) != std::string::npos; });
  });
}

std::vector<HttpSessionInfo> EchoUpstream::infos() {
  std::lock_guard lock(mu_);
  return infos_;
}

std::vector<std::string> EchoUpstream::closed_reasons() {
  std::lock_guard lock(mu_);
  return closed_;
}

std::vector<std::string> EchoUpstream::received() {
  std::lock_guard lock(mu_);
  return received_;
}

// ── Inbox ───────────────────────────────────────────────────────────────────

std::function<void(std::string)> Inbox::OnMessage() {
  return [this](std::string m) {
    std::lock_guard lock(mu_);
    messages_.push_back(std::move(m));
    cv_.notify_all();
  };
}

std::function<void(std::string)> Inbox::OnClosed() {
  return [this](std::string r) {
    std::lock_guard lock(mu_);
    reason_ = std::move(r);
    closed_ = true;
    cv_.notify_all();
  };
}

std::string Inbox::WaitFor(const std::string& needle, size_t from) {
  std::unique_lock lock(mu_);
  std::string found;
  cv_.wait_for(lock, kSafetyTimeout, [&] {
    for (size_t i = from; i < messages_.size(); ++i) {
      if (messages_[i].find(needle) != std::string::npos) {
        found = messages_[i];
        return true;
      }
    }
    return false;
  });
  return found;
}

bool Inbox::WaitClosed() {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, kSafetyTimeout, [&] { return closed_; });
}

std::vector<std::string> Inbox::messages() {
  std::lock_guard lock(mu_);
  return messages_;
}

std::string Inbox::reason() {
  std::lock_guard lock(mu_);
  return reason_;
}

// ── ScriptedServer ──────────────────────────────────────────────────────────

ScriptedServer::ScriptedServer(Handler handler)
    : handler_(std::move(handler)),
      acceptor_(ioc_, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
  port_ = acceptor_.local_endpoint().port();
  accept_thread_ = std::thread([this] {
    while (!stopping_) {
      auto socket = std::make_shared<tcp::socket>(ioc_);
      beast::error_code ec;
      acceptor_.accept(*socket, ec);
      if (ec || stopping_) return;
      SetReceiveTimeout(*socket);
      std::lock_guard lock(mu_);
      sockets_.push_back(socket);
      threads_.emplace_back([this, socket] { Serve(socket); });
    }
  });
}

ScriptedServer::~ScriptedServer() {
  stopping_ = true;
  {
    // Wake the blocking accept.
    tcp::socket wake(ioc_);
    beast::error_code ec;
    wake.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
  }
  accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    // A raw shutdown wakes the blocked reads without touching the socket
    // objects their threads are using.
    for (auto& s : sockets_) ::shutdown(s->native_handle(), SHUT_RDWR);
    threads = std::move(threads_);
  }
  for (auto& t : threads) t.join();
}

void ScriptedServer::Serve(std::shared_ptr<tcp::socket> socket) {
  beast::flat_buffer buffer;
  while (!stopping_) {
    http::request<http::string_body> req;
    beast::error_code ec;
    http::read(*socket, buffer, req, ec);
    if (ec) return;
    int n;
    {
      std::lock_guard lock(mu_);
      requests_.push_back(req);
      n = count_++;
      cv_.notify_all();
    }
    Reply reply = handler_(req, n);
    if (!reply.bytes.empty()) net::write(*socket, net::buffer(reply.bytes), ec);
    if (ec || reply.close) {
      // Only shut down: the destructor closes (and owns) the socket.
      ::shutdown(socket->native_handle(), SHUT_RDWR);
      return;
    }
  }
}

std::vector<http::request<http::string_body>> ScriptedServer::requests() {
  std::lock_guard lock(mu_);
  return requests_;
}

bool ScriptedServer::WaitRequests(size_t n) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, kSafetyTimeout, [&] { return requests_.size() >= n; });
}

std::string HttpReply(int status, const std::string& content_type, const std::string& body,
                      const std::string& extra_headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " X\r\n";
  if (!content_type.empty()) out += "Content-Type: " + content_type + "\r\n";
  out += extra_headers;
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return out;
}

std::string SseReply(const std::string& events, const std::string& extra_headers) {
  std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + extra_headers +
                    "Transfer-Encoding: chunked\r\n\r\n";
  if (!events.empty()) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", events.size());
    out += size + events + "\r\n";
  }
  out += "0\r\n\r\n";
  return out;
}

uint16_t UnusedPort() {
  net::io_context ioc;
  tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

}  // namespace idem::mcp::testing
