#include "idem/ledger.h"

#include <openssl/rand.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>

#include "core/attempt_log.h"
#include "core/fault_point.h"
#include "core/lease_keeper.h"

namespace idem {
namespace {

// Rounds of claim → wait → re-read before Begin gives up. Each round waits
// for a change, so this bounds only pathological churn (a key released and
// re-claimed by others thousands of times during one wait).
constexpr int kMaxRounds = 1000;

// Errors that mean another attempt changed the record between our read and
// our write: not a failure, re-read and decide again.
bool LostRace(const Error& e) {
  return e.code == ErrorCode::kAborted || e.code == ErrorCode::kFailedPrecondition ||
         e.code == ErrorCode::kNotFound;
}

Duration RetentionOf(const Call& call) {
  return call.turn_fallback ? std::min(call.policy.window, call.policy.ttl) : call.policy.ttl;
}

// The retention a settling step applies: the one the claim decided, which the
// record keeps, so that a step rebuilt from the record elsewhere (the ledger
// API's complete, another instance's reconcile) cannot change it; the call's
// own for a record written before records kept theirs.
Duration KeptRetention(const Call& call, const Record& claimed) {
  return claimed.retention > Duration(0) ? claimed.retention : RetentionOf(call);
}

// Bumped in a forked child, so that it never hands out the random bytes its
// parent drew (a pool drawn before the fork is thrown away).
std::atomic<uint64_t> fork_generation{0};

// Sixteen random bytes for an owner token. RAND_bytes costs about as much
// for 512 bytes as for 16 (most of it is the DRBG's fixed work per call:
// ~6,600 instructions under callgrind), so each thread draws 32 tokens'
// worth at a time.
void RandomTokenBytes(unsigned char (&bytes)[16]) {
  struct Pool {
    unsigned char bytes[512];
    size_t used = sizeof bytes;
    uint64_t generation = 0;
  };
  thread_local Pool pool;
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1); });
    return true;
  }();
  (void)registered;
  const uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (pool.used == sizeof pool.bytes || pool.generation != generation) {
    if (RAND_bytes(pool.bytes, sizeof pool.bytes) != 1) {
      // No CSPRNG output (it has never happened on Linux): a token only has
      // to differ from every other claim's, which this still gives.
      thread_local std::mt19937_64 gen{std::random_device{}()};
      for (size_t i = 0; i < sizeof bytes; i += 8) {
        const uint64_t v = gen();
        for (size_t j = 0; j < 8; ++j) bytes[i + j] = static_cast<unsigned char>(v >> (8 * j));
      }
      return;
    }
    pool.used = 0;
    pool.generation = generation;
  }
  std::memcpy(bytes, pool.bytes + pool.used, sizeof bytes);
  std::memset(pool.bytes + pool.used, 0, sizeof bytes);  // handed out once
  pool.used += sizeof bytes;
}

// A new claim owner token: 128 random bits in hex (ClaimRequest::owner).
std::string NewOwnerToken() {
  unsigned char bytes[16];
  RandomTokenBytes(bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * sizeof bytes, '\0');
  for (size_t i = 0; i < sizeof bytes; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 0xF];
  }
  return out;
}

ClaimRequest ClaimOf(const Call& call) {
  ClaimRequest req;
  req.id = call.id;
  req.fingerprint = call.fingerprint;
  req.tool = call.tool;
  req.turn = call.turn;
  req.lease = call.policy.lease;
  req.retention = RetentionOf(call);
  req.owner = call.owner_tag + NewOwnerToken();
  return req;
}

// What is stored of `outcome`: itself, or a kTooLarge marker when its body is
// over the call's max_result_bytes.
const Outcome& Storable(const Call& call, const Outcome& outcome) {
  static const Outcome kTooLargeMarker{OutcomeClass::kTooLarge, {}};
  return outcome.body.size() > call.policy.max_result_bytes ? kTooLargeMarker : outcome;
}

// When a claim that may have been applied (its reply was lost) is gone for
// good: at the end of its retention, as the store judges it.
TimePoint ClaimEnd(const ClaimRequest& req, TimePoint now) {
  return now + std::max(req.retention, req.lease);
}

}  // namespace

