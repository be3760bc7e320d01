#include "fronts/mcp/fd_io.h"

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

// Writes the front of `bytes` while `fd` accepts it without blocking, and
// removes what was written. False if a write failed (the peer closed its
// end). An O_NONBLOCK fd is written at once (one syscall per message);
// otherwise poll() reporting a pipe writable means at least kChunk bytes
// fit, so each write of at most kChunk returns at once.
bool WriteWithoutBlocking(int fd, bool nonblocking, std::string_view& bytes) {
  while (nonblocking && !bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN;  // full: the rest waits; else the peer closed its end
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  while (!bytes.empty()) {
    pollfd pfd = {fd, POLLOUT, 0};
    int r = ::poll(&pfd, 1, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if ((pfd.revents & (POLLERR | POLLNVAL)) != 0) return false;
    if ((pfd.revents & (POLLOUT | POLLHUP)) == 0) return true;  // full: the rest waits
    ssize_t n = ::write(fd, bytes.data(), std::min(bytes.size(), kChunk));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;  // EPIPE: the peer closed its end
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Writing from a caller's thread is safe only where a peer that closed its end
// gives EPIPE rather than a SIGPIPE that kills the process: the writer thread
// blocks the signal for itself, but callers' threads are not ours to change.
bool SigpipeIgnored() {
  struct sigaction action {};
  return ::sigaction(SIGPIPE, nullptr, &action) == 0 && action.sa_handler == SIG_IGN;
}

bool IsNonblocking(int fd) {
  const int flags = fd >= 0 ? ::fcntl(fd, F_GETFL) : -1;
  return flags >= 0 && (flags & O_NONBLOCK) != 0;
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

FdWriter::FdWriter(int fd)
    : fd_(fd),
      inline_writes_(SigpipeIgnored()),
      nonblocking_(IsNonblocking(fd)),
      broken_(fd < 0),
      thread_([this] { Loop(); }) {}

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
  std::unique_lock g(mu_);
  if (closing_ || broken_ || stop_) return false;
  if (!inline_writes_ || !queue_.empty() || writing_) {
    queue_.push_back(std::move(bytes));
    g.unlock();
    cv_.notify_all();
    return true;
  }
  // Nothing queued and nobody writing: write from this thread what the pipe
  // takes without blocking, and leave only the rest to the writer thread.
  // Saves a thread hand-off (a wake-up and a context switch) per message,
  // which is most of what a pass-through message costs.
  writing_ = true;
  g.unlock();
  std::string_view rest = bytes;
  bool ok = WriteWithoutBlocking(fd_, nonblocking_, rest);
  g.lock();
  writing_ = false;
  if (!ok) {
    broken_ = true;
  } else if (!rest.empty()) {
    queue_.push_front(std::string(rest));
  } else if (queue_.empty() && !closing_) {
    return true;  // all written and nothing for the thread to do: leave it asleep
  }
  g.unlock();
  cv_.notify_all();
  return ok;
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
    cv_.wait(g, [&] { return stop_ || broken_ || (!writing_ && (closing_ || !queue_.empty())); });
    if (stop_ || broken_ || queue_.empty()) break;  // stopped, broken, or closing with nothing left
    std::deque<std::string> batch;
    batch.swap(queue_);
    writing_ = true;
    g.unlock();
    bool ok = true;
    for (const std::string& bytes : batch) {
      if (!WriteAll(fd_, wake_.read_fd(), bytes)) {
        ok = false;
        break;
      }
    }
    g.lock();
    writing_ = false;
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
