// An operator's acts on a record (docs/DESIGN.md §4 step 4, §8): settling an
// `unknown` record (release it: the action did not happen; or store the
// outcome that did happen) and evicting a record. One implementation for
// every way in: `idemgate resolve` / `evict`, the ledger API's
// POST /v1/records/{key}/resolve and DELETE /v1/records/{key}, and the
// operator console.
//
// Every write is conditional on the record's fence, so a resolve never
// overwrites an owner or a reconcile that got there first. Each act that
// changed the store is appended to the audit log (AttemptOutcome kResolved,
// kEvicted) naming who did it and through what.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/policy.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem {

// Who acts, for the audit entry: "released by ops (console)".
struct Operator {
  std::string name;      // the admin tenant's name, or the CLI's user
  std::string via;       // "console", "ledger api", "cli"
  std::string instance;  // the process, as in the audit log ("serve-4242")
};

struct ResolveRequest {
  RecordId id;
  // nullopt: release (the action did not happen; the next attempt executes).
  // Else the outcome that did happen: stored, and retries replay it.
  std::optional<Outcome> outcome;
  // Also settle an in-progress record whose owner's lease has expired (the
  // owner is presumed dead): its fence is moved on first.
  bool force = false;
  // Set: the record must still have this fence (what the operator saw), else
  // kChanged and nothing is written.
  std::optional<uint64_t> expect_fence;
  // Retention of a stored outcome; nullopt: the record's own (decided at its
  // claim), or the tool's policy ttl for a record that has none.
  std::optional<Duration> ttl;
};

struct Resolution {
  enum class Kind {
    kReleased,      // the record is gone
    kStored,        // the outcome is stored (record: as written)
    kNoRecord,      // nothing to resolve: no live record
    kCompleted,     // refused: completed, retries replay it (evict to forget it)
    kRunning,       // refused: in progress, the owner's lease runs (record.lease_expires_at)
    kLeaseExpired,  // refused: in progress, lease expired, and not forced
    kTooLarge,      // refused: the outcome is over the tool's max_result_bytes (policy)
    kChanged,       // refused: the fence is not expect_fence any more (record: as read)
  };
  Kind kind = Kind::kNoRecord;
  Record record;  // as written (kStored), as it was (kReleased), as read (refusals)
  Policy policy;  // of the record's tool
  // The audit entry could not be written (the act itself was done).
  std::optional<Error> audit_error;
};

// Reads the record of req.id and settles it. `policy_for` gives a tool's
// policy (Config::PolicyFor). Errors: the store's (kAborted when someone
// else changed the record between the read and the write: nothing written).
Result<Resolution> ResolveRecord(Store& store, Clock& clock,
                                 const std::function<Policy(const std::string& tool)>& policy_for,
                                 const ResolveRequest& req, const Operator& who);

// Evicts the record whatever its state and logs it (kEvicted) when there was
// one. Returns whether there was one. `audit_error` (may be null) gets an
// audit write's failure.
Result<bool> EvictRecord(Store& store, Clock& clock, const RecordId& id, const Operator& who,
                         std::optional<Error>* audit_error = nullptr);

}  // namespace idem