Ledger::Ledger(Store& store, Clock& clock, LedgerOptions options)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      attempts_(options_.audit ? std::make_unique<AttemptLog>(store, 256, Duration(200),
                                                              options_.audit_backlog)
                               : nullptr),
      leases_(std::make_unique<LeaseKeeper>(store, clock)) {}

Ledger::~Ledger() = default;

namespace {

// An execution whose turn ran this tool with other arguments just before (a
// re-planned retry, docs/hosts.md) is logged and counted as executed_again,
// with the earlier key in its detail.
AttemptOutcome Relabeled(const Call& call, AttemptOutcome outcome, std::string* detail) {
  if (outcome != AttemptOutcome::kExecuted || call.replanned_from.empty()) return outcome;
  if (detail) {
    *detail =
        "re-planned: earlier key " + call.replanned_from + (detail->empty() ? "" : "; " + *detail);
  }
  return AttemptOutcome::kExecutedAgain;
}

}  // namespace

std::optional<Attempt> Ledger::EntryOf(const Call& call, AttemptOutcome outcome,
                                       TimePoint started_at, std::string detail) {
  if (!attempts_) return std::nullopt;
  outcome = Relabeled(call, outcome, &detail);
  Attempt a;
  a.at = started_at;
  a.tenant = call.id.tenant;
  a.key = call.id.key;
  a.tool = call.tool;
  a.turn = call.turn;
  a.outcome = outcome;
  a.latency = std::max(Duration(0), clock_.Now() - started_at);
  a.instance = options_.instance;
  // What this attempt adds ("drift replayed", an error), then what scoped the
  // call ("turn: meta:vscode.requestId", "explicit key").
  a.detail = detail.empty() ? call.detail
             : call.detail.empty() ? std::move(detail)
                                   : std::move(detail) + "; " + call.detail;
  return a;
}

void Ledger::Observe(const Call& call, AttemptOutcome outcome, TimePoint started_at) {
  if (!options_.on_attempt) return;
  options_.on_attempt(call, Relabeled(call, outcome, nullptr), started_at,
                      std::max(Duration(0), clock_.Now() - started_at));
}

void Ledger::LogAttempt(const Call& call, AttemptOutcome outcome, TimePoint started_at,
                        std::string detail) {
  Observe(call, outcome, started_at);
  if (auto a = EntryOf(call, outcome, started_at, std::move(detail))) {
    attempts_->Append(*std::move(a));
  }
}

ClaimRequest Ledger::ClaimFor(const Call& call, TimePoint started_at) {
  ClaimRequest req = ClaimOf(call);
  if (store_.LogsWithRecords()) req.logged = EntryOf(call, AttemptOutcome::kClaimed, started_at);
  return req;
}

void Ledger::Claimed(const Call& call, const ClaimRequest& req, TimePoint started_at) {
  if (req.logged) return;  // the store wrote it with the record
  if (auto a = EntryOf(call, AttemptOutcome::kClaimed, started_at)) attempts_->Append(*std::move(a));
}

void Ledger::Flush() {
  if (attempts_) attempts_->Flush();
}

Decision Ledger::Finish(const Call& call, Decision d, AttemptOutcome logged) {
  std::string detail;
  if (d.drift) detail = "drift replayed";
  if (d.reconciled) detail = "reconciled";
  LogAttempt(call, logged, d.started_at, detail);
  return d;
}

// Observe mode: the call runs unguarded; the attempt says what enforcing
// would have answered.
Decision Ledger::Observed(const Call& call, TimePoint started_at, AttemptOutcome would) {
  Decision d;
  d.kind = Decision::Kind::kPassThrough;
  d.observed = true;
  d.started_at = started_at;
  return Finish(call, std::move(d), would);
}

