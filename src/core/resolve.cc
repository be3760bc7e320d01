#include "idem/resolve.h"

#include <vector>

namespace idem {
namespace {

// "released by ops (console)"
std::string Detail(std::string_view what, const Operator& who) {
  std::string d(what);
  d += " by ";
  d += who.name.empty() ? "an unnamed operator" : who.name;
  if (!who.via.empty()) d += " (" + who.via + ")";
  return d;
}

std::optional<Error> Log(Store& store, Clock& clock, const Record& r, AttemptOutcome outcome,
                         std::string detail, const Operator& who) {
  Attempt a;
  a.at = clock.Now();
  a.tenant = r.id.tenant;
  a.key = r.id.key;
  a.tool = r.tool;
  a.turn = r.turn;
  a.outcome = outcome;
  a.instance = who.instance;
  a.detail = std::move(detail);
  if (auto w = store.AppendAttempts({a}); !w) return w.error();
  return std::nullopt;
}

}  // namespace

Result<Resolution> ResolveRecord(Store& store, Clock& clock,
                                 const std::function<Policy(const std::string& tool)>& policy_for,
                                 const ResolveRequest& req, const Operator& who) {
  Resolution res;
  auto got = store.Get(req.id);
  if (!got) return std::unexpected(got.error());
  if (!*got) return res;  // kNoRecord
  Record r = std::move(**got);
  res.policy = policy_for(r.tool);
  auto refuse = [&](Resolution::Kind k) {
    res.kind = k;
    res.record = std::move(r);
    return res;
  };
  if (req.expect_fence && *req.expect_fence != r.fence) return refuse(Resolution::Kind::kChanged);
  if (r.state == RecordState::kCompleted) return refuse(Resolution::Kind::kCompleted);
  if (req.outcome && req.outcome->body.size() > res.policy.max_result_bytes) {
    return refuse(Resolution::Kind::kTooLarge);
  }
  const bool was_forced = r.state == RecordState::kInProgress;
  if (was_forced) {
    if (r.lease_expires_at > clock.Now()) return refuse(Resolution::Kind::kRunning);
    if (!req.force) return refuse(Resolution::Kind::kLeaseExpired);
    // The presumed-dead owner still holds this fence; taking over moves the
    // fence on so that owner can never write after we resolve.
    auto taken = store.TakeOver(r.id, r.fence, res.policy.lease);
    if (!taken) return std::unexpected(taken.error());
    r = std::move(*taken);
  }
  const std::string forced = was_forced ? " (forced: the owner's lease had expired)" : "";
  if (!req.outcome) {
    if (auto released = store.Release(r.id, r.fence); !released) {
      return std::unexpected(released.error());
    }
    res.kind = Resolution::Kind::kReleased;
    res.audit_error = Log(store, clock, r, AttemptOutcome::kResolved,
                          Detail("released" + forced, who), who);
    res.record = std::move(r);
    return res;
  }
  // The retention the claim decided and the record keeps, as every other
  // step does (a window record resolved was kept for the ttl: review H2);
  // the policy's for a record written before records kept theirs.
  const Duration kept = r.retention > Duration(0) ? r.retention : res.policy.ttl;
  auto done = store.Complete(r.id, r.fence, *req.outcome, req.ttl.value_or(kept));
  if (!done) return std::unexpected(done.error());
  res.kind = Resolution::Kind::kStored;
  res.audit_error =
      Log(store, clock, *done, AttemptOutcome::kResolved,
          Detail("outcome set (" + std::string(OutcomeClassName(req.outcome->cls)) + ", " +
                     std::to_string(req.outcome->body.size()) + " bytes)" + forced,
                 who),
          who);
  res.record = std::move(*done);
  return res;
}

Result<bool> EvictRecord(Store& store, Clock& clock, const RecordId& id, const Operator& who,
                         std::optional<Error>* audit_error) {
  // Read first only to name the tool and state in the audit entry.
  auto got = store.Get(id);
  auto evicted = store.Evict(id);
  if (!evicted) return std::unexpected(evicted.error());
  if (!*evicted) return false;
  Record r;
  r.id = id;
  std::string what = "evicted";
  if (got && *got) {
    r = **got;
    what += " (was " + std::string(RecordStateName(r.state)) + ", fence " +
            std::to_string(r.fence) + ")";
  }
  auto e = Log(store, clock, r, AttemptOutcome::kEvicted, Detail(what, who), who);
  if (audit_error) *audit_error = std::move(e);
  return true;
}

}  // namespace idem
