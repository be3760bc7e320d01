#include "mcp/fd_io.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace idem::mcp {
namespace {

// A write of at most this many bytes to a pipe that poll() reported
// writable never blocks (PIPE_BUF, one pipe buffer slot on Linux).
constexpr size_t kChunk = 4096;

// Writes all of `bytes` unless `wake_fd` becomes readable or a write fails.
bool WriteAll(int fd, int wake_fd, std::string_view bytes) {
  while (!bytes.empty()) {
    pollfd fds[2] = {{fd, POLLOUT, 0}, {wake_fd, POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (fds[1].revents != 0) return false;
    if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) return false;
    if ((fds[0].revents & (POLLOUT | POLLHUP)) == 0) continue;
    ssize_t n = ::write(fd, bytes.data(), std::min(bytes.size(), kChunk));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;  // EPIPE: the peer closed its end
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

WakePipe::WakePipe() {
  if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) fds_[0] = fds_[1] = -1;
}

WakePipe::~WakePipe() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void WakePipe::Wake() {
  if (fds_[1] < 0) return;
  char c = 1;
  while (::write(fds_[1], &c, 1) < 0 && errno == EINTR) {
  }
}

ReadEnd ReadFrames(int fd, int wake_fd, LineFramer& framer,
                   const std::function<void(LineFramer::Frame)>& on_frame, std::string* error) {
  char buf[1 << 16];
  while (true) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      *error = std::strerror(errno);
      return ReadEnd::kError;
    }
    if (fds[1].revents != 0) return ReadEnd::kWoken;
    if ((fds[0].revents & POLLNVAL) != 0) {
      *error = "the file descriptor is not open";
      return ReadEnd::kError;
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *error = std::strerror(errno);
      return ReadEnd::kError;
    }
    if (n == 0) {
      for (LineFramer::Frame& f : framer.Finish()) on_frame(std::move(f));
      return ReadEnd::kEof;
    }
    for (LineFramer::Frame& f : framer.Feed(std::string_view(buf, static_cast<size_t>(n)))) {
      on_frame(std::move(f));
    }
  }
}

FdWriter::FdWriter(int fd) : fd_(fd), broken_(fd < 0), thread_([this] { Loop(); }) {}

FdWriter::~FdWriter() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  wake_.Wake();
  thread_.join();
}

bool FdWriter::Send(std::string bytes) {
  {
    std::lock_guard g(mu_);
    if (closing_ || broken_ || stop_) return false;
    queue_.push_back(std::move(bytes));
  }
  cv_.notify_all();
  return true;
}

void FdWriter::Close() {
  {
    std::lock_guard g(mu_);
    closing_ = true;
  }
  cv_.notify_all();
}

bool FdWriter::AwaitClosed(std::chrono::milliseconds timeout) {
  std::unique_lock g(mu_);
  return cv_.wait_for(g, timeout, [&] { return done_; });
}

void FdWriter::Loop() {
  // A peer that closed its end gives EPIPE here instead of killing the process.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);

  std::unique_lock g(mu_);
  while (true) {
    cv_.wait(g, [&] { return stop_ || closing_ || !queue_.empty(); });
    if (stop_ || queue_.empty()) break;  // stopped, or closing with nothing left
    std::deque<std::string> batch;
    batch.swap(queue_);
    g.unlock();
    bool ok = true;
    for (const std::string& bytes : batch) {
      if (!WriteAll(fd_, wake_.read_fd(), bytes)) {
        ok = false;
        break;
      }
    }
    g.lock();
    if (!ok) {
      broken_ = true;
      queue_.clear();
      break;
    }
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  done_ = true;
  cv_.notify_all();
}

}  // namespace idem::mcp
