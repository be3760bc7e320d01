#include "fronts/http_proxy/reverse_proxy.h"

#include <ctime>

#include "core/fault_point.h"
#include "fronts/http_proxy/route_reconcile.h"
#include "fronts/http_proxy/stored_response.h"
#include "gate/answer.h"
#include "gate/upstream_class.h"
#include "json/json_text.h"

namespace idem::proxy {
namespace {

constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";

// Extra problem members naming the key.
std::string KeyMember(const Call& call) { return "\"key\":" + json_text::Quote(call.id.key); }

// The client's address without its port: "127.0.0.1:5312" → "127.0.0.1",
// "[::1]:5312" → "::1".
std::string ClientAddress(std::string_view remote) {
  if (remote.starts_with('[')) {
    size_t close = remote.find(']');
    return std::string(
        remote.substr(1, close == std::string_view::npos ? remote.size() : close - 1));
  }
  return std::string(remote.substr(0, remote.rfind(':')));
}

// Every Connection field's options, as one list: a message may repeat the
// field (RFC 9110 §5.3), and a second one must not smuggle a hop-by-hop
// header through (security review F18).
std::string Connection(const std::vector<http::Header>& headers) {
  std::string options;
  for (const http::Header& h : headers) {
    if (!HeaderNameEquals(h.name, "Connection")) continue;
    if (!options.empty()) options.append(", ");
    options.append(h.value);
  }
  return options;
}

// Fields a client could set to lie to the upstream about where the request
// came from, or how, which upstreams believe when they come from their
// proxy (security review F18). Not forwarded: idemgate says only what it
// knows, the client's address in X-Forwarded-For.
bool IsClientForwardingClaim(std::string_view name) {
  return HeaderNameEquals(name, "Forwarded") || HeaderNameEquals(name, "X-Forwarded-Host") ||
         HeaderNameEquals(name, "X-Forwarded-Proto") ||
         HeaderNameEquals(name, "X-Forwarded-Port") || HeaderNameEquals(name, "X-Real-IP");
}

// The answer to send the client for a fresh upstream answer.
http::Response Relayed(http::Response upstream) {
  const std::string connection = Connection(upstream.headers);
  upstream.headers = EndToEndHeaders(std::move(upstream.headers), connection);
  return upstream;
}

// The store's message (its host, path, driver text) is not the client's to
// see (security review F15).
http::Response StoreUnavailable(const Error&) {
  http::Response r =
      http::Problem(503, "store-unavailable", "Store unavailable",
                    "idemgate could not reach its store, so the request was not executed. It is "
                    "safe to retry it shortly. (Why is for the operator: /readyz with an admin "
                    "token, and idemgate's log.)");
  r.headers.push_back({"Retry-After", "1"});
  return r;
}

// What the upstream's answer says about the action (gate::ClassOfHttpStatus,
// the table every front uses), with errors = "release" turning a tool error
// into a release.
Execution::Kind ClassOfAnswer(int status, const Call& call) {
  const Execution::Kind kind = gate::ClassOfHttpStatus(status);
  if (kind == Execution::Kind::kToolError && call.policy.errors == ErrorPolicy::kRelease) {
    return Execution::Kind::kNotSent;
  }
  return kind;
}

// An answer the outcome of which is stored (then relayed).
bool IsAnswerToStore(const net::HttpClientResult& r, const Call& call) {
  if (r.kind != net::HttpClientResult::Kind::kResponse) return false;
  const Execution::Kind kind = ClassOfAnswer(r.response.status, call);
  return kind == Execution::Kind::kSuccess || kind == Execution::Kind::kToolError;
}

// Why an answer was released, for the verbose log.
std::string ReleasedNote(int status) {
  return "released: HTTP " + std::to_string(status) +
         (gate::ClassOfHttpStatus(status) == Execution::Kind::kToolError
              ? " (errors = release)"
              : " (the upstream did not act: a retry runs)");
}

// The upstream's answer as it is relayed and as it is stored: a too-large
// marker if it does not fit max_result_bytes (with its status and headers,
// for the problem a retry gets).
StoredAnswer ToStore(const Call& call, http::Response upstream) {
  StoredAnswer a;
  a.status = upstream.status;
  a.response = Relayed(std::move(upstream));
  StoredResponse stored{a.status, a.response.headers, {}};
  a.outcome.cls = a.status >= 400 ? OutcomeClass::kToolError : OutcomeClass::kSuccess;
  const size_t head_size = EncodeStoredResponse(stored).size();
  if (head_size + a.response.body.size() > call.policy.max_result_bytes) {
    a.outcome = Outcome{OutcomeClass::kTooLarge, EncodeStoredResponse(stored)};
  } else {
    stored.body = a.response.body;
    a.outcome.body = EncodeStoredResponse(stored);
  }
  return a;
}

http::Response OutcomeNotStored(const Call& call, const Error& e) {
  return http::Problem(
      500, "outcome-not-stored", "Outcome not stored",
      "the upstream answered, but idemgate could not store its answer (" + e.message +
          "), so it is withheld. The action has probably happened: do not repeat it blindly. "
          "An operator can check with `idemgate inspect " +
          call.id.key + "`.",
      KeyMember(call));
}

}  // namespace

struct ReverseProxy::Gated {
  http::Request request;
  http::Responder respond;
  RequestPlan plan;
  Decision decision;
  std::shared_ptr<Ledger::LeaseGuard> lease;
  std::string note;  // for the verbose log