Result<Decision> Ledger::Begin(const Call& call) {
  const TimePoint started = clock_.Now();
  const ClaimRequest req = ClaimFor(call, started);
  // An earlier attempt of this process whose claim reply was lost may have
  // left its claim behind: take it back first, or this attempt would wait
  // for it and then call a call that never ran "outcome unknown".
  auto cleared = leases_->AbandonNow(call.id);
  auto claim = cleared ? store_.Claim(req) : std::unexpected(cleared.error());
  if (auto decided = AfterClaim(call, req, started, cleared.has_value(), claim)) {
    return std::move(*decided);
  }
  auto decided = Decide(call, std::move(claim->record), started);
  if (decided && decided->kind == Decision::Kind::kExecute) FaultPoint("after_claim");
  return decided;
}

bool Ledger::BeginAsync(const Call& call,
                        std::function<void(std::optional<Result<Decision>>)> done) {
  // AbandonNow would write, blocking, before the claim.
  if (leases_->AbandonsPending()) return false;
  const TimePoint started = clock_.Now();
  auto req = std::make_shared<const ClaimRequest>(ClaimFor(call, started));
  return store_.ClaimAsync(
      *req, [this, &call, started, req, done = std::move(done)](Result<ClaimResult> claim) {
        auto decided = AfterClaim(call, *req, started, /*sent=*/true, claim);
        // The claim found the record: a finished call is answered from it,
        // as SettledAsync would from a read.
        if (!decided) {
          if (auto final = Final(call, claim->record, started, /*waited=*/false)) decided = *final;
        }
        done(std::move(decided));
      });
}

void Ledger::BeginWithoutBlocking(const Call& call, Offload offload,
                                  std::function<void(Result<Decision>)> done) {
  auto finish = std::make_shared<std::function<void(Result<Decision>)>>(std::move(done));
  auto begin = [this, &call, finish] { (*finish)(Begin(call)); };
  auto claim = [this, &call, offload = std::move(offload), begin, finish] {
    const bool async =
        BeginAsync(call, [offload, begin, finish](std::optional<Result<Decision>> claimed) {
          if (!claimed) return offload(begin);  // the record exists: Begin may wait
          (*finish)(*std::move(claimed));
        });
    if (!async) offload(begin);
  };
  // Where a claim that finds the record answers as a read would, the read
  // first would only add a round trip to every fresh call; a finished call
  // whose record is held in memory still costs no claim.
  if (!store_.ReadsBeforeClaim()) {
    if (auto settled = AnswerHeld(call)) return (*finish)(*std::move(settled));
    return claim();
  }
  const bool read = SettledAsync(call, [claim, finish](std::optional<Decision> settled) {
    if (!settled) return claim();
    (*finish)(*std::move(settled));
  });
  if (!read) claim();
}

std::optional<Decision> Ledger::AnswerHeld(const Call& call) {
  auto held = store_.Held(call.id);
  if (!held) return std::nullopt;
  return Final(call, *held, clock_.Now(), /*waited=*/false);
}

std::optional<Result<Decision>> Ledger::AfterClaim(const Call& call, const ClaimRequest& req,
                                                   TimePoint started, bool sent,
                                                   Result<ClaimResult>& claim) {
  if (!claim) {
    // Only an outage passes: the store was not reached and nothing was
    // written. Contention, a lost reply or replicas short of the write may
    // have left a claim, and running unguarded then could run twice.
    const bool pass = claim.error().code == ErrorCode::kUnavailable &&
                      claim.error().unreached &&
                      call.policy.on_store_down == OnStoreDown::kPass;
    // A claim that failed may still have been applied (the store ran it and
    // the reply was lost): nothing executed, so take it back in the
    // background. Harmless if it was not applied: the token is this
    // attempt's alone. Not for a pass-through, which does execute: a retry
    // that finds the claim then rightly answers "outcome unknown".
    if (sent && !pass) leases_->Abandon(call.id, req.owner, ClaimEnd(req, started));
    if (pass) {
      Decision d;
      d.kind = Decision::Kind::kPassThrough;
      d.started_at = started;
      LogAttempt(call, AttemptOutcome::kError, started, "store down, passed through unguarded");
      return d;
    }
    LogAttempt(call, AttemptOutcome::kError, started, claim.error().ToString());
    return std::unexpected(claim.error());
  }
  if (!claim->claimed) return std::nullopt;
  Claimed(call, req, started);
  Decision d;
  d.kind = Decision::Kind::kExecute;
  d.fence = claim->record.fence;
  d.record = std::move(claim->record);
  d.started_at = started;
  FaultPoint("after_claim");
  return d;
}

