// Read connections for a SqliteStore.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "sqlite_connection.h"

namespace idem::sqlite {

// A pool of read-only-by-use connections to one file. In WAL mode readers
// never wait for the writer, so every concurrent reader gets its own
// connection: an idle one if there is one, else a new one. At most
// `max_idle` are kept once returned. Thread-safe.
class ReadPool {
 public:
  // A borrowed connection; returns to the pool when destroyed.
  class Lease {
   public:
    Lease(ReadPool* pool, std::unique_ptr<Connection> conn) : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&&) = default;
    ~Lease();
    Connection& operator*() const { return *conn_; }
    Connection* operator->() const { return conn_.get(); }

   private:
    ReadPool* pool_;
    std::unique_ptr<Connection> conn_;
  };

  ReadPool(std::string path, Duration busy_timeout, size_t max_idle);

  // Borrows a connection, opening one if none is idle. Errors as
  // Connection::Open.
  Result<Lease> Acquire();

 private:
  void Return(std::unique_ptr<Connection> conn);

  const std::string path_;
  const Duration busy_timeout_;
  const size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace idem::sqlite
