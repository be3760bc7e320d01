#include "change_announcer.h"

#include <string_view>
#include <utility>
#include <vector>

#include "connection_pool.h"
#include "pg_connection.h"
#include "record_rows.h"

namespace idem::postgres {

ChangeAnnouncer::ChangeAnnouncer(ConnectionPool& pool) : pool_(pool), thread_([this] { Loop(); }) {}

ChangeAnnouncer::~ChangeAnnouncer() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ChangeAnnouncer::Announce(std::string payload) {
  {
    std::lock_guard g(mu_);
    pending_.insert(std::move(payload));
  }
  cv_.notify_one();
}

void ChangeAnnouncer::Loop() {
  std::unique_lock g(mu_);
  for (;;) {
    cv_.wait(g, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing left to send
    std::set<std::string> batch;
    batch.swap(pending_);
    g.unlock();
    Send(batch);
    g.lock();
  }
}

void ChangeAnnouncer::Send(const std::set<std::string>& batch) {
  auto conn = pool_.Acquire();
  if (!conn) return;  // unreachable: waiters elsewhere fall back to polling
  std::vector<std::string_view> payloads(batch.begin(), batch.end());
  Params p;
  p.TextArray(TextArrayLiteral(payloads));
  auto sent = (*conn)->Execute(kAnnounceChanges, p, "announcing changes");
  if (!sent && (*conn)->last_failure() == Failure::kConnectionLost) conn->Discard();
}

}  // namespace idem::postgres
