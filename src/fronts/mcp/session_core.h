// The state of one McpSession (McpSession::Core) and what it keeps per
// request, shared by its two halves: routing messages between the client
// and the upstream (mcp_session.cc) and running gated calls on worker
// threads (gated_call.cc). Internal to the MCP front.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/worker_pool.h"
#include "idem/canonical_json.h"
#include "fronts/mcp/json_rpc.h"
#include "fronts/mcp/mcp_session.h"
#include "fronts/mcp/tool_gate.h"
#include "json/json_text.h"

namespace idem::mcp {

inline constexpr size_t kDefaultBudget = 256;

// A gated tools/call from its arrival to its answer. Guarded by the
// session's mutex, except `prepared`, which is immutable once shared.
struct GatedCall {
  std::string id_text;
  std::string id_key;
  PreparedCall prepared;
  std::condition_variable cv;  // signalled on answer, cancel, upstream gone, the stop's cut-off
  bool forwarded = false;      // sent upstream (a cancel is then forwarded too)
  bool cancelled = false;      // the client sent notifications/cancelled for it
  bool cut_off = false;        // forwarded and unanswered when the stop grace ran out (Drain)
  TimePoint cancelled_at{};
  std::optional<std::string> response;  // the upstream's answer, as received
  std::optional<Message> response_msg;
  // The worker gave up (the cancel grace, or the stop grace, ran out) and
  // marked the record unknown; a late answer still settles it with
  // `decision`'s fence.
  bool abandoned = false;
  Decision decision;
};

// One request the proxy itself sent upstream (a reconcile lookup).
struct ProxyRequest {
  std::condition_variable cv;
  std::optional<std::string> response;
};

// A client request forwarded upstream and not yet answered.
struct Pending {
  enum class Kind { kPlain, kToolsList, kGatedCall };
  Kind kind = Kind::kPlain;
  std::string id_text;
  std::shared_ptr<GatedCall> call;  // kGatedCall
  // kPlain, kToolsList: the client cancelled it. The entry stays until the
  // upstream answers (the answer is dropped) or the session ends, so the id
  // is not taken by a new request that the late answer would then reach.
  bool cancelled = false;
};

// What CallKeys and RecentKeys keep of a client string: itself when short,
// else "#" + its SHA-256 (the same string compacts the same way). Ids, turns
// and tool names are client strings of up to 1 MiB each, and these maps keep
// thousands per session: compacted, each entry is bounded in bytes, not only
// in count (security review F11). A client can make its own long string
// collide with a short "#..." one of its own session only.
inline constexpr size_t kMaxRememberedBytes = 128;
inline std::string Remembered(std::string_view s) {
  if (s.size() <= kMaxRememberedBytes) return std::string(s);
  return "#" + Sha256Hex(s);
}

// The call ids a session has seen (config.mcp.call_id), each with its tool
// and key, the oldest forgotten first past a limit. Ids and tools are kept
// compacted (Remembered); keys are bounded by kMaxKeyBytes. Not thread-safe:
// the session's mutex guards it.
class CallKeys {
 public:
  // The key `call_id` was first seen with, if that was a call to `tool`.
  std::optional<std::string> KeyOf(std::string_view call_id, std::string_view tool) const {
    auto it = keys_.find(Remembered(call_id));
    if (it == keys_.end() || it->second.tool != Remembered(tool)) return std::nullopt;
    return it->second.key;
  }
  // Remembers the first key `call_id` came with; keeps at most `limit`.
  void Remember(const std::string& call_id, const std::string& tool, const std::string& key,
                size_t limit) {
    std::string id = Remembered(call_id);
    Seen seen{Remembered(tool), key};
    const size_t bytes = 2 * id.size() + seen.tool.size() + seen.key.size();
    if (!keys_.try_emplace(id, std::move(seen)).second) return;
    bytes_ += bytes;
    order_.push_back(std::move(id));
    while (order_.size() > limit) {
      auto it = keys_.find(order_.front());
      bytes_ -= 2 * it->first.size() + it->second.tool.size() + it->second.key.size();
      keys_.erase(it);
      order_.pop_front();
    }
  }
  // Bytes of the strings held (for tests: bounded by limit entries).
  size_t Bytes() const { return bytes_; }

