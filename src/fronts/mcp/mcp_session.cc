#include "fronts/mcp/mcp_session.h"

#include <boost/json.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "core/fault_point.h"
#include "core/worker_pool.h"
#include "fronts/mcp/json_rpc.h"
#include "json/json_text.h"
#include "fronts/mcp/reconcile.h"
#include "fronts/mcp/tool_gate.h"

namespace idem::mcp {

bool CallBudget::TryAcquire() {
  size_t used = used_.load();
  while (used < max_) {
    if (used_.compare_exchange_weak(used, used + 1)) return true;
  }
  return false;
}

void CallBudget::Release() { used_.fetch_sub(1); }

namespace {

using json_text::Quote;

constexpr size_t kDefaultBudget = 256;

// A gated tools/call from its arrival to its answer. Guarded by the
// session's mutex, except `prepared`, which is immutable once shared.
struct GatedCall {
  std::string id_text;
  std::string id_key;
  PreparedCall prepared;
  std::condition_variable cv;    // signalled on answer, cancel, upstream gone
  bool forwarded = false;        // sent upstream (a cancel is then forwarded too)
  bool awaiting_forward = true;  // counted in Core::unforwarded_
  bool cancelled = false;        // the client sent notifications/cancelled for it
  TimePoint cancelled_at{};
  std::optional<std::string> response;  // the upstream's answer, as received
  std::optional<Message> response_msg;
  // The worker gave up after the cancel grace and marked the record
  // unknown; a late answer still settles it with `decision`'s fence.
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
};

// The call ids a session has seen (config.mcp.call_id), each with its tool
// and key, the oldest forgotten first past a limit. Not thread-safe: the
// session's mutex guards it.
class CallKeys {
 public:
  // The key `call_id` was first seen with, if that was a call to `tool`.
  std::optional<std::string> KeyOf(std::string_view call_id, std::string_view tool) const {
    auto it = keys_.find(call_id);
    if (it == keys_.end() || it->second.tool != tool) return std::nullopt;
    return it->second.key;
  }
  // Remembers the first key `call_id` came with; keeps at most `limit`.
  void Remember(const std::string& call_id, const std::string& tool, const std::string& key,
                size_t limit) {
    if (!keys_.try_emplace(call_id, Seen{tool, key}).second) return;
    order_.push_back(call_id);
    while (order_.size() > limit) {
      keys_.erase(order_.front());
      order_.pop_front();
    }
  }

 private:
  struct Seen {
    std::string tool;
    std::string key;
  };
  std::map<std::string, Seen, std::less<>> keys_;
  std::deque<std::string> order_;
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
    const std::string pair = scope + '\n' + tool;  // a turn id has no newline worth keeping apart
    auto [it, fresh] = last_.try_emplace(pair, Last{key, now});
    std::optional<std::string> earlier;
    if (!fresh) {
      if (it->second.key != key && now - it->second.at <= window) earlier = it->second.key;
      it->second = Last{key, now};
      return earlier;
    }
    order_.push_back(pair);
    while (order_.size() > limit) {
      last_.erase(order_.front());
      order_.pop_front();
    }
    return earlier;
  }

