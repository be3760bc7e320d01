// Commands pipelined on one connection, for the Store's asynchronous
// operations (GetAsync, ClaimAsync, CompleteAsync): a caller queues a
// command and returns at once; everything queued since the connection's last
// turn goes out in one write, and each reply, in order, is handed to its
// callback. Under load one write and one read carry many requests' commands,
// where a blocking call costs each request a thread switch or two and a
// round trip of its own.
//
// The I/O runs on an io_context: a thread of the pipeline's own, started by
// the first command, or the threads of the caller's (StoreOptions::io), so
// that a front whose listener and upstream client run there too carries a
// request from its read to its answer without handing it to another thread
// (docs/DESIGN.md §5, "Redis"). Either way the connection's work runs on one
// strand, one handler at a time. A command is written by the first thread
// free to take the strand's turn, with everything queued by then (posted:
// deferring the turn until the queuing handler returned measured worse
// tails and fewer calls/s, bench/README.md run DD).
//
// The connection is opened on the first command and again after an error,
// on a short-lived thread of its own (a connect may wait for the connect
// timeout; it must not hold up the io_context's other work); an error (I/O,
// timeout, a server that cannot be reached) fails every command in flight
// with kUnavailable and drops the connection. After a failed connect,
// commands fail at once for the node's backoff (ConnectBackoff, shared with
// the blocking calls' pool) instead of each waiting for a connect timeout
// of its own. A command is never resent: a write that failed in flight may
// or may not have been applied, and its caller must treat it so.
// Thread-safe; a callback may Submit.
#pragma once

#include <functional>
#include <memory>

#include "redis_connection.h"

namespace boost::asio {
class io_context;
}

namespace idem::redis {

class Pipeline {
 public:
  // Runs on the pipeline's strand with the reply (error replies are
  // replies) or kUnavailable. Must not block: it holds up every command
  // behind it.
  using Done = std::function<void(Result<Reply>)>;

  // `backoff`: the node's, shared with its pool (RedisClient::BackoffFor);
  // null for one of the pipeline's own. `io`: the io_context to run on, whose
  // threads must run until the pipeline is destroyed; null for a thread of
  // the pipeline's own.
  Pipeline(NodeAddress node, ConnectOptions options, std::shared_ptr<ConnectBackoff> backoff = {},
           boost::asio::io_context* io = nullptr);
  // Fails every command not yet answered (kUnavailable, "closing") and waits
  // for the pipeline's handlers to finish (joining its own thread). Not from
  // a callback, nor from a thread of the caller's io_context when it has
  // only one.
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Queues `command`; `done` runs exactly once.
  void Submit(Command command, Done done);
  // As Submit, with the command built by `make` under the queue's lock:
  // commands are written in the order they were built, whatever the
  // threads (the store chains audit entries in that order, docs/DESIGN.md
  // §7). `make` must be quick and must not call into this pipeline.
  void SubmitBuilt(const std::function<Command()>& make, Done done);
  // Whether the caller runs on a thread that runs callbacks (the
  // pipeline's own, or any of the caller's io_context): it must not wait for
  // a reply, which that thread may be the one to read.
  bool OnPipelineThread() const;

  struct State;
  struct OwnThread;

 private:
  std::unique_ptr<OwnThread> own_;  // null on the caller's io_context; outlives state_
  std::shared_ptr<State> state_;
};

}  // namespace idem::redis
