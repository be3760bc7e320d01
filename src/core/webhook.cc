#include "core/webhook.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <iostream>

namespace idem {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

struct WebhookSender::Target {
  bool tls = false;
  std::string host;  // without brackets
  std::string port;
  std::string host_header;
  std::string path;  // with query
};

struct WebhookSender::Tls {
  ssl::context ctx{ssl::context::tls_client};
};

namespace {

// Largest response body read (the answer is ignored apart from its status).
constexpr size_t kMaxResponseBytes = 64 * 1024;

template <typename Stream>
net::awaitable<int> Exchange(Stream& stream, const WebhookSender::Target& t, std::string body) {
  http::request<http::string_body> req{http::verb::post, t.path, 11};
  req.set(http::field::host, t.host_header);
  req.set(http::field::user_agent, "idemgate/" IDEM_VERSION);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::connection, "close");
  req.body() = std::move(body);
  req.prepare_payload();
  co_await http::async_write(stream, req, net::use_awaitable);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  co_await http::async_read(stream, buffer, parser, net::use_awaitable);
  co_return parser.get().result_int();
}

// One POST within `timeout`: the HTTP status, or what went wrong.
Result<int> PostOnce(const WebhookSender::Target& t, ssl::context* tls, bool verify,
                     std::string body, Duration timeout) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream tcp_stream(ioc);
  std::optional<beast::ssl_stream<beast::tcp_stream&>> tls_stream;
  net::steady_timer deadline(ioc);
  bool timed_out = false;
  Result<int> result = MakeError(ErrorCode::kInternal, "not run");

  deadline.expires_after(timeout);
  deadline.async_wait([&](beast::error_code ec) {
    if (ec) return;
    timed_out = true;
    resolver.cancel();
    tcp_stream.socket().close(ec);
  });
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        try {
          auto endpoints = co_await resolver.async_resolve(t.host, t.port, net::use_awaitable);
          co_await tcp_stream.async_connect(endpoints, net::use_awaitable);
          int status;
          if (tls != nullptr) {
            tls_stream.emplace(tcp_stream, *tls);
            beast::error_code ec;
            net::ip::make_address(t.host, ec);
            if (ec) SSL_set_tlsext_host_name(tls_stream->native_handle(), t.host.c_str());
            if (verify) tls_stream->set_verify_callback(ssl::host_name_verification(t.host));
            co_await tls_stream->async_handshake(ssl::stream_base::client, net::use_awaitable);
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
      net::detached);
  ioc.run();
  if (timed_out && !result) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "no answer within " + std::to_string(timeout.count()) + " ms");
  }
  return result;
}

Result<WebhookSender::Target> ParseWebhookUrl(std::string_view url) {
  auto u = boost::urls::parse_absolute_uri(url);
  auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "alert.webhook \"" + std::string(url) + "\" " + std::string(why));
  };
  if (!u) return bad("is not an absolute URL");
  WebhookSender::Target t;
  if (u->scheme() == "https") {
    t.tls = true;
  } else if (u->scheme() != "http") {
    return bad("must start with http:// or https://");
  }
  if (u->host().empty()) return bad("has no host");
  t.host = u->host_address();
  t.port = u->has_port() ? std::string(u->port()) : (t.tls ? "443" : "80");
  t.host_header = u->encoded_host_and_port();
  t.path = u->encoded_target().empty() ? "/" : std::string(u->encoded_target());
  if (t.path.front() != '/') t.path.insert(0, "/");
  return t;
}

}  // namespace

Result<std::unique_ptr<WebhookSender>> WebhookSender::Create(std::string_view url,
                                                             WebhookOptions options) {
  auto target = ParseWebhookUrl(url);
  if (!target) return std::unexpected(target.error());
  std::unique_ptr<Tls> tls;
  if (target->tls) {
    tls = std::make_unique<Tls>();
    beast::error_code ec;
    if (options.verify_tls) {
      tls->ctx.set_default_verify_paths(ec);
      if (ec) {
        return MakeError(ErrorCode::kUnavailable,
                         "cannot load the system TLS trust store: " + ec.message());
      }
      if (!options.ca_file.empty()) {
        tls->ctx.load_verify_file(options.ca_file, ec);
        if (ec) {
          return MakeError(ErrorCode::kInvalidArgument,
                           "cannot load CA file '" + options.ca_file + "': " + ec.message());
        }
      }
      tls->ctx.set_verify_mode(ssl::verify_peer);
    } else {
      tls->ctx.set_verify_mode(ssl::verify_none);
    }
  }
  return std::unique_ptr<WebhookSender>(new WebhookSender(
      std::make_unique<Target>(std::move(*target)), std::move(tls), std::move(options)));
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
      Log("alert webhook to " + target_->host_header + " failed: " + failure);
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