 private:
  struct Last {
    std::string key;
    TimePoint at{};
  };
  std::map<std::string, Last, std::less<>> last_;
  std::deque<std::string> order_;  // insertion order of last_'s pairs
};

std::string RetryableData(std::string_view condition) {
  return "{" + Quote(kMetaCondition) + ":" + Quote(condition) + R"(,"retryable":true})";
}

std::string ConditionData(std::string_view condition, std::string_view key) {
  return "{" + Quote(kMetaCondition) + ":" + Quote(condition) + "," + Quote(kMetaKey) + ":" +
         Quote(key) + R"(,"retryable":false})";
}

}  // namespace

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
    auto on_client = [self = shared_from_this()](std::string message) {
      if (self->Enter()) {
        self->OnClientMessage(std::move(message));
        self->Exit();
      }
    };
    auto on_client_closed = [self = shared_from_this()](std::string reason) {
      if (self->Enter()) {
        self->OnClientClosed(std::move(reason));
        self->Exit();
      }
    };
    auto on_upstream = [self = shared_from_this()](std::string message) {
      if (self->Enter()) {
        self->OnUpstreamMessage(std::move(message));
        self->Exit();
      }
    };
    auto on_upstream_closed = [self = shared_from_this()](std::string reason) {
      if (self->Enter()) {
        self->OnUpstreamClosed(std::move(reason));
        self->Exit();
      }
    };
    // Upstream first, so the client's first message finds it delivering.
    upstream_.Start(std::move(on_upstream), std::move(on_upstream_closed));
    client_.Start(std::move(on_client), std::move(on_client_closed));
  }

  SessionEnd Wait() {
    std::unique_lock g(mu_);
    done_cv_.wait(g, [&] { return finished_; });
    return SessionEnd{upstream_first_, upstream_reason_, client_reason_};
  }

  bool ended() {
    std::lock_guard g(mu_);
    return finished_;
  }

  // Stops using the channels: wakes every waiting worker (they settle as if
  // the upstream were gone), waits for running callbacks and workers.
  void Detach() {
    {
      std::unique_lock g(mu_);
      detached_ = true;
      for (auto& [id, p] : pending_) {
        if (p.call) p.call->cv.notify_all();
      }
      for (auto& [id, r] : proxy_) r->cv.notify_all();
      callbacks_cv_.wait(g, [&] { return callbacks_ == 0; });
    }
    pool_.Shutdown();
  }

  // The reconcile lookup of one call (ReconcileLookup for the ledger hook).
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

  // ---- gated calls (worker threads)
  void RunGatedCall(const std::shared_ptr<GatedCall>& gc);
  std::string Execute(GatedCall& gc, const Decision& d);
  std::string Settle(GatedCall& gc, const Decision& d, std::string response, const Message& msg,
                     bool answer);
  void SettleLate(const std::shared_ptr<GatedCall>& gc, std::string response, Message msg);
  void Answer(GatedCall& gc, std::string response);
  // `gc` is forwarded or will never be: closes the upstream if the client
  // left and nothing else is waiting to be forwarded.
  void DoneForwarding(GatedCall& gc);
  // The answer may have happened: the record becomes unknown (if this call
  // claimed one) and, if `answer`, the client hears why.
  void MarkUnknown(GatedCall& gc, const Decision& d, std::string_view why, bool answer);
  void ReleaseQuietly(const Call& call, const Decision& d);
  void FinishCall(const std::shared_ptr<GatedCall>& gc, bool holds_budget);
  // True (once) when the session has ended: the upstream is closed and no
  // gated call is left; the caller must then call Finish() outside the lock.
  bool MaybeFinishLocked();
  // Closes the client channel, then lets Wait() return.
  void Finish();

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
  std::condition_variable callbacks_cv_;
  // Whether a request in flight holds `id_key`: a client request of any
  // kind, or one idemgate sent itself. JSON-RPC ids are unique among
  // requests in flight; a second one would take the first one's answer (a
  // plain request's answer stored as a gated call's outcome). Under mu_.
  bool IdInUse(const std::string& id_key) const {
    return pending_.contains(id_key) || proxy_.contains(id_key);
  }
  static std::string IdInUseError(const Message& msg) {
    return ErrorResponse(msg.id_text, kRpcInvalidRequest,
                         "request id " + msg.id_text +
                             " is already in use by a request in progress; use a new id");
  }
  std::map<std::string, Pending> pending_;                      // by client id key
  CallKeys call_keys_;                                          // the call ids seen
  RecentKeys recent_keys_;  // the last key of each (turn, tool), for re-planned retries
  std::map<std::string, std::shared_ptr<ProxyRequest>> proxy_;  // by proxy id key
  std::map<std::string, ToolInfo> tools_;  // what tools/list said, by tool name
  std::string host_;  // the client's clientInfo.name from initialize, for the metrics
  uint64_t next_proxy_id_ = 1;
  int active_calls_ = 0;  // gated calls and late settlements not finished
  // Gated calls admitted but not yet forwarded or settled: the upstream's
  // stdin is closed only after them, so everything the client sent before
  // leaving reaches the upstream first, as it would without the proxy.
  int unforwarded_ = 0;
  bool upstream_close_due_ = false;  // the client left; close the upstream when unforwarded_ is 0
  int callbacks_ = 0;
  bool client_closed_ = false;
  bool upstream_closed_ = false;
  bool upstream_first_ = false;
  bool detached_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  std::string client_reason_;
  std::string upstream_reason_;

  WorkerPool pool_;  // last: its threads use everything above
};

namespace {

// ReconcileLookup for one call of one session.
class SessionLookup final : public ReconcileLookup {
 public:
  explicit SessionLookup(std::function<Result<std::optional<Outcome>>()> fn) : fn_(std::move(fn)) {}
  Result<std::optional<Outcome>> Reconcile(const Call&) override { return fn_(); }

 private:
  std::function<Result<std::optional<Outcome>>()> fn_;
};

}  // namespace

// ---------------------------------------------------------------------------
// client → upstream

