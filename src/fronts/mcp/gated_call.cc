// McpSession's gated calls, each on a worker thread: begin in the ledger,
// answer what it decided (gate::AnswerFor), or forward the call under a
// lease and settle the upstream's answer (ClassifyToolAnswer, Ledger::Settle)
// before the client sees it; a call cancelled or left unanswered becomes
// unknown; the reconcile lookup of on_unknown = "reconcile".
#include "fronts/mcp/session_core.h"

#include "core/fault_point.h"
#include "fronts/mcp/reconcile.h"

namespace idem::mcp {

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

void McpSession::Core::FinishCall(const std::shared_ptr<GatedCall>& gc, bool holds_budget,
                                  bool on_channel_thread) {
  bool close_client;
  {
    std::lock_guard g(mu_);
    if (holds_budget && !gc->abandoned) {
      auto it = pending_.find(gc->id_key);
      if (it != pending_.end() && it->second.call == gc) pending_.erase(it);
    }
    if (--active_calls_ == 0) drain_cv_.notify_all();
    close_client = MaybeFinishLocked();
  }
  if (holds_budget) budget_->Release();
  if (!close_client) return;
  // Not on the client channel's own thread: closing the channel from its
  // callback may end the HTTP session that is delivering it. The pool is
  // still up while a channel callback runs (Detach waits for callbacks
  // first).
  if (on_channel_thread && pool_.Submit([self = shared_from_this()] { self->Finish(); })) return;
  Finish();
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
  SessionLookup lookup([this, gc] { return Reconcile(gc->prepared); });
  Result<Decision> begun = [&] {
    ReconcileScope scope(&lookup);
    return ledger_.Begin(gc->prepared.call);
  }();
  Decided(gc, std::move(begun), /*on_channel_thread=*/false);
}

void McpSession::Core::Decided(const std::shared_ptr<GatedCall>& gc, Result<Decision> begun,
                               bool on_channel_thread) {
  const Call& call = gc->prepared.call;
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
  FinishCall(gc, true, on_channel_thread);
}

std::string McpSession::Core::Execute(GatedCall& gc, const Decision& d) {
  const Call& call = gc.prepared.call;
  const bool claimed = d.kind == Decision::Kind::kExecute;
  {
    std::unique_lock g(mu_);
    std::string why;
    const bool gone = upstream_closed_ || detached_;
    const bool stopped = phase_ >= SessionPhase::kClosing;
    if (gc.cancelled) {
      why = "cancelled by the client before it was sent";
    } else if (gone) {
      why = "the upstream is gone";
    } else if (stopped) {
      why = "idemgate is stopping";
    }
    if (!why.empty()) {
      const bool answer = (gone || stopped) && !gc.cancelled;
      std::string refusal =
          gone ? UpstreamGone(gc.id_text, upstream_reason_, false) : StoppingError(gc.id_text);
      g.unlock();
      ReleaseQuietly(call, d);
      if (answer) client_.Send(std::move(refusal));
      return "released: " + why;
    }
    gc.forwarded = true;
  }

  Ledger::LeaseGuard lease;
  if (claimed) lease = ledger_.KeepAlive(call, d.fence);
  const bool sent = upstream_.Send(gc.prepared.forward);
  if (sent) FaultPoint("after_send");
  if (!sent) {
    lease = Ledger::LeaseGuard();
    ReleaseQuietly(call, d);
    Answer(gc, UpstreamGone(gc.id_text, "its connection is closed", false));
    return "released: not sent, the upstream is closed";
  }

  std::optional<std::string> response;
  std::optional<Message> response_msg;
  bool cancelled, gone, stopped;
  std::string reason;
  {
    std::unique_lock g(mu_);
    Clock& clock = ledger_.clock();
    while (!gc.response && !upstream_closed_ && !detached_ && !gc.cut_off) {
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
    stopped = gc.cut_off;
    reason = upstream_reason_.empty() ? "the proxy is shutting down" : upstream_reason_;
    if (!response && !gone) {  // no answer within the cancel grace or the stop grace
      gc.abandoned = true;
      gc.decision = d;
    }
  }
  lease = Ledger::LeaseGuard();  // stop renewing before the final write
  if (response) FaultPoint("after_answer");

  if (!response) {
    if (stopped && !cancelled) {
      MarkUnknown(gc, d,
                  "idemgate stopped before the tool answered (it waited [mcp] stop_grace for it)",
                  true);
      return "outcome unknown: still running when the stop grace ran out";
    }
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
  const bool outcome = a.kind == Execution::Kind::kSuccess || a.kind == Execution::Kind::kToolError;
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
      ": a late answer, after the call was given up, settled the record (" + note + ")");
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
  std::string text = R"({"jsonrpc":"2.0","id":)" + json_text::Quote(id) +
                     R"(,"method":"tools/call","params":{"name":)" +
                     json_text::Quote(*p.reconcile_tool) + R"(,"arguments":)" +
                     p.forward_arguments + R"(,"_meta":{)" + json_text::Quote(kMetaIdempotencyKey) +
                     ":" + json_text::Quote(p.forward_key) + "}}}";
  std::optional<std::string> response;
  if (upstream_.Send(std::move(text))) {
    std::unique_lock g(mu_);
    Clock& clock = ledger_.clock();
    const TimePoint deadline = clock.Now() + options_.reconcile_timeout;
    while (!request->response && !upstream_closed_ && !detached_ &&
           phase_ < SessionPhase::kClosing && clock.Now() < deadline) {
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

}  // namespace idem::mcp
