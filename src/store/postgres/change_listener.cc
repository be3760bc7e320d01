#include "change_listener.h"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace idem::postgres {
namespace {

// NOTIFY refuses payloads of 8000 bytes or more.
constexpr size_t kMaxPayload = 7900;

constexpr int kFirstBackoffMs = 100;
constexpr int kMaxBackoffMs = 1000;

std::string PayloadPrefix(std::string_view schema) {
  return std::to_string(schema.size()) + ":" + std::string(schema);
}

Result<std::unique_ptr<Connection>> Listen(const PostgresUrl& url) {
  auto conn = Connection::Open(url);
  if (!conn) return conn;
  if (auto ok = (*conn)->ExecuteScript(
          fmt::format("LISTEN {}; LISTEN {}", kChangeChannel, kEvictionChannel),
          "listening for changes");
      !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  return conn;
}

}  // namespace

std::string ChangePayload(std::string_view schema, const RecordId& id) {
  std::string payload = PayloadPrefix(schema) + ChangeHub::KeyOf(id);
  if (payload.size() > kMaxPayload) return PayloadPrefix(schema) + "*";
  return payload;
}

std::string EvictionPayload(std::string_view schema) { return PayloadPrefix(schema); }

Result<std::unique_ptr<ChangeListener>> ChangeListener::Start(const PostgresUrl& url,
                                                              ChangeHub& hub) {
  auto conn = Listen(url);
  if (!conn) return std::unexpected(std::move(conn.error()));
  const int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    return MakeError(ErrorCode::kInternal, fmt::format("postgres store {}: eventfd failed: {}",
                                                       url.where, std::strerror(errno)));
  }
  std::unique_ptr<ChangeListener> listener(new ChangeListener(url, hub, stop_fd));
  listener->listening_ = true;
  listener->thread_ = std::thread(&ChangeListener::Run, listener.get(), std::move(*conn));
  return listener;
}

ChangeListener::ChangeListener(const PostgresUrl& url, ChangeHub& hub, int stop_fd)
    : url_(url), hub_(hub), stop_fd_(stop_fd), prefix_(PayloadPrefix(url.schema)) {}

ChangeListener::~ChangeListener() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(stop_fd_);
}

void ChangeListener::WatchEvictions(std::function<void(bool heard)> on_change) {
  std::lock_guard feed(feed_mu_);
  feed_ = std::move(on_change);
  if (feed_) feed_(listening_.load());
}

void ChangeListener::SetListening(bool listening) {
  std::lock_guard feed(feed_mu_);
  listening_ = listening;
  if (feed_) feed_(listening);
}

bool ChangeListener::Pause(int ms) {
  pollfd stop{stop_fd_, POLLIN, 0};
  return ::poll(&stop, 1, ms) == 0;
}

void ChangeListener::Dispatch(std::string_view payload) {
  if (!payload.starts_with(prefix_)) return;  // another schema's change
  payload.remove_prefix(prefix_.size());
  if (payload == "*") {
    hub_.NotifyAll();
  } else {
    hub_.Notify(payload);
  }
}

void ChangeListener::Run(std::unique_ptr<Connection> conn) {
  int backoff_ms = kFirstBackoffMs;
  for (;;) {
    if (!conn) {
      auto fresh = Listen(url_);
      if (!fresh) {
        if (!Pause(backoff_ms)) return;
        backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
        continue;
      }
      conn = std::move(*fresh);
      backoff_ms = kFirstBackoffMs;
      SetListening(true);
      hub_.NotifyAll();  // whatever changed while nobody listened
    }

    pollfd fds[2] = {{conn->socket(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready > 0 && fds[1].revents != 0) return;

    // A poll failure other than EINTR counts as a lost connection.
    const bool alive = ready > 0 && PQconsumeInput(conn->raw()) != 0;
    bool evicted = false;
    while (PGnotify* n = PQnotifies(conn->raw())) {
      if (n->relname == std::string_view(kEvictionChannel)) {
        evicted = evicted || n->extra == prefix_;  // in our schema
      } else {
        Dispatch(n->extra);
      }
      PQfreemem(n);
    }
    if (evicted) {
      std::lock_guard feed(feed_mu_);
      if (feed_) feed_(true);  // the cache drops what it holds
    }
    if (!alive || PQstatus(conn->raw()) != CONNECTION_OK) {
      conn.reset();
      SetListening(false);
      hub_.NotifyAll();  // waiters re-read and poll until the listener is back
    }
  }
}

}  // namespace idem::postgres
