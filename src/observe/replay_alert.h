// The replay-spike alert (docs/DESIGN.md §7): when a tool's replay ratio over
// alert.window, with at least alert.min_attempts attempts, exceeds
// alert.replay_ratio, the alert fires once; it resolves once when the window
// drops back. A spike means a network problem or a client retrying too hard.
//
// This file decides and formats; it does no I/O. GatewayMetrics calls Judge
// for every tool on each evaluation and acts on the events (log line, gauge,
// webhook).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "observe/replay_window.h"
#include "idem/clock.h"
#include "idem/config.h"

namespace idem {

struct AlertEvent {
  std::string tool;
  bool firing = true;  // true: the alert starts; false: it resolved
  ReplayWindow::Totals totals;
  TimePoint at{};
};

// True when `totals` breach the rule: attempts >= min_attempts and
// replays / attempts > replay_ratio.
bool ReplayRatioBreached(const AlertConfig& config, const ReplayWindow::Totals& totals);

// Remembers which tools are firing. Thread-safe.
class ReplayAlerter {
 public:
  explicit ReplayAlerter(AlertConfig config) : config_(std::move(config)) {}

  // Judges `tool`'s window at `now`. Returns an event only when the tool's
  // state changes (so each firing is reported once, and so is its end).
  std::optional<AlertEvent> Judge(std::string_view tool, const ReplayWindow::Totals& totals,
                                  TimePoint now);
  bool firing(std::string_view tool) const;
  const AlertConfig& config() const { return config_; }

 private:
  const AlertConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, bool, std::less<>> firing_;
};

// One log line, without a prefix or newline:
// "ALERT replay ratio of tool \"x\" is 0.80 (20 replays of 25 attempts in 5m), above 0.5: ..."
// or "resolved: replay ratio of tool \"x\" is 0.10 (...), threshold 0.5".
std::string AlertLogLine(const AlertEvent& event, const AlertConfig& config);

// The webhook body, one JSON object:
// {"alert":"idemgate_replay_ratio","status":"firing"|"resolved","tool":"x",
//  "replay_ratio":0.8,"attempts":25,"replays":20,"threshold":0.5,
//  "min_attempts":20,"window_seconds":300,"instance":"mcp-42",
//  "at":"2026-01-01T00:00:00Z"}
std::string AlertJson(const AlertEvent& event, const AlertConfig& config,
                      std::string_view instance);

}  // namespace idem