bool Ledger::SettledAsync(const Call& call, std::function<void(std::optional<Decision>)> done) {
  const TimePoint started = clock_.Now();
  return store_.GetAsync(
      call.id, [this, &call, started, done = std::move(done)](Result<std::optional<Record>> read) {
        if (!read || !read->has_value()) return done(std::nullopt);
        done(Final(call, **read, started, /*waited=*/false));
      });
}

// The answers a record gives without a write or a wait, in the order Decide
// asks: drift under reject, a completed record, an unknown one under
// on_unknown = fail. nullopt leaves `record` intact.
std::optional<Decision> Ledger::Final(const Call& call, Record& record, TimePoint started_at,
                                      bool waited) {
  const Policy& p = call.policy;
  const bool drifted = record.fingerprint != call.fingerprint;
  // One key sent with another tool is another call, whatever on_drift says:
  // answering cancel_order with refund_order's outcome, marked replayed,
  // would report an action that never ran. (A derived key names its tool;
  // only a caller's explicit key can meet another tool's record.)
  const bool other_tool = !record.tool.empty() && record.tool != call.tool;
  Decision d;
  d.started_at = started_at;
  if (other_tool || (drifted && p.on_drift == OnDrift::kReject)) {
    if (p.observe) return Observed(call, started_at, AttemptOutcome::kWouldDrift);
    d.kind = Decision::Kind::kDrift;
    d.record = std::move(record);
    return Finish(call, std::move(d), AttemptOutcome::kDrift);
  }
  if (record.state == RecordState::kCompleted) {
    if (p.observe) return Observed(call, started_at, AttemptOutcome::kWouldReplay);
    d.kind = Decision::Kind::kReplay;
    d.attached = waited;
    d.drift = drifted;
    d.record = std::move(record);
    return Finish(call, std::move(d),
                  waited ? AttemptOutcome::kAttached : AttemptOutcome::kReplayed);
  }
  if (record.state == RecordState::kUnknown && p.on_unknown == OnUnknown::kFail) {
    if (p.observe) return Observed(call, started_at, AttemptOutcome::kWouldUnknown);
    d.kind = Decision::Kind::kUnknown;
    d.record = std::move(record);
    return Finish(call, std::move(d), AttemptOutcome::kUnknown);
  }
  return std::nullopt;
}

// The record exists and is not ours. Loops until it can answer: replay a
// completed record, attach to a running owner (waiting up to policy.wait),
// apply on_unknown to a dead owner's record, or claim a record that vanished.
Result<Decision> Ledger::Decide(const Call& call, Record record, TimePoint started_at) {
  const Policy& p = call.policy;
  const TimePoint wait_deadline = started_at + p.wait;
  bool waited = false;
  Decision d;
  d.started_at = started_at;
  for (int round = 0; round < kMaxRounds; ++round) {
    if (auto final = Final(call, record, started_at, waited)) return *std::move(final);
    // Running, or unknown under a policy that acts on it.
    const TimePoint now = clock_.Now();
    const bool owner_gone = record.state == RecordState::kUnknown || record.lease_expires_at <= now;
    if (p.observe) {
      // Observe mode never waits and never takes a record over.
      return Observed(call, started_at,
                      owner_gone ? AttemptOutcome::kWouldUnknown : AttemptOutcome::kWouldWait);
    }
    if (owner_gone) {
      auto gone = OnOwnerGone(call, record, started_at);
      if (gone || !LostRace(gone.error())) return gone;
      // Someone else moved the record first: re-read and decide again.
    } else if (now >= wait_deadline) {
      d.kind = Decision::Kind::kInProgress;
      d.retry_after = std::max(Duration(1000), std::min(record.lease_expires_at - now, p.wait));
      d.record = std::move(record);
      return Finish(call, std::move(d), AttemptOutcome::kInProgress);
    } else {
      if (auto w = store_.WaitForChange(call.id, record,
                                        std::min(wait_deadline, record.lease_expires_at));
          !w) {
        LogAttempt(call, AttemptOutcome::kError, started_at, w.error().ToString());
        return std::unexpected(w.error());
      }
      waited = true;
    }
    auto current = store_.Get(call.id);
    if (!current) {
      LogAttempt(call, AttemptOutcome::kError, started_at, current.error().ToString());
      return std::unexpected(current.error());
    }
    if (current->has_value()) {
      record = std::move(**current);
      continue;
    }
    // Released or evicted while we waited: try to become the owner.
    const ClaimRequest req = ClaimFor(call, started_at);
    auto claim = store_.Claim(req);
    if (!claim) {
      leases_->Abandon(call.id, req.owner, ClaimEnd(req, clock_.Now()));  // as in Begin
      LogAttempt(call, AttemptOutcome::kError, started_at, claim.error().ToString());
      return std::unexpected(claim.error());
    }
    if (claim->claimed) {
      Claimed(call, req, started_at);
      d.kind = Decision::Kind::kExecute;
      d.fence = claim->record.fence;
      d.record = std::move(claim->record);
      return d;
    }
    record = std::move(claim->record);
  }
  return MakeError(ErrorCode::kAborted, "record " + call.id.key +
                                            " kept changing under this attempt; retry the call");
}

