// The ledger: the state machine of docs/DESIGN.md §4 on top of a Store.
//
// Two ways in:
//  - Run(call, fn): the whole life of a call for C++ callers.
//  - Begin / Complete / Release / MarkUnknown / Heartbeat: the steps the
//    fronts (MCP, HTTP, ledger API) drive themselves.
//
// Thread-safe: one Ledger serves every call of a process. The store and the
// clock must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/policy.h"
#include "idem/record.h"
#include "idem/resolve.h"
#include "idem/store.h"

namespace idem {

// One logical call, as the front derived it.
struct Call;
// The reconcile hook (on_unknown = reconcile): looks the outcome up with a
// read-only tool or route. Returns the outcome if the action happened,
// nullopt if it did not, an error if it cannot tell (the record then becomes
// kUnknown).
using ReconcileHook = std::function<Result<std::optional<Outcome>>(const Call&)>;

struct Call {
  RecordId id;              // tenant + key (key from DeriveKey)
  std::string fingerprint;  // of the full arguments: drift is judged on this
  std::string tool;
  std::string turn;
  Policy policy;
  bool turn_fallback = false;  // no turn id in turn mode: retained for policy.window
  std::string detail;          // note for the attempt log (never arguments)
  // The key of the call this one re-plans (the same turn ran the tool with
  // other arguments just before; the front decides): its execution is
  // logged kExecutedAgain naming that key instead of kExecuted. Empty: none.
  std::string replanned_from;
  // The agent host the call came from (MCP clientInfo.name), for the host
  // label of the metrics (GatewayMetrics bounds it). Empty: unknown.
  std::string host;
  // This call's own reconcile lookup, from the front that knows what the
  // upstream received (the key as forwarded, the caller's credentials);
  // empty: LedgerOptions::reconcile.
  ReconcileHook reconcile;
  // Prefixed to the claim's owner token (Record::owner), naming who began
  // the call, so that a front can bind later steps to it (the ledger API:
  // a digest of the bearer token). Empty: none.
  std::string owner_tag;
};

// What Begin decided. Exactly one owner gets kExecute for a live key.
struct Decision {
  enum class Kind {
    kExecute,     // run the call, then Complete / Release / MarkUnknown with `fence`
    kReplay,      // `record` is completed: answer its outcome, marked replayed
    kInProgress,  // another owner is still running after policy.wait: retry after `retry_after`
    kUnknown,     // the owner died mid-call: the action may have happened; do not repeat blindly
    kDrift,       // same key, different arguments, on_drift = reject
    kPassThrough, // run unguarded: the store is down and on_store_down = pass, or observe mode
  };
  Kind kind = Kind::kExecute;
  Record record;            // the record as last seen (for kExecute: the claimed one)
  uint64_t fence = 0;       // kExecute only
  bool attached = false;    // kReplay after waiting for a running owner
  bool drift = false;       // kReplay of a record whose fingerprint differs (on_drift = replay)
  bool reconciled = false;  // kReplay of an outcome found by the reconcile hook
  bool took_over = false;   // kExecute after the previous owner's lease expired (retry/reconcile)
  bool observed = false;    // kPassThrough in observe mode: enforcing would have answered itself
  Duration retry_after{0};  // kInProgress
  TimePoint started_at{};   // when the attempt arrived, for latency in the audit log
};
std::string_view DecisionKindName(Decision::Kind k);


// What the caller's function reports about one execution (§4.7).
struct Execution {
  enum class Kind {
    kSuccess,    // stored and returned
    kToolError,  // the tool reported an error: stored (or released if errors = release)
    kNotSent,    // the action did not happen (not sent, or refused before acting): released
    kMaybeSent,  // timeout / lost connection / 5xx after sending: marked unknown
    kInterim,    // not an outcome (MCP input_required): released
  };
  Kind kind = Kind::kSuccess;
  std::string body;
};

// What Ledger::Settle did with an execution's report.
struct Settlement {
  enum class Kind {
    kStored,    // the outcome is stored: answer it
    kReleased,  // the record is gone: a retry runs
    kUnknown,   // the record is unknown: on_unknown decides a retry
  };
  Kind kind = Kind::kStored;
  Record record;  // kStored / kUnknown: the record as written (empty when unguarded)
};

struct RunResult {
  Decision decision;        // how the call was answered
  std::optional<Outcome> outcome;  // the stored or fresh outcome (kExecute / kReplay)
  std::string body;         // kExecute with kNotSent / kMaybeSent / kInterim: what fn returned
};

// Sees every attempt the ledger records (the ones the audit log gets, also
// with audit = false): when it arrived and how long it took, by the ledger's
// clock. For metrics and alerts (GatewayMetrics::ObserverFor). Runs on the
// caller's thread on the request path: must be fast, must not block and must
// not call the ledger.
using AttemptHook = std::function<void(const Call& call, AttemptOutcome outcome,
                                       TimePoint started_at, Duration latency)>;

struct LedgerOptions {
  std::string instance = "idemgate";  // names this process in the audit log
  ReconcileHook reconcile;            // used when a call's policy says reconcile
  bool audit = true;                  // append every attempt to the store's log
  AttemptHook on_attempt;             // observer of every attempt; default none
  // Audit entries that may wait for a slow store; past it new ones are
  // dropped and reported on stderr ([limits] max_audit_backlog).
  size_t audit_backlog = 100'000;
};

// Audit entries the ledger lost since it started (never a record): dropped
// while `audit_backlog` entries already waited for a slow store, and in
// batches the store refused. For the metrics.
struct AuditDrops {
  uint64_t backlog = 0;
  uint64_t refused = 0;
};

class AttemptLog;
class LeaseKeeper;

class Ledger {
 public:
  Ledger(Store& store, Clock& clock, LedgerOptions options = {});
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Claims `call` and decides. May block up to call.policy.wait while
  // another owner runs, waking the moment it completes. Errors: kUnavailable
  // when the store is down (fail closed; nothing may execute), kAborted if the
  // store kept changing under us, kDataLoss for a corrupt store.
  Result<Decision> Begin(const Call& call);

