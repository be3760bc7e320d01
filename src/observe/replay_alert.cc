#include "observe/replay_alert.h"

#include <time.h>

#include <cstdio>

#include "json/json_text.h"
#include "observe/metrics.h"

namespace idem {
namespace {

}  // namespace

bool ReplayRatioBreached(const AlertConfig& config, const ReplayWindow::Totals& totals) {
  return totals.attempts > 0 && totals.attempts >= config.min_attempts &&
         totals.ratio() > config.replay_ratio;
}

std::optional<AlertEvent> ReplayAlerter::Judge(std::string_view tool,
                                               const ReplayWindow::Totals& totals, TimePoint now) {
  const bool breached = ReplayRatioBreached(config_, totals);
  std::lock_guard lock(mu_);
  auto it = firing_.find(tool);
  if (it == firing_.end()) {
    if (!breached) return std::nullopt;  // never fired: nothing to remember
    it = firing_.emplace(std::string(tool), false).first;
  }
  if (it->second == breached) return std::nullopt;
  it->second = breached;
  return AlertEvent{std::string(tool), breached, totals, now};
}

bool ReplayAlerter::firing(std::string_view tool) const {
  std::lock_guard lock(mu_);
  auto it = firing_.find(tool);
  return it != firing_.end() && it->second;
}

std::string AlertLogLine(const AlertEvent& e, const AlertConfig& config) {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", e.totals.ratio());
  std::string line = e.firing ? "ALERT replay ratio of tool " : "resolved: replay ratio of tool ";
  line += json_text::Quote(e.tool);
  line += " is ";
  line += ratio;
  line += " (" + std::to_string(e.totals.replays) + " replays of " +
          std::to_string(e.totals.attempts) + " attempts in " + FormatDuration(config.window) + ")";
  line += e.firing ? ", above " : ", threshold ";
  line += FormatMetricValue(config.replay_ratio);
  if (e.firing) line += ": a network problem or a client retrying too hard?";
  return line;
}

std::string AlertJson(const AlertEvent& e, const AlertConfig& config, std::string_view instance) {
  std::string out = "{\"alert\":\"idemgate_replay_ratio\",\"status\":";
  out += e.firing ? "\"firing\"" : "\"resolved\"";
  out += ",\"tool\":" + json_text::Quote(e.tool);
  out += ",\"replay_ratio\":" + FormatMetricValue(e.totals.ratio());
  out += ",\"attempts\":" + std::to_string(e.totals.attempts);
  out += ",\"replays\":" + std::to_string(e.totals.replays);
  out += ",\"threshold\":" + FormatMetricValue(config.replay_ratio);
  out += ",\"min_attempts\":" + std::to_string(config.min_attempts);
  out += ",\"window_seconds\":" + FormatMetricValue(config.window.count() / 1000.0);
  out += ",\"instance\":" + json_text::Quote(instance);
  out += ",\"at\":" + json_text::Quote(FormatIsoTime(e.at, /*with_millis=*/false));
  out += "}";
  return out;
}

}  // namespace idem
