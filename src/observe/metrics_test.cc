// The registry and its Prometheus text exposition (format 0.0.4).
#include "observe/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace idem {
namespace {

TEST(MetricsTest, CounterAndGaugeRenderWithHelpTypeAndSortedSeries) {
  MetricsRegistry r;
  auto& c = r.AddCounter("t_requests_total", "Requests.", {"tool"});
  c.With({"zeta"}).Inc(2);
  c.With({"alpha"}).Inc();
  auto& g = r.AddGauge("t_temperature_celsius", "Temperature.");
  g.With({}).Set(21.5);
  EXPECT_EQ(r.Render(),
            "# HELP t_requests_total Requests.\n"
            "# TYPE t_requests_total counter\n"
            "t_requests_total{tool=\"alpha\"} 1\n"
            "t_requests_total{tool=\"zeta\"} 2\n"
            "# HELP t_temperature_celsius Temperature.\n"
            "# TYPE t_temperature_celsius gauge\n"
            "t_temperature_celsius 21.5\n");
}

TEST(MetricsTest, WithReturnsTheSameSeriesForTheSameLabels) {
  MetricsRegistry r;
  auto& c = r.AddCounter("t_total", "T.", {"a", "b"});
  Counter& one = c.With({"x", "y"});
  EXPECT_EQ(&one, &c.With({"x", "y"}));
  EXPECT_NE(&one, &c.With({"xy", ""}));  // the separator cannot be forged by concatenation
  EXPECT_NE(&one, &c.With({"y", "x"}));
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  MetricsRegistry r;
  r.AddCounter("t_total", "Line one\nback\\slash.", {"tool"}).With({"a\"b\\c\nd"}).Inc();
  EXPECT_EQ(r.Render(),
            "# HELP t_total Line one\\nback\\\\slash.\n"
            "# TYPE t_total counter\n"
            "t_total{tool=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTest, HistogramHasCumulativeBucketsInfSumAndCount) {
  MetricsRegistry r;
  const double bounds[] = {0.1, 1, 10};
  auto& h = r.AddHistogram("t_duration_seconds", "D.", {"op"}, bounds);
  Histogram& get = h.With({"get"});
  get.Observe(0.05);
  get.Observe(0.1);  // on the bound: le is inclusive
  get.Observe(5);
  get.Observe(100);
  EXPECT_EQ(r.Render(),
            "# HELP t_duration_seconds D.\n"
            "# TYPE t_duration_seconds histogram\n"
            "t_duration_seconds_bucket{op=\"get\",le=\"0.1\"} 2\n"
            "t_duration_seconds_bucket{op=\"get\",le=\"1\"} 2\n"
            "t_duration_seconds_bucket{op=\"get\",le=\"10\"} 3\n"
            "t_duration_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
            "t_duration_seconds_sum{op=\"get\"} 105.15\n"
            "t_duration_seconds_count{op=\"get\"} 4\n");
}

TEST(MetricsTest, UnlabelledHistogram) {
  MetricsRegistry r;
  const double bounds[] = {1};
  r.AddHistogram("t_seconds", "S.", {}, bounds).With({}).Observe(2);
  EXPECT_EQ(r.Render(),
            "# HELP t_seconds S.\n# TYPE t_seconds histogram\n"
            "t_seconds_bucket{le=\"1\"} 0\n"
            "t_seconds_bucket{le=\"+Inf\"} 1\n"
            "t_seconds_sum 2\n"
            "t_seconds_count 1\n");
}

TEST(MetricsTest, SeriesBeyondTheCapShareOneOtherSeries) {
  MetricsRegistry r;
  auto& c = r.AddCounter("t_total", "T.", {"tool"}, /*max_series=*/2);
  c.With({"a"}).Inc();
  c.With({"b"}).Inc();
  c.With({"c"}).Inc();
  c.With({"d"}).Inc();
  c.With({"a"}).Inc();  // existing series keep working
  EXPECT_EQ(r.Render(),
            "# HELP t_total T.\n# TYPE t_total counter\n"
            "t_total{tool=\"a\"} 2\n"
            "t_total{tool=\"b\"} 1\n"
            "t_total{tool=\"other\"} 2\n");
}

TEST(MetricsTest, OnCollectRunsBeforeEveryRender) {
  MetricsRegistry r;
  Gauge& g = r.AddGauge("t_running", "R.").With({});
  int renders = 0;
  r.OnCollect([&] { g.Set(++renders); });
  EXPECT_NE(r.Render().find("t_running 1\n"), std::string::npos);
  EXPECT_NE(r.Render().find("t_running 2\n"), std::string::npos);
}

TEST(MetricsTest, ValuesFormatAsPrometheusFloats) {
  EXPECT_EQ(FormatMetricValue(0.005), "0.005");
  EXPECT_EQ(FormatMetricValue(60), "60");
  EXPECT_EQ(FormatMetricValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatMetricValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatMetricValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
}

TEST(MetricsTest, ConcurrentIncrementsAreNotLost) {
  MetricsRegistry r;
  auto& c = r.AddCounter("t_total", "T.", {"tool"});
  const double bounds[] = {1};
  auto& h = r.AddHistogram("t_seconds", "S.", {"tool"}, bounds);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        c.With({i % 2 ? "odd" : "even"}).Inc();
        h.With({t % 2 ? "a" : "b"}).Observe(0.5);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.With({"odd"}).value() + c.With({"even"}).value(), 40000u);
  EXPECT_EQ(h.With({"a"}).snapshot().count + h.With({"b"}).snapshot().count, 40000u);
}

}  // namespace
}  // namespace idem
