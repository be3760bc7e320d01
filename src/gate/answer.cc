#include "gate/answer.h"

#include <algorithm>

namespace idem::gate {

int64_t RetryAfterSeconds(Duration wait) {
  return std::max<int64_t>(1, (wait.count() + 999) / 1000);
}

namespace {

Answer ReplayAnswer(const Decision& d) {
  const Record& r = d.record;
  if (!r.outcome) {
    return {
        .kind = Answer::Kind::kNoOutcome, .http_status = 500, .note = "replay failed: no outcome"};
  }
  if (r.outcome->cls == OutcomeClass::kTooLarge) {
    return {
        .kind = Answer::Kind::kTooLarge, .http_status = 409, .note = "replayed a too-large marker"};
  }
  return {.kind = Answer::Kind::kReplay,
          .http_status = 200,
          .note = d.reconciled ? "reconciled"
                  : d.attached ? "attached"
                               : "replayed"};
}

}  // namespace

Answer AnswerFor(const Decision& d) {
  Answer a;
  switch (d.kind) {
    case Decision::Kind::kExecute:
    case Decision::Kind::kPassThrough:
      return a;  // kRun
    case Decision::Kind::kReplay:
      a = ReplayAnswer(d);
      break;
    case Decision::Kind::kInProgress:
      a = {.kind = Answer::Kind::kInProgress,
           .http_status = 409,
           .retry_after_seconds = RetryAfterSeconds(d.retry_after),
           .note = "in progress"};
      break;
    case Decision::Kind::kUnknown:
      a = {.kind = Answer::Kind::kUnknown, .http_status = 409, .note = "outcome unknown"};
      break;
    case Decision::Kind::kDrift:
      a = {.kind = Answer::Kind::kDrift, .http_status = 422, .note = "drift"};
      break;
  }
  a.first_at = FormatIsoTime(d.record.created_at);
  return a;
}

}  // namespace idem::gate