void McpSession::Core::OnClientMessage(std::string text) {
  auto parsed = ParseMessage(text);
  if (!parsed) {
    std::string detail = parsed.error().message;
    if (parsed.error().code == ErrorCode::kResourceExhausted) {
      detail += "; tool arguments may nest at most " + std::to_string(config_.limits.max_depth) +
                " levels (limits.max_depth)";
    } else {
      detail += "; send one JSON-RPC message per line";
    }
    client_.Send(ParseErrorResponse(RecoverIdText(text), detail));
    return;
  }
  Message& msg = *parsed;
  // A peer drops a message that is not JSON-RPC without a word, and the
  // client would wait for ever: answer it here, and forward nothing.
  std::optional<std::string> problem;
  if (msg.kind == Message::Kind::kBatch) {
    if (json_text::View(text).Elements().empty()) problem = "an empty batch";
  } else if (!json_text::IsObject(text)) {
    problem = JsonRpcEnvelopeProblem(json_text::View(text));
  } else {
    problem = JsonRpcEnvelopeProblem(text, msg.members);
  }
  if (problem) {
    client_.Send(ErrorResponse(RecoverIdText(text), kRpcInvalidRequest,
                               "Invalid Request: " + *problem + "; nothing was forwarded"));
    return;
  }
  switch (msg.kind) {
    case Message::Kind::kBatch:
      HandleClientBatch(std::move(text));
      return;
    case Message::Kind::kRequest:
      if (msg.method == "initialize") {
        std::lock_guard g(mu_);
        host_ = ClientNameOf(text);
      }
      if (msg.method == "tools/call") {
        HandleToolCall(std::move(text), msg);
      } else {
        ForwardRequest(
            std::move(text), msg,
            msg.method == "tools/list" ? Pending::Kind::kToolsList : Pending::Kind::kPlain);
      }
      return;
    case Message::Kind::kNotification:
      if (msg.method == "notifications/cancelled" && !HandleCancel(text)) return;
      upstream_.Send(std::move(text));
      return;
    default:  // responses to server-to-client requests, and anything else
      upstream_.Send(std::move(text));
      return;
  }
}

// A batch (MCP 2025-03-26) passes through whole unless it holds a request the
// proxy intercepts; then its elements are handled one by one (and answered
// one by one, which JSON-RPC clients match by id).
void McpSession::Core::HandleClientBatch(std::string text) {
  auto elements = json_text::ArrayElements(text);
  bool intercept = false;
  for (size_t i = 0; elements && i < elements->size() && !intercept; ++i) {
    const json_text::View e((*elements)[i].In(text));
    // A member sent twice counts as sent: the element is then handled (and
    // refused) on its own, never forwarded ungated.
    const json_text::View id = e["id"];
    const json_text::View method = e["method"];
    const std::optional<std::string> name = method.string();
    intercept = (id.present() || id.ambiguous()) &&
                (method.ambiguous() || name == "tools/call" || name == "tools/list");
  }
  if (!intercept) {
    upstream_.Send(std::move(text));
    return;
  }
  for (const json_text::Span& e : *elements) OnClientMessage(std::string(e.In(text)));
}

std::string McpSession::Core::UpstreamGone(std::string_view id_text, std::string_view reason,
                                           bool sent) const {
  std::string message = sent
                            ? "The tool server went away before answering (" + std::string(reason) +
                                  "); the request may or may not have been processed."
                            : "The tool server is not available (" + std::string(reason) +
                                  "); the request was not sent.";
  return ErrorResponse(id_text, kRpcUpstreamUnavailable, message,
                       sent ? R"({"retryable":false})" : RetryableData("upstream_unavailable"));
}

void McpSession::Core::ForwardRequest(std::string text, const Message& msg, Pending::Kind kind) {
  {
    std::unique_lock g(mu_);
    if (upstream_closed_ || detached_) {
      std::string reason = upstream_reason_;
      g.unlock();
      client_.Send(UpstreamGone(msg.id_text, reason, false));
      return;
    }
    if (IdInUse(msg.id_key)) {
      g.unlock();
      client_.Send(IdInUseError(msg));
      return;
    }
    pending_[msg.id_key] = Pending{kind, msg.id_text, nullptr};
  }
  if (!upstream_.Send(std::move(text))) {
    std::unique_lock g(mu_);
    auto it = pending_.find(msg.id_key);
    if (it == pending_.end() || it->second.kind != kind) return;  // answered by OnUpstreamClosed
    pending_.erase(it);
    std::string reason = upstream_reason_.empty() ? "its connection is closed" : upstream_reason_;
    g.unlock();
    client_.Send(UpstreamGone(msg.id_text, reason, false));
  }
}

