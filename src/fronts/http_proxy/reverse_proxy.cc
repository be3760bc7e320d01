#include "fronts/http_proxy/reverse_proxy.h"

#include <ctime>

#include "core/fault_point.h"
#include "fronts/http_proxy/route_reconcile.h"
#include "fronts/http_proxy/stored_response.h"
#include "gate/answer.h"
#include "gate/gated_call.h"
#include "gate/problem_types.h"
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
      http::Problem(503, gate::problem::kStoreUnavailable, "Store unavailable",
                    "idemgate could not reach its store, so the request was not executed. It is "
                    "safe to retry it shortly. (Why is for the operator: /readyz with an admin "
                    "token, and idemgate's log.)");
  r.headers.push_back({"Retry-After", "1"});
  return r;
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
      500, gate::problem::kOutcomeNotStored, "Outcome not stored",
      "the upstream answered, but idemgate could not store its answer (" + e.message +
          "), so it is withheld. The action has probably happened: do not repeat it blindly. "
          "An operator can check with `idemgate inspect " +
          call.id.key + "`.",
      KeyMember(call));
}

}  // namespace

// One gated request: its context and the phases the driver (gate/gated_call.h)
// calls. Every answer to it, fresh or replayed, goes out through Reply.
struct ReverseProxy::Gated final : gate::GatedFront {
  ReverseProxy* proxy = nullptr;
  http::Request request;
  http::Responder respond;
  RequestPlan plan;
  net::HttpClientResult result;  // the upstream's, once Forward is done
  StoredAnswer answer;           // an answer to store (kResponse that is an outcome)

  void Reply(http::Response response) {
    FaultPoint("before_reply");
    respond(std::move(response));
  }

  // ---- gate::GatedFront
  const Call& call() const override { return plan.call; }
  bool Offload(std::function<void()> work) override {
    return proxy->workers_.Submit(std::move(work));
  }
  void Forward(const Decision&, std::function<void(gate::Upstream)> done) override;
  std::string RenderAnswer(const Decision& d, const gate::Answer& a) override;
  std::string RenderBeginFailed(const gate::BeginFailure& f) override;
  std::string RenderSettled(const Decision& d, const gate::Settled& s) override;
  void Log(std::string line) override { proxy->Log(line); }
  void Finish(std::string_view note, const Decision*) override {
    if (proxy->options_.verbose) proxy->Log(call().tool + " key=" + call().id.key + ": " + std::string(note));
    proxy->Done();
  }

 private:
  // What the upstream's answer means for the record: its status's class
  // (gate::ClassOfHttpStatus, an answer over max_response_bytes judged by its
  // status first), and what is stored of an outcome.
  gate::Upstream Classify();
  std::string RenderReleased();
  std::string RenderUnknown();
};

void ReverseProxy::Gated::Forward(const Decision&, std::function<void(gate::Upstream)> done) {
  net::HttpClientRequest forward = proxy->Forwarded(request, &plan);
  if (FaultPointsArmed()) forward.on_written = [] { FaultPoint("after_send"); };
  // On an upstream I/O thread: the driver stores an outcome with the store's
  // non-blocking write where it has one, anything else on the worker pool.
  proxy->upstream_.Send(std::move(forward),
                        [this, done = std::move(done)](net::HttpClientResult r) {
                          result = std::move(r);
                          done(Classify());
                        });
}

gate::Upstream ReverseProxy::Gated::Classify() {
  using Kind = net::HttpClientResult::Kind;
  if (result.kind == Kind::kNotSent) return {.kind = Execution::Kind::kNotSent};
  if (result.kind == Kind::kMaybeSent && !result.too_large) {
    return {.kind = Execution::Kind::kMaybeSent};  // sent, then no answer or a broken one
  }
  gate::Upstream up{.kind = gate::ClassOfHttpStatus(result.response.status), .answered = true};
  const bool kept = up.kind == Execution::Kind::kSuccess ||
                    (up.kind == Execution::Kind::kToolError &&
                     call().policy.errors != ErrorPolicy::kRelease);
  if (!kept) return up;  // released or unknown: the answer stays in `result` for the render
  if (result.kind == Kind::kResponse) {
    answer = ToStore(call(), std::move(result.response));
    up.outcome = answer.outcome;
    return up;
  }
  // Over max_response_bytes: only a marker with its status and headers.
  const std::string connection(Connection(result.response.headers));
  StoredResponse marker{result.response.status,
                        EndToEndHeaders(std::move(result.response.headers), connection),
                        {}};
  up.outcome = Outcome{OutcomeClass::kTooLarge, EncodeStoredResponse(marker)};
  return up;
}

