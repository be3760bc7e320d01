// GatewayMetrics fed by a real Ledger (memory store, FakeClock) through the
// on_attempt hook: counters, histograms, in-flight, the replay window and
// the alert's log lines and gauges.
#include "observe/gateway_metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory_store.h"
#include "observe/exposition_lines.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

class GatewayMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GatewayMetricsOptions o;
    o.alert.window = 5min;
    o.alert.min_attempts = 4;
    o.alert.replay_ratio = 0.5;
    o.evaluate_every = Duration(0);  // the test evaluates
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    o.max_hosts = 2;
    auto m = GatewayMetrics::Create(clock_, o);
    ASSERT_TRUE(m) << m.error().ToString();
    metrics_ = std::move(*m);
    ledger_ = std::make_unique<Ledger>(
        *store_, clock_, LedgerOptions{"test", nullptr, false, metrics_->ObserverFor("mcp")});
    metrics_->TrackInFlight("mcp", [this] { return double(ledger_->running_executions()); });
  }

  Call MakeCall(std::string key, std::string tool = "charge") {
    Call c;
    c.id = RecordId{"default", std::move(key)};
    c.fingerprint = "fp";
    c.tool = std::move(tool);
    c.turn = "turn-1";
    return c;
  }
  void RunOk(const Call& call, Duration takes = Duration(0)) {
    auto r = ledger_->Run(call, [&] {
      clock_.Advance(takes);
      return Execution{Execution::Kind::kSuccess, "ok"};
    });
    ASSERT_TRUE(r) << r.error().ToString();
  }

  FakeClock clock_;
  std::unique_ptr<Store> store_ = NewMemoryStore(clock_);
  std::vector<std::string> log_;
  std::unique_ptr<GatewayMetrics> metrics_;
  std::unique_ptr<Ledger> ledger_;
};

TEST_F(GatewayMetricsTest, CountsAttemptsByOutcomeAndTimesThem) {
  Call call = MakeCall("k1");
  RunOk(call, 20ms);
  RunOk(call);  // a retry: replayed
  const std::string text = metrics_->Render();
  EXPECT_TRUE(
      Has(text, R"(idemgate_attempts_total{front="mcp",tool="charge",outcome="executed",host="unknown"} 1)"));
  EXPECT_TRUE(
      Has(text, R"(idemgate_attempts_total{front="mcp",tool="charge",outcome="replayed",host="unknown"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_attempts_total{front="mcp",tool="charge",outcome="error",host="unknown"} 0)"));
  EXPECT_TRUE(Has(
      text,
      R"(idemgate_call_duration_seconds_bucket{front="mcp",tool="charge",decision="executed",le="0.01"} 0)"));
  EXPECT_TRUE(Has(
      text,
      R"(idemgate_call_duration_seconds_bucket{front="mcp",tool="charge",decision="executed",le="0.025"} 1)"));
  EXPECT_TRUE(Has(
      text,
      R"(idemgate_call_duration_seconds_sum{front="mcp",tool="charge",decision="executed"} 0.02)"));
  EXPECT_TRUE(Has(
      text,
      R"(idemgate_call_duration_seconds_count{front="mcp",tool="charge",decision="replayed"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_replay_ratio{tool="charge"} 0.5)"));
  EXPECT_TRUE(Has(text, R"(idemgate_replay_alert{tool="charge"} 0)"));
  EXPECT_TRUE(Has(text, R"(idemgate_alerts_total{tool="charge"} 0)"));
  EXPECT_TRUE(Has(text, R"(idemgate_in_flight_calls{front="mcp"} 0)"));
  EXPECT_TRUE(Has(text, R"(idemgate_build_info{version=")" IDEM_VERSION R"("} 1)"));
  EXPECT_TRUE(Has(text, "process_start_time_seconds 1767225600"));
  EXPECT_TRUE(log_.empty());
}

TEST_F(GatewayMetricsTest, InFlightCountsRunningExecutions) {
  std::string during;
  auto r = ledger_->Run(MakeCall("k1"), [&] {
    during = metrics_->Render();
    return Execution{Execution::Kind::kSuccess, "ok"};
  });
  ASSERT_TRUE(r);
  EXPECT_TRUE(Has(during, R"(idemgate_in_flight_calls{front="mcp"} 1)"));
  EXPECT_TRUE(Has(metrics_->Render(), R"(idemgate_in_flight_calls{front="mcp"} 0)"));
}

TEST_F(GatewayMetricsTest, ReplaySpikeFiresOnceThenResolvesWhenTheWindowSlides) {
  Call call = MakeCall("k1");
  RunOk(call);
  RunOk(call);
  RunOk(call);  // 2 replays of 3 attempts: below min_attempts
  metrics_->Evaluate();
  EXPECT_TRUE(log_.empty());
  RunOk(call);  // 3 of 4 = 0.75 > 0.5
  metrics_->Evaluate();
  metrics_->Evaluate();
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rfind("ALERT replay ratio of tool \"charge\" is 0.75", 0), 0u) << log_[0];
  std::string text = metrics_->Render();
  EXPECT_TRUE(Has(text, R"(idemgate_replay_alert{tool="charge"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_alerts_total{tool="charge"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_replay_ratio{tool="charge"} 0.75)"));

  clock_.Advance(5min + 5s);
  metrics_->Evaluate();
  ASSERT_EQ(log_.size(), 2u);
  EXPECT_EQ(log_[1].rfind("resolved: replay ratio of tool \"charge\"", 0), 0u);
  text = metrics_->Render();
  EXPECT_TRUE(Has(text, R"(idemgate_replay_alert{tool="charge"} 0)"));
  EXPECT_TRUE(Has(text, R"(idemgate_alerts_total{tool="charge"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_replay_ratio{tool="charge"} 0)"));
}

