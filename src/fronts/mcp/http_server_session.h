// One client session of the Streamable HTTP server, and the routing of
// messages between the client's HTTP streams and the session's Channel.
//
// The client POSTs messages; they reach McpSession through this Channel's
// on_message. McpSession answers through Send, and the session routes each
// message to a stream:
//   - a response goes to the POST whose request had that id;
//   - a progress notification goes to the POST whose request carried that
//     progressToken;
//   - any other message goes to the one POST stream open, if exactly one is,
//     else to the GET stream; with neither it waits (bounded) for a GET stream.
// The stateless session (MCP 2026-07-28: no initialize, no session id) is
// shared by every sessionless client of a tenant, so it rewrites each
// request's id to a private one on the way in and restores it on the way
// out: clients that pick the same ids never see each other's answers, and
// only responses and matching progress reach a client.
//
// No sockets here: streams are StreamSinks, so routing is unit-tested alone.
// Thread-safe: Send/Close come from McpSession's threads, the rest from the
// server's I/O threads.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fronts/mcp/channel.h"
#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/http_message_pump.h"

namespace idem::mcp {

// Where the server writes one HTTP response stream. Calls may come from any
// thread; implementations post to their connection and never block.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // SSE streams: one event carrying `message`.
  virtual void Event(std::string message) = 0;
  // SSE streams: the last event was sent; end the response.
  virtual void End() = 0;
  // SSE streams: `message` is the last event (the final answer); end the
  // response after it. A sink that has not sent its header yet may answer
  // with `message` as a plain JSON body instead.
  virtual void Final(std::string message) {
    Event(std::move(message));
    End();
  }
  // JSON responses: the whole body (one message or a batch), ending the response.
  virtual void Json(std::string body) = 0;
};

// One open HTTP response of a session: a POST waiting for its answers or the
// GET stream. Guarded by its session's mutex.
struct Exchange {
  enum class Kind { kPostSse, kPostJson, kGet };
  Kind kind = Kind::kPostSse;
  std::shared_ptr<StreamSink> sink;
  bool batch = false;  // the POST body was a batch: a JSON answer is an array
  // Request id key (the private one in the stateless session) → the id's
  // JSON as the client sent it.
  std::map<std::string, std::string> outstanding;
  std::set<std::string> progress_tokens;
  std::vector<std::string> json_answers;  // kPostJson: answers collected so far
  bool finished = false;
};

class ServerSession : public Channel, public std::enable_shared_from_this<ServerSession> {
 public:
  // `on_end` is called (once, without locks held) when the proxy Close()s
  // the channel, so the server can forget the session; it may be empty.
  ServerSession(HttpSessionInfo info, size_t max_json_depth, size_t max_undelivered,
                std::function<void(ServerSession*)> on_end);
  ~ServerSession() override;

  // Channel (McpSession's side).
  void Start(std::function<void(std::string message)> on_message,
             std::function<void(std::string reason)> on_closed) override;
  bool Send(std::string message) override;
  void Close() override;

  // Server side.
  const HttpSessionInfo& info() const { return info_; }

  // Runs `task` on the session's thread before any message is delivered
  // (the session factory). False if the session already ended.
  bool RunOnSessionThread(std::function<void()> task);

  enum class Outcome { kOk, kClosed, kDuplicateId, kBadMessage };
  // Registers `exchange` as waiting for the answers to the requests in
  // `batch` and queues every message of the batch for on_message. kDuplicateId
  // if a request reuses an id already waiting in this session (stateful
  // sessions only), kBadMessage if a request's id cannot be rewritten.
  Outcome BeginPost(const std::shared_ptr<Exchange>& exchange, const MessageBatch& batch);
  // Queues messages that need no answer (notifications, responses). False if
  // the session ended.
  bool Deliver(const MessageBatch& batch);
  enum class AttachOutcome { kOk, kClosed, kConflict };
  // Makes `exchange` the session's GET stream and flushes buffered messages
  // to it. kConflict if a GET stream is already open.
  AttachOutcome AttachGet(const std::shared_ptr<Exchange>& exchange);
  // The client went away from `exchange`: later answers for it are dropped.
  void Detach(const std::shared_ptr<Exchange>& exchange);

  // Ends the session: waiting requests are answered with a JSON-RPC error
  // naming `reason`, streams end, and on_closed(reason) runs after the last
  // queued message. Idempotent.
  void Shutdown(const std::string& reason);

  bool ended() const;
  // True if nothing is open and nothing happened for `idle`.
  bool IdleFor(std::chrono::steady_clock::duration idle,
               std::chrono::steady_clock::time_point now) const;

 private:
  void Answer(const std::shared_ptr<Exchange>& ex, const std::string& key, std::string message);
  void Emit(const std::shared_ptr<Exchange>& ex, std::string message);
  // Stateless session: a message from the client as the upstream gets it.
  // A notifications/cancelled names the private id of the one waiting
  // request the client sent with that id; nullopt (logged: dropped) when no
  // waiting request, or more than one, has it, since the cancel then names
  // no request of its own. Other messages unchanged. Under mu_.
  std::optional<std::string> ForUpstream(const MessageInfo& m) const;
  void Touch() { last_activity_ = std::chrono::steady_clock::now(); }

  const HttpSessionInfo info_;
  const size_t max_json_depth_;
  const size_t max_undelivered_;
  std::function<void(ServerSession*)> on_end_;
  MessagePump pump_;

  mutable std::mutex mu_;
  bool ended_ = false;
  std::map<std::string, std::shared_ptr<Exchange>> waiting_;  // request id key → its POST
  std::vector<std::shared_ptr<Exchange>> posts_;              // open POST exchanges
  std::shared_ptr<Exchange> get_;
  std::deque<std::string> undelivered_;
  uint64_t next_private_id_ = 1;
  std::chrono::steady_clock::time_point last_activity_;
};

}  // namespace idem::mcp
