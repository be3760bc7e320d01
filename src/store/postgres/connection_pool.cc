#include "connection_pool.h"

#include <fmt/format.h>

#include <algorithm>

namespace idem::postgres {
namespace {

constexpr std::chrono::milliseconds kFirstBackoff{100};
constexpr std::chrono::milliseconds kMaxBackoff{1000};

}  // namespace

ConnectionPool::Handle::~Handle() {
  if (conn_) pool_->Return(std::move(conn_), discard_);
}

ConnectionPool::ConnectionPool(PostgresUrl url) : url_(std::move(url)) {}

ConnectionPool::~ConnectionPool() = default;

Result<ConnectionPool::Handle> ConnectionPool::Acquire() {
  const SteadyTime give_up = std::chrono::steady_clock::now() + kAcquireTimeout;
  std::unique_lock lock(mu_);
  for (;;) {
    while (!idle_.empty()) {
      std::unique_ptr<Connection> conn = std::move(idle_.back());
      idle_.pop_back();
      lock.unlock();
      const bool alive = conn->LooksAlive();
      if (alive) return Handle(this, std::move(conn));
      conn.reset();  // closes it outside the lock
      lock.lock();
      --open_;
    }
    if (open_ < url_.pool_size) {
      const SteadyTime now = std::chrono::steady_clock::now();
      if (now < retry_at_) {
        const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now);
        return std::unexpected(Error{ErrorCode::kUnavailable,
                                     fmt::format("{} (next connection attempt in {} ms)",
                                                 last_connect_error_, wait.count()),
                                     /*unreached=*/true});
      }
      ++open_;
      lock.unlock();
      auto conn = Connection::Open(url_);
      lock.lock();
      if (conn) {
        backoff_ = std::chrono::milliseconds(0);
        retry_at_ = SteadyTime{};
        return Handle(this, std::move(*conn));
      }
      --open_;
      backoff_ = std::clamp(backoff_ * 2, kFirstBackoff, kMaxBackoff);
      retry_at_ = std::chrono::steady_clock::now() + backoff_;
      last_connect_error_ = conn.error().message;
      returned_.notify_all();
      Error refused = std::move(conn.error());
      // No connection, so nothing of the request was sent: not reached.
      refused.unreached = refused.code == ErrorCode::kUnavailable;
      return std::unexpected(std::move(refused));
    }
    if (returned_.wait_until(lock, give_up) == std::cv_status::timeout && idle_.empty() &&
        open_ >= url_.pool_size) {
      return MakeError(ErrorCode::kUnavailable,
                       fmt::format("postgres store {}: all {} connections stayed busy for {} s; "
                                   "retryable: raise pool_size in the store URL or the server's "
                                   "capacity",
                                   url_.where, url_.pool_size, kAcquireTimeout.count()));
    }
  }
}

void ConnectionPool::Return(std::unique_ptr<Connection> conn, bool discard) {
  if (discard) conn.reset();  // closes it outside the lock
  std::lock_guard lock(mu_);
  if (conn) {
    idle_.push_back(std::move(conn));
  } else {
    --open_;
  }
  returned_.notify_one();
}

}  // namespace idem::postgres
