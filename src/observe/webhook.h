// Delivers alert documents to alert.webhook (docs/DESIGN.md §7) off the request
// path: Post() only queues; one background thread POSTs each document as
// application/json over HTTP or HTTPS (certificate and host name verified
// against the system trust store), each within a short timeout. Failures are
// logged, never retried and never seen by callers: an alert is advice, and
// the log line and the gauge carry it too.
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "idem/clock.h"
#include "idem/error.h"

namespace idem {

struct WebhookOptions {
  // Resolve, connect, TLS handshake, request and response, all within this.
  // Default 5 s.
  Duration timeout{5'000};
  // Documents waiting to be sent; beyond it new ones are dropped (and
  // logged). Default 64.
  size_t max_queue = 64;
  // Verify the server's certificate and host name. Default true; false is
  // for tests only.
  bool verify_tls = true;
  // Extra CA bundle (PEM) to trust, for tests and private CAs. Default none.
  std::string ca_file;
  // Where failures are reported, one line each. Default: stderr.
  std::function<void(std::string_view)> log;
};

class WebhookSender {
 public:
  // kInvalidArgument unless `url` is an absolute http:// or https:// URL;
  // kUnavailable if the TLS trust store cannot be loaded.
  static Result<std::unique_ptr<WebhookSender>> Create(std::string_view url,
                                                       WebhookOptions options = {});
  // Finishes the POST in progress (bounded by the timeout); drops the rest.
  ~WebhookSender();

  // Queues `json` for delivery. Never blocks.
  void Post(std::string json);
  // Blocks until every document queued so far was sent or given up (tests,
  // orderly shutdown).
  void Drain();

  // Documents answered with a 2xx / not delivered, so far.
  uint64_t delivered() const;
  uint64_t failed() const;

  struct Target;
  struct Tls;

 private:
  WebhookSender(std::unique_ptr<Target> target, std::unique_ptr<Tls> tls, WebhookOptions options);
  void Loop();
  void Log(std::string_view line) const;

  const std::unique_ptr<Target> target_;
  const std::unique_ptr<Tls> tls_;
  const WebhookOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool busy_ = false;
  bool stop_ = false;
  uint64_t delivered_ = 0;
  uint64_t failed_ = 0;
  std::thread thread_;
};

}  // namespace idem
