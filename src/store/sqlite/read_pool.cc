#include "read_pool.h"

namespace idem::sqlite {

ReadPool::Lease::~Lease() {
  if (conn_) pool_->Return(std::move(conn_));
}

ReadPool::ReadPool(std::string path, Duration busy_timeout, size_t max_idle)
    : path_(std::move(path)), busy_timeout_(busy_timeout), max_idle_(max_idle) {}

Result<ReadPool::Lease> ReadPool::Acquire() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(conn));
    }
  }
  auto conn = Connection::Open(path_, busy_timeout_);
  if (!conn) return std::unexpected(std::move(conn.error()));
  if (auto r = (*conn)->Exec("PRAGMA query_only = 1", "making a read connection"); !r) {
    return std::unexpected(std::move(r.error()));
  }
  return Lease(this, std::move(*conn));
}

void ReadPool::Return(std::unique_ptr<Connection> conn) {
  std::lock_guard lock(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(conn));
  // Otherwise `conn` closes here.
}

}  // namespace idem::sqlite
