// A small pool of PostgreSQL connections, each used by one thread at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "idem/error.h"
#include "pg_connection.h"
#include "postgres_url.h"

namespace idem::postgres {

// Opens connections on demand up to url.pool_size and keeps them for reuse.
// A connection found dead (server restarted, connection lost mid-request) is
// dropped and a new one opened; while the server cannot be reached, new
// attempts back off from 100 ms doubling to 1 s, and requests in between fail
// at once with kUnavailable instead of each waiting for a connect to time
// out. Real time, not the store's Clock: this paces network retries.
// Thread-safe.
class ConnectionPool {
 public:
  // Returns its connection to the pool when destroyed, unless Discard()ed.
  class Handle {
   public:
    Handle(ConnectionPool* pool, std::unique_ptr<Connection> conn)
        : pool_(pool), conn_(std::move(conn)) {}
    ~Handle();
    Handle(Handle&& other) noexcept = default;
    Handle& operator=(Handle&&) = delete;

    Connection& operator*() { return *conn_; }
    Connection* operator->() { return conn_.get(); }
    // The connection is broken: close it instead of reusing it.
    void Discard() { discard_ = true; }

   private:
    ConnectionPool* pool_;
    std::unique_ptr<Connection> conn_;
    bool discard_ = false;
  };

  // How long Acquire waits for a connection when all are in use.
  static constexpr std::chrono::seconds kAcquireTimeout{10};

  explicit ConnectionPool(PostgresUrl url);
  ~ConnectionPool();

  // A connection that looked alive when handed out. kUnavailable if the
  // server cannot be reached (or was not reachable moments ago: backoff), or
  // if every connection stayed busy for kAcquireTimeout.
  Result<Handle> Acquire();

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;

  void Return(std::unique_ptr<Connection> conn, bool discard);

  const PostgresUrl url_;
  std::mutex mu_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;  // connections handed out, idle, or being opened
  // Backoff after a failed connect.
  SteadyTime retry_at_{};
  std::chrono::milliseconds backoff_{0};
  std::string last_connect_error_;
};

}  // namespace idem::postgres