 private:
  struct Seen {
    std::string tool;
    std::string key;
  };
  std::map<std::string, Seen, std::less<>> keys_;
  std::deque<std::string> order_;
  size_t bytes_ = 0;
};

// The last key each (scope, tool) of a session was called with, and when:
// a call in the same turn (or session) to the same tool with another key
// soon after is a re-planned retry (the agent changed the arguments, so the
// key differs and it runs again; crewAI#5802). At most `limit` pairs, the
// oldest forgotten first. Not thread-safe: the session's mutex guards it.
class RecentKeys {
 public:
  // The key (scope, tool) was last called with, if that was another key
  // at or after now - window; then remembers `key` for the pair.
  std::optional<std::string> Note(const std::string& scope, const std::string& tool,
                                  const std::string& key, TimePoint now, Duration window,
                                  size_t limit) {
    // A turn id has no newline worth keeping apart; compacted (F11).
    const std::string pair = Remembered(scope + '\n' + tool);
    auto [it, fresh] = last_.try_emplace(pair, Last{key, now});
    std::optional<std::string> earlier;
    if (!fresh) {
      if (it->second.key != key && now - it->second.at <= window) earlier = it->second.key;
      bytes_ = bytes_ - it->second.key.size() + key.size();
      it->second = Last{key, now};
      return earlier;
    }
    bytes_ += 2 * pair.size() + key.size();
    order_.push_back(pair);
    while (order_.size() > limit) {
      auto old = last_.find(order_.front());
      bytes_ -= 2 * old->first.size() + old->second.key.size();
      last_.erase(old);
      order_.pop_front();
    }
    return earlier;
  }
  // Bytes of the strings held (for tests: bounded by limit entries).
  size_t Bytes() const { return bytes_; }

 private:
  struct Last {
    std::string key;
    TimePoint at{};
  };
  std::map<std::string, Last, std::less<>> last_;
  std::deque<std::string> order_;  // insertion order of last_'s pairs
  size_t bytes_ = 0;
};

inline std::string RetryableData(std::string_view condition) {
  return "{" + json_text::Quote(kMetaCondition) + ":" + json_text::Quote(condition) +
         R"(,"retryable":true})";
}

inline std::string ConditionData(std::string_view condition, std::string_view key) {
  return "{" + json_text::Quote(kMetaCondition) + ":" + json_text::Quote(condition) + "," +
         json_text::Quote(kMetaKey) + ":" + json_text::Quote(key) + R"(,"retryable":false})";
}

// Where a session is in its life. It only moves forward; kOpen may skip to
// kFinishing (the upstream closed first). Guarded by the session's mutex.
enum class SessionPhase {
  kOpen,       // taking calls
  kDraining,   // stopping (Stop(), or the client's end of input): no new
               // tools/call; calls in flight have [mcp] stop_grace to settle
  kClosing,    // every call settled, or the grace ran out: calls still running
               // are abandoned (outcome unknown) and the upstream is closed
  kFinishing,  // the upstream has closed and no call is left: Finish() runs
  kFinished,   // Wait() returns
};

// Why a session stops, which decides how its upstream is closed. A later
// cause outranks an earlier one (a stop signal while draining after the
// client left terminates the upstream too).
enum class StopCause {
  kNone,
  kClientLeft,  // end of input: the upstream gets EOF, as it would without
                // idemgate, and time (ChildOptions::kill_grace) to exit
  kStopped,     // McpSession::Stop (a stop signal): the upstream is
                // terminated (Channel::CloseNow), its host is about to kill
};

// The session itself: the channels' callbacks run on the channels' threads
// (Enter/Exit count them, so Detach can wait for them), gated calls on the
// worker pool. Thread-safe: everything below `mu_` is guarded by it, and
// nothing blocking (a store write, a channel send) runs under it.
class McpSession::Core : public std::enable_shared_from_this<Core> {
 public:
  Core(Channel& client, Channel& upstream, Ledger& ledger, const Config& config,
       SessionOptions options)
      : client_(client),
        upstream_(upstream),
        ledger_(ledger),
        config_(config),
        options_(std::move(options)),
        tenant_(options_.tenant.empty() ? config.mcp.tenant : options_.tenant),
        budget_(options_.budget ? options_.budget : std::make_shared<CallBudget>(kDefaultBudget)) {}