  // Every answer to a gated request, fresh or replayed, goes out here.
  void Reply(http::Response response) {
    FaultPoint("before_reply");
    respond(std::move(response));
  }
};

ReverseProxy::ReverseProxy(Ledger& ledger, const Config& config, net::HttpClient& upstream,
                           WorkerPool& workers, ReverseProxyOptions options)
    : ledger_(ledger),
      config_(config),
      upstream_(upstream),
      workers_(workers),
      options_(std::move(options)) {}

void ReverseProxy::Log(std::string_view line) const {
  if (options_.log) options_.log(line);
}

void ReverseProxy::Done() {
  std::lock_guard g(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
}

bool ReverseProxy::Drain(std::chrono::milliseconds grace) {
  std::unique_lock g(mu_);
  return idle_.wait_for(g, grace, [&] { return in_flight_ == 0; });
}

void ReverseProxy::Handle(http::Request request, http::Responder respond) {
  RequestPlan plan = PlanRequest(request, config_, options_.plan);
  if (plan.kind == RequestPlan::Kind::kRefuse) {
    const Refusal& r = plan.refusal;
    respond(http::Problem(r.status, r.type, r.title, r.detail));
    return;
  }
  {
    std::lock_guard g(mu_);
    ++in_flight_;
  }
  if (plan.kind == RequestPlan::Kind::kPassThrough) {
    PassThrough(std::move(request), std::move(respond));
    return;
  }
  if (plan.call.policy.on_unknown == OnUnknown::kReconcile) {
    // The lookup asks for the key the upstream received, with this
    // request's credentials (route_reconcile.h).
    plan.call.reconcile =
        MakeRouteLookup(config_, upstream_, plan.forward_key, CredentialHeaders(request, config_));
  }
  auto gated = std::make_shared<Gated>();
  gated->request = std::move(request);
  gated->respond = std::move(respond);
  gated->plan = std::move(plan);
  // Where the store allows (Redis), a retry of a finished request is
  // answered from one read (or the replay cache) and a fresh one claimed
  // with one pipelined write, without a worker; Begin, which may wait for a
  // running owner or a slow store, runs on the worker pool, never here.
  ledger_.BeginWithoutBlocking(
      gated->plan.call, [this, gated](std::function<void()> begin) { ToWorkers(gated, begin); },
      [this, gated](Result<Decision> begun) { Begun(gated, std::move(begun)); });
}

void ReverseProxy::ToWorkers(const std::shared_ptr<Gated>& g, std::function<void()> begin) {
  if (workers_.Submit(std::move(begin))) return;
  g->Reply(http::Problem(503, "shutting-down", "Shutting down",
                         "idemgate is stopping; the request was not executed. Retry it."));
  Done();
}

void ReverseProxy::PassThrough(http::Request request, http::Responder respond) {
  net::HttpClientRequest forward = Forwarded(request, nullptr);
  forward.stream = true;  // never stored: relayed as it comes, any size
  upstream_.Send(std::move(forward), [this, respond = std::move(respond)](net::HttpClientResult r) {
    switch (r.kind) {
      case net::HttpClientResult::Kind::kResponse:
        respond(Relayed(std::move(r.response)));
        break;
      case net::HttpClientResult::Kind::kNotSent:
        respond(http::Problem(502, "upstream-unreachable", "Upstream unreachable",
                              r.detail + "; the request was not sent"));
        break;
      case net::HttpClientResult::Kind::kMaybeSent:
        respond(http::Problem(r.timed_out ? 504 : 502,
                              r.timed_out ? "upstream-timeout" : "upstream-failed",
                              r.timed_out ? "Upstream timeout" : "Upstream failed", r.detail));
        break;
    }
    Done();
  });
}

net::HttpClientRequest ReverseProxy::Forwarded(http::Request& request, const RequestPlan* plan) const {
  net::HttpClientRequest out;
  out.method = std::move(request.method);
  out.target = std::move(request.target);
  out.body = std::move(request.body);
  const std::string connection = Connection(request.headers);
  std::string forwarded_for;
  out.headers.reserve(request.headers.size() + 2);
  for (http::Header& h : request.headers) {
    // Expect: the listener has read the whole body already; forwarded, it
    // would draw an interim 100 answer from the upstream.
    if (IsHopByHop(h.name) || HeaderNameEquals(h.name, "Host") ||
        HeaderNameEquals(h.name, "Expect") || IsClientForwardingClaim(h.name)) {
      continue;
    }
    if (HeaderNameEquals(h.name, "X-Forwarded-For")) {
      if (!forwarded_for.empty()) forwarded_for.append(", ");
      forwarded_for.append(h.value);
      continue;
    }
    if (!options_.forward_authorization && HeaderNameEquals(h.name, "Authorization")) continue;
    if (plan != nullptr && (HeaderNameEquals(h.name, "Idempotency-Key") ||
                            HeaderNameEquals(h.name, config_.http.turn_header) ||
                            HeaderNameEquals(h.name, plan->key_header))) {
      continue;
    }
    out.headers.push_back(std::move(h));
  }
  // Named by Connection: hop-by-hop too. Checked after the moves above only
  // against names, which were not moved from kept headers.
  if (!connection.empty()) out.headers = EndToEndHeaders(std::move(out.headers), connection);
  if (plan != nullptr && !plan->key_header.empty()) {
    out.headers.push_back({plan->key_header, plan->forward_key});
  }
  if (plan != nullptr && !plan->key_field.empty()) {
    out.body = BodyWithKeyField(std::move(out.body), plan->key_field, plan->forward_key);
  }
  const std::string client = ClientAddress(request.remote);
  if (!client.empty()) {
    if (!forwarded_for.empty()) forwarded_for.append(", ");
    forwarded_for.append(client);
  }
  if (!forwarded_for.empty()) out.headers.push_back({"X-Forwarded-For", std::move(forwarded_for)});
  return out;
}

void ReverseProxy::Begun(const std::shared_ptr<Gated>& g, Result<Decision> begun) {
  const Call& call = g->plan.call;
  if (!begun) {
    const Error& e = begun.error();
    g->Reply(e.code == ErrorCode::kUnavailable || e.code == ErrorCode::kAborted
                 ? StoreUnavailable(e)
                 : http::Problem(500, "claim-failed", "Claim failed",
                                 "idemgate could not claim the request (" + e.ToString() +
                                     "), so it was not executed.",
                                 KeyMember(call)));
    if (options_.verbose) Log(call.tool + " key=" + call.id.key + ": refused: " + e.ToString());
    return Done();
  }
  g->decision = std::move(*begun);
  Answer(g);
}

void ReverseProxy::Answer(const std::shared_ptr<Gated>& g) {
  const Call& call = g->plan.call;
  const gate::Answer a = gate::AnswerFor(g->decision);
  std::string_view note = a.note;
  // The problem members naming the key and the first attempt.
  const std::string key_and_first_at =
      KeyMember(call) + ",\"first_at\":" + json_text::Quote(a.first_at);
  switch (a.kind) {
    case gate::Answer::Kind::kRun:
      return Execute(g);  // answers and calls Done() when the upstream has answered
    case gate::Answer::Kind::kReplay: {
      Result<StoredResponse> stored = DecodeStoredResponse(g->decision.record.outcome->body);
      if (!stored) {
        g->Reply(http::Problem(500, "unreadable-outcome", "Stored outcome unreadable",
                               stored.error().message + "; the action was not performed again",
                               KeyMember(call)));
        note = "replay failed: unreadable outcome";
        break;
      }
      http::Response r;
      r.status = stored->status;
      r.headers = std::move(stored->headers);
      r.headers.push_back({std::string(kReplayedHeader), "true"});
      r.body = std::move(stored->body);
      g->Reply(std::move(r));
      break;
    }
    case gate::Answer::Kind::kNoOutcome:
      g->Reply(http::Problem(a.http_status, "unreadable-outcome", "Stored outcome missing",
                             "the record of this key is completed but holds no outcome; the "
                             "action was not performed again",
                             KeyMember(call)));
      break;
    case gate::Answer::Kind::kTooLarge: {
      std::string extra = key_and_first_at;
      if (auto stored = DecodeStoredResponse(g->decision.record.outcome->body)) {
        extra += ",\"upstream_status\":" + std::to_string(stored->status);
      }
      g->Reply(http::Problem(
          a.http_status, "result-too-large", "Result too large to replay",
          "an identical request with this key already ran at " + a.first_at +
              ", but its answer was larger than max_result_bytes and was not stored; the action "
              "was not performed again. Look the result up at the upstream.",
          extra));
      break;
    }
    case gate::Answer::Kind::kInProgress: {
      const std::string seconds = std::to_string(a.retry_after_seconds);
      http::Response r =
          http::Problem(a.http_status, "request-in-progress", "Request in progress",
                        "an identical request with this key is still running; retry after " +
                            seconds + " s to get its answer",
                        KeyMember(call) + ",\"retry_after\":" + seconds);
      r.headers.push_back({"Retry-After", seconds});
      g->Reply(std::move(r));
      break;
    }
    case gate::Answer::Kind::kUnknown:
      g->Reply(http::Problem(
          a.http_status, "outcome-unknown", "Outcome unknown",
          "an identical request with this key was sent upstream at " + a.first_at +
              " but no answer came back, so the action may already have happened. It was not "
              "performed again; do not repeat it blindly. Check at the upstream, then an operator "
              "can settle the record (`idemgate resolve " +
              call.id.key + "`) or wait for it to expire.",
          key_and_first_at));
      break;
    case gate::Answer::Kind::kDrift:
      g->Reply(http::Problem(
          a.http_status, "idempotency-key-reused", "Idempotency-Key reused",
          "the key " + call.id.key + " was first used at " + a.first_at +
              " for a request with a different method, path, query or body; a key names one "
              "request. Send the original request to get its answer, or use a new key for a new "
              "request.",
          key_and_first_at));
      break;
  }
  if (options_.verbose) Log(call.tool + " key=" + call.id.key + ": " + std::string(note));
  Done();
}

void ReverseProxy::Execute(const std::shared_ptr<Gated>& g) {
  const Call& call = g->plan.call;
  if (g->decision.kind == Decision::Kind::kExecute) {
    g->lease = std::make_shared<Ledger::LeaseGuard>(ledger_.KeepAlive(call, g->decision.fence));
  }
  net::HttpClientRequest forward = Forwarded(g->request, &g->plan);
  if (FaultPointsArmed()) forward.on_written = [] { FaultPoint("after_send"); };
  upstream_.Send(std::move(forward), [this, g](net::HttpClientResult result) {
    // On an upstream I/O thread. An answer to store goes to the store's
    // non-blocking write where it has one; any other store write may block,
    // so it goes to the worker pool.
    if (IsAnswerToStore(result, g->plan.call)) return StoreAnswer(g, std::move(result.response));
    auto shared = std::make_shared<net::HttpClientResult>(std::move(result));
    if (!workers_.Submit([this, g, shared] { Settle(g, std::move(*shared)); })) {
      Settle(g, std::move(*shared));
    }
  });
}

void ReverseProxy::StoreAnswer(const std::shared_ptr<Gated>& g, http::Response response) {
  const Call& call = g->plan.call;
  g->lease.reset();  // stop renewing before the final write
  FaultPoint("after_answer");
  auto answer = std::make_shared<StoredAnswer>(ToStore(call, std::move(response)));
  auto relay = [this, g, answer](const Result<Record>& stored) {
    Relay(g, std::move(*answer), stored);
  };
  if (ledger_.CompleteAsync(call, g->decision, answer->outcome, relay)) return;
  auto complete = [this, g, answer, relay] {
    relay(ledger_.Complete(g->plan.call, g->decision, answer->outcome));
  };
  if (!workers_.Submit(complete)) complete();
}

void ReverseProxy::Relay(const std::shared_ptr<Gated>& g, StoredAnswer answer,
                         const Result<Record>& stored) {
  const Call& call = g->plan.call;
  std::string note;
  if (stored) {
    g->Reply(std::move(answer.response));
    note = "executed: HTTP " + std::to_string(answer.status);
  } else {
    g->Reply(OutcomeNotStored(call, stored.error()));
    note = "executed, not stored: " + stored.error().ToString();
  }
  if (options_.verbose) Log(call.tool + " key=" + call.id.key + ": " + note);
  Done();
}

void ReverseProxy::Settle(const std::shared_ptr<Gated>& g, net::HttpClientResult result) {
  const Call& call = g->plan.call;
  const Decision& d = g->decision;
  g->lease.reset();  // stop renewing before the final write
  if (result.kind == net::HttpClientResult::Kind::kResponse || result.too_large) {
    FaultPoint("after_answer");
  }
  std::string note;
  auto mark_unknown = [&] {
    if (auto m = ledger_.MarkUnknown(call, d); !m) {
      Log("could not mark " + call.id.key + " unknown: " + m.error().ToString());
    }
  };
  auto complete = [&](Outcome outcome) -> bool {
    auto stored = ledger_.Complete(call, d, std::move(outcome));
    if (stored) return true;
    g->Reply(OutcomeNotStored(call, stored.error()));
    note = "executed, not stored: " + stored.error().ToString();
    return false;
  };

  switch (result.kind) {
    case net::HttpClientResult::Kind::kNotSent:
      if (auto r = ledger_.Release(call, d); !r) {
        Log("could not release " + call.id.key + " (" + r.error().ToString() +
            "); it stays claimed until its lease runs out");
      }
      g->Reply(
          http::Problem(502, "upstream-unreachable", "Upstream unreachable",
                        result.detail + "; the request was not sent, so it is safe to retry it",
                        KeyMember(call)));
      note = "released: not sent: " + result.detail;
      break;
    case net::HttpClientResult::Kind::kMaybeSent:
      // An answer over max_response_bytes is judged by its status first: a
      // 5xx is unknown, a 429 released, like the same answer within the limit.
      if (result.too_large &&
          ClassOfAnswer(result.response.status, call) == Execution::Kind::kNotSent) {
        if (auto r = ledger_.Release(call, d); !r) {
          Log("could not release " + call.id.key + ": " + r.error().ToString());
        }
        g->Reply(http::Problem(
            502, "upstream-answer-too-large", "Upstream answer too large",
            result.detail + "; the upstream answered HTTP " +
                std::to_string(result.response.status) +
                (gate::ClassOfHttpStatus(result.response.status) == Execution::Kind::kToolError
                     ? ", a refusal that errors = \"release\" does not keep, so a retry runs again"
                     : ", which means it did not act, so a retry runs again"),
            KeyMember(call) + ",\"upstream_status\":" + std::to_string(result.response.status)));
        note = ReleasedNote(result.response.status) + ", answer too large";
        break;
      }
      if (result.too_large &&
          ClassOfAnswer(result.response.status, call) != Execution::Kind::kMaybeSent) {
        const std::string connection(Connection(result.response.headers));
        StoredResponse marker{result.response.status,
                              EndToEndHeaders(std::move(result.response.headers), connection),
                              {}};
        if (complete(Outcome{OutcomeClass::kTooLarge, EncodeStoredResponse(marker)})) {
          g->Reply(http::Problem(
              502, "upstream-answer-too-large", "Upstream answer too large",
              result.detail + "; the upstream answered HTTP " +
                  std::to_string(result.response.status) +
                  " and the action was carried out, but the answer cannot be relayed. Retries "
                  "with this key are not executed again.",
              KeyMember(call) + ",\"upstream_status\":" + std::to_string(result.response.status)));
          note = "executed: answer too large";
        }
        break;
      }
      mark_unknown();  // a 5xx over the limit too
      g->Reply(http::Problem(
          result.timed_out ? 504 : 502, "outcome-unknown", "Outcome unknown",
          result.detail +
              ". The action may have happened: do not repeat it blindly. Retries with this key "
              "get this answer until an operator settles the record (`idemgate resolve " +
              call.id.key + "`) or it expires.",
          KeyMember(call)));
      note = "outcome unknown: " + result.detail;
      break;
    case net::HttpClientResult::Kind::kResponse: {
      const int status = result.response.status;
      if (ClassOfAnswer(status, call) == Execution::Kind::kMaybeSent) {
        mark_unknown();
        g->Reply(http::Problem(
            502, "outcome-unknown", "Outcome unknown",
            "the upstream answered HTTP " + std::to_string(status) +
                ", so the action may or may not have happened: do not repeat it blindly. Retries "
                "with this key get this answer until an operator settles the record (`idemgate "
                "resolve " +
                call.id.key + "`) or it expires.",
            KeyMember(call) + ",\"upstream_status\":" + std::to_string(status)));
        note = "outcome unknown: HTTP " + std::to_string(status);
        break;
      }
      // The upstream did not act (429, a redirect…), or a tool error under
      // errors = release; an answer to store went to StoreAnswer instead. The
      // upstream's answer goes to the client as it is, Retry-After included.
      if (auto r = ledger_.Release(call, d); !r) {
        Log("could not release " + call.id.key + ": " + r.error().ToString());
      }
      g->Reply(Relayed(std::move(result.response)));
      note = ReleasedNote(status);
      break;
    }
  }
  if (options_.verbose) Log(call.tool + " key=" + call.id.key + ": " + note);
  Done();
}

}  // namespace idem::proxy
