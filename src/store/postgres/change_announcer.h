// Sends one store's change announcements (pg_notify on idemgate_changes) off
// the request path: a writer hands the payload over and returns; one thread
// sends everything pending in one statement, on a pooled connection, in a
// transaction with an asynchronous commit. Best effort, as an announcement
// always was: one that is lost (server unreachable) costs the other
// instances' waiters a poll, never a wrong answer. Thread-safe.
#pragma once

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace idem::postgres {

class ConnectionPool;

class ChangeAnnouncer {
 public:
  // `pool` must outlive the announcer.
  explicit ChangeAnnouncer(ConnectionPool& pool);
  // Sends what is still pending, then stops.
  ~ChangeAnnouncer();
  ChangeAnnouncer(const ChangeAnnouncer&) = delete;
  ChangeAnnouncer& operator=(const ChangeAnnouncer&) = delete;

  // Queues `payload` (ChangePayload) for the next batch; a payload already
  // queued is sent once.
  void Announce(std::string payload);

 private:
  void Loop();
  void Send(const std::set<std::string>& batch);

  ConnectionPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> pending_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace idem::postgres
