#include "pipeline.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>

namespace idem::redis {

Pipeline::Pipeline(NodeAddress node, ConnectOptions options,
                   std::shared_ptr<ConnectBackoff> backoff)
    : node_(std::move(node)),
      options_(std::move(options)),
      backoff_(backoff ? std::move(backoff) : std::make_shared<ConnectBackoff>()),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Pipeline::~Pipeline() {
  {
    std::lock_guard g(mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  close(wake_fd_);
}

void Pipeline::Submit(Command command, Done done) {
  SubmitBuilt([&command] { return std::move(command); }, std::move(done));
}

void Pipeline::SubmitBuilt(const std::function<Command()>& make, Done done) {
  // The thread starts with the first command: a store opened by a command
  // that never uses it (inspect, audit) costs no thread.
  std::call_once(started_, [this] { thread_ = std::thread([this] { Run(); }); });
  bool wake;
  {
    std::lock_guard g(mu_);
    if (stopping_) {
      done(std::unexpected(Failure("the store is closing")));
      return;
    }
    wake = queued_.empty();  // else the thread is already due to take the queue
    queued_.emplace_back(make(), std::move(done));
  }
  if (wake) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
}

Error Pipeline::Failure(std::string_view what) const {
  return Error{ErrorCode::kUnavailable, "redis store: pipelined command to " + node_.ToString() +
                                            " failed: " + std::string(what)};
}

void Pipeline::Run() {
  thread_id_ = std::this_thread::get_id();
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<Connection> conn;
  std::deque<Done> in_flight;    // in the order the commands were written
  Clock::time_point progress{};  // the last write or reply while reads were in flight
  auto fail_all = [&](const Error& e) {
    conn.reset();
    while (!in_flight.empty()) {
      Done done = std::move(in_flight.front());
      in_flight.pop_front();
      done(std::unexpected(e));
    }
  };
  std::vector<Queued> batch;
  for (;;) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {conn ? conn->fd() : -1, POLLIN, 0}};
    int timeout_ms = -1;
    if (!in_flight.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          progress + options_.command_timeout - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
    }
    if (poll(fds, 2, timeout_ms) < 0) continue;  // EINTR

    if (fds[0].revents != 0) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof n);
      std::lock_guard g(mu_);
      if (stopping_) {
        batch = std::move(queued_);
        queued_.clear();
        break;
      }
      batch.swap(queued_);
    }
    if (!batch.empty()) {
      // After a failed connect, batches fail at once for the node's
      // backoff, so that a server that is down costs each call no connect
      // timeout of its own.
      std::optional<Error> unreached;
      if (!conn) unreached = backoff_->Check();
      if (!conn && !unreached) {
        auto opened = Connection::Open(node_, options_);
        if (opened) {
          conn = std::move(*opened);
          backoff_->Reached();
        } else {
          backoff_->Failed(opened.error());
          unreached = opened.error();
        }
      }
      if (!conn) {
        const Error e = Failure("cannot connect: " + unreached->message);
        for (Queued& q : batch) q.second(std::unexpected(e));
      } else {
        if (in_flight.empty()) progress = Clock::now();
        for (Queued& q : batch) {
          conn->Append(q.first);
          in_flight.push_back(std::move(q.second));
        }
        if (auto flushed = conn->Flush(); !flushed) fail_all(flushed.error());
      }
      batch.clear();
    }
    if (conn && (fds[1].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      auto replies = conn->ReadAvailable();
      if (!replies) {
        fail_all(replies.error());
      } else {
        for (Reply& r : *replies) {
          if (in_flight.empty()) {  // a reply nobody asked for: the stream is lost
            fail_all(Failure("unexpected reply"));
            break;
          }
          Done done = std::move(in_flight.front());
          in_flight.pop_front();
          done(std::move(r));
        }
        progress = Clock::now();
      }
    }
    if (!in_flight.empty() && Clock::now() >= progress + options_.command_timeout) {
      fail_all(Failure("no reply within the command timeout"));
    }
  }
  const Error closing = Failure("the store is closing");
  fail_all(closing);
  for (Queued& q : batch) q.second(std::unexpected(closing));
}

}  // namespace idem::redis
