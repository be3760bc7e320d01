// One writer per SQLite file on a machine (docs/DESIGN.md §5): the processes
// that open the same file (eight `idemgate mcp` stdio proxies of eight agent
// sessions, say) hand their claims, completions and audit entries to one of
// them, whose group-commit writer puts the writes of all of them into shared
// transactions, one fsync for many. Processes cannot share an SQLite
// transaction, so without this each commits, and fsyncs, alone.
//
// The file stays the only truth. Whoever holds an exclusive flock on
// PATH-writer.lock serves: it listens on the Unix socket PATH-writer.sock
// (mode 0600; a peer of another user is refused by its credentials). The
// others connect to it. Serving is never required for correctness: a
// process that cannot reach a server writes the file itself, as every
// process did before, through the write lock. When the server goes away,
// the next process to find its socket dead takes the flock and serves.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/error.h"

namespace idem::sqlite {

// Where the shared writer of the database at `database_path` listens, and
// the lock its server holds.
std::string SharedWriterSocketPath(const std::string& database_path);
std::string SharedWriterLockPath(const std::string& database_path);

class SharedWriter {
 public:
  // Sends a reply to the call it was made for. Callable from any thread,
  // once, also after the SharedWriter is gone.
  using Reply = std::function<void(std::string reply)>;
  // Starts one call that another process sent (a writer_protocol.h call) and
  // returns; `reply` is called with the reply once the write is done
  // (typically on the group-commit writer's thread, so no thread of the
  // connection wakes to pass it on). Calls of several clients run at once
  // and share the writer's transactions.
  using Handler = std::function<void(std::string_view call, Reply reply)>;

  // Serves the database at `database_path` if no process does, else
  // prepares to be a client of the one that does. `max_clients`: connections
  // served at once (each is a thread); one more is refused, and its process
  // writes itself. `reply_timeout`: how long a client waits for the server's
  // hello or reply; past it (a server stopped with SIGSTOP or in a debugger
  // answers nothing, yet its socket accepts) the call counts as lost and the
  // process writes itself for ten times as long before it asks the server
  // again. kUnavailable if the lock file cannot be opened.
  static Result<std::unique_ptr<SharedWriter>> Open(const std::string& database_path,
                                                    Handler handler, size_t max_clients,
                                                    std::chrono::milliseconds reply_timeout);
  // Stops serving: every call being run is finished and answered first.
  ~SharedWriter();
  SharedWriter(const SharedWriter&) = delete;
  SharedWriter& operator=(const SharedWriter&) = delete;

  // Sends `call` to the serving process and returns its reply.
  //   nullopt: nothing was sent, so nothing was written: this process serves
  //     (perhaps from now on, having found the server gone), or no server can
  //     be reached. The caller writes itself.
  //   kUnavailable: the call was sent and the server went away, or did
  //     not answer within the reply timeout. It may or may not have been
  //     written, and a server that did not answer may still write it
  //     later; the caller reads the file to find out, and writes only what
  //     a late write of the server cannot turn into a second effect (a
  //     claim or a fenced completion).
  std::optional<Result<std::string>> Call(std::string_view call);

  // Whether this process serves the file.
  bool serving() const { return serving_.load(std::memory_order_acquire); }
  // Calls answered for other processes, and calls sent to another.
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  struct Socket;

  SharedWriter(std::string socket_path, int lock_fd, Handler handler, size_t max_clients,
               std::chrono::milliseconds reply_timeout);

  // Takes the server's flock if it is free and starts listening.
  void TryToServe();
  void Accept();
  void Serve(const std::shared_ptr<Socket>& socket);
  // Sends `reply` as a frame without blocking the calling thread (the
  // writer's): what the socket's buffer does not take at once (a reply
  // larger than it, to a client that is slow to read) is sent by a thread
  // of its own.
  static void SendReply(const std::shared_ptr<Socket>& socket, std::string reply);
  // A connection to the server, from the idle ones or new; -1 if none can be
  // made (and no attempt for a moment after a failed one).
  int Connect();
  void PutBack(int fd);
  // No connect attempt for `pause` from now.
  void Avoid(std::chrono::nanoseconds pause);

  const std::string socket_path_;
  const int lock_fd_;
  const Handler handler_;
  const size_t max_clients_;
  const std::chrono::milliseconds reply_timeout_;

  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> sent_{0};

  // Serving: the listening socket and one thread per connection.
  int listen_fd_ = -1;
  std::thread acceptor_;
  std::mutex conns_mu_;
  bool stopping_ = false;
  // A served connection's socket, closed when the last of its thread and a
  // reply still to send lets go of it.
  struct Socket {
    explicit Socket(int fd) : fd(fd) {}
    ~Socket();
    const int fd;
  };
  struct Conn {
    std::shared_ptr<Socket> socket;
    std::thread thread;
    bool done = false;
  };
  std::list<Conn> conns_;

  // Client: idle connections to the server.
  std::mutex idle_mu_;
  std::vector<int> idle_;
  int64_t retry_after_ns_ = 0;  // steady clock; no connect attempt before
};

}  // namespace idem::sqlite
