// One connection to one Redis server, plain TCP or TLS (OpenSSL): commands
// are written in RESP, replies parsed by hiredis's reader. The socket is
// non-blocking; the blocking calls wait in poll() up to their timeout.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "net/tls_client.h"
#include "redis_url.h"

namespace idem::redis {

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// A command as its arguments; binary-safe (sent with explicit lengths).
using Command = std::vector<std::string>;

// True if `r` is an error reply whose text starts with `prefix` (any error
// if `prefix` is empty).
bool IsError(const redisReply& r, std::string_view prefix = {});
// The bytes of a string, status or error reply; empty for other types.
std::string_view Text(const redisReply& r);

// TLS for every connection of one store (rediss://): one context, shared.
struct TlsConnect {
  net::SslCtxPtr ctx;
  std::string server_name;  // the name certificates must carry; empty: each node's host
  bool verify = true;
};

struct ConnectOptions {
  Duration connect_timeout{1'000};
  Duration command_timeout{2'000};
  std::string user;      // empty: "AUTH password"
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT when not 0
  std::shared_ptr<const TlsConnect> tls;  // null: plain TCP
};

// When one node may be dialled again. After a failed connect, attempts fail
// at once for a backoff (25 ms doubling to 1 s) instead of each waiting for a
// connect timeout of its own; any successful connect to the node ends it.
// The blocking calls' pool and the pipeline of a node share one, so that
// once either has reached a restarted server the other does not go on
// refusing calls with its stale error. Thread-safe.
class ConnectBackoff {
 public:
  // nullopt when a connect may be tried now; else the error to fail with,
  // kUnavailable and unreached, naming the last failure and the wait.
  std::optional<Error> Check() const;
  void Failed(const Error& error);
  void Reached();

 private:
  mutable std::mutex mu_;
  int failures_ = 0;
  std::chrono::steady_clock::time_point retry_at_{};
  std::string last_error_;
};

// Not thread-safe: one thread at a time (the pool hands it out). Once an I/O
// error or a timeout happened, broken() is true and the connection must be
// dropped: the reply stream can no longer be matched to commands.
class Connection {
 public:
  // Connects (and completes the TLS handshake), AUTHs and SELECTs, all
  // within the connect timeout. kUnavailable naming host:port if the server
  // cannot be reached, fails the handshake or its verification, or refuses
  // the credentials or the database.
  static Result<std::unique_ptr<Connection>> Open(const NodeAddress& node,
                                                  const ConnectOptions& options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends every command in one write and reads one reply each (error replies
  // are replies, not errors). kUnavailable on an I/O error or a timeout; the
  // server may then have applied any prefix of the commands.
  Result<std::vector<Reply>> Pipeline(std::span<const Command> commands);
  Result<Reply> Run(const Command& command);

  // For the pub/sub reader and the pipeline, which poll fd() themselves:
  // Append queues a command, Flush writes everything queued (waiting up to the
  // command timeout), ReadAvailable reads what the socket has without waiting
  // (call it when fd() is readable) and returns the complete replies, none
  // if only part of one (or of a TLS record) has arrived.
  void Append(const Command& command);
  Result<void> Flush();
  Result<std::vector<Reply>> ReadAvailable();
  int fd() const { return fd_; }

  bool broken() const { return broken_; }
  // True if the server closed (or reset) this idle connection; a poll with
  // no timeout, no I/O. A pooled connection is checked before reuse, so a
  // restarted server costs no failed command.
  bool ClosedByPeer() const;
  const NodeAddress& node() const { return node_; }

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  Connection(int fd, NodeAddress node, Duration command_timeout);
  Deadline CommandDeadline() const;
  Result<void> Handshake(const TlsConnect& tls, Deadline deadline);
  // Reads what the socket (and the TLS layer) has into reader_ without
  // waiting: the byte count, 0 if nothing yet.
  Result<size_t> ReadSome();
  // Writes out_, waiting up to `deadline`.
  Result<void> WriteAll(Deadline deadline);
  Error Broken(std::string_view why, std::string_view doing);

  const int fd_;
  SSL* ssl_ = nullptr;  // TLS: owned; null for plain TCP
  redisReader* const reader_;
  std::string out_;  // appended commands not yet written
  NodeAddress node_;
  Duration command_timeout_;
  bool broken_ = false;
};

// "1s", "250ms": for messages.
std::string DescribeDuration(Duration d);

}  // namespace idem::redis