  // The answer to `call` if one read of its record settles it without a
  // write or a wait: a completed record (kReplay, or kDrift when on_drift is
  // reject) or an unknown one under on_unknown = fail (kUnknown), decided and
  // logged exactly as Begin would; nullopt when only Begin can answer (no
  // record, a running owner, a policy that writes, a failed read: Begin then
  // reports the store's error). Without blocking the caller: the read is
  // the store's GetAsync, and `done` runs exactly once, later on a thread of
  // the store's or, from a cache, before this returns; it must not block. Returns false if the
  // store has no such read (`done` is dropped; the caller goes to Begin). `call` must stay alive
  // until `done` has run. Fronts call it on their I/O thread, so that a retry of a finished call
  // costs one pipelined read and no claim.
  bool SettledAsync(const Call& call, std::function<void(std::optional<Decision>)> done);

  // The answer Begin would give `call` from a record the store holds in
  // memory (Store::Held: the replay cache), decided and logged as Begin
  // would, with no I/O and no wait: a completed record (kReplay, or kDrift),
  // or an unknown one under on_unknown = fail. nullopt when only the store
  // can answer. For threads that must not block: an MCP session answers a
  // retry on its reader thread with it, instead of handing it to a worker.
  std::optional<Decision> AnswerHeld(const Call& call);

  // Begin's claim without blocking the caller, for stores that write
  // asynchronously (Store::ClaimAsync): `done` runs exactly once, later on a
  // thread of the store's or, from a cache, before this returns, with Begin's
  // answer when the claim settles it
  // (claimed: kExecute; the store's error; a pass-through under
  // on_store_down = pass), the answer SettledAsync would give when the
  // record it found settles the call (a completed record, say), or nullopt
  // when only Begin, which may wait for the record's owner, can answer. It
  // must not block. False if the store has no such write, or the claim would
  // first need a blocking one (`done` is dropped; the caller goes to Begin).
  // `call` must stay alive until `done` has run.
  bool BeginAsync(const Call& call, std::function<void(std::optional<Result<Decision>>)> done);