  void Start() {
    // Upstream first, so the client's first message finds it delivering.
    upstream_.Start(Callback(&Core::OnUpstreamMessage), Callback(&Core::OnUpstreamClosed));
    client_.Start(Callback(&Core::OnClientMessage), Callback(&Core::OnClientClosed));
  }

  SessionEnd Wait() {
    std::unique_lock g(mu_);
    done_cv_.wait(g, [&] { return phase_ == SessionPhase::kFinished; });
    return SessionEnd{upstream_first_, upstream_reason_, client_reason_};
  }

  bool ended() {
    std::lock_guard g(mu_);
    return phase_ == SessionPhase::kFinished;
  }

  // McpSession::Stop, and the client's end of input: starts the drain (a
  // pool task, Drain) if the session is open; a stop signal that comes after
  // the drain closed the upstream with EOF terminates it now.
  void Stop(StopCause cause);

  // Stops using the channels: wakes every waiting worker (they settle as if
  // the upstream were gone), waits for running callbacks and workers.
  void Detach() {
    {
      std::unique_lock g(mu_);
      detached_ = true;
      drain_cv_.notify_all();
      for (auto& [id, p] : pending_) {
        if (p.call) p.call->cv.notify_all();
      }
      for (auto& [id, r] : proxy_) r->cv.notify_all();
      callbacks_cv_.wait(g, [&] { return callbacks_ == 0; });
    }
    pool_.Shutdown();
  }

  // The reconcile lookup of one call (its Call::reconcile).
  Result<std::optional<Outcome>> Reconcile(const PreparedCall& p);

 private:
  bool Enter() {
    std::lock_guard g(mu_);
    if (detached_) return false;
    ++callbacks_;
    return true;
  }
  void Exit() {
    std::lock_guard g(mu_);
    if (--callbacks_ == 0) callbacks_cv_.notify_all();
  }
  // A channel callback that runs `handler` between Enter and Exit: nothing
  // once the session is detached, and Detach waits for it.
  std::function<void(std::string)> Callback(void (Core::*handler)(std::string)) {
    return [self = shared_from_this(), handler](std::string text) {
      if (self->Enter()) {
        (self.get()->*handler)(std::move(text));
        self->Exit();
      }
    };
  }

  void Log(std::string line) {
    if (options_.log) options_.log(line);
  }

  // ---- client → upstream
  void OnClientMessage(std::string text);
  void HandleClientBatch(std::string text);
  void ForwardRequest(std::string text, const Message& msg, Pending::Kind kind);
  void HandleToolCall(std::string text, Message& msg);
  bool HandleCancel(std::string_view text);  // true: forward the notification
  // Marks `p` as re-planning the earlier call of its turn and tool, if it
  // is one (RecentKeys). Under mu_, before `p` is shared.
  void NoteReplan(PreparedCall& p);
  void OnClientClosed(std::string reason);

  // ---- upstream → client
  void OnUpstreamMessage(std::string text);
  void HandleUpstreamBatch(std::string text);
  std::string RewriteToolsList(std::string text, const Message& msg);
  void OnUpstreamClosed(std::string reason);

