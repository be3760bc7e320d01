#include "redis_client.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <thread>

namespace idem::redis {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kMaxAttempts = 8;  // per Execute: redirections and TRYAGAIN-style retries

// Backoff for TRYAGAIN / CLUSTERDOWN / LOADING: 10 ms doubling, at most 200 ms.
void Backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10 << attempt, 200)));
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 :6381" → the target node. An empty
// host means the node that answered.
std::optional<NodeAddress> ParseRedirect(std::string_view text, const NodeAddress& from) {
  size_t space = text.rfind(' ');
  if (space == std::string_view::npos) return std::nullopt;
  std::string_view hp = text.substr(space + 1);
  size_t colon = hp.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  NodeAddress to;
  to.host = std::string(hp.substr(0, colon));
  if (to.host.starts_with('[') && to.host.ends_with(']'))
    to.host = to.host.substr(1, to.host.size() - 2);
  if (to.host.empty()) to.host = from.host;
  std::string_view port = hp.substr(colon + 1);
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), to.port);
  if (ec != std::errc() || p != port.data() + port.size()) return std::nullopt;
  return to;
}

bool Transient(std::string_view text) {
  for (std::string_view p : {"TRYAGAIN", "CLUSTERDOWN", "LOADING"}) {
    if (text.starts_with(p)) return true;
  }
  return false;
}

}  // namespace

Error ReplyError(const NodeAddress& node, std::string_view text) {
  for (std::string_view p :
       {"BUSY", "MASTERDOWN", "READONLY", "NOREPLICAS", "OOM", "LOADING", "MISCONF", "TRYAGAIN",
        "CLUSTERDOWN", "NOAUTH", "WRONGPASS", "NOPERM"}) {
    if (text.starts_with(p)) {
      return Error{ErrorCode::kUnavailable,
                   "redis store " + node.ToString() +
                       " cannot serve the request now: " + std::string(text) + "; retryable"};
    }
  }
  if (text.starts_with("WRONGTYPE")) {
    return Error{ErrorCode::kDataLoss,
                 "redis store " + node.ToString() + ": " + std::string(text) +
                     "; another program writes under this key prefix: give the store its own "
                     "prefix (?prefix=) or database"};
  }
  return Error{ErrorCode::kInternal,
               "redis store " + node.ToString() + " answered an error: " + std::string(text)};
}

// NodePool ------------------------------------------------------------------

Result<std::unique_ptr<Connection>> NodePool::Acquire(bool* reused) {
  {
    std::lock_guard lock(mu_);
    while (!idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      if (!c->ClosedByPeer()) {
        *reused = true;
        return c;
      }
    }
  }
  if (std::optional<Error> wait = backoff_->Check()) return std::unexpected(std::move(*wait));
  auto conn = Connection::Open(node_, options_);
  if (!conn) {
    backoff_->Failed(conn.error());
    return std::unexpected(conn.error());
  }
  backoff_->Reached();
  *reused = false;
  return conn;
}

void NodePool::Release(std::unique_ptr<Connection> conn) {
  if (conn->broken()) return;
  std::lock_guard lock(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(conn));
}

// RedisClient ---------------------------------------------------------------

RedisClient::RedisClient(RedisConfig config, std::shared_ptr<const TlsConnect> tls)
    : config_(std::move(config)), connect_{config_.connect_timeout,
                                           config_.command_timeout,
                                           config_.user,
                                           config_.password,
                                           config_.db,
                                           std::move(tls)} {}

Result<std::unique_ptr<RedisClient>> RedisClient::Open(const RedisConfig& config) {
  std::shared_ptr<TlsConnect> tls;
  if (config.tls.enabled) {
    auto ctx = net::NewTlsClientContext({.verify = config.tls.verify,
                                         .ca_file = config.tls.ca_file,
                                         .cert_file = config.tls.cert_file,
                                         .key_file = config.tls.key_file,
                                         .ca_option = "tls_ca",
                                         .cert_option = "tls_cert",
                                         .key_option = "tls_key"});
    if (!ctx) {
      return MakeError(ctx.error().code, "redis store URL: " + ctx.error().message);
    }
    tls = std::make_shared<TlsConnect>(
        TlsConnect{std::move(*ctx), config.tls.server_name, config.tls.verify});
  }
  std::unique_ptr<RedisClient> client(new RedisClient(config, std::move(tls)));
  if (config.cluster) {
    if (auto r = client->RefreshSlots(true); !r) return std::unexpected(r.error());
  } else {
    if (auto r = client->RunOn(config.nodes.front(), {"PING"}); !r) {
      return std::unexpected(r.error());
    }
  }
  return client;
}