void McpSession::Core::HandleToolCall(std::string text, Message& msg) {
  // What the HTTP front carried in from the request's headers, out of the
  // bytes before anything is forwarded.
  const std::optional<RequestHeaders> headers = TakeRequestHeaders(text, msg);
  std::optional<ToolInfo> info;
  auto params = json_text::FindMember(msg.members, "params");
  if (std::optional<std::string> name =
          params && *params ? json_text::View((*params)->value.In(text))["name"].string()
                            : std::nullopt) {
    std::lock_guard g(mu_);
    if (auto it = tools_.find(*name); it != tools_.end()) info = it->second;
  }
  std::string host;
  {
    std::lock_guard g(mu_);
    host = host_;
  }
  PlanContext context{tenant_, options_.scope, &options_.env, host, nullptr,
                      headers ? &*headers : nullptr};
  if (config_.mcp.max_call_ids > 0) {
    context.key_of_call = [this](std::string_view call_id, std::string_view tool) {
      std::lock_guard g(mu_);
      return call_keys_.KeyOf(call_id, tool);
    };
  }
  CallPlan plan = PlanToolCall(text, msg, config_, context, info ? &*info : nullptr);
  switch (plan.kind) {
    case CallPlan::Kind::kPassThrough:
      ForwardRequest(std::move(text), msg, Pending::Kind::kPlain);
      return;
    case CallPlan::Kind::kAnswer:
      if (options_.verbose) Log("tools/call " + plan.tool + ": refused before claiming");
      client_.Send(std::move(plan.answer));
      return;
    case CallPlan::Kind::kGated:
      break;
  }
  if (!budget_->TryAcquire()) {
    client_.Send(ErrorResponse(msg.id_text, kRpcOverloaded,
                               "idemgate already has " + std::to_string(budget_->max()) +
                                   " tool calls in progress, its limit; this call was not "
                                   "executed. Retry it shortly.",
                               RetryableData("overloaded")));
    return;
  }
  auto gc = std::make_shared<GatedCall>();
  gc->id_text = msg.id_text;
  gc->id_key = msg.id_key;
  gc->prepared = std::move(plan.prepared);
  {
    std::unique_lock g(mu_);
    std::optional<std::string> refusal;
    if (upstream_closed_ || detached_) {
      refusal = UpstreamGone(msg.id_text, upstream_reason_, false);
    } else if (IdInUse(msg.id_key)) {
      refusal = IdInUseError(msg);
    }
    if (refusal) {
      g.unlock();
      budget_->Release();
      client_.Send(std::move(*refusal));
      return;
    }
    NoteReplan(gc->prepared);
    pending_[msg.id_key] = Pending{Pending::Kind::kGatedCall, msg.id_text, gc};
    if (!gc->prepared.call_id.empty()) {
      call_keys_.Remember(gc->prepared.call_id, gc->prepared.call.tool, gc->prepared.derived_key,
                          config_.mcp.max_call_ids);
    }
    ++active_calls_;
    ++unforwarded_;
  }
  if (!pool_.Submit([self = shared_from_this(), gc] { self->RunGatedCall(gc); })) {
    FinishCall(gc, true);  // shutting down: nothing was claimed
  }
}

void McpSession::Core::NoteReplan(PreparedCall& p) {
  if (!p.replan_candidate || config_.mcp.replan_window.count() <= 0 ||
      config_.mcp.max_replan_pairs == 0) {
    return;
  }
  if (auto earlier =
          recent_keys_.Note(p.call.turn, p.call.tool, p.call.id.key, ledger_.clock().Now(),
                            config_.mcp.replan_window, config_.mcp.max_replan_pairs)) {
    p.call.replanned_from = std::move(*earlier);
  }
}

bool McpSession::Core::HandleCancel(std::string_view text) {
  const json_text::View request_id = json_text::View(text)["params"]["requestId"];
  if (!request_id.present()) return true;
  std::lock_guard g(mu_);
  auto it = pending_.find(IdKeyOfText(request_id.text()));
  if (it == pending_.end()) return true;
  if (it->second.kind != Pending::Kind::kGatedCall) {
    pending_.erase(it);  // the client no longer expects an answer
    return true;
  }
  GatedCall& gc = *it->second.call;
  if (!gc.cancelled) {
    gc.cancelled = true;
    gc.cancelled_at = ledger_.clock().Now();
    gc.cv.notify_all();
  }
  return gc.forwarded;  // the upstream never saw a call that was not forwarded
}

void McpSession::Core::OnClientClosed(std::string reason) {
  bool close_now;
  {
    std::lock_guard g(mu_);
    client_closed_ = true;
    client_reason_ = std::move(reason);
    close_now = unforwarded_ == 0;
    upstream_close_due_ = !close_now;
  }
  // EOF to the upstream; calls it is running still finish and are stored,
  // and answered if the client still reads.
  if (close_now) upstream_.Close();
}

void McpSession::Core::DoneForwarding(GatedCall& gc) {
  bool close_now = false;
  {
    std::lock_guard g(mu_);
    if (!gc.awaiting_forward) return;
    gc.awaiting_forward = false;
    --unforwarded_;
    if (upstream_close_due_ && unforwarded_ == 0) {
      upstream_close_due_ = false;
      close_now = true;
    }
  }
  if (close_now) upstream_.Close();
}

// ---------------------------------------------------------------------------
// upstream → client