// The owner of `record` died (lease expired) or an earlier attempt marked it
// unknown. A LostRace error means another attempt acted first: the caller
// re-reads.
Result<Decision> Ledger::OnOwnerGone(const Call& call, const Record& record,
                                     TimePoint started_at) {
  const Policy& p = call.policy;
  // Marks the record owned with `fence` unknown and answers so.
  auto unknown = [&](uint64_t fence) -> Result<Decision> {
    Decision u;
    u.kind = Decision::Kind::kUnknown;
    if (record.state == RecordState::kUnknown) {
      u.record = record;  // already unknown at that fence (reconcile asked again): nothing to write
    } else {
      auto marked = store_.MarkUnknown(call.id, fence, KeptRetention(call, record));
      if (!marked) return std::unexpected(marked.error());
      u.record = std::move(*marked);
    }
    u.started_at = started_at;
    return Finish(call, std::move(u), AttemptOutcome::kUnknown);
  };
  if (p.on_unknown == OnUnknown::kFail) return unknown(record.fence);
  // Takes the record over under a new fence, to execute the call again.
  auto take_over = [&]() -> Result<Decision> {
    auto taken = store_.TakeOver(call.id, record.fence, p.lease);
    if (!taken) return std::unexpected(taken.error());
    Decision d;
    d.kind = Decision::Kind::kExecute;
    d.fence = taken->fence;
    d.took_over = true;
    d.started_at = started_at;
    d.record = std::move(*taken);
    return d;
  };
  if (p.on_unknown == OnUnknown::kRetry) return take_over();
  // Reconcile: ask before taking anything over, so that until the lookup
  // says "never happened" the record keeps its owner's fence. An owner cut
  // off from the store for a lease is not necessarily dead: when the lookup
  // cannot tell (or there is no hook to ask) the record turns unknown at
  // that fence, and the owner's late outcome is still stored (guarantees
  // review F3); a found outcome is stored at it too, and a concurrent
  // retry's lookup or the owner's own completion loses the race cleanly
  // (LostRace: re-read, replay).
  const ReconcileHook& lookup = call.reconcile ? call.reconcile : options_.reconcile;
  if (!lookup) return unknown(record.fence);
  Result<std::optional<Outcome>> found = lookup(call);
  if (!found) return unknown(record.fence);
  if (!found->has_value()) return take_over();  // it never happened: execute under a new fence
  // The action happened: its completion is stored and logged like any other
  // (guarantees review H6): over max_result_bytes only a too-large marker,
  // and its `executed` entry, with the record where the store writes them
  // together. A lost race logs nothing: the winner's entries stand.
  const std::optional<Attempt> entry =
      store_.LogsWithRecords()
          ? EntryOf(call, AttemptOutcome::kExecuted, started_at, "found by reconcile")
          : std::nullopt;
  auto completed = store_.Complete(call.id, record.fence, Storable(call, **found),
                                   KeptRetention(call, record), entry ? &*entry : nullptr);
  if (!completed) return std::unexpected(completed.error());
  if (entry) {
    Observe(call, AttemptOutcome::kExecuted, started_at);
  } else {
    LogAttempt(call, AttemptOutcome::kExecuted, started_at, "found by reconcile");
  }
  Decision r;
  r.kind = Decision::Kind::kReplay;
  r.reconciled = true;
  r.record = std::move(*completed);
  r.started_at = started_at;
  return Finish(call, std::move(r), AttemptOutcome::kReplayed);
}

