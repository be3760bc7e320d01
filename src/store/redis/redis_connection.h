// One connection to one Redis server (hiredis, blocking, with timeouts).
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
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

struct ConnectOptions {
  Duration connect_timeout{1'000};
  Duration command_timeout{2'000};
  std::string user;      // empty: "AUTH password"
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT when not 0
};

// Not thread-safe: one thread at a time (the pool hands it out). Once an I/O
// error or a timeout happened, broken() is true and the connection must be
// dropped: the reply stream can no longer be matched to commands.
class Connection {
 public:
  // Connects, AUTHs and SELECTs. kUnavailable naming host:port if the server
  // cannot be reached, refuses the credentials or the database.
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

  // For the pub/sub reader, which polls fd() itself: Append queues a command,
  // Flush writes everything queued, ReadAvailable reads once from the socket
  // (call it when fd() is readable) and returns the complete replies.
  void Append(const Command& command);
  Result<void> Flush();
  Result<std::vector<Reply>> ReadAvailable();
  int fd() const { return ctx_->fd; }

  bool broken() const { return broken_; }
  // True if the server closed (or reset) this idle connection; a poll with
  // no timeout, no I/O. A pooled connection is checked before reuse, so a
  // restarted server costs no failed command.
  bool ClosedByPeer() const;
  const NodeAddress& node() const { return node_; }

 private:
  Connection(redisContext* ctx, NodeAddress node, Duration command_timeout)
      : ctx_(ctx), node_(std::move(node)), command_timeout_(command_timeout) {}
  Error IoError(std::string_view doing);

  redisContext* ctx_;
  NodeAddress node_;
  Duration command_timeout_;
  bool broken_ = false;
};

// "1s", "250ms": for messages.
std::string DescribeDuration(Duration d);

}  // namespace idem::redis