TEST_F(GatewayMetricsTest, FreshExecutionsDoNotFire) {
  for (int i = 0; i < 10; ++i) RunOk(MakeCall("k" + std::to_string(i)));
  metrics_->Evaluate();
  EXPECT_TRUE(log_.empty());
  EXPECT_TRUE(Has(metrics_->Render(), R"(idemgate_replay_ratio{tool="charge"} 0)"));
}

TEST_F(GatewayMetricsTest, AttemptsBeforeBeginAreCountedToo) {
  ledger_->LogAttempt(MakeCall("k1", "deploy"), AttemptOutcome::kError, clock_.Now(), "refused");
  EXPECT_TRUE(Has(metrics_->Render(),
                  R"(idemgate_attempts_total{front="mcp",tool="deploy",outcome="error",host="unknown"} 1)"));
}

// The host label: what a host calls itself, bounded: its characters and
// length, "unknown" when it said nothing, "other" past max_hosts (2 here).
TEST_F(GatewayMetricsTest, TheHostIsABoundedLabel) {
  for (const char* host : {"claude-code", "Visual Studio Code", "third", ""}) {
    Call call = MakeCall(std::string("k-") + host);
    call.host = host;
    RunOk(call);
  }
  const std::string text = metrics_->Render();
  const std::string series = R"(idemgate_attempts_total{front="mcp",tool="charge",outcome="executed",host=")";
  EXPECT_TRUE(Has(text, series + R"(claude-code"} 1)")) << text;
  EXPECT_TRUE(Has(text, series + R"(Visual_Studio_Code"} 1)")) << text;
  EXPECT_TRUE(Has(text, series + R"(other"} 1)")) << "a third host: " << text;
  EXPECT_TRUE(Has(text, series + R"(unknown"} 1)")) << "one that gave no name: " << text;
  EXPECT_EQ(HostLabel(""), "unknown");
  EXPECT_EQ(HostLabel("a\"b}\n"), "a_b__");
  EXPECT_EQ(HostLabel(std::string(100, 'x')), std::string(32, 'x'));
}

// Security review F3: tool names come from clients (up to 1 MiB in MCP), so
// the tool label is bounded in length and in distinct count.
TEST(GatewayMetricsToolLabelTest, LongAndManyToolNamesAreBoundedLabels) {
  FakeClock clock;
  GatewayMetricsOptions o;
  o.evaluate_every = Duration(0);
  o.max_tools = 3;
  o.max_label_bytes = 64;
  auto m = GatewayMetrics::Create(clock, o);
  ASSERT_TRUE(m) << m.error().ToString();
  std::unique_ptr<Store> store = NewMemoryStore(clock);
  Ledger ledger(*store, clock, LedgerOptions{"test", nullptr, false, (*m)->ObserverFor("serve")});
  const std::string huge = "charge" + std::string(1 << 20, 'x');
  for (int i = 0; i < 50; ++i) {
    Call c;
    c.id = RecordId{"default", "k" + std::to_string(i)};
    c.fingerprint = "fp";
    c.tool = i == 0 ? huge : huge + std::to_string(i);
    c.turn = "turn-1";
    auto r = ledger.Run(c, [] { return Execution{Execution::Kind::kSuccess, "ok"}; });
    ASSERT_TRUE(r) << r.error().ToString();
  }
  const std::string text = (*m)->Render();
  EXPECT_LT(text.size(), 64u * 1024) << "the exposition holds the names";
  const std::string label = ToolLabel(huge, 64);
  EXPECT_EQ(label.size(), 64u);
  EXPECT_TRUE(label.starts_with("charge"));
  EXPECT_NE(label, ToolLabel(huge + "1", 64)) << "long names stay distinct";
  EXPECT_NE(text.find(R"(tool=")" + label + R"(")"), std::string::npos) << text;
  EXPECT_TRUE(Has(text, R"(idemgate_attempts_total{front="serve",tool="other",outcome="executed",host="unknown"} 47)"))
      << text;
  EXPECT_EQ(ToolLabel("create_ticket", 64), "create_ticket");
  EXPECT_EQ(ToolLabel(std::string(40, 'a') + "\xc3\xa9" + std::string(40, 'b'), 32).size(), 32u);
  EXPECT_EQ(ToolLabel(std::string(14, 'a') + "\xc3\xa9" + std::string(40, 'b'), 32).size(), 31u)
      << "cut before the two-byte character, not inside it";
}

TEST(GatewayMetricsCreateTest, RejectsABadWebhookUrl) {
  FakeClock clock;
  GatewayMetricsOptions o;
  o.alert.webhook = "ftp://example.com/hook";
  auto m = GatewayMetrics::Create(clock, o);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace idem
