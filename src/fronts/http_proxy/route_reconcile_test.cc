// The route lookup against a real loopback server that answers each
// connection with the next canned answer.
#include "fronts/http_proxy/route_reconcile.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <thread>

namespace idem::proxy {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Answers one request per connection, in order, with `bodies` (200, JSON).
class CannedVendor {
 public:
  explicit CannedVendor(std::vector<std::string> bodies)
      : acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)),
        total_(bodies.size()) {
    thread_ = std::thread([this, bodies = std::move(bodies)] {
      for (const std::string& body : bodies) {
        tcp::socket s(ioc_);
        boost::system::error_code ec;
        acceptor_.accept(s, ec);
        ++accepted_;
        if (ec) return;
        std::string head;
        asio::read_until(s, asio::dynamic_buffer(head), "\r\n\r\n", ec);
        asio::write(s,
                    asio::buffer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 "Connection: close\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body),
                    ec);
        s.shutdown(tcp::socket::shutdown_both, ec);
      }
    });
  }
  // A test that stopped early leaves answers unasked for: a connection that
  // closes at once takes each (a blocked accept() is not woken by close()).
  ~CannedVendor() {
    for (size_t i = accepted_; i < total_; ++i) {
      tcp::socket wake(ioc_);
      boost::system::error_code ec;
      wake.connect(acceptor_.local_endpoint(), ec);
    }
    thread_.join();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }

 private:
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  const size_t total_;
  std::atomic<size_t> accepted_{0};
  std::thread thread_;
};

// Review H8: a 2xx means "found". A search endpoint answering 200 with an
// empty list when nothing matched completed the record with that list, and
// the call never ran (a lost action). An empty list names no outcome: the
// lookup cannot tell, and the record stays unknown.
TEST(RouteReconcileTest, AnEmptyListIsNotAFoundOutcome) {
  CannedVendor vendor({R"({"object":"list","data":[],"has_more":false})", "[]",
                       R"({"object":"list","data":[{"id":"ch_1"}],"has_more":false})",
                       R"({"id":"ch_1","refunds":[]})"});
  Config config;
  RouteRule rule;
  rule.match = "/v1/charges";
  rule.reconcile = "/v1/charges?idempotency_key={key}";
  config.routes.push_back(rule);
  auto upstream = net::HttpClient::Create({.url = vendor.url()});
  ASSERT_TRUE(upstream) << upstream.error().message;
  ReconcileHook lookup = MakeRouteLookup(config, **upstream, "k-1", {});
  Call call;
  call.tool = "POST /v1/charges";
  for (int i = 0; i < 2; ++i) {
    Result<std::optional<Outcome>> empty = lookup(call);
    ASSERT_FALSE(empty) << "an empty list was taken as the outcome";
    EXPECT_EQ(empty.error().code, ErrorCode::kUnavailable);
    EXPECT_NE(empty.error().message.find("empty list"), std::string::npos)
        << empty.error().message;
  }
  for (int i = 0; i < 2; ++i) {
    Result<std::optional<Outcome>> found = lookup(call);
    ASSERT_TRUE(found) << found.error().message;
    ASSERT_TRUE(found->has_value());
    EXPECT_NE((*found)->body.find("ch_1"), std::string::npos);
  }
}

}  // namespace
}  // namespace idem::proxy
