// The problem `type` names (RFC 9457) idemgate's HTTP fronts give the
// conditions of a gated call: one table, so the reverse proxy and the ledger
// API name the same condition the same way, and in the words the MCP front's
// `dev.idemgate/condition` uses (in_progress there, in-progress here). A
// client may match on these: renaming one is a breaking change (README's
// "What a caller is told" lists them).
//
// Pure, no state: safe from any thread.
#pragma once

#include <string_view>

#include "gate/answer.h"
#include "gate/begin_failure.h"

namespace idem::gate::problem {

// Begin failed; nothing ran.
inline constexpr std::string_view kStoreUnavailable = "store-unavailable";  // retry shortly
inline constexpr std::string_view kClaimFailed = "claim-failed";            // an operator looks
inline constexpr std::string_view kStopping = "stopping";                   // retry shortly
// What the ledger decided, when it is not "run".
inline constexpr std::string_view kInProgress = "in-progress";
inline constexpr std::string_view kOutcomeUnknown = "outcome-unknown";
inline constexpr std::string_view kDrift = "drift";
inline constexpr std::string_view kOutcomeTooLarge = "outcome-too-large";
inline constexpr std::string_view kUnreadableOutcome = "unreadable-outcome";
// The call ran, and its outcome could not be stored: withheld.
inline constexpr std::string_view kOutcomeNotStored = "outcome-not-stored";

// The type of a failed begin.
std::string_view TypeOf(BeginFailure::Kind kind);
// The type of a refusal (every Answer::Kind but kRun and kReplay).
std::string_view TypeOf(Answer::Kind kind);

}  // namespace idem::gate::problem
