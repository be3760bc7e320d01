// Crash safety on a real SQLite file (docs/DESIGN.md §4): a child process is
// SIGKILLed (1) after claiming, (2) after executing but before completing,
// (3) after completing but before answering. The next attempt must give an
// explicit unknown (or a retry under on_unknown = retry), an explicit
// unknown, and the replay; never a silent second execution, and nothing
// completed is lost. The lease's expiry is simulated with a FakeClock set past
// it, so the test never sleeps.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "idem/ledger.h"
#include "idem/store.h"

#ifndef IDEM_CRASH_CHILD
#error "IDEM_CRASH_CHILD must name the crash_child binary"
#endif

namespace idem {
namespace {

using namespace std::chrono_literals;

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/idem-crash-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    db_ = dir_ + "/idemgate.db";
    effects_ = dir_ + "/charges.log";
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // Runs the child to completion or death; returns the wait status.
  int RunChild(const std::string& key, const std::string& point) {
    pid_t pid = fork();
    if (pid == 0) {
      execl(IDEM_CRASH_CHILD, IDEM_CRASH_CHILD, db_.c_str(), key.c_str(), effects_.c_str(),
            point.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  }

  int Executions() {
    std::ifstream in(effects_);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }

  // The retry, as a restarted instance makes it, after the dead owner's lease.
  Result<RunResult> Retry(const std::string& key, OnUnknown on_unknown, int* runs) {
    clock_ = std::make_unique<FakeClock>(SystemClock::Default().Now() + 31s);
    auto store = OpenStore("sqlite:" + db_, *clock_);
    EXPECT_TRUE(store) << store.error().ToString();
    store_ = std::move(*store);
    ledger_ = std::make_unique<Ledger>(*store_, *clock_, LedgerOptions{"retry", nullptr, false});
    Call call;
    call.id = RecordId{"default", key};
    call.fingerprint = "fp";
    call.tool = "charge";
    call.turn = "turn-1";
    call.policy.on_unknown = on_unknown;
    return ledger_->Run(call, [&] {
      ++*runs;
      std::ofstream(effects_, std::ios::app) << "charged " << key << " (retry)\n";
      return Execution{Execution::Kind::kSuccess, "ch_2"};
    });
  }

  std::string dir_, db_, effects_;
  std::unique_ptr<FakeClock> clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Ledger> ledger_;
};

bool Killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

TEST_F(CrashTest, KilledAfterClaimGivesExplicitUnknown) {
  ASSERT_TRUE(Killed(RunChild("k1", "after_claim")));
  EXPECT_EQ(Executions(), 0);
  int runs = 0;
  auto r = Retry("k1", OnUnknown::kFail, &runs);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->decision.kind, Decision::Kind::kUnknown);
  EXPECT_EQ(runs, 0);
}

TEST_F(CrashTest, KilledAfterClaimRetriesUnderOnUnknownRetry) {
  ASSERT_TRUE(Killed(RunChild("k1", "after_claim")));
  int runs = 0;
  auto r = Retry("k1", OnUnknown::kRetry, &runs);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->decision.kind, Decision::Kind::kExecute);
  EXPECT_TRUE(r->decision.took_over);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Executions(), 1);
}

TEST_F(CrashTest, KilledAfterExecuteGivesExplicitUnknownNeverASecondCharge) {
  ASSERT_TRUE(Killed(RunChild("k2", "after_execute")));
  EXPECT_EQ(Executions(), 1);
  int runs = 0;
  auto r = Retry("k2", OnUnknown::kFail, &runs);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->decision.kind, Decision::Kind::kUnknown);
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(Executions(), 1);
}

TEST_F(CrashTest, KilledAfterCompleteReplaysAndLosesNothing) {
  ASSERT_TRUE(Killed(RunChild("k3", "after_complete")));
  EXPECT_EQ(Executions(), 1);
  int runs = 0;
  auto r = Retry("k3", OnUnknown::kRetry, &runs);  // even retry must not run again
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->decision.kind, Decision::Kind::kReplay);
  ASSERT_TRUE(r->outcome);
  EXPECT_EQ(r->outcome->body, "ch_1");
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(Executions(), 1);
}

TEST_F(CrashTest, ChildThatLivesAnswersAndARetryReplays) {
  ASSERT_TRUE(WIFEXITED(RunChild("k4", "none")));
  int runs = 0;
  auto r = Retry("k4", OnUnknown::kFail, &runs);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->decision.kind, Decision::Kind::kReplay);
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(Executions(), 1);
}

TEST_F(CrashTest, ManyKilledChildrenNeverLoseACompletedOutcome) {
  // Twenty keys, each completed by a child killed right after Complete.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Killed(RunChild("many" + std::to_string(i), "after_complete")));
  }
  for (int i = 0; i < 20; ++i) {
    int runs = 0;
    auto r = Retry("many" + std::to_string(i), OnUnknown::kRetry, &runs);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->decision.kind, Decision::Kind::kReplay) << i;
    EXPECT_EQ(runs, 0);
  }
  EXPECT_EQ(Executions(), 20);
}

}  // namespace
}  // namespace idem
