// What the store keeps per key (docs/DESIGN.md §2, §4) and the attempt log (§7).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"

namespace idem {

// Identifies a record. Records never cross tenants: the tenant is part of the
// identity in every store.
struct RecordId {
  std::string tenant = "default";
  std::string key;
  bool operator==(const RecordId&) const = default;
};

enum class RecordState {
  kInProgress,  // claimed; an owner holding `fence` is executing until lease_expires_at
  kCompleted,   // the outcome is stored and replayed until expires_at
  kUnknown,     // the owner died mid-call: the side effect may or may not have happened
};
std::string_view RecordStateName(RecordState s);
Result<RecordState> ParseRecordState(std::string_view s);

enum class OutcomeClass {
  kSuccess,    // the tool succeeded
  kToolError,  // the tool reported an error (MCP isError, HTTP 4xx): deterministic, replayed
  kTooLarge,   // larger than max_result_bytes: only a marker is stored; retries get an error
};
std::string_view OutcomeClassName(OutcomeClass c);
Result<OutcomeClass> ParseOutcomeClass(std::string_view s);

struct Outcome {
  OutcomeClass cls = OutcomeClass::kSuccess;
  // Front-defined bytes: an MCP result object, a serialized HTTP response, a
  // ledger-API JSON value. Opaque to the core and the stores.
  std::string body;
  bool operator==(const Outcome&) const = default;
};

struct Record {
  RecordId id;
  RecordState state = RecordState::kInProgress;
  std::string fingerprint;
  std::string tool;
  std::string turn;
  uint64_t fence = 0;
  // The owner token of the attempt whose claim created the record
  // (ClaimRequest::owner); empty once taken over, and in records written
  // before owner tokens existed. Only Store::Abandon reads it.
  std::string owner;
  TimePoint created_at{};        // first claim of this record
  TimePoint lease_expires_at{};  // meaningful while kInProgress
  TimePoint completed_at{};      // when the outcome (or unknown) was written
  TimePoint expires_at{};        // retention end: after this the record is gone
  // How long the record is kept once completed or marked unknown, decided by
  // the claim (ClaimRequest::retention) and kept by every later step, so a
  // step made elsewhere (the ledger API's complete) cannot shorten it. Zero
  // in records written before it was stored: the step's own retention then.
  Duration retention{0};
  std::optional<Outcome> outcome;  // set when kCompleted
};

// One arrival of a call at idemgate, for the audit log (§7).
enum class AttemptOutcome {
  kExecuted, kReplayed, kAttached, kInProgress, kDrift, kUnknown, kReleased, kError,
  // Observe mode (Policy::observe): the call ran; enforcing would have
  // replayed it, refused it as drift, made it wait for a running owner, or
  // answered outcome unknown.
  kWouldReplay, kWouldDrift, kWouldWait, kWouldUnknown,
  // Executed, and the same turn had run this tool with other arguments just
  // before (a re-planned retry, docs/hosts.md); the detail names that key.
  kExecutedAgain,
  // The attempt claimed the key and runs the call: written with the claim
  // itself (ClaimRequest::logged), so the trail names it even if it never
  // finished. Audit only: not an answer, never counted in the metrics.
  kClaimed,
  // An operator settled the record (released it, or stored the outcome that
  // happened: idem/resolve.h) or evicted it; the detail names who and how.
  // Audit only, like kClaimed.
  kResolved, kEvicted,
};
std::string_view AttemptOutcomeName(AttemptOutcome o);
// claimed, executed and replayed: what nearly every audit entry says. The
// SQL stores index outcomes only for the others (the ones an operator looks
// for), and a query for one of those names the index's condition.
bool IsFrequentOutcome(AttemptOutcome o);
Result<AttemptOutcome> ParseAttemptOutcome(std::string_view s);

struct Attempt {
  TimePoint at{};
  std::string tenant;
  std::string key;
  std::string tool;
  std::string turn;
  AttemptOutcome outcome = AttemptOutcome::kExecuted;
  Duration latency{0};
  std::string instance;  // which idemgate process saw the attempt
  std::string detail;    // short, never arguments or results ("turn fallback", error text)
  // The tenant's hash chain (docs/DESIGN.md §7, include/idem/attempt_chain.h),
  // set by the store as it appends the entry: whatever the caller passes is
  // ignored. seq counts the tenant's entries from 1; prev_hash is the hash of
  // entry seq - 1 ("" for seq 1); hash is ChainHash of this entry. Entries
  // written before the chain existed have seq 0 and no hashes.
  uint64_t seq = 0;
  std::string prev_hash;
  std::string hash;
};

// Where a tenant's chain stands, kept by the store and moved in the same
// write as every entry it appends (docs/DESIGN.md §7).
struct ChainHead {
  std::string tenant;
  uint64_t seq = 0;  // the newest entry's (0: no entry yet)
  std::string hash;  // the newest entry's hash
  // Where the chain restarts after older entries were purged or trimmed:
  // the oldest entry kept should be start_seq, and its prev_hash start_prev
  // (the hash of the last entry removed). 1 and "" until anything is removed.
  uint64_t start_seq = 1;
  std::string start_prev;
  bool operator==(const ChainHead&) const = default;
};

// One page of Store::ReadChain.
struct ChainPage {
  std::vector<Attempt> entries;
  std::string next;  // the cursor of the next page; empty: this was the last
};

struct AttemptFilter {
  std::optional<std::string> tenant;
  std::optional<std::string> key;
  std::optional<std::string> tool;
  std::optional<AttemptOutcome> outcome;
  std::optional<TimePoint> since;
  size_t limit = 1000;  // newest first
  // Set to true by a store that stopped looking before the oldest entry
  // (the Redis store examines at most `attempts_scan` entries a query, so
  // that one query cannot scan the whole stream): older matches may exist.
  // Left alone otherwise. Null: the caller does not ask.
  bool* cut = nullptr;
};

}  // namespace idem