NodePool& RedisClient::PoolFor(const NodeAddress& node) {
  std::lock_guard lock(pools_mu_);
  auto& pool = pools_[node];
  if (!pool) pool = std::make_unique<NodePool>(node, connect_, config_.pool);
  return *pool;
}

std::vector<NodeAddress> RedisClient::CandidateNodes() {
  std::vector<NodeAddress> nodes;
  {
    std::lock_guard lock(slots_mu_);
    nodes = slots_.masters();
  }
  for (const NodeAddress& seed : config_.nodes) {
    if (std::find(nodes.begin(), nodes.end(), seed) == nodes.end()) nodes.push_back(seed);
  }
  return nodes;
}

std::vector<NodeAddress> RedisClient::Masters() {
  if (!config_.cluster) return config_.nodes;
  std::lock_guard lock(slots_mu_);
  return slots_.masters();
}

Result<void> RedisClient::RefreshSlots(bool force) {
  {
    std::lock_guard lock(slots_mu_);
    const auto now = SteadyClock::now();
    if (!force && now - last_refresh_ < std::chrono::milliseconds(100)) return {};
    last_refresh_ = now;
  }
  Error last{ErrorCode::kUnavailable, "redis cluster: no seed node"};
  for (const NodeAddress& node : CandidateNodes()) {
    auto reply = RunOnNode(node, Request{{"CLUSTER", "SLOTS"}, {}, true, false}, false);
    if (!reply) {
      last = reply.error();
      continue;
    }
    if (IsError(**reply)) {
      last = ReplyError(node, Text(**reply));
      continue;
    }
    auto map = SlotMap::Parse(reply->get(), node);
    if (!map) {
      last = map.error();
      continue;
    }
    std::lock_guard lock(slots_mu_);
    slots_ = std::move(*map);
    return {};
  }
  return MakeError(
      last.code, "redis cluster: could not read the slot map from any node; last: " + last.message);
}

Result<Reply> RedisClient::RunOnNode(const NodeAddress& node, const Request& req, bool asking) {
  NodePool& pool = PoolFor(node);
  for (int round = 0;; ++round) {
    bool reused = false;
    auto conn = pool.Acquire(&reused);
    if (!conn) return std::unexpected(conn.error());

    auto send = [&](const Command& command) -> Result<Reply> {
      std::vector<Command> batch;
      if (asking || req.wait_replicas) {
        if (asking) batch.push_back({"ASKING"});
        batch.push_back(command);
        if (req.wait_replicas) {
          batch.push_back({"WAIT", std::to_string(config_.wait_replicas),
                           std::to_string(config_.wait_timeout.count())});
        }
      }
      // The common case sends `command` as it is, without a copy.
      auto replies = (*conn)->Pipeline(batch.empty() ? std::span<const Command>(&command, 1)
                                                     : std::span<const Command>(batch));
      if (!replies) return std::unexpected(replies.error());
      Reply main = std::move((*replies)[asking ? 1 : 0]);
      if (req.wait_replicas && main->type != REDIS_REPLY_ERROR) {
        const redisReply& acks = *replies->back();
        if (acks.type != REDIS_REPLY_INTEGER || acks.integer < config_.wait_replicas) {
          return MakeError(
              ErrorCode::kUnavailable,
              "redis store " + node.ToString() + ": the write was applied on the master but " +
                  (acks.type == REDIS_REPLY_INTEGER ? std::to_string(acks.integer) : "no") +
                  " of the " + std::to_string(config_.wait_replicas) +
                  " replicas asked for (wait_replicas) acknowledged it within " +
                  DescribeDuration(config_.wait_timeout) + "; its durability is not confirmed");
        }
      }
      return main;
    };

    auto reply = send(req.command);
    if (reply && req.script_source && IsError(**reply, "NOSCRIPT")) {
      Command eval = req.command;
      eval[0] = "EVAL";
      eval[1] = *req.script_source;
      reply = send(eval);
    }
    const bool broken = (*conn)->broken();
    pool.Release(std::move(*conn));
    if (reply || !broken) return reply;
    // A pooled connection may have died without our noticing (the server
    // restarted): reads go again once on a fresh connection. Writes do not:
    // the server may have applied them.
    if (!(reused && req.resend_safe && round == 0)) {
      if (!req.resend_safe) {
        return MakeError(reply.error().code,
                         reply.error().message + " (the write may or may not have been applied)");
      }
      return reply;
    }
  }
}