  // Begin for a front that must not block its I/O thread, in the cheapest
  // way the store allows: one read settles a finished call (SettledAsync),
  // one claim a fresh one (BeginAsync; the claim alone where it answers as
  // the read would, Store::ReadsBeforeClaim), and only what is left, Begin, which
  // may block or wait for a running owner, goes to `offload`. `offload`
  // runs the work it is given on a worker thread or, if it cannot (the
  // front is stopping), answers the request itself, and then `done` is
  // never called. Otherwise `done` runs exactly once, on a thread of the
  // store's, a worker, or the caller's (an answer from a cache). `call`
  // must stay alive until `done` has run.
  using Offload = std::function<void(std::function<void()> work)>;
  void BeginWithoutBlocking(const Call& call, Offload offload,
                            std::function<void(Result<Decision>)> done);

  // Persists the outcome of an execution. Durable before it returns; the
  // caller may answer only after it returns OK. kAborted: this owner lost the
  // record (lease expired and someone took over) and must not answer with its
  // outcome as if it were stored. Outcomes over max_result_bytes are stored
  // as a kTooLarge marker (the returned record says so).
  Result<Record> Complete(const Call& call, const Decision& d, Outcome outcome);
  // Complete without blocking the caller (Store::CompleteAsync): `done`
  // runs exactly once, later, on a thread of the store's, with what Complete
  // would return; it must not block. False if the store has no such write or
  // the call passed through unguarded (`done` is dropped; the caller uses
  // Complete). `call` must stay alive until `done` has run.
  bool CompleteAsync(const Call& call, const Decision& d, const Outcome& outcome,
                     std::function<void(Result<Record>)> done);
  // Nothing happened (or an interim result): delete the record so a retry runs.
  Result<void> Release(const Call& call, const Decision& d);
  // The side effect may have happened: kUnknown until resolved or expired.
  Result<Record> MarkUnknown(const Call& call, const Decision& d);
  // Settles what one execution reported (§4.7), the one way every front and
  // Run share: kSuccess and kToolError are stored (a tool error is released
  // under errors = release), kNotSent and kInterim released, kMaybeSent
  // marked unknown. Durable before it returns. Errors: the store's (kAborted
  // when this owner lost the record); nothing is answered as stored then.
  Result<Settlement> Settle(const Call& call, const Decision& d, Execution ex);
  // The same, for a front that made the outcome to store itself: `kind`
  // decides as above, and a stored outcome is `outcome` as it is (its class
  // may be a too-large marker of the front's own: the HTTP proxy's keeps the
  // upstream's status and headers).
  Result<Settlement> Settle(const Call& call, const Decision& d, Execution::Kind kind,
                            Outcome outcome);
  // Whether Settle stores what `kind` reports for `call` (a success, or a
  // tool error unless errors = "release"), rather than releasing the record
  // or marking it unknown.
  static bool SettlesAsOutcome(const Call& call, Execution::Kind kind);
  // Extends the lease by call.policy.lease.
  Result<TimePoint> Heartbeat(const Call& call, uint64_t fence);

  // Renews the lease every lease/3 until the returned guard is destroyed.
  // Fronts hold one while the upstream works.
  class LeaseGuard {
   public:
    LeaseGuard() = default;
    LeaseGuard(LeaseGuard&&) noexcept;
    LeaseGuard& operator=(LeaseGuard&&) noexcept;
    ~LeaseGuard();
    // True once a heartbeat found the fence moved on.
    bool lost() const;

   private:
    friend class Ledger;
    LeaseGuard(LeaseKeeper* keeper, uint64_t ticket) : keeper_(keeper), ticket_(ticket) {}
    LeaseKeeper* keeper_ = nullptr;
    uint64_t ticket_ = 0;
  };
  LeaseGuard KeepAlive(const Call& call, uint64_t fence);

