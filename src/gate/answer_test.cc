#include "gate/answer.h"

#include <gtest/gtest.h>

namespace idem::gate {
namespace {

using Kind = Decision::Kind;

Decision Decided(Kind kind) {
  Decision d;
  d.kind = kind;
  d.record.id.key = "k";
  d.record.created_at = TimePoint(Duration(1767225600123));  // 2026-01-01T00:00:00.123Z
  return d;
}

Decision Completed(OutcomeClass cls) {
  Decision d = Decided(Kind::kReplay);
  d.record.outcome = Outcome{.cls = cls, .body = "{}"};
  return d;
}

TEST(AnswerFor, ExecuteAndPassThroughRunTheCall) {
  for (Kind k : {Kind::kExecute, Kind::kPassThrough}) {
    const Answer a = AnswerFor(Decided(k));
    EXPECT_EQ(a.kind, Answer::Kind::kRun);
    EXPECT_EQ(a.http_status, 200);
    EXPECT_EQ(a.first_at, "");
    EXPECT_EQ(a.note, "");
  }
}

TEST(AnswerFor, ACompletedRecordIsReplayedAndSaysHowItWasFound) {
  Decision d = Completed(OutcomeClass::kSuccess);
  Answer a = AnswerFor(d);
  EXPECT_EQ(a.kind, Answer::Kind::kReplay);
  EXPECT_EQ(a.http_status, 200);
  EXPECT_EQ(a.first_at, "2026-01-01T00:00:00.123Z");
  EXPECT_EQ(a.note, "replayed");
  d.attached = true;
  EXPECT_EQ(AnswerFor(d).note, "attached");
  d.reconciled = true;
  EXPECT_EQ(AnswerFor(d).note, "reconciled");
  // A stored tool error is an outcome like any other: replayed.
  EXPECT_EQ(AnswerFor(Completed(OutcomeClass::kToolError)).kind, Answer::Kind::kReplay);
}

TEST(AnswerFor, ATooLargeMarkerIsRefusedNotReplayedAndNotRun) {
  const Answer a = AnswerFor(Completed(OutcomeClass::kTooLarge));
  EXPECT_EQ(a.kind, Answer::Kind::kTooLarge);
  EXPECT_EQ(a.http_status, 409);
  EXPECT_EQ(a.first_at, "2026-01-01T00:00:00.123Z");
}

TEST(AnswerFor, ACompletedRecordWithoutAnOutcomeIsDataLossNotARun) {
  const Answer a = AnswerFor(Decided(Kind::kReplay));
  EXPECT_EQ(a.kind, Answer::Kind::kNoOutcome);
  EXPECT_EQ(a.http_status, 500);
}

TEST(AnswerFor, RefusalsCarryTheirStatusAndTheFirstAttemptsTime) {
  EXPECT_EQ(AnswerFor(Decided(Kind::kUnknown)).kind, Answer::Kind::kUnknown);
  EXPECT_EQ(AnswerFor(Decided(Kind::kUnknown)).http_status, 409);
  EXPECT_EQ(AnswerFor(Decided(Kind::kDrift)).kind, Answer::Kind::kDrift);
  EXPECT_EQ(AnswerFor(Decided(Kind::kDrift)).http_status, 422);
  for (Kind k : {Kind::kInProgress, Kind::kUnknown, Kind::kDrift}) {
    EXPECT_EQ(AnswerFor(Decided(k)).first_at, "2026-01-01T00:00:00.123Z");
  }
}

TEST(AnswerFor, InProgressRoundsTheWaitUpToWholeSecondsAndNeverSaysZero) {
  Decision d = Decided(Kind::kInProgress);
  d.retry_after = Duration(0);
  EXPECT_EQ(AnswerFor(d).retry_after_seconds, 1);
  d.retry_after = Duration(1000);
  EXPECT_EQ(AnswerFor(d).retry_after_seconds, 1);
  d.retry_after = Duration(1001);
  EXPECT_EQ(AnswerFor(d).retry_after_seconds, 2);
  EXPECT_EQ(AnswerFor(d).http_status, 409);
  EXPECT_EQ(RetryAfterSeconds(Duration(29999)), 30);
}

}  // namespace
}  // namespace idem::gate