std::string ReverseProxy::Gated::RenderBeginFailed(const gate::BeginFailure& f) {
  const Error& e = f.error;
  switch (f.kind) {
    case gate::BeginFailure::Kind::kStoreUnavailable:
      Reply(StoreUnavailable(e));
      break;
    case gate::BeginFailure::Kind::kClaimFailed:
      Reply(http::Problem(500, gate::problem::kClaimFailed, "Claim failed",
                          "idemgate could not claim the request (" + e.ToString() +
                              "), so it was not executed.",
                          KeyMember(call())));
      break;
    case gate::BeginFailure::Kind::kStopping:
      Reply(http::Problem(503, gate::problem::kStopping, "Stopping",
                          "idemgate is stopping; the request was not executed. Retry it."));
      break;
  }
  return {};
}

std::string ReverseProxy::Gated::RenderAnswer(const Decision& d, const gate::Answer& a) {
  const Call& call = plan.call;
  // The problem members naming the key and the first attempt.
  const std::string key_and_first_at =
      KeyMember(call) + ",\"first_at\":" + json_text::Quote(a.first_at);
  switch (a.kind) {
    case gate::Answer::Kind::kRun:
      break;  // the driver runs it
    case gate::Answer::Kind::kReplay: {
      Result<StoredResponse> stored = DecodeStoredResponse(d.record.outcome->body);
      if (!stored) {
        Reply(http::Problem(500, gate::problem::kUnreadableOutcome, "Stored outcome unreadable",
                            stored.error().message + "; the action was not performed again",
                            KeyMember(call)));
        return "replay failed: unreadable outcome";
      }
      http::Response r;
      r.status = stored->status;
      r.headers = std::move(stored->headers);
      r.headers.push_back({std::string(kReplayedHeader), "true"});
      r.body = std::move(stored->body);
      Reply(std::move(r));
      break;
    }
    case gate::Answer::Kind::kNoOutcome:
      Reply(http::Problem(a.http_status, gate::problem::TypeOf(a.kind), "Stored outcome missing",
                          "the record of this key is completed but holds no outcome; the "
                          "action was not performed again",
                          KeyMember(call)));
      break;
    case gate::Answer::Kind::kTooLarge: {
      std::string extra = key_and_first_at;
      if (auto stored = DecodeStoredResponse(d.record.outcome->body)) {
        extra += ",\"upstream_status\":" + std::to_string(stored->status);
      }
      Reply(http::Problem(
          a.http_status, gate::problem::TypeOf(a.kind), "Outcome too large to replay",
          "an identical request with this key already ran at " + a.first_at +
              ", but its answer was larger than max_result_bytes and was not stored; the action "
              "was not performed again. Look the result up at the upstream.",
          extra));
      break;
    }
    case gate::Answer::Kind::kInProgress: {
      const std::string seconds = std::to_string(a.retry_after_seconds);
      http::Response r =
          http::Problem(a.http_status, gate::problem::TypeOf(a.kind), "Request in progress",
                        "an identical request with this key is still running; retry after " +
                            seconds + " s to get its answer",
                        KeyMember(call) + ",\"retry_after\":" + seconds);
      r.headers.push_back({"Retry-After", seconds});
      Reply(std::move(r));
      break;
    }
    case gate::Answer::Kind::kUnknown:
      Reply(http::Problem(
          a.http_status, gate::problem::TypeOf(a.kind), "Outcome unknown",
          "an identical request with this key was sent upstream at " + a.first_at +
              " but no answer came back, so the action may already have happened. It was not "
              "performed again; do not repeat it blindly. Check at the upstream, then an operator "
              "can settle the record (`idemgate resolve " +
              call.id.key + "`) or wait for it to expire.",
          key_and_first_at));
      break;
    case gate::Answer::Kind::kDrift:
      Reply(http::Problem(
          a.http_status, gate::problem::TypeOf(a.kind), "Idempotency-Key reused",
          "the key " + call.id.key + " was first used at " + a.first_at +
              " for a request with a different method, path, query or body; a key names one "
              "request. Send the original request to get its answer, or use a new key for a new "
              "request.",
          key_and_first_at));
      break;
  }
  return {};
}