  // The whole call: Begin; if kExecute, run fn under a heartbeat and store
  // what it reports (§4.7) before returning. fn is never run without a claim
  // (unless on_store_down = pass). If storing the outcome fails, returns the
  // error, not the outcome.
  Result<RunResult> Run(const Call& call, const std::function<Execution()>& fn);

  // Records one attempt in the audit log (fronts use it for attempts that
  // never reach Begin, such as a rejected request). Buffered; see Flush.
  void LogAttempt(const Call& call, AttemptOutcome outcome, TimePoint started_at,
                  std::string detail = {});
  // Writes buffered attempts now.
  void Flush();

  // Executions running now: calls holding a KeepAlive guard (the upstream
  // is working on them). For the in-flight gauge.
  size_t running_executions();
  // Audit entries lost so far (zero with audit = false).
  AuditDrops audit_drops() const;

  // ── Reading records and the audit log, and an operator's acts ──────────
  // What the ledger API, the console and other readers may do besides the
  // gated call's steps, so that no front reaches around the ledger to its
  // store (docs/DESIGN.md §6.3, §8). Each is the store's own operation, with
  // its errors; the ledger adds nothing but the clock and the audit entry.

  // The record of `id` as stored now, or nullopt.
  Result<std::optional<Record>> Read(const RecordId& id);
  // The same without blocking where the store can (Store::GetAsync); false
  // when it cannot and `done` will not be called.
  bool ReadAsync(const RecordId& id, Store::GetDone done);
  // Settles an unknown record (release, or store what happened): ResolveRecord
  // with this ledger's store and clock.
  Result<Resolution> Resolve(const ResolveRequest& req,
                             const std::function<Policy(const std::string& tool)>& policy_for,
                             const Operator& who);
  // Forgets a record whatever its state: EvictRecord with this ledger's store
  // and clock. Returns whether there was one.
  Result<bool> Evict(const RecordId& id, const Operator& who,
                     std::optional<Error>* audit_error = nullptr);
  // The audit log: its entries matching `filter`, and their counts per tool.
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter);
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter);

  Clock& clock() { return clock_; }
  // Names this process in the audit log (LedgerOptions::instance).
  const std::string& instance() const { return options_.instance; }

 private:
  // The audit entry of one attempt of `call`, its latency measured now;
  // nullopt when the audit log is off.
  std::optional<Attempt> EntryOf(const Call& call, AttemptOutcome outcome, TimePoint started_at,
                                 std::string detail = {});
  // Tells the observer (metrics) of an attempt whose entry the store wrote.
  void Observe(const Call& call, AttemptOutcome outcome, TimePoint started_at);
  // The claim of `call`, carrying its kClaimed entry where the store writes
  // it with the record (Store::LogsWithRecords).
  ClaimRequest ClaimFor(const Call& call, TimePoint started_at);
  // After `req` claimed: its kClaimed entry, to the batch if the store did not write it.
  void Claimed(const Call& call, const ClaimRequest& req, TimePoint started_at);
  // The kExecuted entry Complete hands the store, where it writes it with the record.
  std::optional<Attempt> CompletionEntry(const Call& call, TimePoint started_at);
  std::optional<Result<Decision>> AfterClaim(const Call& call, const ClaimRequest& req,
                                             TimePoint started, bool sent,
                                             Result<ClaimResult>& claim);
  Result<Record> Completed(const Call& call, TimePoint started_at, bool logged, Result<Record> r);
  Result<Decision> Decide(const Call& call, Record record, TimePoint started_at);
  Result<Decision> OnOwnerGone(const Call& call, const Record& record, TimePoint started_at);
  std::optional<Decision> Final(const Call& call, Record& record, TimePoint started_at,
                                bool waited);
  Decision Finish(const Call& call, Decision d, AttemptOutcome logged);
  Decision Observed(const Call& call, TimePoint started_at, AttemptOutcome would);

  Store& store_;
  Clock& clock_;
  LedgerOptions options_;
  std::unique_ptr<AttemptLog> attempts_;
  std::unique_ptr<LeaseKeeper> leases_;
};

}  // namespace idem
