// The sliding replay window and the alert rule, on a FakeClock.
#include "observe/replay_alert.h"

#include <gtest/gtest.h>

#include "observe/replay_window.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

AlertConfig Rule(uint64_t min_attempts = 4, double ratio = 0.5) {
  AlertConfig c;
  c.window = 5min;
  c.min_attempts = min_attempts;
  c.replay_ratio = ratio;
  return c;
}

TEST(ReplayWindowTest, CountsAttemptsAndReplays) {
  FakeClock clock;
  ReplayWindow w(5min);
  w.Record(clock.Now(), false);
  w.Record(clock.Now(), true);
  w.Record(clock.Now(), true);
  auto t = w.Sum(clock.Now());
  EXPECT_EQ(t.attempts, 3u);
  EXPECT_EQ(t.replays, 2u);
  EXPECT_DOUBLE_EQ(t.ratio(), 2.0 / 3.0);
  EXPECT_EQ(ReplayWindow::Totals{}.ratio(), 0.0);
}

TEST(ReplayWindowTest, SlidesOutOldBucketsAndReusesSlots) {
  FakeClock clock;
  ReplayWindow w(5min);  // 5 s buckets
  w.Record(clock.Now(), true);
  clock.Advance(3min);
  w.Record(clock.Now(), false);
  EXPECT_EQ(w.Sum(clock.Now()).attempts, 2u);
  clock.Advance(2min + 5s);  // the first bucket left the window
  auto t = w.Sum(clock.Now());
  EXPECT_EQ(t.attempts, 1u);
  EXPECT_EQ(t.replays, 0u);
  // A full lap later the ring's slots are reused, not added to.
  clock.Advance(5min);
  w.Record(clock.Now(), true);
  t = w.Sum(clock.Now());
  EXPECT_EQ(t.attempts, 1u);
  EXPECT_EQ(t.replays, 1u);
  clock.Advance(10min);
  EXPECT_EQ(w.Sum(clock.Now()).attempts, 0u);
}

TEST(ReplayAlertTest, FiresAboveTheRatioOnceAndResolvesOnce) {
  FakeClock clock;
  ReplayAlerter alerter(Rule(4, 0.5));
  // 2 of 4 is exactly the threshold: the rule says "exceeds".
  EXPECT_FALSE(alerter.Judge("charge", {4, 2}, clock.Now()));
  auto fired = alerter.Judge("charge", {4, 3}, clock.Now());
  ASSERT_TRUE(fired);
  EXPECT_TRUE(fired->firing);
  EXPECT_EQ(fired->tool, "charge");
  EXPECT_TRUE(alerter.firing("charge"));
  EXPECT_FALSE(alerter.Judge("charge", {10, 9}, clock.Now()));  // still firing: no new event
  auto resolved = alerter.Judge("charge", {10, 5}, clock.Now());
  ASSERT_TRUE(resolved);
  EXPECT_FALSE(resolved->firing);
  EXPECT_FALSE(alerter.firing("charge"));
  EXPECT_FALSE(alerter.Judge("charge", {10, 1}, clock.Now()));
}

TEST(ReplayAlertTest, NotBelowMinAttempts) {
  FakeClock clock;
  ReplayAlerter alerter(Rule(20, 0.5));
  EXPECT_FALSE(alerter.Judge("charge", {19, 19}, clock.Now()));
  EXPECT_TRUE(alerter.Judge("charge", {20, 19}, clock.Now()));
  // Traffic stopping (attempts dropping below the minimum) resolves it.
  auto resolved = alerter.Judge("charge", {3, 3}, clock.Now());
  ASSERT_TRUE(resolved);
  EXPECT_FALSE(resolved->firing);
}

TEST(ReplayAlertTest, ToolsAreJudgedSeparately) {
  FakeClock clock;
  ReplayAlerter alerter(Rule(1, 0.5));
  EXPECT_TRUE(alerter.Judge("a", {2, 2}, clock.Now()));
  EXPECT_FALSE(alerter.Judge("b", {2, 0}, clock.Now()));
  EXPECT_TRUE(alerter.firing("a"));
  EXPECT_FALSE(alerter.firing("b"));
}

TEST(ReplayAlertTest, WindowAndRuleTogetherFireThenResolveAsTimePasses) {
  FakeClock clock;
  AlertConfig rule = Rule(4, 0.5);
  ReplayWindow w(rule.window);
  ReplayAlerter alerter(rule);
  w.Record(clock.Now(), false);
  for (int i = 0; i < 3; ++i) w.Record(clock.Now(), true);
  ASSERT_TRUE(alerter.Judge("t", w.Sum(clock.Now()), clock.Now()));
  clock.Advance(4min);
  EXPECT_FALSE(alerter.Judge("t", w.Sum(clock.Now()), clock.Now()));  // still inside the window
  clock.Advance(1min + 5s);
  auto resolved = alerter.Judge("t", w.Sum(clock.Now()), clock.Now());
  ASSERT_TRUE(resolved);
  EXPECT_FALSE(resolved->firing);
  EXPECT_EQ(resolved->totals.attempts, 0u);
}

TEST(ReplayAlertTest, LogLineAndJsonDocument) {
  AlertConfig rule = Rule(20, 0.5);
  AlertEvent e{"create_\"user", true, {25, 20}, FromUnixMillis(1'767'225'600'000)};
  EXPECT_EQ(AlertLogLine(e, rule),
            "ALERT replay ratio of tool \"create_\\\"user\" is 0.80 (20 replays of 25 "
            "attempts in 5m), above 0.5: a network problem or a client retrying too hard?");
  EXPECT_EQ(
      AlertJson(e, rule, "mcp-7"),
      "{\"alert\":\"idemgate_replay_ratio\",\"status\":\"firing\",\"tool\":\"create_\\\"user\","
      "\"replay_ratio\":0.8,\"attempts\":25,\"replays\":20,\"threshold\":0.5,"
      "\"min_attempts\":20,\"window_seconds\":300,\"instance\":\"mcp-7\","
      "\"at\":\"2026-01-01T00:00:00Z\"}");
  e.firing = false;
  EXPECT_EQ(AlertLogLine(e, rule).rfind("resolved: replay ratio", 0), 0u);
  EXPECT_NE(AlertJson(e, rule, "x").find("\"status\":\"resolved\""), std::string::npos);
}

}  // namespace
}  // namespace idem