Result<Record> Ledger::Complete(const Call& call, const Decision& d, Outcome outcome) {
  if (d.kind == Decision::Kind::kPassThrough) {
    LogAttempt(call, AttemptOutcome::kExecuted, d.started_at,
               d.observed ? "observe mode: ran unguarded" : "unguarded: store was down");
    Record r;
    r.id = call.id;
    r.state = RecordState::kCompleted;
    r.outcome = std::move(outcome);
    return r;
  }
  const std::optional<Attempt> entry = CompletionEntry(call, d.started_at);
  return Completed(call, d.started_at, entry.has_value(),
                   store_.Complete(call.id, d.fence, Storable(call, outcome),
                                   KeptRetention(call, d.record), entry ? &*entry : nullptr));
}

bool Ledger::CompleteAsync(const Call& call, const Decision& d, const Outcome& outcome,
                           std::function<void(Result<Record>)> done) {
  if (d.kind == Decision::Kind::kPassThrough) return false;
  // Read before CompleteAsync returns (Store::CompleteAsync).
  const std::optional<Attempt> entry = CompletionEntry(call, d.started_at);
  return store_.CompleteAsync(
      call.id, d.fence, Storable(call, outcome), KeptRetention(call, d.record),
      [this, &call, started_at = d.started_at, logged = entry.has_value(),
       done = std::move(done)](Result<Record> r) {
        done(Completed(call, started_at, logged, std::move(r)));
      },
      entry ? &*entry : nullptr);
}

std::optional<Attempt> Ledger::CompletionEntry(const Call& call, TimePoint started_at) {
  if (!store_.LogsWithRecords()) return std::nullopt;
  return EntryOf(call, AttemptOutcome::kExecuted, started_at);
}

// `logged`: the store wrote the kExecuted entry with the record, so only
// the observer hears of it here.
Result<Record> Ledger::Completed(const Call& call, TimePoint started_at, bool logged,
                                 Result<Record> r) {
  if (!r) {
    LogAttempt(call, AttemptOutcome::kError, started_at,
               "outcome not stored: " + r.error().ToString());
    return r;
  }
  FaultPoint("after_persist");
  if (logged) {
    Observe(call, AttemptOutcome::kExecuted, started_at);
  } else {
    LogAttempt(call, AttemptOutcome::kExecuted, started_at);
  }
  return r;
}

Result<void> Ledger::Release(const Call& call, const Decision& d) {
  if (d.kind == Decision::Kind::kPassThrough) return {};
  auto r = store_.Release(call.id, d.fence);
  LogAttempt(call, r ? AttemptOutcome::kReleased : AttemptOutcome::kError, d.started_at,
             r ? std::string() : r.error().ToString());
  return r;
}

Result<Record> Ledger::MarkUnknown(const Call& call, const Decision& d) {
  if (d.kind == Decision::Kind::kPassThrough) {
    return MakeError(ErrorCode::kFailedPrecondition, "an unguarded call has no record");
  }
  auto r = store_.MarkUnknown(call.id, d.fence, KeptRetention(call, d.record));
  LogAttempt(call, r ? AttemptOutcome::kUnknown : AttemptOutcome::kError, d.started_at,
             r ? std::string() : r.error().ToString());
  return r;
}

