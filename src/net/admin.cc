// WithAdmin: /healthz, /readyz and /metrics (docs/DESIGN.md §6.4) in front of a
// front's own handler. `ready` and `metrics` may block (a store round trip),
// so they run on a small worker pool owned by the returned handler, never on
// an I/O thread.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "core/worker_pool.h"
#include "net/cross_site.h"
#include "net/http_listener.h"

namespace idem::http {
namespace {

// Runs `ready` at most once at a time; concurrent probes share the result
// of the check in flight.
class ReadyProbe {
 public:
  ReadyProbe(std::function<Result<void>()> ready, std::function<void(std::string_view)> log)
      : ready_(std::move(ready)), log_(std::move(log)) {}

  // Blocks up to `timeout` for a fresh result. Runs the check on `pool` if
  // none is running.
  Result<void> Probe(WorkerPool& pool, std::chrono::milliseconds timeout,
                     const std::shared_ptr<ReadyProbe>& self) {
    std::unique_lock lock(mu_);
    const uint64_t want = started_ + (running_ ? 0 : 1);
    if (!running_) {
      running_ = true;
      ++started_;
      if (!pool.Submit([self] { self->RunCheck(); })) {
        running_ = false;
        return MakeError(ErrorCode::kUnavailable, "idemgate is stopping");
      }
    }
    if (!cv_.wait_for(lock, timeout, [&] { return finished_ >= want; })) {
      return MakeError(ErrorCode::kDeadlineExceeded, "the store did not answer within " +
                                                         std::to_string(timeout.count()) + " ms");
    }
    return last_;
  }

 private:
  void RunCheck() {
    Result<void> r = ready_();
    std::lock_guard lock(mu_);
    // Logged once per change of reason, not once per probe.
    const std::string reason = r ? std::string() : r.error().message;
    if (reason != logged_reason_ && log_) {
      log_(r ? std::string("the store answers again: ready")
             : "not ready: the store is not reachable: " + reason);
    }
    logged_reason_ = reason;
    last_ = std::move(r);
    running_ = false;
    ++finished_;
    cv_.notify_all();
  }

  const std::function<Result<void>()> ready_;
  const std::function<void(std::string_view)> log_;
  std::mutex mu_;
  std::string logged_reason_;  // empty: ready (or never checked)
  std::condition_variable cv_;
  bool running_ = false;
  uint64_t started_ = 0;   // checks started
  uint64_t finished_ = 0;  // checks finished
  Result<void> last_;
};

struct AdminState {
  AdminEndpoints admin;
  Handler next;
  std::shared_ptr<ReadyProbe> probe;
  WorkerPool pool;  // last: its threads use everything above
};

Response Text(int status, std::string body, std::string_view content_type) {
  Response r;
  r.status = status;
  r.headers.push_back({"Content-Type", std::string(content_type)});
  r.headers.push_back({"Cache-Control", "no-store"});
  r.body = std::move(body);
  return r;
}

}  // namespace

Handler WithAdmin(AdminEndpoints admin, Handler next) {
  auto state = std::make_shared<AdminState>();
  if (admin.ready) state->probe = std::make_shared<ReadyProbe>(admin.ready, admin.log);
  state->admin = std::move(admin);
  state->next = std::move(next);
  // Request&&: std::function passes its argument on as an rvalue, so the
  // request is moved once less on its way to `next`.
  return [state](Request&& request, Responder respond) {
    const std::string& path = request.path;
    if (path != "/healthz" && path != "/readyz" && path != "/metrics") {
      return state->next(std::move(request), std::move(respond));
    }
    if (request.method != "GET" && request.method != "HEAD") {
      Response r = Problem(405, "method-not-allowed", "Method not allowed",
                           "idemgate: " + path + " answers GET and HEAD");
      r.headers.push_back({"Allow", "GET, HEAD"});
      return respond(std::move(r));
    }
    if (path == "/healthz") return respond(Text(200, "ok\n", "text/plain; charset=utf-8"));
    // A probe or a scraper sends no Origin; a web page of another site must
    // not make the browser run a store check or render the metrics (F7).
    if (auto refused = CrossSiteRefusal(request)) return respond(std::move(*refused));
    if (path == "/readyz") {
      if (!state->probe) return respond(Text(200, "ready\n", "text/plain; charset=utf-8"));
      // The task holds the state by pointer: the state owns the pool, whose
      // destruction runs every task submitted before it goes.
      const bool detail = request.principal.admin;
      bool submitted = state->pool.Submit([s = state.get(), respond, detail] {
        Result<void> r = s->probe->Probe(s->pool, s->admin.ready_timeout, s->probe);
        if (r) return respond(Text(200, "ready\n", "text/plain; charset=utf-8"));
        // /readyz is public: the store's host, path and messages are for an
        // admin and the log only (F15).
        Response p = Problem(503, "not-ready", "Not ready",
                             detail ? "idemgate: the store is not reachable: " + r.error().message
                                    : std::string("idemgate: the store is not reachable; the "
                                                  "reason is in idemgate's log (or ask /readyz "
                                                  "with an admin token)"));
        p.headers.push_back({"Retry-After", "1"});
        respond(std::move(p));
      });
      if (!submitted) respond(Problem(503, "stopping", "Stopping", "idemgate is stopping"));
      return;
    }
    // /metrics
    if (!state->admin.metrics) {
      return respond(Problem(404, "metrics-disabled", "Metrics not enabled",
                             "idemgate: this listener does not export metrics yet"));
    }
    if (!request.principal.admin) {
      return respond(Problem(403, "forbidden", "Forbidden",
                             "idemgate: /metrics needs an admin token (a [[tenant]] with "
                             "admin = true)"));
    }
    bool submitted = state->pool.Submit([s = state.get(), respond] {
      respond(Text(200, s->admin.metrics(), "text/plain; version=0.0.4; charset=utf-8"));
    });
    if (!submitted) respond(Problem(503, "stopping", "Stopping", "idemgate is stopping"));
  };
}

}  // namespace idem::http
