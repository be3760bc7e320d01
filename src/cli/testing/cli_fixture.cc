// idemgate_cli_fixture STORE_URL: fills a store with known records and
// attempts for tests/integration/cli_test.py, which then drives the real
// `idemgate` binary against it. Test-only; not installed.
//
// Records in the past are made through a FakeClock set back in time: the
// store judges expiry by its clock, so the CLI (on the system clock) sees an
// expired lease or an expired retention without anybody sleeping.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem {
namespace {

using std::chrono::hours;
using std::chrono::seconds;

int Die(const char* what, const Error& e) {
  std::fprintf(stderr, "idemgate_cli_fixture: %s: %s\n", what, e.ToString().c_str());
  return 1;
}

ClaimRequest Req(std::string tenant, std::string key, std::string tool, std::string turn,
                 Duration lease) {
  ClaimRequest r;
  r.id = RecordId{std::move(tenant), std::move(key)};
  r.fingerprint = std::string(64, 'a');
  r.tool = std::move(tool);
  r.turn = std::move(turn);
  r.lease = lease;
  r.retention = hours(24);
  return r;
}

int Run(const std::string& url) {
  TimePoint now = SystemClock::Default().Now();
  {
    // An hour ago: an in-progress record whose 30 s lease has long expired.
    // Two days ago: completed records whose 1 h retention has ended (purge).
    FakeClock past(now - hours(1));
    auto store = OpenStore(url, past);
    if (!store) return Die("open (past)", store.error());
    auto stale = (*store)->Claim(Req("default", "fx-stale", "deploy", "turn-1", seconds(30)));
    if (!stale) return Die("claim fx-stale", stale.error());

    FakeClock long_ago(now - hours(48));
    auto old_store = OpenStore(url, long_ago);
    if (!old_store) return Die("open (long ago)", old_store.error());
    for (int i = 0; i < 5; ++i) {
      auto c = (*old_store)
                   ->Claim(Req("default", "fx-expired-" + std::to_string(i), "create_ticket", "t0",
                               seconds(30)));
      if (!c) return Die("claim fx-expired", c.error());
      auto done = (*old_store)
                      ->Complete(c->record.id, c->record.fence,
                                 Outcome{OutcomeClass::kSuccess, "{}"}, hours(1));
      if (!done) return Die("complete fx-expired", done.error());
    }
  }

  auto store = OpenStore(url, SystemClock::Default());
  if (!store) return Die("open", store.error());
  Store& s = **store;

  auto completed = s.Claim(Req("default", "fx-completed", "create_ticket", "turn-1", seconds(30)));
  if (!completed) return Die("claim fx-completed", completed.error());
  auto done = s.Complete(completed->record.id, completed->record.fence,
                         Outcome{OutcomeClass::kSuccess, "{\"ticket\":42,\"secret\":\"s3cr3t\"}"},
                         hours(24));
  if (!done) return Die("complete fx-completed", done.error());

  // Same key, another tenant: must never be seen through tenant "default".
  auto other = s.Claim(Req("acme", "fx-completed", "create_ticket", "turn-9", seconds(30)));
  if (!other) return Die("claim acme", other.error());
  auto other_done = s.Complete(other->record.id, other->record.fence,
                               Outcome{OutcomeClass::kToolError, "acme-body"}, hours(24));
  if (!other_done) return Die("complete acme", other_done.error());

  for (const char* key : {"fx-unknown", "fx-unknown-2"}) {
    auto unknown = s.Claim(Req("default", key, "charge_card", "turn-2", seconds(30)));
    if (!unknown) return Die("claim fx-unknown", unknown.error());
    auto marked = s.MarkUnknown(unknown->record.id, unknown->record.fence, hours(24));
    if (!marked) return Die("mark fx-unknown", marked.error());
  }

  auto live = s.Claim(Req("default", "fx-live", "deploy", "turn-3", hours(1)));
  if (!live) return Die("claim fx-live", live.error());

  std::vector<Attempt> attempts;
  auto attempt = [&](std::string key, std::string tool, AttemptOutcome o, Duration ago) {
    Attempt a;
    a.at = now - ago;
    a.tenant = "default";
    a.key = std::move(key);
    a.tool = std::move(tool);
    a.turn = "turn-1";
    a.outcome = o;
    a.latency = Duration(12);
    a.instance = "fixture";
    attempts.push_back(std::move(a));
  };
  attempt("fx-completed", "create_ticket", AttemptOutcome::kExecuted, seconds(50));
  attempt("fx-completed", "create_ticket", AttemptOutcome::kReplayed, seconds(40));
  attempt("fx-completed", "create_ticket", AttemptOutcome::kReplayed, seconds(30));
  attempt("fx-completed", "create_ticket", AttemptOutcome::kAttached, seconds(20));
  attempt("fx-unknown", "charge_card", AttemptOutcome::kExecuted, seconds(10));
  attempt("fx-unknown", "charge_card", AttemptOutcome::kUnknown, seconds(5));
  attempt("fx-old", "deploy", AttemptOutcome::kExecuted, hours(30));
  if (auto r = s.AppendAttempts(attempts); !r) return Die("append attempts", r.error());
  return 0;
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: idemgate_cli_fixture STORE_URL\n");
    return 2;
  }
  return idem::Run(argv[1]);
}