void McpSession::Core::OnUpstreamMessage(std::string text) {
  auto parsed = ParseMessage(text);
  if (!parsed) {
    Log("upstream sent a message that is " + parsed.error().message + "; passed through");
    client_.Send(std::move(text));
    return;
  }
  Message& msg = *parsed;
  if (msg.kind == Message::Kind::kBatch) {
    HandleUpstreamBatch(std::move(text));
    return;
  }
  if (msg.kind != Message::Kind::kResult && msg.kind != Message::Kind::kError) {
    client_.Send(std::move(text));  // server-to-client requests and notifications
    return;
  }
  std::unique_lock g(mu_);
  if (auto p = proxy_.find(msg.id_key); p != proxy_.end()) {
    p->second->response = std::move(text);
    p->second->cv.notify_all();
    proxy_.erase(p);
    return;
  }
  auto it = pending_.find(msg.id_key);
  if (it == pending_.end()) {
    g.unlock();
    client_.Send(std::move(text));
    return;
  }
  switch (it->second.kind) {
    case Pending::Kind::kPlain:
      pending_.erase(it);
      g.unlock();
      client_.Send(std::move(text));
      return;
    case Pending::Kind::kToolsList:
      pending_.erase(it);
      g.unlock();
      client_.Send(RewriteToolsList(std::move(text), msg));
      return;
    case Pending::Kind::kGatedCall: {
      std::shared_ptr<GatedCall> gc = it->second.call;
      if (!gc->forwarded) {  // an answer to a request the upstream never got
        g.unlock();
        client_.Send(std::move(text));
        return;
      }
      if (gc->abandoned) {
        pending_.erase(it);
        ++active_calls_;
        g.unlock();
        auto late = [self = shared_from_this(), gc, text = std::move(text),
                     msg = std::move(msg)]() mutable {
          self->SettleLate(gc, std::move(text), std::move(msg));
        };
        if (!pool_.Submit(std::move(late))) FinishCall(gc, false);
        return;
      }
      gc->response = std::move(text);
      gc->response_msg = std::move(msg);
      gc->cv.notify_all();
      return;
    }
  }
}

void McpSession::Core::HandleUpstreamBatch(std::string text) {
  auto elements = json_text::ArrayElements(text);
  bool intercept = false;
  if (elements) {
    std::lock_guard g(mu_);
    for (const json_text::Span& span : *elements) {
      const json_text::View e(span.In(text));
      const json_text::View id = e["id"];
      if (!id.present() || e["method"].present()) continue;
      const std::string key = IdKeyOfText(id.text());
      auto it = pending_.find(key);
      if (proxy_.contains(key) ||
          (it != pending_.end() && it->second.kind != Pending::Kind::kPlain)) {
        intercept = true;
      }
    }
  }
  if (!intercept) {
    client_.Send(std::move(text));
    return;
  }
  for (const json_text::Span& e : *elements) OnUpstreamMessage(std::string(e.In(text)));
}

std::string McpSession::Core::RewriteToolsList(std::string text, const Message& msg) {
  if (msg.kind != Message::Kind::kResult) return text;
  auto result = json_text::FindMember(msg.members, "result");
  if (!result || !*result) return text;
  const json_text::Span span = (*result)->value;
  std::map<std::string, ToolInfo> learned;
  auto rewritten = RewriteToolsListResult(span.In(text), config_, learned);
  if (!rewritten) {
    Log("could not rewrite a tools/list result (" + rewritten.error().message +
        "); passed it through unchanged");
    return text;
  }
  {
    std::lock_guard g(mu_);
    for (auto& [name, info] : learned) tools_[name] = info;
  }
  if (options_.on_tools_listed) options_.on_tools_listed(DescribeGating(config_, learned));
  std::string out = text.substr(0, span.begin);
  out += *rewritten;
  out.append(text, span.end);
  return out;
}

void McpSession::Core::OnUpstreamClosed(std::string reason) {
  std::vector<Pending> unanswered;
  bool close_client = false;
  bool client_there = false;
  {
    std::lock_guard g(mu_);
    if (upstream_closed_) return;
    upstream_closed_ = true;
    upstream_reason_ = reason;
    client_there = !client_closed_;
    upstream_first_ = client_there;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.kind == Pending::Kind::kGatedCall) {
        it->second.call->cv.notify_all();  // its worker answers it
        it = it->second.call->abandoned ? pending_.erase(it) : std::next(it);
        continue;
      }
      unanswered.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
    for (auto& [id, r] : proxy_) r->cv.notify_all();
    ++active_calls_;  // the session may not end before these answers are sent
  }
  if (client_there) Log("the upstream went away: " + reason);
  for (const Pending& p : unanswered) client_.Send(UpstreamGone(p.id_text, reason, true));
  {
    std::lock_guard g(mu_);
    --active_calls_;
    close_client = MaybeFinishLocked();
  }
  if (close_client) Finish();
}

// ---------------------------------------------------------------------------
// gated calls

