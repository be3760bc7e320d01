#include "gate/upstream_class.h"

#include <gtest/gtest.h>

namespace idem::gate {
namespace {

TEST(ClassOfJsonRpcError, OnlyTheCodesSentBeforeDispatchMeanTheToolDidNotRun) {
  for (int64_t code : {-32700, -32600, -32601, -32602}) {
    EXPECT_EQ(ClassOfJsonRpcError(code), Execution::Kind::kNotSent) << code;
  }
}

// A low-level SDK server that inserts and then throws answers -32603: the
// insert happened. Released, the retry ran it a second time.
TEST(ClassOfJsonRpcError, InternalAndServerDefinedErrorsLeaveTheOutcomeUnknown) {
  for (int64_t code : {-32603, -32000, -32001, -32099, -32800, -1, 0, 1, 400, 500}) {
    EXPECT_EQ(ClassOfJsonRpcError(code), Execution::Kind::kMaybeSent) << code;
  }
}

TEST(ClassOfHttpStatus, SuccessRefusalAndServerError) {
  EXPECT_EQ(ClassOfHttpStatus(200), Execution::Kind::kSuccess);
  EXPECT_EQ(ClassOfHttpStatus(201), Execution::Kind::kSuccess);
  EXPECT_EQ(ClassOfHttpStatus(402), Execution::Kind::kToolError);
  EXPECT_EQ(ClassOfHttpStatus(422), Execution::Kind::kToolError);
  EXPECT_EQ(ClassOfHttpStatus(500), Execution::Kind::kMaybeSent);
  EXPECT_EQ(ClassOfHttpStatus(503), Execution::Kind::kMaybeSent);
}

// A vendor that rate-limits the first POST of a key answers 429 and
// Retry-After; stored as a tool error, the 429 was replayed to every retry
// for the record's whole retention and the charge never ran.
TEST(ClassOfHttpStatus, AnswersThatSayTheVendorDidNotActAreReleased) {
  for (int status : {408, 409, 423, 425, 429}) {
    EXPECT_EQ(ClassOfHttpStatus(status), Execution::Kind::kNotSent) << status;
  }
}

// 3xx is decided here once: 303 See Other means done (the result is
// elsewhere); any other redirect means the action is elsewhere, not done.
TEST(ClassOfHttpStatus, SeeOtherIsDoneOtherRedirectsAreNot) {
  EXPECT_EQ(ClassOfHttpStatus(303), Execution::Kind::kSuccess);
  for (int status : {300, 301, 302, 304, 307, 308}) {
    EXPECT_EQ(ClassOfHttpStatus(status), Execution::Kind::kNotSent) << status;
  }
}

TEST(LookupVerdictOfHttpStatus, OnlyAnExplicitAnswerIsFoundOrNotFound) {
  EXPECT_EQ(LookupVerdictOfHttpStatus(200), LookupVerdict::kFound);
  EXPECT_EQ(LookupVerdictOfHttpStatus(404), LookupVerdict::kNotFound);
  EXPECT_EQ(LookupVerdictOfHttpStatus(410), LookupVerdict::kNotFound);
  for (int status : {301, 400, 401, 403, 429, 500, 502, 503, 504}) {
    EXPECT_EQ(LookupVerdictOfHttpStatus(status), LookupVerdict::kCannotTell) << status;
  }
}

}  // namespace
}  // namespace idem::gate
