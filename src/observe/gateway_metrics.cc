#include "observe/gateway_metrics.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "observe/replay_alert.h"
#include "observe/replay_window.h"
#include "observe/webhook.h"

namespace idem {
namespace {

constexpr size_t kHostLabelBytes = 32;  // HostLabel keeps this much of a host's name
// AttemptOutcome's answers, kExecuted .. kExecutedAgain; kClaimed, kResolved
// and kEvicted (after them) are audit only.
constexpr size_t kOutcomes = 13;

size_t IndexOf(AttemptOutcome o) { return static_cast<size_t>(o); }

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

template <typename V>
using StringMap = std::unordered_map<std::string, std::unique_ptr<V>, StringHash, std::equal_to<>>;

// The entry for `key` in `map`, made by `make` on first use. Shared lock on
// the common path: no allocation once the entry exists.
template <typename V, typename Make>
V& FindOrMake(std::shared_mutex& mu, StringMap<V>& map, std::string_view key, Make&& make) {
  {
    std::shared_lock lock(mu);
    if (auto it = map.find(key); it != map.end()) return *it->second;
  }
  std::unique_lock lock(mu);
  if (auto it = map.find(key); it != map.end()) return *it->second;
  return *map.emplace(std::string(key), make()).first->second;
}

}  // namespace

std::string HostLabel(std::string_view host) {
  std::string out;
  for (char c : host.substr(0, kHostLabelBytes)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    out.push_back(keep ? c : '_');
  }
  return out.empty() ? "unknown" : out;
}

std::string ToolLabel(std::string_view tool, size_t max_bytes) {
  if (tool.size() <= max_bytes) return std::string(tool);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: stable across runs, unlike std::hash
  for (unsigned char c : tool) hash = (hash ^ c) * 1099511628211ull;
  size_t keep = max_bytes - 17;
  while (keep > 0 && (static_cast<unsigned char>(tool[keep]) & 0xC0) == 0x80) --keep;
  char suffix[18];
  std::snprintf(suffix, sizeof suffix, "~%016llx", static_cast<unsigned long long>(hash));
  return std::string(tool.substr(0, keep)) + suffix;
}

struct GatewayMetrics::Impl {
  // One tool's sliding window and the metrics judged from it.
  struct ToolWindow {
    ToolWindow(Duration window, Gauge& r, Gauge& a, Counter& n)
        : window(window), ratio(r), alert(a), alerts(n) {}
    ReplayWindow window;
    Gauge& ratio;
    Gauge& alert;
    Counter& alerts;
  };
  // The series of one (front, host, tool): what an attempt touches.
  struct ToolSeries {
    std::array<Counter*, kOutcomes> attempts{};
    std::array<std::atomic<Histogram*>, kOutcomes> durations{};  // made on first use
    ToolWindow* window = nullptr;
    std::string tool;  // the tool's label
  };
  struct Front {
    // Unique in the process (never reused, unlike an address): keys the
    // per-thread series cache.
    uint64_t id = 0;
    std::string name;
    std::shared_mutex mu;
    StringMap<ToolSeries> tools;
  };