bool McpSession::Core::MaybeFinishLocked() {
  if (finishing_ || !upstream_closed_ || active_calls_ > 0) return false;
  finishing_ = true;
  return true;
}

void McpSession::Core::Finish() {
  client_.Close();
  {
    std::lock_guard g(mu_);
    finished_ = true;
    done_cv_.notify_all();
  }
  if (options_.on_ended) options_.on_ended();
}

void McpSession::Core::FinishCall(const std::shared_ptr<GatedCall>& gc, bool holds_budget) {
  DoneForwarding(*gc);
  bool close_client;
  {
    std::lock_guard g(mu_);
    if (holds_budget && !gc->abandoned) {
      auto it = pending_.find(gc->id_key);
      if (it != pending_.end() && it->second.call == gc) pending_.erase(it);
    }
    --active_calls_;
    close_client = MaybeFinishLocked();
  }
  if (holds_budget) budget_->Release();
  if (close_client) Finish();
}

void McpSession::Core::Answer(GatedCall& gc, std::string response) {
  {
    std::lock_guard g(mu_);
    if (gc.cancelled) return;  // the client no longer expects an answer
  }
  FaultPoint("before_reply");
  client_.Send(std::move(response));
}

void McpSession::Core::ReleaseQuietly(const Call& call, const Decision& d) {
  if (auto r = ledger_.Release(call, d); !r) {
    Log("could not release " + call.id.key + " (" + r.error().ToString() +
        "); it stays claimed until its lease runs out");
  }
}

void McpSession::Core::RunGatedCall(const std::shared_ptr<GatedCall>& gc) {
  const Call& call = gc->prepared.call;
  SessionLookup lookup([this, gc] { return Reconcile(gc->prepared); });
  Result<Decision> begun = [&] {
    ReconcileScope scope(&lookup);
    return ledger_.Begin(call);
  }();
  std::string note;
  if (!begun) {
    const Error& e = begun.error();
    if (e.code == ErrorCode::kUnavailable || e.code == ErrorCode::kAborted) {
      Answer(*gc, ErrorResponse(gc->id_text, kRpcStoreUnavailable,
                                "idemgate could not reach its store (" + e.message +
                                    "), so the tool call was not executed. It is safe to retry "
                                    "it once the store is reachable again: nothing ran, and "
                                    "idemgate takes back any claim this attempt left in the "
                                    "store, so the retry is not taken for a repeat.",
                                RetryableData("store_unavailable")));
    } else {
      Answer(*gc, ErrorResponse(gc->id_text, kRpcInternalError,
                                "idemgate could not claim the tool call (" + e.ToString() +
                                    "), so it was not executed."));
    }
    note = "refused: " + e.ToString();
  } else {
    const Decision& d = *begun;
    const gate::Answer a = gate::AnswerFor(d);
    const bool stateless = gc->prepared.stateless;
    note = a.note;
    switch (a.kind) {
      case gate::Answer::Kind::kRun:
        note = Execute(*gc, d);
        break;
      case gate::Answer::Kind::kReplay:
      case gate::Answer::Kind::kNoOutcome:
        if (auto result = ReplayResult(d, a, config_)) {
          Answer(*gc, ResultResponse(gc->id_text, CompleteResult(std::move(*result), stateless)));
        } else {
          Answer(*gc, ErrorResponse(gc->id_text, kRpcInternalError,
                                    "idemgate could not read the stored result of an identical "
                                    "earlier call (" +
                                        result.error().message +
                                        "); the action was not performed again.",
                                    ConditionData("unreadable", call.id.key)));
          note = "replay failed: " + result.error().message;
        }
        break;
      case gate::Answer::Kind::kTooLarge:
        Answer(*gc,
               ResultResponse(gc->id_text, CompleteResult(TooLargeResult(call, a), stateless)));
        break;
      case gate::Answer::Kind::kInProgress:
        Answer(*gc,
               ResultResponse(gc->id_text, CompleteResult(InProgressResult(call, a), stateless)));
        break;
      case gate::Answer::Kind::kUnknown:
        Answer(*gc, ResultResponse(gc->id_text,
                                   CompleteResult(OutcomeUnknownResult(call, a), stateless)));
        break;
      case gate::Answer::Kind::kDrift:
        Answer(*gc, ResultResponse(gc->id_text,
                                   CompleteResult(DriftResult(call, d, a, gc->prepared.gate.mode),
                                                  stateless)));
        break;
    }
  }
  if (options_.verbose) {
    const auto ms = (ledger_.clock().Now() - (begun ? begun->started_at : ledger_.clock().Now()));
    Log("tools/call " + call.tool + " key=" + call.id.key + ": " + note + " (" +
        std::to_string(ms.count()) + " ms)");
  }
  FinishCall(gc, true);
}

