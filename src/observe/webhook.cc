#include "observe/webhook.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <iostream>

#include "net/http_target.h"
#include "net/tls_client.h"

namespace idem {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

struct WebhookSender::Target {
  net::HttpTarget where;
  std::string request_target;  // path and query
};

struct WebhookSender::Tls {
  explicit Tls(net::SslCtxPtr native) : ctx(native.release()) {}
  ssl::context ctx;
};

namespace {

// Largest response body read (the answer is ignored apart from its status).
constexpr size_t kMaxResponseBytes = 64 * 1024;

template <typename Stream>
asio::awaitable<int> Exchange(Stream& stream, const WebhookSender::Target& t, std::string body) {
  http::request<http::string_body> req{http::verb::post, t.request_target, 11};
  req.set(http::field::host, t.where.host_header);
  req.set(http::field::user_agent, "idemgate/" IDEM_VERSION);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::connection, "close");
  req.body() = std::move(body);
  req.prepare_payload();
  co_await http::async_write(stream, req, asio::use_awaitable);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  co_await http::async_read(stream, buffer, parser, asio::use_awaitable);
  co_return parser.get().result_int();
}

// One POST within `timeout`: the HTTP status, or what went wrong.
Result<int> PostOnce(const WebhookSender::Target& t, ssl::context* tls, bool verify,
                     std::string body, Duration timeout) {
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream tcp_stream(ioc);
  std::optional<beast::ssl_stream<beast::tcp_stream&>> tls_stream;
  asio::steady_timer deadline(ioc);
  bool timed_out = false;
  Result<int> result = MakeError(ErrorCode::kInternal, "not run");

  deadline.expires_after(timeout);
  deadline.async_wait([&](beast::error_code ec) {
    if (ec) return;
    timed_out = true;
    resolver.cancel();
    tcp_stream.socket().close(ec);
  });
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        try {
          auto endpoints =
              co_await resolver.async_resolve(t.where.host, t.where.port, asio::use_awaitable);
          co_await tcp_stream.async_connect(endpoints, asio::use_awaitable);
          int status;
          if (tls != nullptr) {
            tls_stream.emplace(tcp_stream, *tls);
            net::PrepareTlsClient(tls_stream->native_handle(), t.where.host, verify);
            co_await tls_stream->async_handshake(ssl::stream_base::client, asio::use_awaitable);
            status = co_await Exchange(*tls_stream, t, std::move(body));
          } else {
            status = co_await Exchange(tcp_stream, t, std::move(body));
          }
          result = status;
        } catch (const boost::system::system_error& e) {
          result = MakeError(ErrorCode::kUnavailable, e.code().message());
        }
        deadline.cancel();
      },
      asio::detached);
  ioc.run();
  if (timed_out && !result) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "no answer within " + std::to_string(timeout.count()) + " ms");
  }
  return result;
}

}  // namespace

Result<std::unique_ptr<WebhookSender>> WebhookSender::Create(std::string_view url,
                                                             WebhookOptions options) {
  auto where = net::ParseHttpTarget(url, "alert.webhook");
  if (!where) return std::unexpected(where.error());
  auto target = std::make_unique<Target>(Target{std::move(*where), {}});
  target->request_target = target->where.RequestTarget();
  std::unique_ptr<Tls> tls;
  if (target->where.tls) {
    auto ctx = net::NewTlsClientContext(
        {.verify = options.verify_tls, .ca_file = options.ca_file, .ca_option = "the CA file"});
    if (!ctx) return std::unexpected(ctx.error());
    tls = std::make_unique<Tls>(std::move(*ctx));
  }
  return std::unique_ptr<WebhookSender>(
      new WebhookSender(std::move(target), std::move(tls), std::move(options)));
}

WebhookSender::WebhookSender(std::unique_ptr<Target> target, std::unique_ptr<Tls> tls,
                             WebhookOptions options)
    : target_(std::move(target)),
      tls_(std::move(tls)),
      options_(std::move(options)),
      thread_([this] { Loop(); }) {}

WebhookSender::~WebhookSender() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    if (!queue_.empty()) {
      Log("alert webhook: dropping " + std::to_string(queue_.size()) +
          " undelivered alert(s) at shutdown");
      queue_.clear();
    }
  }
  cv_.notify_all();
  thread_.join();
}

void WebhookSender::Post(std::string json) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.max_queue) {
      ++failed_;
      Log("alert webhook: queue full (" + std::to_string(options_.max_queue) + "); alert dropped");
      return;
    }
    queue_.push_back(std::move(json));
  }
  cv_.notify_all();
}

void WebhookSender::Drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || stop_; });
}

uint64_t WebhookSender::delivered() const {
  std::lock_guard lock(mu_);
  return delivered_;
}

uint64_t WebhookSender::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void WebhookSender::Log(std::string_view line) const {
  if (options_.log) return options_.log(line);
  std::cerr << "idemgate: " + std::string(line) + "\n" << std::flush;
}

void WebhookSender::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::string body = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    Result<int> status = PostOnce(*target_, tls_ ? &tls_->ctx : nullptr, options_.verify_tls,
                                  std::move(body), options_.timeout);
    std::string failure;
    if (!status) {
      failure = status.error().message;
    } else if (*status < 200 || *status > 299) {
      failure = "answered HTTP " + std::to_string(*status);
    }
    if (!failure.empty()) {
      // Host only: webhook paths often carry a secret (chat hooks).
      Log("alert webhook to " + target_->where.host_header + " failed: " + failure);
    }
    lock.lock();
    busy_ = false;
    if (failure.empty()) {
      ++delivered_;
    } else {
      ++failed_;
    }
    cv_.notify_all();
  }
}

}  // namespace idem
