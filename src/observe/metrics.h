// Metrics (docs/DESIGN.md §7): counters, gauges and fixed-bucket histograms with
// labels, and their Prometheus text exposition (format 0.0.4).
//
// Built for the request path: a series is a few atomics; once it exists,
// Family::With finds it under a shared lock without allocating. Callers on
// hot paths keep the returned reference (it lives as long as the registry)
// instead of looking it up on every call. Series are never removed.
//
// Thread-safe throughout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace idem {

// A count that only goes up.
class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is
// implicit), with their sum and count.
class Histogram {
 public:
  // `bounds` must outlive the histogram (the family owns them).
  explicit Histogram(std::span<const double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // A consistent-enough copy: each bucket is read once; concurrent
  // observations may show in count and not yet in a bucket, so `cumulative`
  // is made monotonic and its +Inf entry is the count.
  Snapshot snapshot() const;

 private:
  std::span<const double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// Default buckets for latencies in seconds, 1 ms .. 60 s.
std::span<const double> LatencyBuckets();
// Finer buckets for store operations, 100 µs .. 10 s.
std::span<const double> StoreLatencyBuckets();

class MetricsRegistry;

// All series of one metric name, one per combination of label values.
template <typename M>
class Family {
 public:
  // The series for `values` (one per label name, in the family's order),
  // created on first use. Once a family holds max_series series, new
  // combinations share one series whose label values are all "other" (a
  // guard against unbounded label values). Never fails.
  M& With(std::initializer_list<std::string_view> values);
  M& With(std::span<const std::string_view> values);

  const std::string& name() const { return name_; }

 private:
  friend class MetricsRegistry;
  struct Series {
    std::vector<std::string> labels;
    std::unique_ptr<M> metric;
  };
  // Heterogeneous lookup by a list of string_views: no key is built.
  struct Key {
    std::span<const std::string_view> parts;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(const Key& k) const;
    size_t operator()(const std::vector<std::string>& k) const;
  };
  struct Eq {
    using is_transparent = void;
    bool operator()(const std::vector<std::string>& a, const std::vector<std::string>& b) const {
      return a == b;
    }
    bool operator()(const Key& a, const std::vector<std::string>& b) const;
    bool operator()(const std::vector<std::string>& a, const Key& b) const { return (*this)(b, a); }
  };

  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds, size_t max_series);
  std::unique_ptr<M> Make() const;
  // The series as they are now (pointers stay valid; series are never removed).
  std::vector<const Series*> List() const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  const size_t max_series_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::vector<std::string>, std::unique_ptr<Series>, Hash, Eq> series_;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns every family and renders them. Families are added at start-up; the
// references returned stay valid for the registry's life.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // `name` and `label_names` must be valid Prometheus names (asserted: they
  // are written by us, never taken from requests). `max_series` default 10000.
  CounterFamily& AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {}, size_t max_series = 10000);
  GaugeFamily& AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {}, size_t max_series = 10000);
  HistogramFamily& AddHistogram(std::string name, std::string help,
                                std::vector<std::string> label_names,
                                std::span<const double> bounds, size_t max_series = 10000);

  // Runs `refresh` at the start of every Render, on the rendering thread:
  // for gauges computed on demand (a sliding window, a running count).
  void OnCollect(std::function<void()> refresh);

  // Every family in registration order, series sorted by label values, in
  // the Prometheus text exposition format 0.0.4 (Content-Type
  // kExpositionContentType). Holds each family's lock only to list its
  // series, never while formatting.
  std::string Render();

 private:
  struct Entry {
    MetricType type;
    void* family;  // CounterFamily*, GaugeFamily* or HistogramFamily*
  };
  std::mutex mu_;  // guards entries_ and collectors_ (not the series)
  std::vector<Entry> entries_;
  std::vector<std::unique_ptr<CounterFamily>> counters_;
  std::vector<std::unique_ptr<GaugeFamily>> gauges_;
  std::vector<std::unique_ptr<HistogramFamily>> histograms_;
  std::vector<std::function<void()>> collectors_;
};

inline constexpr std::string_view kExpositionContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Escapes a label value for the exposition: backslash, double quote and
// line feed (\\ \" \n).
std::string EscapeLabelValue(std::string_view v);
// Formats a sample value: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double v);

}  // namespace idem
