// Test helpers for the Streamable HTTP transports: a raw blocking HTTP
// client (to check status codes and headers byte for byte), an SSE stream
// reader, an "echo" MCP upstream to put behind the server, and a scripted
// raw HTTP server to make an upstream misbehave on purpose.
//
// Every blocking read has a receive timeout as a safety net so that a broken
// build fails instead of hanging; no test relies on it for timing.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fronts/mcp/channel.h"
#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/sse.h"

namespace idem::mcp::testing {

// An initialize request (id 1) for `version`, and the notification that
// follows it.
inline std::string InitializeRequest(std::string_view version) {
  return R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":")" +
         std::string(version) + R"(","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})";
}
inline constexpr char kInitialized[] = R"({"jsonrpc":"2.0","method":"notifications/initialized"})";

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

inline constexpr std::chrono::seconds kSafetyTimeout{10};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::vector<SseEvent> events;  // parsed when the body is text/event-stream
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

// One blocking HTTP/1.1 connection.
class RawClient {
 public:
  explicit RawClient(uint16_t port);
  // Writes raw bytes (for malformed or partial requests).
  void WriteRaw(std::string_view bytes);
  // Sends a request and reads the whole response (SSE bodies until the
  // server ends the stream).
  RawResponse Request(http::verb verb, const std::string& target, const Headers& headers,
                      const std::string& body = {});
  // Sends a request and reads only the response header; then NextEvent()
  // reads its SSE body event by event.
  RawResponse Open(http::verb verb, const std::string& target, const Headers& headers,
                   const std::string& body = {});
  // The next SSE event of the response opened with Open(); nullopt at the
  // end of the stream or on error.
  std::optional<SseEvent> NextEvent();
  // True if the server closed the connection (reads EOF or reset) before
  // the safety timeout.
  bool ServerClosed();

 private:
  void Send(http::verb verb, const std::string& target, const Headers& headers,
            const std::string& body);

  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> parser_;
  size_t consumed_ = 0;
  SseParser sse_;
  std::vector<SseEvent> pending_;
};

// The standard request headers of an MCP client.
Headers McpHeaders(const std::string& session_id = {}, const std::string& version = {});

// A fake MCP server behind HttpMcpServer: answers initialize, ping,
// server/discover and tools/call; "progress" first sends a progress
// notification, "ask" sends a sampling request and answers after the client
// responds, "slow" never answers. The notification "test/trigger" makes it
// send notifications/message (a server-initiated message).
class EchoUpstream {
 public:
  // Releases the session channels first, which waits for their threads, so
  // no callback touches this object while it is being destroyed.
  ~EchoUpstream();
  HttpSessionFactory Factory();
  // Waits until `n` sessions were created / closed.
  bool WaitSessions(size_t n);
  bool WaitClosed(size_t n);
  // Waits until a message containing `needle` reached the upstream.
  bool WaitReceived(const std::string& needle);
  std::vector<HttpSessionInfo> infos();
  std::vector<std::string> closed_reasons();
  std::vector<std::string> received();

 private:
  void OnMessage(const std::shared_ptr<Channel>& channel, const std::string& message);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Channel>> channels_;
  std::vector<HttpSessionInfo> infos_;
  std::vector<std::string> closed_;
  std::vector<std::string> received_;
  std::map<Channel*, std::string> pending_ask_;  // channel → id JSON of the "ask" call
};

// Collects what a Channel delivers.
class Inbox {
 public:
  std::function<void(std::string)> OnMessage();
  std::function<void(std::string)> OnClosed();
  // Waits for the first message that contains `needle` (after `from`);
  // returns it, or "" after the safety timeout.
  std::string WaitFor(const std::string& needle, size_t from = 0);
  bool WaitClosed();
  std::vector<std::string> messages();
  std::string reason();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> messages_;
  std::string reason_;
  bool closed_ = false;
};

// A raw HTTP server whose answers a test scripts: for the n-th request
// (counting from 0 over all connections) it writes what the handler returns.
class ScriptedServer {
 public:
  struct Reply {
    std::string bytes;   // written as is
    bool close = false;  // close the connection afterwards
  };
  using Handler = std::function<Reply(const http::request<http::string_body>& request, int n)>;
  explicit ScriptedServer(Handler handler);
  ~ScriptedServer();
  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/mcp"; }
  std::vector<http::request<http::string_body>> requests();
  // Waits until `n` requests arrived.
  bool WaitRequests(size_t n);

 private:
  void Serve(std::shared_ptr<tcp::socket> socket);

  Handler handler_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<http::request<http::string_body>> requests_;
  int count_ = 0;
};

// "HTTP/1.1 <status> X\r\n<headers>Content-Length: n\r\n\r\n<body>".
std::string HttpReply(int status, const std::string& content_type, const std::string& body,
                      const std::string& extra_headers = {});
// An SSE response with chunked encoding; `events` are raw SSE bytes.
std::string SseReply(const std::string& events, const std::string& extra_headers = {});

// A port on which nothing listens (bound, then closed).
uint16_t UnusedPort();

}  // namespace idem::mcp::testing
