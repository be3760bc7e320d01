// One io_context and the threads that run it, shared by the parts of a
// front that should carry a request from its read to its answer without
// handing it to a thread of another part: `idemgate http` runs its listener,
// its upstream client and its Redis store's pipeline here (docs/DESIGN.md
// §6.2), so that a callback of one (a claim's reply) starts the next step
// (the upstream request) on the thread it runs on, instead of waking a
// thread of another's.
//
// Whoever uses the io_context must be stopped (listener, store) before
// Stop(), except an HttpClient on it, which is stopped after (its Stop ends
// what is left in flight, on the calling thread).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <thread>
#include <vector>

namespace idem::net {

class IoThreads {
 public:
  // Starts `threads` threads (at least one).
  explicit IoThreads(int threads);
  ~IoThreads();  // Stop()s
  IoThreads(const IoThreads&) = delete;
  IoThreads& operator=(const IoThreads&) = delete;

  boost::asio::io_context& context() { return io_; }

  // Stops the io_context (handlers still queued never run; they are
  // destroyed with it) and joins the threads. Idempotent. Not from one of
  // them.
  void Stop();

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
};

}  // namespace idem::net
