#include "observe/metrics.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <charconv>
#include <cmath>
#include <type_traits>

namespace idem {
namespace {

constexpr std::array<double, 15> kLatencyBuckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                 0.5,   1,      2.5,   5,    10,    30,   60};
constexpr std::array<double, 16> kStoreLatencyBuckets{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                      1,      2.5,     5,      10};

// Metric and label names are ours, never from requests: checked in debug builds.
[[maybe_unused]] bool ValidName(std::string_view n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

size_t HashParts(auto begin, auto end) {
  size_t h = 0xcbf29ce484222325ull;
  for (auto it = begin; it != end; ++it) {
    h ^= std::hash<std::string_view>{}(std::string_view(*it)) + 0x9e3779b97f4a7c15ull + (h << 6) +
         (h >> 2);
  }
  return h;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string_view TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// `{a="x",b="y"` without the closing brace, or "" for no labels; `extra`
// (such as le="0.1") is appended as one more pair.
std::string LabelPairs(const std::vector<std::string>& names,
                       const std::vector<std::string>& values, std::string_view extra = {}) {
  if (names.empty() && extra.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  return out;
}

void AppendSample(std::string& out, std::string_view name, const std::string& labels,
                  std::string_view value) {
  out += name;
  if (!labels.empty()) {
    out += labels;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::span<const double> LatencyBuckets() { return kLatencyBuckets; }
std::span<const double> StoreLatencyBuckets() { return kStoreLatencyBuckets; }

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

// ── Histogram ───────────────────────────────────────────────────────────────

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  // Few buckets: a linear scan beats a binary search and stays branch-predictable.
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.count = count_.load(std::memory_order_relaxed);
  s.sum = sum_.load(std::memory_order_relaxed);
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = std::min(running, s.count);
  }
  s.cumulative.back() = s.count;
  return s;
}

// ── Family ──────────────────────────────────────────────────────────────────

template <typename M>
size_t Family<M>::Hash::operator()(const Key& k) const {
  return HashParts(k.parts.begin(), k.parts.end());
}
template <typename M>
size_t Family<M>::Hash::operator()(const std::vector<std::string>& k) const {
  return HashParts(k.begin(), k.end());
}
template <typename M>
bool Family<M>::Eq::operator()(const Key& a, const std::vector<std::string>& b) const {
  return std::equal(a.parts.begin(), a.parts.end(), b.begin(), b.end(),
                    [](std::string_view x, const std::string& y) { return x == y; });
}

template <typename M>
Family<M>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds, size_t max_series)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)),
      max_series_(std::max<size_t>(max_series, 1)) {
  assert(ValidName(name_));
  for ([[maybe_unused]] const auto& l : label_names_) assert(ValidName(l) && l != "le");
}

template <typename M>
std::unique_ptr<M> Family<M>::Make() const {
  if constexpr (std::is_same_v<M, Histogram>) {
    return std::make_unique<Histogram>(std::span<const double>(bounds_));
  } else {
    return std::make_unique<M>();
  }
}

template <typename M>
M& Family<M>::With(std::initializer_list<std::string_view> values) {
  return With(std::span<const std::string_view>(values.begin(), values.size()));
}

template <typename M>
M& Family<M>::With(std::span<const std::string_view> values) {
  assert(values.size() == label_names_.size());
  const Key key{values};
  {
    std::shared_lock lock(mu_);
    if (auto it = series_.find(key); it != series_.end()) return *it->second->metric;
  }
  std::vector<std::string> labels(values.begin(), values.end());
  std::unique_lock lock(mu_);
  if (auto it = series_.find(labels); it != series_.end()) return *it->second->metric;
  if (series_.size() >= max_series_) {
    labels.assign(label_names_.size(), "other");
    if (auto it = series_.find(labels); it != series_.end()) return *it->second->metric;
  }
  auto series = std::make_unique<Series>(Series{labels, Make()});
  M& metric = *series->metric;
  series_.emplace(std::move(labels), std::move(series));
  return metric;
}

template <typename M>
std::vector<const typename Family<M>::Series*> Family<M>::List() const {
  std::vector<const Series*> out;
  {
    std::shared_lock lock(mu_);
    out.reserve(series_.size());
    for (const auto& [labels, series] : series_) out.push_back(series.get());
  }
  std::sort(out.begin(), out.end(),
            [](const Series* a, const Series* b) { return a->labels < b->labels; });
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ── Registry ────────────────────────────────────────────────────────────────

CounterFamily& MetricsRegistry::AddCounter(std::string name, std::string help,
                                           std::vector<std::string> label_names,
                                           size_t max_series) {
  std::lock_guard lock(mu_);
  counters_.emplace_back(
      new CounterFamily(std::move(name), std::move(help), std::move(label_names), {}, max_series));
  entries_.push_back({MetricType::kCounter, counters_.back().get()});
  return *counters_.back();
}

GaugeFamily& MetricsRegistry::AddGauge(std::string name, std::string help,
                                       std::vector<std::string> label_names, size_t max_series) {
  std::lock_guard lock(mu_);
  gauges_.emplace_back(
      new GaugeFamily(std::move(name), std::move(help), std::move(label_names), {}, max_series));
  entries_.push_back({MetricType::kGauge, gauges_.back().get()});
  return *gauges_.back();
}

HistogramFamily& MetricsRegistry::AddHistogram(std::string name, std::string help,
                                               std::vector<std::string> label_names,
                                               std::span<const double> bounds, size_t max_series) {
  assert(std::is_sorted(bounds.begin(), bounds.end()));
  std::lock_guard lock(mu_);
  histograms_.emplace_back(
      new HistogramFamily(std::move(name), std::move(help), std::move(label_names),
                          std::vector<double>(bounds.begin(), bounds.end()), max_series));
  entries_.push_back({MetricType::kHistogram, histograms_.back().get()});
  return *histograms_.back();
}

void MetricsRegistry::OnCollect(std::function<void()> refresh) {
  std::lock_guard lock(mu_);
  collectors_.push_back(std::move(refresh));
}

std::string MetricsRegistry::Render() {
  std::vector<Entry> entries;
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard lock(mu_);
    entries = entries_;
    collectors = collectors_;
  }
  for (auto& refresh : collectors) refresh();

  std::string out;
  out.reserve(4096);
  auto header = [&](const std::string& name, const std::string& help, MetricType type) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += EscapeHelp(help);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += TypeName(type);
    out += '\n';
  };
  for (const Entry& e : entries) {
    switch (e.type) {
      case MetricType::kCounter: {
        auto* f = static_cast<CounterFamily*>(e.family);
        header(f->name_, f->help_, e.type);
        for (const auto* s : f->List()) {
          AppendSample(out, f->name_, LabelPairs(f->label_names_, s->labels),
                       std::to_string(s->metric->value()));
        }
        break;
      }
      case MetricType::kGauge: {
        auto* f = static_cast<GaugeFamily*>(e.family);
        header(f->name_, f->help_, e.type);
        for (const auto* s : f->List()) {
          AppendSample(out, f->name_, LabelPairs(f->label_names_, s->labels),
                       FormatMetricValue(s->metric->value()));
        }
        break;
      }
      case MetricType::kHistogram: {
        auto* f = static_cast<HistogramFamily*>(e.family);
        header(f->name_, f->help_, e.type);
        const std::string bucket = f->name_ + "_bucket";
        for (const auto* s : f->List()) {
          Histogram::Snapshot snap = s->metric->snapshot();
          for (size_t i = 0; i <= f->bounds_.size(); ++i) {
            const std::string le =
                "le=\"" +
                (i < f->bounds_.size() ? FormatMetricValue(f->bounds_[i]) : std::string("+Inf")) +
                "\"";
            AppendSample(out, bucket, LabelPairs(f->label_names_, s->labels, le),
                         std::to_string(snap.cumulative[i]));
          }
          const std::string labels = LabelPairs(f->label_names_, s->labels);
          AppendSample(out, f->name_ + "_sum", labels, FormatMetricValue(snap.sum));
          AppendSample(out, f->name_ + "_count", labels, std::to_string(snap.count));
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace idem