std::string McpSession::Core::Execute(GatedCall& gc, const Decision& d) {
  const Call& call = gc.prepared.call;
  const bool claimed = d.kind == Decision::Kind::kExecute;
  {
    std::unique_lock g(mu_);
    std::string why;
    const bool gone = upstream_closed_ || detached_;
    if (gc.cancelled) {
      why = "cancelled by the client before it was sent";
    } else if (gone) {
      why = "the upstream is gone";
    }
    if (!why.empty()) {
      const bool answer = gone && !gc.cancelled;
      std::string reason = upstream_reason_;
      g.unlock();
      ReleaseQuietly(call, d);
      if (answer) client_.Send(UpstreamGone(gc.id_text, reason, false));
      return "released: " + why;
    }
    gc.forwarded = true;
  }

  Ledger::LeaseGuard lease;
  if (claimed) lease = ledger_.KeepAlive(call, d.fence);
  const bool sent = upstream_.Send(gc.prepared.forward);
  if (sent) FaultPoint("after_send");
  DoneForwarding(gc);
  if (!sent) {
    lease = Ledger::LeaseGuard();
    ReleaseQuietly(call, d);
    Answer(gc, UpstreamGone(gc.id_text, "its connection is closed", false));
    return "released: not sent, the upstream is closed";
  }

  std::optional<std::string> response;
  std::optional<Message> response_msg;
  bool cancelled, gone;
  std::string reason;
  {
    std::unique_lock g(mu_);
    Clock& clock = ledger_.clock();
    while (!gc.response && !upstream_closed_ && !detached_) {
      if (gc.cancelled) {
        const TimePoint deadline = gc.cancelled_at + options_.cancel_grace;
        if (clock.Now() >= deadline) break;
        clock.WaitUntil(gc.cv, g, deadline);
      } else {
        gc.cv.wait(g);
      }
    }
    response = std::move(gc.response);
    response_msg = std::move(gc.response_msg);
    gc.response.reset();
    cancelled = gc.cancelled;
    gone = upstream_closed_ || detached_;
    reason = upstream_reason_.empty() ? "the proxy is shutting down" : upstream_reason_;
    if (!response && !gone) {  // cancelled and no answer within the grace
      gc.abandoned = true;
      gc.decision = d;
    }
  }
  lease = Ledger::LeaseGuard();  // stop renewing before the final write
  if (response) FaultPoint("after_answer");

  if (!response) {
    MarkUnknown(gc, d, "the tool server went away before answering (" + reason + ")", !cancelled);
    return gone ? "outcome unknown: " + reason
                : "outcome unknown: cancelled and no answer within the grace period";
  }
  return Settle(gc, d, std::move(*response), *response_msg, !cancelled);
}

void McpSession::Core::MarkUnknown(GatedCall& gc, const Decision& d, std::string_view why,
                                   bool answer) {
  const Call& call = gc.prepared.call;
  if (d.kind == Decision::Kind::kExecute) {
    if (auto m = ledger_.MarkUnknown(call, d); !m) {
      Log("could not mark " + call.id.key + " unknown: " + m.error().ToString());
    }
  }
  if (!answer) return;
  // A condition, like every idempotency condition: a tool result the model
  // reads (docs/DESIGN.md §6.1), not a transport error a host may hide.
  Answer(gc, ResultResponse(gc.id_text,
                            CompleteResult(UnansweredResult(call, why), gc.prepared.stateless)));
}

std::string McpSession::Core::Settle(GatedCall& gc, const Decision& d, std::string response,
                                     const Message& msg, bool answer) {
  const Call& call = gc.prepared.call;
  if (msg.kind == Message::Kind::kError && options_.classify_delivery) {
    const UpstreamDelivery delivery = options_.classify_delivery(response);
    if (delivery != UpstreamDelivery::kAnswered) {
      std::string detail = "the request could not be delivered";
      if (auto message = json_text::View(response)["error"]["message"].string()) {
        detail = std::move(*message);
      }
      if (delivery == UpstreamDelivery::kMaybeSent) {
        if (gc.abandoned) return "outcome unknown: " + detail;  // already marked
        MarkUnknown(gc, d, "no answer came back (" + detail + ")", answer);
        return "outcome unknown: " + detail;
      }
      ReleaseQuietly(call, d);
      if (answer) Answer(gc, UpstreamGone(gc.id_text, detail, false));
      return "released: not delivered: " + detail;
    }
  }
  ToolAnswer a = ClassifyToolAnswer(response, msg);
  const bool outcome =
      a.kind == Execution::Kind::kSuccess || a.kind == Execution::Kind::kToolError;
  if (gc.abandoned && a.kind == Execution::Kind::kMaybeSent) {
    return "outcome unknown: " + a.why;  // already marked unknown
  }
  // Persist before acknowledging: the client sees the result only once it
  // is stored. An answer that is not an outcome (released, or unknown: the
  // server's error as it was) goes to the client whatever the store said.
  auto settled = ledger_.Settle(call, d, Execution{a.kind, std::move(a.body)});
  if (!settled && outcome) {
    if (answer) {
      Answer(gc, ErrorResponse(gc.id_text, kRpcOutcomeNotStored,
                               "The tool ran, but idemgate could not store its result (" +
                                   settled.error().message +
                                   "), so the result is withheld. The action has probably "
                                   "happened: do not repeat it blindly. An operator can check "
                                   "with `idemgate inspect " +
                                   call.id.key + "`.",
                               ConditionData("not_stored", call.id.key)));
    }
    return "executed, but not stored: " + settled.error().ToString();
  }
  if (!settled) Log("could not settle " + call.id.key + ": " + settled.error().ToString());
  if (answer) Answer(gc, std::move(response));
  if (d.kind == Decision::Kind::kPassThrough) {
    return d.observed ? "executed (observe mode)" : "executed unguarded (store down)";
  }
  if (!settled) return "not settled: " + a.why;
  switch (settled->kind) {
    case Settlement::Kind::kStored:
      return "executed: " + a.why + ", stored";
    case Settlement::Kind::kReleased:
      return "released: " + a.why;
    case Settlement::Kind::kUnknown:
      return "outcome unknown: " + a.why + " (the tool may have run)";
  }
  return a.why;
}