Result<TimePoint> Ledger::Heartbeat(const Call& call, uint64_t fence) {
  return store_.Heartbeat(call.id, fence, call.policy.lease);
}

size_t Ledger::running_executions() { return leases_->running(); }

AuditDrops Ledger::audit_drops() const { return attempts_ ? attempts_->drops() : AuditDrops{}; }

Ledger::LeaseGuard Ledger::KeepAlive(const Call& call, uint64_t fence) {
  return LeaseGuard(leases_.get(), leases_->Start(call.id, fence, call.policy.lease));
}

Ledger::LeaseGuard::LeaseGuard(LeaseGuard&& o) noexcept
    : keeper_(std::exchange(o.keeper_, nullptr)), ticket_(o.ticket_) {}

Ledger::LeaseGuard& Ledger::LeaseGuard::operator=(LeaseGuard&& o) noexcept {
  if (this != &o) {
    if (keeper_) keeper_->Stop(ticket_);
    keeper_ = std::exchange(o.keeper_, nullptr);
    ticket_ = o.ticket_;
  }
  return *this;
}

Ledger::LeaseGuard::~LeaseGuard() {
  if (keeper_) keeper_->Stop(ticket_);
}

bool Ledger::LeaseGuard::lost() const { return keeper_ && keeper_->lost(ticket_); }

Result<RunResult> Ledger::Run(const Call& call, const std::function<Execution()>& fn) {
  auto begun = Begin(call);
  if (!begun) return std::unexpected(begun.error());
  RunResult result;
  result.decision = std::move(*begun);
  const Decision& d = result.decision;
  if (d.kind != Decision::Kind::kExecute && d.kind != Decision::Kind::kPassThrough) {
    result.outcome = d.record.outcome;
    return result;
  }
  Execution ex;
  {
    LeaseGuard guard;
    if (d.kind == Decision::Kind::kExecute) guard = KeepAlive(call, d.fence);
    ex = fn();
  }
  const Execution::Kind kind = ex.kind;
  Outcome fresh{kind == Execution::Kind::kSuccess ? OutcomeClass::kSuccess
                                                  : OutcomeClass::kToolError,
                ex.body};
  auto settled = Settle(call, d, std::move(ex));
  if (!settled) return std::unexpected(settled.error());
  if (kind == Execution::Kind::kSuccess || kind == Execution::Kind::kToolError) {
    // The caller that executed gets the real outcome even when only a
    // too-large marker could be stored.
    result.outcome = std::move(fresh);
  } else {
    result.body = std::move(fresh.body);
  }
  return result;
}

Result<Settlement> Ledger::Settle(const Call& call, const Decision& d, Execution ex) {
  const OutcomeClass cls = ex.kind == Execution::Kind::kToolError ? OutcomeClass::kToolError
                                                                   : OutcomeClass::kSuccess;
  return Settle(call, d, ex.kind, Outcome{cls, std::move(ex.body)});
}

bool Ledger::SettlesAsOutcome(const Call& call, Execution::Kind kind) {
  return kind == Execution::Kind::kSuccess ||
         (kind == Execution::Kind::kToolError && call.policy.errors != ErrorPolicy::kRelease);
}

Result<Settlement> Ledger::Settle(const Call& call, const Decision& d, Execution::Kind kind,
                                  Outcome outcome) {
  Settlement s;
  if (SettlesAsOutcome(call, kind)) {
    auto stored = Complete(call, d, std::move(outcome));
    if (!stored) return std::unexpected(stored.error());
    s.kind = Settlement::Kind::kStored;
    s.record = std::move(*stored);
    return s;
  }
  if (kind == Execution::Kind::kMaybeSent) {
    s.kind = Settlement::Kind::kUnknown;
    if (d.kind == Decision::Kind::kExecute) {
      auto marked = MarkUnknown(call, d);
      if (!marked) return std::unexpected(marked.error());
      s.record = std::move(*marked);
    }
    return s;
  }
  // kNotSent, kInterim, and a tool error under errors = "release".
  if (auto r = Release(call, d); !r) return std::unexpected(r.error());
  s.kind = Settlement::Kind::kReleased;
  return s;
}

}  // namespace idem
