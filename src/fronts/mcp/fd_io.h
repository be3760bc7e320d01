// Reading and writing the pipes of the stdio transports on their own
// threads: a poll() loop that a WakePipe can interrupt, and a queued writer,
// so no caller ever blocks on a peer that stops reading (and a stuck peer
// cannot deadlock the proxy: reading never waits for writing).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "fronts/mcp/json_rpc.h"

namespace idem::mcp {

// A self-pipe that wakes a poll() loop from another thread. Thread-safe.
class WakePipe {
 public:
  WakePipe();
  ~WakePipe();
  WakePipe(const WakePipe&) = delete;
  WakePipe& operator=(const WakePipe&) = delete;
  int read_fd() const { return fds_[0]; }
  // Makes read_fd() readable for good.
  void Wake();

 private:
  int fds_[2] = {-1, -1};
};

// Why ReadFrames returned.
enum class ReadEnd { kEof, kError, kWoken };

// Reads `fd` until end of file, an error, or `wake_fd` becomes readable,
// feeding the bytes to `framer` and each frame to `on_frame` in order. On
// EOF the framer's last frame is delivered first. `error` gets the reason of
// kError.
ReadEnd ReadFrames(int fd, int wake_fd, LineFramer& framer,
                   const std::function<void(LineFramer::Frame)>& on_frame, std::string* error);

// Writes byte strings to a file descriptor in order without ever blocking the
// caller: Send writes at once what the fd takes without blocking (when
// nothing is queued and the process ignores SIGPIPE), and a thread of its own
// writes the rest. Give it an O_NONBLOCK fd where the fd's file description
// is ours alone (a pipe we made): Send then writes without asking poll()
// first, one syscall per message. Thread-safe.
class FdWriter {
 public:
  // Takes ownership of `fd`.
  explicit FdWriter(int fd);
  // Stops at once: unwritten bytes are dropped, the fd is closed.
  ~FdWriter();
  FdWriter(const FdWriter&) = delete;
  FdWriter& operator=(const FdWriter&) = delete;

  // Queues `bytes`. False after Close() or once a write failed (the peer
  // closed its end).
  bool Send(std::string bytes);
  // Writes what is queued, then closes the fd (EOF to the peer). Returns at
  // once. Idempotent.
  void Close();
  // Waits up to `timeout` for Close() to have written everything and closed
  // the fd. True if it has (or a write failed).
  bool AwaitClosed(std::chrono::milliseconds timeout);

 private:
  void Loop();

  int fd_;
  const bool inline_writes_;  // SIGPIPE ignored: Send may write from the caller's thread
  const bool nonblocking_;    // O_NONBLOCK: Send writes without polling first
  WakePipe wake_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool closing_ = false;  // Close() called: no more Sends
  bool broken_ = false;   // a write failed
  bool writing_ = false;  // Send or the thread is writing: others queue behind it
  bool done_ = false;     // the thread closed the fd
  bool stop_ = false;     // destructor
  std::thread thread_;
};

}  // namespace idem::mcp
