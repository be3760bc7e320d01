#include "gate/problem_types.h"

namespace idem::gate::problem {

std::string_view TypeOf(BeginFailure::Kind kind) {
  switch (kind) {
    case BeginFailure::Kind::kStoreUnavailable:
      return kStoreUnavailable;
    case BeginFailure::Kind::kClaimFailed:
      return kClaimFailed;
    case BeginFailure::Kind::kStopping:
      return kStopping;
  }
  return kClaimFailed;
}

std::string_view TypeOf(Answer::Kind kind) {
  switch (kind) {
    case Answer::Kind::kInProgress:
      return kInProgress;
    case Answer::Kind::kUnknown:
      return kOutcomeUnknown;
    case Answer::Kind::kDrift:
      return kDrift;
    case Answer::Kind::kTooLarge:
      return kOutcomeTooLarge;
    case Answer::Kind::kNoOutcome:
      return kUnreadableOutcome;
    case Answer::Kind::kRun:
    case Answer::Kind::kReplay:
      break;
  }
  return {};
}

}  // namespace idem::gate::problem
