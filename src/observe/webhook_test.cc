// The alert webhook against a real (tiny, one-request) HTTP server on port 0.
#include "observe/webhook.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <future>
#include <thread>

#include "observe/gateway_metrics.h"
#include "memory_store.h"

namespace idem {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

// Accepts one connection on 127.0.0.1:0, reads one request and answers it
// with `status` (or, with answer = false, holds the connection without
// answering until destroyed).
class OneRequestServer {
 public:
  explicit OneRequestServer(int status = 200, bool answer = true)
      : acceptor_(ioc_, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)),
        status_(status),
        answer_(answer),
        thread_([this] { Serve(); }) {}
  ~OneRequestServer() {
    release_.set_value();
    thread_.join();
  }

  std::string url(std::string_view path = "/hook") const {
    return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()) +
           std::string(path);
  }
  // Waits for the request.
  http::request<http::string_body> Request() { return received_.get_future().get(); }

 private:
  void Serve() {
    tcp::socket socket(ioc_);
    beast::error_code ec;
    acceptor_.accept(socket, ec);
    if (ec) return;
    beast::flat_buffer buffer;
    http::request<http::string_body> req;
    http::read(socket, buffer, req, ec);
    received_.set_value(req);
    if (answer_) {
      http::response<http::string_body> res{static_cast<http::status>(status_), 11};
      res.body() = "thanks";
      res.prepare_payload();
      http::write(socket, res, ec);
    }
    release_.get_future().wait();
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  const int status_;
  const bool answer_;
  std::promise<http::request<http::string_body>> received_;
  std::promise<void> release_;
  std::thread thread_;
};

TEST(WebhookTest, PostsTheDocumentAsJson) {
  OneRequestServer server;
  std::vector<std::string> log;
  WebhookOptions o;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  auto sender = WebhookSender::Create(server.url("/hook?team=ops"), o);
  ASSERT_TRUE(sender) << sender.error().ToString();
  (*sender)->Post(R"({"alert":"x"})");
  auto req = server.Request();
  (*sender)->Drain();
  EXPECT_EQ(req.method(), http::verb::post);
  EXPECT_EQ(req.target(), "/hook?team=ops");
  EXPECT_EQ(req[http::field::content_type], "application/json");
  EXPECT_EQ(req.body(), R"({"alert":"x"})");
  EXPECT_EQ((*sender)->delivered(), 1u);
  EXPECT_EQ((*sender)->failed(), 0u);
  EXPECT_TRUE(log.empty());
}

TEST(WebhookTest, AnErrorStatusIsLoggedAsAFailure) {
  OneRequestServer server(500);
  std::vector<std::string> log;
  WebhookOptions o;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  auto sender = WebhookSender::Create(server.url(), o);
  ASSERT_TRUE(sender);
  (*sender)->Post("{}");
  (*sender)->Drain();
  EXPECT_EQ((*sender)->failed(), 1u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("answered HTTP 500"), std::string::npos) << log[0];
}

TEST(WebhookTest, AServerThatNeverAnswersTimesOut) {
  OneRequestServer server(200, /*answer=*/false);
  std::vector<std::string> log;
  WebhookOptions o;
  o.timeout = 200ms;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  auto sender = WebhookSender::Create(server.url(), o);
  ASSERT_TRUE(sender);
  (*sender)->Post("{}");  // returns at once: delivery is on the sender's thread
  (*sender)->Drain();
  EXPECT_EQ((*sender)->failed(), 1u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("no answer within 200 ms"), std::string::npos) << log[0];
}

TEST(WebhookTest, HttpsToAPlainServerFailsTheHandshake) {
  OneRequestServer server;  // answers the ClientHello with plain HTTP
  std::vector<std::string> log;
  WebhookOptions o;
  o.timeout = 10s;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  std::string url = server.url();
  url.replace(0, 4, "https");
  auto sender = WebhookSender::Create(url, o);
  ASSERT_TRUE(sender) << sender.error().ToString();
  (*sender)->Post("{}");
  (*sender)->Drain();
  EXPECT_EQ((*sender)->failed(), 1u);
  EXPECT_EQ((*sender)->delivered(), 0u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].find("no answer within"), std::string::npos) << log[0];
}

TEST(WebhookTest, RejectsUrlsThatAreNotHttp) {
  EXPECT_FALSE(WebhookSender::Create("not a url"));
  EXPECT_FALSE(WebhookSender::Create("ftp://example.com/x"));
  EXPECT_FALSE(WebhookSender::Create("/relative"));
  EXPECT_TRUE(WebhookSender::Create("https://hooks.example.com/services/T0"));
}

// The whole path: attempts through a ledger fire the alert, and the alert
// document reaches the webhook.
TEST(WebhookTest, AReplaySpikePostsTheAlertDocument) {
  OneRequestServer server;
  FakeClock clock;
  GatewayMetricsOptions o;
  o.alert.min_attempts = 2;
  o.alert.replay_ratio = 0.4;
  o.alert.webhook = server.url("/alerts");
  o.instance = "mcp-test";
  o.evaluate_every = Duration(0);
  std::vector<std::string> log;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  auto metrics = GatewayMetrics::Create(clock, o);
  ASSERT_TRUE(metrics) << metrics.error().ToString();
  std::unique_ptr<Store> store = NewMemoryStore(clock);
  Ledger ledger(*store, clock, LedgerOptions{"t", nullptr, false, (*metrics)->ObserverFor("mcp")});
  Call call;
  call.id = RecordId{"default", "k"};
  call.fingerprint = "fp";
  call.tool = "create_ticket";
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ledger.Run(call, [] { return Execution{Execution::Kind::kSuccess, "ok"}; }));
  }
  (*metrics)->Evaluate();
  auto req = server.Request();
  (*metrics)->DrainWebhooks();
  EXPECT_EQ(req.target(), "/alerts");
  EXPECT_EQ(req.body(),
            "{\"alert\":\"idemgate_replay_ratio\",\"status\":\"firing\",\"tool\":\"create_ticket\","
            "\"replay_ratio\":0.5,\"attempts\":2,\"replays\":1,\"threshold\":0.4,"
            "\"min_attempts\":2,\"window_seconds\":300,\"instance\":\"mcp-test\","
            "\"at\":\"2026-01-01T00:00:00Z\"}");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("ALERT"), std::string::npos);
}

}  // namespace
}  // namespace idem