  // ---- gated calls (worker threads, and a replay from memory on the
  // client channel's thread), run by the driver (gate/gated_call.h) with a
  // CallFront per call (gated_call.cc)
  class CallFront;
  // Begin, then the rest of the call's life.
  void RunGatedCall(const std::shared_ptr<GatedCall>& gc);
  // Answers what the ledger decided (a held decision), or executes the call
  // (on a worker only: the front waits there for the upstream).
  void Decided(const std::shared_ptr<GatedCall>& gc, Decision d, bool on_channel_thread);
  // A late answer to a call given up (its record already unknown): stored
  // at the call's fence, answered to nobody.
  void SettleLate(const std::shared_ptr<GatedCall>& gc, std::string response, Message msg);
  void Answer(GatedCall& gc, std::string response);
  // Ends a gated call's bookkeeping; the last call of a session whose
  // upstream has gone ends the session (Finish, handed to a worker when
  // `on_channel_thread`).
  void FinishCall(const std::shared_ptr<GatedCall>& gc, bool holds_budget,
                  bool on_channel_thread = false);
  // True (once) when the session has ended: the upstream is closed and no
  // gated call is left; the caller must then call Finish() outside the lock.
  bool MaybeFinishLocked();
  // Closes the client channel, then lets Wait() return.
  void Finish();
  // The stop's pool task: waits (by the ledger's clock) until no gated call
  // is in flight or [mcp] stop_grace has passed, abandons the calls still
  // running (kClosing wakes their workers, which mark them unknown) and
  // closes the upstream as `stop_cause_` says.
  void Drain();
  // The answer to a tools/call that comes once the session is stopping.
  std::string StoppingError(std::string_view id_text) const;

  std::string UpstreamGone(std::string_view id_text, std::string_view reason, bool sent) const;

  Channel& client_;
  Channel& upstream_;
  Ledger& ledger_;
  const Config& config_;
  const SessionOptions options_;
  const std::string tenant_;
  const std::shared_ptr<CallBudget> budget_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::condition_variable drain_cv_;  // a gated call finished, the upstream closed, detached
  std::condition_variable callbacks_cv_;
  // Whether a request in flight holds `id_key`: a client request of any
  // kind, or one idemgate sent itself. JSON-RPC ids are unique among
  // requests in flight; a second one would take the first one's answer (a
  // plain request's answer stored as a gated call's outcome). Under mu_.
  bool IdInUse(const std::string& id_key) const {
    return pending_.contains(id_key) || proxy_.contains(id_key);
  }
  std::string IdInUseError(const Message& msg) const {
    auto it = pending_.find(msg.id_key);
    const bool cancelled = it != pending_.end() && it->second.cancelled;
    return ErrorResponse(msg.id_text, kRpcInvalidRequest,
                         "request id " + msg.id_text + " is already in use by " +
                             (cancelled ? "a cancelled request the tool server has not answered "
                                          "yet"
                                        : "a request in progress") +
                             "; use a new id");
  }
  std::map<std::string, Pending> pending_;  // by client id key
  CallKeys call_keys_;                      // the call ids seen
  RecentKeys recent_keys_;  // the last key of each (turn, tool), for re-planned retries
  std::map<std::string, std::shared_ptr<ProxyRequest>> proxy_;  // by proxy id key
  std::map<std::string, ToolInfo> tools_;  // what tools/list said, by tool name
  std::string host_;  // the client's clientInfo.name from initialize, for the metrics
  uint64_t next_proxy_id_ = 1;
  // Gated calls and late settlements not finished. A stop closes the
  // upstream only once this is 0 (or the grace ran out), so everything the
  // client sent before it left reaches the upstream first, as it would
  // without the proxy.
  int active_calls_ = 0;
  int callbacks_ = 0;
  SessionPhase phase_ = SessionPhase::kOpen;
  StopCause stop_cause_ = StopCause::kNone;
  bool client_closed_ = false;    // the client channel reported on_closed
  bool upstream_closed_ = false;  // the upstream channel reported on_closed
  bool upstream_first_ = false;   // ... while the session was open
  bool detached_ = false;         // the destructor runs: channels are no longer used
  std::string client_reason_;
  std::string upstream_reason_;

  WorkerPool pool_;  // last: its threads use everything above
};

}  // namespace idem::mcp