  Impl(Clock& c, GatewayMetricsOptions o)
      : clock(c),
        options(std::move(o)),
        attempts(registry.AddCounter(
            "idemgate_attempts_total",
            "Tool-call attempts by front, tool and outcome (executed, replayed, attached, "
            "in_progress, drift, unknown, released, error, the observe mode's would_*, and "
            "executed_again: a re-planned retry that ran), and the agent host (the MCP "
            "client's name; unknown, or other past [metrics] max_hosts).",
            {"front", "tool", "outcome", "host"})),
        durations(registry.AddHistogram(
            "idemgate_call_duration_seconds",
            "Latency of tool-call attempts in seconds (arrival to answer, millisecond "
            "resolution), by front, tool and decision (the attempt's outcome).",
            {"front", "tool", "decision"}, LatencyBuckets())),
        in_flight(registry.AddGauge("idemgate_in_flight_calls",
                                    "Executions running now (the upstream is working on them).",
                                    {"front"})),
        ratio(registry.AddGauge(
            "idemgate_replay_ratio",
            "Share of a tool's attempts answered from the store (replayed + attached) over the "
            "sliding alert window.",
            {"tool"})),
        alert(registry.AddGauge("idemgate_replay_alert",
                                "1 while the tool's replay-ratio alert is firing, else 0.",
                                {"tool"})),
        alerts_total(registry.AddCounter("idemgate_alerts_total",
                                         "Replay-ratio alerts fired, by tool.", {"tool"})),
        alerter(options.alert) {
    registry
        .AddGauge("idemgate_build_info", "Always 1; the version label names the build.",
                  {"version"})
        .With({IDEM_VERSION})
        .Set(1);
    registry
        .AddGauge("process_start_time_seconds",
                  "Start time of the process since the Unix epoch in seconds.")
        .With({})
        .Set(static_cast<double>(ToUnixMillis(clock.Now())) / 1000.0);
    registry.OnCollect([this] { Collect(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(eval_mu);
      stop = true;
    }
    eval_cv.notify_all();
    if (evaluator.joinable()) evaluator.join();
  }

  void Log(std::string_view line) {
    if (options.log) return options.log(line);
    std::cerr << "idemgate: " + std::string(line) + "\n" << std::flush;
  }

  ToolWindow& WindowFor(std::string_view tool) {
    return FindOrMake(windows_mu, windows, tool, [&] {
      return std::make_unique<ToolWindow>(options.alert.window, ratio.With({tool}),
                                          alert.With({tool}), alerts_total.With({tool}));
    });
  }

  // The label of `host`: HostLabel, or "other" once max_hosts distinct
  // names are in use ("unknown" is always there, uncounted).
  std::string LabelOfHost(std::string_view host) {
    std::string label = HostLabel(host);
    if (host.empty()) return label;
    std::lock_guard lock(hosts_mu);
    if (hosts.contains(label)) return label;
    if (hosts.size() >= options.max_hosts) return "other";
    hosts.insert(label);
    return label;
  }

  // The label of `tool`: ToolLabel, or "other" once max_tools distinct
  // labels are in use.
  std::string LabelOfTool(std::string_view tool) {
    std::string label = ToolLabel(tool, std::max<size_t>(32, options.max_label_bytes));
    std::lock_guard lock(tools_mu);
    if (tools.contains(label)) return label;
    if (tools.size() >= options.max_tools) return "other";
    tools.insert(label);
    return label;
  }

  // The series of the tool labelled `tool` (LabelOfTool) from the host
  // labelled `host_label` (LabelOfHost): at most max_hosts + 2 per tool
  // label, max_tools + 1 tool labels.
  ToolSeries& SeriesFor(Front& front, std::string_view tool, std::string_view host_label) {
    std::string key(host_label);
    key.push_back('/');  // a label holds no '/'
    key.append(tool);
    return FindOrMake(front.mu, front.tools, key, [&] {
      auto s = std::make_unique<ToolSeries>();
      s->tool = tool;
      for (size_t i = 0; i < kOutcomes; ++i) {
        s->attempts[i] = &attempts.With(
            {front.name, tool, AttemptOutcomeName(static_cast<AttemptOutcome>(i)), host_label});
      }
      s->window = &WindowFor(tool);
      return s;
    });
  }

  // SeriesFor through a small per-thread cache: a hit costs a hash and a
  // string compare, and touches no shared cache line (the shared lock's
  // reader count would bounce between cores at high rates).
  // `host` as it came: only the bytes HostLabel reads key the cache. A tool
  // longer than a label is not cached (the cache would hold its name).
  ToolSeries& CachedSeriesFor(Front& front, std::string_view tool, std::string_view host) {
    host = host.substr(0, kHostLabelBytes);
    if (tool.size() > options.max_label_bytes) {
      return SeriesFor(front, LabelOfTool(tool), LabelOfHost(host));
    }
    struct Entry {
      uint64_t front_id = 0;
      std::string tool;
      std::string host;
      ToolSeries* series = nullptr;
    };
    thread_local std::array<Entry, 64> cache;
    Entry& e = cache[std::hash<std::string_view>{}(tool) % cache.size()];
    if (e.front_id == front.id && e.tool == tool && e.host == host) return *e.series;
    ToolSeries& s = SeriesFor(front, LabelOfTool(tool), LabelOfHost(host));
    e.front_id = front.id;
    e.tool.assign(tool);
    e.host.assign(host);
    e.series = &s;
    return s;
  }

  void Observe(Front& front, std::string_view tool, std::string_view host, AttemptOutcome outcome,
               TimePoint now, Duration latency) {
    ToolSeries& s = CachedSeriesFor(front, tool, host);
    const size_t i = IndexOf(outcome);
    if (i >= kOutcomes) return;
    s.attempts[i]->Inc();
    Histogram* h = s.durations[i].load(std::memory_order_acquire);
    if (h == nullptr) {
      h = &durations.With({front.name, s.tool, AttemptOutcomeName(outcome)});
      s.durations[i].store(h, std::memory_order_release);
    }
    h->Observe(static_cast<double>(latency.count()) / 1000.0);
    const bool replay =
        outcome == AttemptOutcome::kReplayed || outcome == AttemptOutcome::kAttached;
    s.window->window.Record(now, replay);
  }

  void Evaluate() {
    std::vector<std::pair<std::string_view, ToolWindow*>> all;
    {
      std::shared_lock lock(windows_mu);
      all.reserve(windows.size());
      for (auto& [tool, w] : windows) all.emplace_back(tool, w.get());
    }
    std::lock_guard lock(judge_mu);  // one evaluation at a time: events stay in order
    const TimePoint now = clock.Now();
    for (auto& [tool, w] : all) {
      const ReplayWindow::Totals totals = w->window.Sum(now);
      w->ratio.Set(totals.ratio());
      std::optional<AlertEvent> event = alerter.Judge(tool, totals, now);
      if (!event) continue;
      w->alert.Set(event->firing ? 1 : 0);
      if (event->firing) w->alerts.Inc();
      Log(AlertLogLine(*event, options.alert));
      if (webhook) webhook->Post(AlertJson(*event, options.alert, options.instance));
    }
  }

  void Collect() {
    Evaluate();
    std::lock_guard lock(in_flight_mu);
    for (auto& [gauge, running] : in_flight_sources) gauge->Set(running());
  }

  void EvaluateLoop() {
    std::unique_lock lock(eval_mu);
    while (!stop) {
      const TimePoint due = clock.Now() + options.evaluate_every;
      while (!stop && clock.Now() < due) clock.WaitUntil(eval_cv, lock, due);
      if (stop) return;
      lock.unlock();
      Evaluate();
      lock.lock();
    }
  }

  Clock& clock;
  const GatewayMetricsOptions options;
  MetricsRegistry registry;
  CounterFamily& attempts;
  HistogramFamily& durations;
  GaugeFamily& in_flight;
  std::once_flag in_flight_limit_made;
  GaugeFamily* in_flight_limit = nullptr;  // SetInFlightLimit
  GaugeFamily& ratio;
  GaugeFamily& alert;
  CounterFamily& alerts_total;
  ReplayAlerter alerter;
  std::unique_ptr<WebhookSender> webhook;

  std::mutex hosts_mu;
  std::set<std::string, std::less<>> hosts;  // host labels in use, at most max_hosts
  std::mutex tools_mu;
  std::set<std::string, std::less<>> tools;  // tool labels in use, at most max_tools

  std::shared_mutex windows_mu;
  StringMap<ToolWindow> windows;
  std::mutex fronts_mu;
  std::vector<std::unique_ptr<Front>> fronts;  // stable addresses for the hooks
  std::mutex in_flight_mu;
  std::vector<std::pair<Gauge*, std::function<double()>>> in_flight_sources;
  std::mutex judge_mu;

  std::mutex eval_mu;
  std::condition_variable eval_cv;
  bool stop = false;
  std::thread evaluator;
};

Result<std::unique_ptr<GatewayMetrics>> GatewayMetrics::Create(Clock& clock,
                                                               GatewayMetricsOptions options) {
  auto impl = std::make_unique<Impl>(clock, std::move(options));
  if (!impl->options.alert.webhook.empty()) {
    WebhookOptions w;
    w.timeout = impl->options.webhook_timeout;
    w.verify_tls = impl->options.webhook_verify_tls;
    w.ca_file = impl->options.webhook_ca_file;
    w.log = [impl = impl.get()](std::string_view line) { impl->Log(line); };
    auto sender = WebhookSender::Create(impl->options.alert.webhook, std::move(w));
    if (!sender) return std::unexpected(sender.error());
    impl->webhook = std::move(*sender);
  }
  if (impl->options.evaluate_every.count() > 0) {
    impl->evaluator = std::thread([impl = impl.get()] { impl->EvaluateLoop(); });
  }
  return std::unique_ptr<GatewayMetrics>(new GatewayMetrics(std::move(impl)));
}

GatewayMetrics::GatewayMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GatewayMetrics::~GatewayMetrics() = default;

MetricsRegistry& GatewayMetrics::registry() { return impl_->registry; }

AttemptHook GatewayMetrics::ObserverFor(std::string front) {
  Impl::Front* f;
  {
    std::lock_guard lock(impl_->fronts_mu);
    impl_->fronts.push_back(std::make_unique<Impl::Front>());
    f = impl_->fronts.back().get();
    static std::atomic<uint64_t> next_front_id{1};
    f->id = next_front_id.fetch_add(1);
    f->name = std::move(front);
  }
  return [impl = impl_.get(), f](const Call& call, AttemptOutcome outcome, TimePoint started_at,
                                 Duration latency) {
    impl->Observe(*f, call.tool, call.host, outcome, started_at + latency, latency);
  };
}

void GatewayMetrics::TrackInFlight(std::string front, std::function<double()> running) {
  Gauge& g = impl_->in_flight.With({front});
  std::lock_guard lock(impl_->in_flight_mu);
  impl_->in_flight_sources.emplace_back(&g, std::move(running));
}

void GatewayMetrics::SetInFlightLimit(const std::string& front, size_t limit) {
  // Made on first use: a front without a limit (serve) exports no such family.
  std::call_once(impl_->in_flight_limit_made, [&] {
    impl_->in_flight_limit = &impl_->registry.AddGauge(
        "idemgate_in_flight_limit",
        "Most executions the front can have in flight (idemgate http: --max-connections; "
        "idemgate mcp: [mcp] max_in_flight).",
        {"front"});
  });
  impl_->in_flight_limit->With({front}).Set(static_cast<double>(limit));
}

void GatewayMetrics::Evaluate() { impl_->Evaluate(); }

std::string GatewayMetrics::Render() { return impl_->registry.Render(); }

void GatewayMetrics::DrainWebhooks() {
  if (impl_->webhook) impl_->webhook->Drain();
}

}  // namespace idem
