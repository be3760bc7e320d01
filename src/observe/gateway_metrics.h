// idemgate's own metrics and the replay-spike alert (docs/DESIGN.md §7), on top
// of a MetricsRegistry it owns:
//
//   idemgate_attempts_total{front,tool,outcome,host}       counter
//   idemgate_call_duration_seconds{front,tool,decision}    histogram
//   idemgate_in_flight_calls{front}                        gauge
//   idemgate_replay_ratio{tool}                            gauge, over alert.window
//   idemgate_replay_alert{tool}                            gauge, 1 while firing
//   idemgate_alerts_total{tool}                            counter
//   idemgate_build_info{version}                           gauge, always 1
//   process_start_time_seconds                             gauge
//
// plus the store metrics of InstrumentedStore when one is built on
// registry(). Attempts arrive through the ledger's on_attempt hook
// (ObserverFor), so every front is measured the same way.
//
// The alert: each evaluation (every evaluate_every by the injected clock, and
// on every Render) judges each tool's window; when (replayed + attached) /
// attempts exceeds alert.replay_ratio with at least alert.min_attempts
// attempts, one warning line goes to the log, idemgate_replay_alert{tool}
// becomes 1, idemgate_alerts_total{tool} counts it, and the alert document is
// POSTed to alert.webhook (if set) from a background thread. When the ratio
// drops back, one "resolved" line, the gauge returns to 0 and a "resolved"
// document is POSTed.
//
// The host label is Call::host (the MCP client's clientInfo.name) made a
// bounded label: HostLabel's characters and length, "unknown" when empty,
// and past max_hosts distinct named hosts in the process, "other". The tool
// label is the tool's name bounded the same way (clients choose it): ToolLabel's
// length, and past max_tools distinct tools in the process, "other"; the
// windows of the replay alert are per tool label.
//
// Thread-safe. The hot path (one attempt) takes shared locks only and does
// not allocate once its tool has been seen.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/config.h"
#include "idem/error.h"
#include "idem/ledger.h"
#include "observe/metrics.h"
#include "idem/record.h"

namespace idem {

struct GatewayMetricsOptions {
  AlertConfig alert;  // [alert]; see config.h for its defaults
  // Names this process in alert documents. Default "idemgate".
  std::string instance = "idemgate";
  // How often the windows are judged, by the injected clock. Zero: only by
  // Evaluate() and Render() (tests). Default 1 s.
  Duration evaluate_every{1'000};
  // Alert lines and webhook failures, one line each without a newline.
  // Default: stderr, as "idemgate: <line>".
  std::function<void(std::string_view)> log;
  // Webhook delivery: the whole POST within this. Default 5 s.
  Duration webhook_timeout{5'000};
  // Verify the webhook's TLS certificate. Default true; false for tests only.
  bool webhook_verify_tls = true;
  // Extra CA bundle (PEM) for the webhook. Default none.
  std::string webhook_ca_file;
  // Distinct host labels ([metrics] max_hosts); later hosts count as
  // "other". Default 16.
  size_t max_hosts = 16;
  // Distinct tool labels ([metrics] max_tools); later tools count as
  // "other". Default 1000.
  size_t max_tools = 1000;
  // Longest tool label ([metrics] max_label_bytes, at least 32). Default 128.
  size_t max_label_bytes = 128;
};

// `host` as a metrics label: letters, digits, '.', '_' and '-' kept
// (others become '_'), at most 32 bytes, "unknown" when empty. Hosts name
// themselves, so the label is bounded here, not trusted.
std::string HostLabel(std::string_view host);

// `tool` as a metrics label of at most `max_bytes` (at least 32): unchanged
// when it fits, else its start (cut at a UTF-8 character boundary), "~" and
// 16 hex digits of a hash of the whole name, so that long names stay
// distinct and bounded.
std::string ToolLabel(std::string_view tool, size_t max_bytes);

class GatewayMetrics {
 public:
  // kInvalidArgument for an alert.webhook that is not an http(s) URL;
  // kUnavailable if the TLS trust store cannot be loaded. `clock` must
  // outlive the result.
  static Result<std::unique_ptr<GatewayMetrics>> Create(Clock& clock,
                                                        GatewayMetricsOptions options = {});
  ~GatewayMetrics();  // stops evaluating; undelivered webhooks are dropped
  GatewayMetrics(const GatewayMetrics&) = delete;
  GatewayMetrics& operator=(const GatewayMetrics&) = delete;

  // The registry every metric lives in (add an InstrumentedStore on it).
  MetricsRegistry& registry();

  // The LedgerOptions::on_attempt hook of the front named `front` ("mcp",
  // "http", "serve"). The hook keeps a pointer to this object.
  AttemptHook ObserverFor(std::string front);

  // Reads `running` (e.g. Ledger::running_executions) on every Render as
  // idemgate_in_flight_calls{front}.
  void TrackInFlight(std::string front, std::function<double()> running);
  // idemgate_in_flight_limit{front}: the most executions `front` can have in
  // flight, beside idemgate_in_flight_calls for the near-limit alert
  // (deploy/prometheus/idemgate.rules.yml).
  void SetInFlightLimit(const std::string& front, size_t limit);

  // Judges every tool's window now (see the top of this file).
  void Evaluate();
  // The exposition of every metric (MetricsRegistry::Render), evaluated first.
  std::string Render();
  // Blocks until every alert document queued so far was POSTed or given up.
  void DrainWebhooks();

  struct Impl;

 private:
  explicit GatewayMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