void McpSession::Core::SettleLate(const std::shared_ptr<GatedCall>& gc, std::string response,
                                  Message msg) {
  std::string note = Settle(*gc, gc->decision, std::move(response), msg, false);
  Log("tools/call " + gc->prepared.call.tool + " key=" + gc->prepared.call.id.key +
      ": a late answer after cancellation settled the record (" + note + ")");
  FinishCall(gc, false);
}

Result<std::optional<Outcome>> McpSession::Core::Reconcile(const PreparedCall& p) {
  const Call& call = p.call;
  if (!p.reconcile_tool) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "no reconcile tool is configured for " + call.tool);
  }
  auto request = std::make_shared<ProxyRequest>();
  std::string id;
  {
    std::lock_guard g(mu_);
    if (upstream_closed_ || detached_) {
      return MakeError(ErrorCode::kUnavailable, "the upstream is gone; cannot reconcile");
    }
    // Its own namespace ("idemgate-reconcile-N"; the stateless HTTP front
    // rewrites client ids to "idemgate-client-N"), and never an id a client
    // request in flight holds, so no answer is taken for another's.
    do {
      id = "idemgate-reconcile-" + std::to_string(next_proxy_id_++);
    } while (IdInUse("s:" + id));
    proxy_["s:" + id] = request;
  }
  std::string text = R"({"jsonrpc":"2.0","id":)" + Quote(id) +
                     R"(,"method":"tools/call","params":{"name":)" + Quote(*p.reconcile_tool) +
                     R"(,"arguments":)" + p.forward_arguments + R"(,"_meta":{)" +
                     Quote(kMetaIdempotencyKey) + ":" + Quote(p.forward_key) + "}}}";
  std::optional<std::string> response;
  if (upstream_.Send(std::move(text))) {
    std::unique_lock g(mu_);
    Clock& clock = ledger_.clock();
    const TimePoint deadline = clock.Now() + options_.reconcile_timeout;
    while (!request->response && !upstream_closed_ && !detached_ && clock.Now() < deadline) {
      clock.WaitUntil(request->cv, g, deadline);
    }
    response = std::move(request->response);
  }
  {
    std::lock_guard g(mu_);
    proxy_.erase("s:" + id);
  }
  if (!response) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "the reconcile tool " + *p.reconcile_tool + " did not answer");
  }
  auto msg = ParseMessage(*response);
  if (!msg) {
    return MakeError(ErrorCode::kUnavailable, "the reconcile tool " + *p.reconcile_tool +
                                                  " answered unreadably: " + msg.error().message);
  }
  LookupAnswer a = ClassifyLookupAnswer(*response, *msg);
  switch (a.verdict) {
    case gate::LookupVerdict::kFound:
      return std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, std::move(a.body)});
    case gate::LookupVerdict::kNotFound:
      return std::optional<Outcome>();
    case gate::LookupVerdict::kCannotTell:
      break;
  }
  return MakeError(ErrorCode::kUnavailable,
                   "the reconcile tool " + *p.reconcile_tool + " cannot tell: " + a.why);
}

// ---------------------------------------------------------------------------

McpSession::McpSession(Channel& client, Channel& upstream, Ledger& ledger, const Config& config,
                       SessionOptions options)
    : core_(std::make_shared<Core>(client, upstream, ledger, config, std::move(options))) {}

McpSession::~McpSession() { core_->Detach(); }

void McpSession::Start() { core_->Start(); }

SessionEnd McpSession::Wait() { return core_->Wait(); }

bool McpSession::ended() const { return core_->ended(); }

}  // namespace idem::mcp