Result<Reply> RedisClient::Route(std::string_view slot_key, const Request& req) {
  const int slot = config_.cluster ? KeySlot(slot_key) : 0;
  std::optional<NodeAddress> target;
  bool asking = false;
  std::string last;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (!asking) {
      if (!config_.cluster) {
        target = config_.nodes.front();
      } else {
        {
          std::lock_guard lock(slots_mu_);
          target = slots_.NodeFor(slot);
        }
        if (!target) {
          (void)RefreshSlots(true);
          std::lock_guard lock(slots_mu_);
          target = slots_.NodeFor(slot);
        }
        if (!target) {
          last = "no master serves slot " + std::to_string(slot);
          Backoff(attempt);
          continue;
        }
      }
    }
    auto reply = RunOnNode(*target, req, asking);
    asking = false;
    if (!reply) {
      if (config_.cluster) (void)RefreshSlots(false);  // the node may have failed over
      return reply;
    }
    const redisReply& r = **reply;
    if (r.type != REDIS_REPLY_ERROR) return reply;
    const std::string_view text = Text(r);
    if (config_.cluster && (text.starts_with("MOVED ") || text.starts_with("ASK "))) {
      auto to = ParseRedirect(text, *target);
      if (!to) return std::unexpected(ReplyError(*target, text));
      if (text.starts_with("MOVED ")) {
        {
          std::lock_guard lock(slots_mu_);
          slots_.Assign(slot, *to);
        }
        (void)RefreshSlots(false);
      } else {
        target = *to;
        asking = true;
      }
      last = std::string(text);
      continue;
    }
    if (Transient(text)) {
      last = std::string(text);
      if (text.starts_with("CLUSTERDOWN")) (void)RefreshSlots(false);
      Backoff(attempt);
      continue;
    }
    return std::unexpected(ReplyError(*target, text));
  }
  return MakeError(ErrorCode::kUnavailable,
                   "redis store: gave up after " + std::to_string(kMaxAttempts) +
                       " attempts (cluster resharding or failover in progress?); last answer: " +
                       last + "; retryable");
}

Result<Reply> RedisClient::Execute(std::string_view slot_key, Command command, bool resend_safe) {
  return Route(slot_key, Request{std::move(command), {}, resend_safe, false});
}

Result<Reply> RedisClient::Eval(const Script& script, std::span<const std::string> keys,
                                std::span<const std::string> args, bool write) {
  Request req;
  req.resend_safe = !write;
  req.wait_replicas = write && config_.wait_replicas > 0;
  auto build = [&](std::string verb, const std::string& body) {
    Command c;
    c.reserve(3 + keys.size() + args.size());
    c.push_back(std::move(verb));
    c.push_back(body);
    c.push_back(std::to_string(keys.size()));
    c.insert(c.end(), keys.begin(), keys.end());
    c.insert(c.end(), args.begin(), args.end());
    return c;
  };
  req.command = build("EVALSHA", script.sha1);
  req.script_source = &script.source;  // the scripts are static
  return Route(keys.empty() ? std::string_view() : std::string_view(keys.front()), req);
}

Result<Reply> RedisClient::RunOn(const NodeAddress& node, Command command) {
  auto reply = RunOnNode(node, Request{std::move(command), {}, true, false}, false);
  if (!reply) return reply;
  if (IsError(**reply)) return std::unexpected(ReplyError(node, Text(**reply)));
  return reply;
}

Result<std::vector<Reply>> RedisClient::PipelineOn(const NodeAddress& node,
                                                   std::span<const Command> commands) {
  if (commands.empty()) return std::vector<Reply>();
  NodePool& pool = PoolFor(node);
  for (int round = 0;; ++round) {
    bool reused = false;
    auto conn = pool.Acquire(&reused);
    if (!conn) return std::unexpected(conn.error());
    auto replies = (*conn)->Pipeline(commands);
    const bool broken = (*conn)->broken();
    pool.Release(std::move(*conn));
    if (replies || !broken || !reused || round > 0) return replies;
  }
}

Result<std::unique_ptr<Connection>> RedisClient::ConnectAny() {
  Error last{ErrorCode::kUnavailable, "redis store: no node to connect to"};
  for (const NodeAddress& node : CandidateNodes()) {
    auto conn = Connection::Open(node, connect_);
    if (conn) return conn;
    last = conn.error();
  }
  return std::unexpected(last);
}

}  // namespace idem::redis
