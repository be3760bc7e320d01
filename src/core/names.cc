// Stable text names of the enums in record.h and policy.h: used in stores,
// logs, config files and APIs, so they never change once released.
#include <array>
#include <string>
#include <utility>

#include "idem/ledger.h"
#include "idem/policy.h"
#include "idem/record.h"

namespace idem {
namespace {

template <typename E, size_t N>
Result<E> ParseName(const std::array<std::pair<E, std::string_view>, N>& table,
                    std::string_view s, std::string_view what) {
  for (const auto& [value, name] : table) {
    if (name == s) return value;
  }
  std::string msg = "unknown " + std::string(what) + " \"" + std::string(s) + "\"; expected one of:";
  for (const auto& [value, name] : table) {
    msg += " ";
    msg += name;
  }
  return MakeError(ErrorCode::kInvalidArgument, std::move(msg));
}

template <typename E, size_t N>
std::string_view NameOf(const std::array<std::pair<E, std::string_view>, N>& table, E e) {
  for (const auto& [value, name] : table) {
    if (value == e) return name;
  }
  return "?";
}

constexpr std::array<std::pair<RecordState, std::string_view>, 3> kRecordStates{{
    {RecordState::kInProgress, "in_progress"},
    {RecordState::kCompleted, "completed"},
    {RecordState::kUnknown, "unknown"},
}};
constexpr std::array<std::pair<OutcomeClass, std::string_view>, 3> kOutcomeClasses{{
    {OutcomeClass::kSuccess, "success"},
    {OutcomeClass::kToolError, "tool_error"},
    {OutcomeClass::kTooLarge, "too_large"},
}};
constexpr std::array<std::pair<AttemptOutcome, std::string_view>, 16> kAttemptOutcomes{{
    {AttemptOutcome::kExecuted, "executed"},
    {AttemptOutcome::kReplayed, "replayed"},
    {AttemptOutcome::kAttached, "attached"},
    {AttemptOutcome::kInProgress, "in_progress"},
    {AttemptOutcome::kDrift, "drift"},
    {AttemptOutcome::kUnknown, "unknown"},
    {AttemptOutcome::kReleased, "released"},
    {AttemptOutcome::kError, "error"},
    {AttemptOutcome::kWouldReplay, "would_replay"},
    {AttemptOutcome::kWouldDrift, "would_drift"},
    {AttemptOutcome::kWouldWait, "would_wait"},
    {AttemptOutcome::kWouldUnknown, "would_unknown"},
    {AttemptOutcome::kExecutedAgain, "executed_again"},
    {AttemptOutcome::kClaimed, "claimed"},
    {AttemptOutcome::kResolved, "resolved"},
    {AttemptOutcome::kEvicted, "evicted"},
}};
constexpr std::array<std::pair<OnUnknown, std::string_view>, 3> kOnUnknown{{
    {OnUnknown::kFail, "fail"},
    {OnUnknown::kRetry, "retry"},
    {OnUnknown::kReconcile, "reconcile"},
}};
constexpr std::array<std::pair<ErrorPolicy, std::string_view>, 2> kErrorPolicies{{
    {ErrorPolicy::kStore, "store"},
    {ErrorPolicy::kRelease, "release"},
}};
constexpr std::array<std::pair<OnDrift, std::string_view>, 2> kOnDrift{{
    {OnDrift::kReject, "reject"},
    {OnDrift::kReplay, "replay"},
}};
constexpr std::array<std::pair<OnStoreDown, std::string_view>, 2> kOnStoreDown{{
    {OnStoreDown::kFail, "fail"},
    {OnStoreDown::kPass, "pass"},
}};
constexpr std::array<std::pair<Decision::Kind, std::string_view>, 6> kDecisionKinds{{
    {Decision::Kind::kExecute, "execute"},
    {Decision::Kind::kReplay, "replay"},
    {Decision::Kind::kInProgress, "in_progress"},
    {Decision::Kind::kUnknown, "unknown"},
    {Decision::Kind::kDrift, "drift"},
    {Decision::Kind::kPassThrough, "pass_through"},
}};

}  // namespace

std::string_view RecordStateName(RecordState s) { return NameOf(kRecordStates, s); }
Result<RecordState> ParseRecordState(std::string_view s) {
  return ParseName(kRecordStates, s, "record state");
}
std::string_view OutcomeClassName(OutcomeClass c) { return NameOf(kOutcomeClasses, c); }
Result<OutcomeClass> ParseOutcomeClass(std::string_view s) {
  return ParseName(kOutcomeClasses, s, "outcome class");
}
std::string_view AttemptOutcomeName(AttemptOutcome o) { return NameOf(kAttemptOutcomes, o); }

bool IsFrequentOutcome(AttemptOutcome o) {
  return o == AttemptOutcome::kClaimed || o == AttemptOutcome::kExecuted ||
         o == AttemptOutcome::kReplayed;
}
Result<AttemptOutcome> ParseAttemptOutcome(std::string_view s) {
  return ParseName(kAttemptOutcomes, s, "attempt outcome");
}
std::string_view OnUnknownName(OnUnknown v) { return NameOf(kOnUnknown, v); }
Result<OnUnknown> ParseOnUnknown(std::string_view s) { return ParseName(kOnUnknown, s, "on_unknown"); }
std::string_view ErrorPolicyName(ErrorPolicy v) { return NameOf(kErrorPolicies, v); }
Result<ErrorPolicy> ParseErrorPolicy(std::string_view s) {
  return ParseName(kErrorPolicies, s, "errors policy");
}
std::string_view OnDriftName(OnDrift v) { return NameOf(kOnDrift, v); }
Result<OnDrift> ParseOnDrift(std::string_view s) { return ParseName(kOnDrift, s, "on_drift"); }
std::string_view OnStoreDownName(OnStoreDown v) { return NameOf(kOnStoreDown, v); }
Result<OnStoreDown> ParseOnStoreDown(std::string_view s) {
  return ParseName(kOnStoreDown, s, "on_store_down");
}
std::string_view DecisionKindName(Decision::Kind k) { return NameOf(kDecisionKinds, k); }

}  // namespace idem
