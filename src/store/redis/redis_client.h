// Sends commands to the right Redis node: the one server, or in a cluster
// the master that owns the key's slot. Per-node connection pools. Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cluster_slots.h"
#include "redis_connection.h"
#include "redis_scripts.h"
#include "redis_url.h"

namespace idem::redis {

// Idle connections to one node, and its reconnect backoff. Thread-safe.
class NodePool {
 public:
  NodePool(NodeAddress node, ConnectOptions options, size_t max_idle)
      : node_(std::move(node)), options_(std::move(options)), max_idle_(max_idle) {}

  // An idle connection the server has not closed, else a new one; `*reused`
  // tells which. After a failed connect the node is in backoff
  // (ConnectBackoff): until then Acquire fails at once with the last error.
  Result<std::unique_ptr<Connection>> Acquire(bool* reused);
  // The node's backoff, for the pipeline to the same node to share.
  std::shared_ptr<ConnectBackoff> backoff() const { return backoff_; }
  // Returns a connection; a broken one is dropped.
  void Release(std::unique_ptr<Connection> conn);

 private:
  const NodeAddress node_;
  const ConnectOptions options_;
  const size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
  const std::shared_ptr<ConnectBackoff> backoff_ = std::make_shared<ConnectBackoff>();
};

class RedisClient {
 public:
  // Single server: checks it answers PING. Cluster: reads the slot map from
  // the first seed node that answers. kUnavailable if none does.
  static Result<std::unique_ptr<RedisClient>> Open(const RedisConfig& config);

  // Runs `command` where `slot_key` lives, following MOVED (the slot map is
  // refreshed) and ASK (ASKING, once, on the target), retrying TRYAGAIN,
  // CLUSTERDOWN and LOADING a few times with backoff. `resend_safe` lets a
  // command that a broken pooled connection may or may not have delivered
  // be sent again (reads). Error replies come back as errors: kUnavailable
  // for a server that cannot serve now (retryable), kDataLoss for a key of
  // the wrong type, kInternal otherwise.
  Result<Reply> Execute(std::string_view slot_key, Command command, bool resend_safe);

  // EVALSHA, then EVAL if the node does not know the script (NOSCRIPT).
  // keys[0] routes. A write (`write`) is never resent after a broken
  // connection, and with wait_replicas it is followed by WAIT on the same
  // connection: fewer acknowledgements than asked → kUnavailable.
  Result<Reply> Eval(const Script& script, std::span<const std::string> keys,
                     std::span<const std::string> args, bool write);

  // Runs an unkeyed command (SCAN, PING) on one node.
  Result<Reply> RunOn(const NodeAddress& node, Command command);
  // Reads pipelined on one node, without redirections: error replies (a
  // MOVED for a key that just migrated) come back as replies.
  Result<std::vector<Reply>> PipelineOn(const NodeAddress& node, std::span<const Command> commands);
  // The single server, or every cluster master.
  std::vector<NodeAddress> Masters();
  // A dedicated connection (for pub/sub) to the first node that answers.
  Result<std::unique_ptr<Connection>> ConnectAny();

  const RedisConfig& config() const { return config_; }
  const ConnectOptions& connect_options() const { return connect_; }
  // The reconnect backoff of `node`, which its pool uses: a pipeline to the
  // node shares it (ConnectBackoff).
  std::shared_ptr<ConnectBackoff> BackoffFor(const NodeAddress& node) {
    return PoolFor(node).backoff();
  }

 private:
  struct Request {
    Command command;
    // A script's source, if `command` is its EVALSHA: when that answers
    // NOSCRIPT, `command` goes again as EVAL with the source (built only
    // then: the source is kilobytes).
    const std::string* script_source = nullptr;
    bool resend_safe = false;
    bool wait_replicas = false;
  };

  RedisClient(RedisConfig config, std::shared_ptr<const TlsConnect> tls);
  NodePool& PoolFor(const NodeAddress& node);
  Result<Reply> Route(std::string_view slot_key, const Request& req);
  Result<Reply> RunOnNode(const NodeAddress& node, const Request& req, bool asking);
  Result<void> RefreshSlots(bool force);
  std::vector<NodeAddress> CandidateNodes();

  const RedisConfig config_;
  const ConnectOptions connect_;

  std::mutex pools_mu_;
  std::map<NodeAddress, std::unique_ptr<NodePool>> pools_;

  std::mutex slots_mu_;  // guards slots_ and last_refresh_
  SlotMap slots_;
  std::chrono::steady_clock::time_point last_refresh_{};
};

// An error reply of `node` as the store's error: kUnavailable for a server
// that cannot serve now (BUSY, LOADING, READONLY, …; retryable), kDataLoss for
// WRONGTYPE (another program's key), kInternal otherwise.
Error ReplyError(const NodeAddress& node, std::string_view text);

}  // namespace idem::redis
