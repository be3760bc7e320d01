// Commands pipelined on one connection by one thread, for the Store's
// asynchronous operations (GetAsync, ClaimAsync, CompleteAsync): a caller
// queues a command and returns at once; the thread writes everything queued
// since its last turn in one write and hands each reply, in order, to its
// callback. Under load one write and one read carry many requests' commands,
// where a blocking call costs each request a thread switch or two and a
// round trip of its own.
//
// The connection is opened on the first command and again after an error;
// an error (I/O, timeout, a server that cannot be reached) fails every
// command in flight with kUnavailable and drops the connection. After a
// failed connect, commands fail at once for the node's backoff
// (ConnectBackoff, shared with the blocking calls' pool) instead of each
// waiting for a connect timeout. A command is never
// resent: a write that failed in flight may or may not have been applied,
// and its caller must treat it so. Thread-safe; a callback may Submit.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "redis_connection.h"

namespace idem::redis {

class Pipeline {
 public:
  // Runs on the pipeline's thread with the reply (error replies are
  // replies) or kUnavailable. Must not block: it holds up every command
  // behind it.
  using Done = std::function<void(Result<Reply>)>;

  // `backoff`: the node's, shared with its pool (RedisClient::BackoffFor);
  // null for one of the pipeline's own.
  Pipeline(NodeAddress node, ConnectOptions options, std::shared_ptr<ConnectBackoff> backoff = {});
  // Fails every command not yet answered (kUnavailable, "closing") and joins
  // the pipeline's thread.
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
  // Whether the caller is the pipeline's thread, the one that runs every
  // `done`: it must not wait for a reply.
  bool OnPipelineThread() const { return std::this_thread::get_id() == thread_id_; }

 private:
  using Queued = std::pair<Command, Done>;
  void Run();
  Error Failure(std::string_view what) const;

  const NodeAddress node_;
  const ConnectOptions options_;
  const std::shared_ptr<ConnectBackoff> backoff_;
  const int wake_fd_;  // eventfd: something was queued, or stopping_

  std::mutex mu_;
  std::vector<Queued> queued_;  // guarded by mu_
  bool stopping_ = false;       // guarded by mu_

  std::once_flag started_;
  std::thread thread_;  // started by the first Submit
  std::atomic<std::thread::id> thread_id_{};  // thread_'s, once it runs
};

}  // namespace idem::redis
