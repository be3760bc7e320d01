// What a caller is told for the ledger's decision: the one decision → answer
// table every front renders (docs/DESIGN.md §4.7). The ledger decides
// (Decision); this table says what that means for the caller — run the call,
// replay, or which refusal, with the HTTP status, the retry-after in whole
// seconds and the first attempt's time — and each front only renders it in
// its protocol: a JSON-RPC result (MCP), a problem+json answer (the reverse
// proxy, the ledger API).
//
// Pure functions, no state: safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/ledger.h"

namespace idem::gate {

struct Answer {
  enum class Kind {
    kRun,         // kExecute or kPassThrough: forward the call; the upstream answers
    kReplay,      // the stored outcome, marked replayed
    kTooLarge,    // completed, but only a too-large marker is stored: refuse; nothing runs
    kNoOutcome,   // completed, yet no outcome is stored (data loss): refuse; nothing runs
    kInProgress,  // another owner is still running: retry after `retry_after_seconds`
    kUnknown,     // the first attempt's action may have happened: do not repeat it blindly
    kDrift,       // the key was first used for different arguments (on_drift = reject)
  };
  Kind kind = Kind::kRun;
  // What an HTTP front answers: 200 (run, replay), 409 (too large, in
  // progress, unknown), 422 (drift), 500 (no outcome).
  int http_status = 200;
  // When the first attempt claimed the key (record.created_at), ISO-8601 UTC
  // with milliseconds: the one instant every answer names, in every front.
  // Empty for kRun.
  std::string first_at;
  // kInProgress: the wait the ledger suggests, rounded up to whole seconds,
  // at least 1 (a Retry-After of 0 would invite a busy loop).
  int64_t retry_after_seconds = 0;
  // The attempt's word in the verbose log: "replayed", "attached",
  // "reconciled", "replayed a too-large marker", "in progress", "outcome
  // unknown", "drift", "replay failed: no outcome". Empty for kRun (the
  // upstream's answer decides it).
  std::string_view note;
};

// The answer to `d`. Total: every decision has one.
Answer AnswerFor(const Decision& d);

// A suggested wait as Retry-After seconds: rounded up, at least 1.
int64_t RetryAfterSeconds(Duration wait);

}  // namespace idem::gate
