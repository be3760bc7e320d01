// McpSession's routing: messages between the client and the upstream, the
// requests it intercepts, and the end of the session. Gated calls run in
// gated_call.cc; the state both share is in session_core.h.
#include "fronts/mcp/mcp_session.h"

#include "fronts/mcp/session_core.h"

namespace idem::mcp {

bool CallBudget::TryAcquire() {
  size_t used = used_.load();
  while (used < max_) {
    if (used_.compare_exchange_weak(used, used + 1)) return true;
  }
  return false;
}

void CallBudget::Release() { used_.fetch_sub(1); }

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
      std::string refusal = IdInUseError(msg);
      g.unlock();
      client_.Send(std::move(refusal));
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
  {
    std::unique_lock g(mu_);
    if (phase_ != SessionPhase::kOpen) {
      g.unlock();
      client_.Send(StoppingError(msg.id_text));
      return;
    }
  }
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
  if (!options_.hook_turn_file.empty()) context.hook_turn_file = &options_.hook_turn_file;
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
  if (gc->prepared.call.policy.on_unknown == OnUnknown::kReconcile) {
    // This call's own lookup (Call::reconcile): its session's upstream, its
    // forwarded arguments. Plain pointers: the call outlives its Begin, the
    // session its calls.
    gc->prepared.call.reconcile = [this, p = &gc->prepared](const Call&) { return Reconcile(*p); };
  }
  {
    std::unique_lock g(mu_);
    std::optional<std::string> refusal;
    if (upstream_closed_ || detached_) {
      refusal = UpstreamGone(msg.id_text, upstream_reason_, false);
    } else if (phase_ != SessionPhase::kOpen) {  // the stop began since the check above
      refusal = StoppingError(msg.id_text);
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
  }
  // A retry of a finished call whose record the replay cache holds is
  // answered here, on the client channel's thread: it needs no I/O and no
  // wait, and a worker would cost a wake-up and a hand-off per replay.
  std::optional<Decision> held = ledger_.AnswerHeld(gc->prepared.call);
  if (held && gate::AnswerFor(*held).kind != gate::Answer::Kind::kRun) {
    Decided(gc, *std::move(held), /*on_channel_thread=*/true);
    return;
  }
  auto self = shared_from_this();
  std::function<void()> task = [self, gc] { self->RunGatedCall(gc); };
  if (held) {  // it runs (observe mode): no second Begin
    task = [self, gc, d = *std::move(held)]() mutable {
      self->Decided(gc, std::move(d), /*on_channel_thread=*/false);
    };
  }
  if (!pool_.Submit(std::move(task))) FinishCall(gc, true);  // shutting down: nothing was claimed
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
    // The client no longer expects an answer, but the upstream may still
    // send one: the id stays taken until it does (review F7).
    it->second.cancelled = true;
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
  {
    std::lock_guard g(mu_);
    client_closed_ = true;
    client_reason_ = std::move(reason);
  }
  // The calls in flight are forwarded and get the stop grace to settle
  // (stored, and answered if the client still reads); then EOF to the
  // upstream.
  Stop(StopCause::kClientLeft);
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
  if (it->second.cancelled) {  // the client cancelled it: nobody waits for this answer
    pending_.erase(it);
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
      g.unlock();  // else its worker wakes only to wait for mu_
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
          (it != pending_.end() &&
           (it->second.kind != Pending::Kind::kPlain || it->second.cancelled))) {
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
    // Closed first only while the session was open: once it stops, the
    // upstream closing is what the stop asked for.
    client_there = phase_ == SessionPhase::kOpen;
    upstream_first_ = client_there;
    drain_cv_.notify_all();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.kind == Pending::Kind::kGatedCall) {
        it->second.call->cv.notify_all();  // its worker answers it
        it = it->second.call->abandoned ? pending_.erase(it) : std::next(it);
        continue;
      }
      if (!it->second.cancelled) unanswered.push_back(std::move(it->second));
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
// the end of the session

bool McpSession::Core::MaybeFinishLocked() {
  if (phase_ >= SessionPhase::kFinishing || !upstream_closed_ || active_calls_ > 0) return false;
  phase_ = SessionPhase::kFinishing;
  return true;
}

void McpSession::Core::Finish() {
  client_.Close();
  {
    std::lock_guard g(mu_);
    phase_ = SessionPhase::kFinished;
    done_cv_.notify_all();
  }
  if (options_.on_ended) options_.on_ended();
}

void McpSession::Core::Stop(StopCause cause) {
  bool drain = false;
  bool terminate_now = false;
  {
    std::lock_guard g(mu_);
    if (cause > stop_cause_) stop_cause_ = cause;
    if (phase_ == SessionPhase::kOpen) {
      phase_ = SessionPhase::kDraining;
      drain = true;
    } else if (phase_ == SessionPhase::kClosing && cause == StopCause::kStopped &&
               !upstream_closed_) {
      terminate_now = true;  // the drain gave it EOF after the client left
    }
  }
  // On a worker: the grace is waited for there, never on a channel's thread.
  // The pool refuses only once the session is detached: nothing to stop then.
  if (drain) pool_.Submit([self = shared_from_this()] { self->Drain(); });
  if (terminate_now) upstream_.CloseNow();
}

void McpSession::Core::Drain() {
  std::unique_lock g(mu_);
  Clock& clock = ledger_.clock();
  const Duration grace = config_.mcp.stop_grace;
  const TimePoint deadline = clock.Now() + grace;
  while (active_calls_ > 0 && !upstream_closed_ && !detached_ && clock.Now() < deadline) {
    clock.WaitUntil(drain_cv_, g, deadline);
  }
  // The upstream may have closed and the last call finished meanwhile: the
  // session is then ending already, and the phase never moves back.
  if (detached_ || phase_ >= SessionPhase::kFinishing) return;
  phase_ = SessionPhase::kClosing;
  const int running = upstream_closed_ ? 0 : active_calls_;
  for (auto& [id, p] : pending_) {
    if (!p.call) continue;
    // Its worker gives it up now; one not yet forwarded never will be.
    if (!upstream_closed_ && p.call->forwarded && !p.call->response) p.call->cut_off = true;
    p.call->cv.notify_all();
  }
  for (auto& [id, r] : proxy_) r->cv.notify_all();
  const bool terminate = stop_cause_ == StopCause::kStopped;
  g.unlock();
  if (running > 0) {
    Log(std::to_string(running) + " tool call(s) still running after the stop grace of " +
        std::to_string(grace.count()) +
        " ms ([mcp] stop_grace): each is marked outcome unknown, so a retry is answered "
        "\"outcome unknown\" and does not run it again (if idemgate cannot write that, the "
        "record's lease runs out and a retry finds it unknown all the same)");
  }
  if (terminate) {
    upstream_.CloseNow();
  } else {
    upstream_.Close();
  }
}

std::string McpSession::Core::StoppingError(std::string_view id_text) const {
  return ErrorResponse(id_text, kRpcStopping,
                       "idemgate is stopping (its host is shutting the MCP server down), so this "
                       "tool call was not executed. Retry it once the server is back.",
                       RetryableData("stopping"));
}

// ---------------------------------------------------------------------------

McpSession::McpSession(Channel& client, Channel& upstream, Ledger& ledger, const Config& config,
                       SessionOptions options)
    : core_(std::make_shared<Core>(client, upstream, ledger, config, std::move(options))) {}

McpSession::~McpSession() { core_->Detach(); }

void McpSession::Start() { core_->Start(); }

void McpSession::Stop() { core_->Stop(StopCause::kStopped); }

SessionEnd McpSession::Wait() { return core_->Wait(); }

bool McpSession::ended() const { return core_->ended(); }

}  // namespace idem::mcp