std::string ReverseProxy::Gated::RenderSettled(const Decision&, const gate::Settled& s) {
  const Call& call = plan.call;
  const std::string status = std::to_string(result.response.status);
  switch (s.kind) {
    case gate::Settled::Kind::kNotStored:
      Reply(OutcomeNotStored(call, *s.error));
      return "executed, not stored: " + s.error->ToString();
    case gate::Settled::Kind::kStored:
      if (result.kind == net::HttpClientResult::Kind::kResponse) {
        Reply(std::move(answer.response));
        return "executed: HTTP " + std::to_string(answer.status);
      }
      Reply(http::Problem(
          502, "upstream-answer-too-large", "Upstream answer too large",
          result.detail + "; the upstream answered HTTP " + status +
              " and the action was carried out, but the answer cannot be relayed. Retries "
              "with this key are not executed again.",
          KeyMember(call) + ",\"upstream_status\":" + status));
      return "executed: answer too large";
    case gate::Settled::Kind::kReleased:
      return RenderReleased();
    case gate::Settled::Kind::kUnknown:
      return RenderUnknown();
  }
  return {};
}

std::string ReverseProxy::Gated::RenderReleased() {
  const Call& call = plan.call;
  const int status = result.response.status;
  switch (result.kind) {
    case net::HttpClientResult::Kind::kNotSent:
      Reply(http::Problem(502, "upstream-unreachable", "Upstream unreachable",
                          result.detail + "; the request was not sent, so it is safe to retry it",
                          KeyMember(call)));
      return "released: not sent: " + result.detail;
    case net::HttpClientResult::Kind::kMaybeSent:  // an answer over max_response_bytes
      Reply(http::Problem(
          502, "upstream-answer-too-large", "Upstream answer too large",
          result.detail + "; the upstream answered HTTP " + std::to_string(status) +
              (gate::ClassOfHttpStatus(status) == Execution::Kind::kToolError
                   ? ", a refusal that errors = \"release\" does not keep, so a retry runs again"
                   : ", which means it did not act, so a retry runs again"),
          KeyMember(call) + ",\"upstream_status\":" + std::to_string(status)));
      return ReleasedNote(status) + ", answer too large";
    case net::HttpClientResult::Kind::kResponse:
      // The upstream did not act (429, a redirect…), or a tool error under
      // errors = release: its answer goes to the client as it is,
      // Retry-After included.
      Reply(Relayed(std::move(result.response)));
      return ReleasedNote(status);
  }
  return {};
}

std::string ReverseProxy::Gated::RenderUnknown() {
  const Call& call = plan.call;
  if (result.kind == net::HttpClientResult::Kind::kResponse) {
    const std::string status = std::to_string(result.response.status);
    Reply(http::Problem(
        502, gate::problem::kOutcomeUnknown, "Outcome unknown",
        "the upstream answered HTTP " + status +
            ", so the action may or may not have happened: do not repeat it blindly. Retries "
            "with this key get this answer until an operator settles the record (`idemgate "
            "resolve " +
            call.id.key + "`) or it expires.",
        KeyMember(call) + ",\"upstream_status\":" + status));
    return "outcome unknown: HTTP " + status;
  }
  // No answer, a broken one, or a 5xx over the size limit.
  Reply(http::Problem(
      result.timed_out ? 504 : 502, gate::problem::kOutcomeUnknown, "Outcome unknown",
      result.detail +
          ". The action may have happened: do not repeat it blindly. Retries with this key "
          "get this answer until an operator settles the record (`idemgate resolve " +
          call.id.key + "`) or it expires.",
      KeyMember(call)));
  return "outcome unknown: " + result.detail;
}

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
  gated->proxy = this;
  gated->request = std::move(request);
  gated->respond = std::move(respond);
  gated->plan = std::move(plan);
  // Where the store allows (Redis), a retry of a finished request is
  // answered from one read (or the replay cache) and a fresh one claimed
  // with one pipelined write, without a worker; Begin, which may wait for a
  // running owner or a slow store, runs on the worker pool, never here.
  gate::RunGatedCall(ledger_, std::move(gated), gate::Threading::kContinuations);
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

}  // namespace idem::proxy
