// `idemgate http`: the IETF Idempotency-Key reverse proxy (docs/DESIGN.md §6.2)
// in front of one upstream HTTP API, with the admin endpoints (§6.4) beside
// it. Wiring only: config → store → metrics → one Ledger → net::HttpClient →
// ReverseProxy behind WithAdmin → HttpListener.
//
//   idemgate http --upstream URL [--listen HOST:PORT] [--store URL] [--config FILE]
//                 [--insecure-no-auth] [listener limits…] [-v]
//
// Runs until SIGINT, SIGTERM or SIGHUP (stop_signals.h), then stops
// gracefully: no new connections; requests in flight get their answers and
// their outcomes stored (up to --drain-timeout); buffered audit lines are
// written; exit status 0.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli_common.h"
#include "core/worker_pool.h"
#include "front_core.h"
#include "fronts/console/console.h"
#include "fronts/http_proxy/reverse_proxy.h"
#include "fronts/http_proxy/route_reconcile.h"
#include "fronts/http_proxy/route_summary.h"
#include "idem/ledger.h"
#include "listener_flags.h"
#include "stop_signals.h"
#include "net/http_client.h"
#include "net/cross_site.h"
#include "net/http_listener.h"
#include "net/io_threads.h"

namespace idem::cli {
namespace {

// The listen address when neither --listen nor [listen] address is given.
constexpr char kHttpListen[] = "127.0.0.1:8788";

struct HttpFlags {
  ListenerFlags listener;  // --listen (default kHttpListen), limits, timeouts, --threads
  std::string upstream;    // required
  bool verbose = false;
};

void LogHttp(std::string_view line) { Say("http", line); }

int RunHttp(const GlobalOptions& globals, const HttpFlags& flags) {
  if (flags.upstream.empty()) {
    return UsageError("http", "give the API to put idemgate in front of: --upstream URL");
  }

  // Before any thread starts (BlockStopSignals).
  const sigset_t stop_signals = BlockStopSignals();
  ::signal(SIGPIPE, SIG_IGN);

  Result<Config> config = LoadConfigFor(globals);
  if (!config) return Fail("http", config.error());
  Result<ListenerSetup> setup = ListenerSetupFor(flags.listener, *config, "http", kHttpListen);
  if (!setup) return UsageError("http", setup.error().message);
  if (Result<void> leases = proxy::CheckLeasesOutliveRequests(*config); !leases) {
    return UsageError("http", leases.error().message);
  }
  // What is gated, where each key goes, and the vendors' windows.
  for (const std::string& line : proxy::DescribeRoutes(*config)) LogHttp(line);
  const Duration drain = setup->drain_timeout;

  // One io_context runs the listener, the upstream client and the store's
  // pipelined connection (Redis): a gated request is read, claimed, sent
  // upstream, completed and answered by these threads alone, never handed to
  // a thread of another part (docs/DESIGN.md §6.2). --threads of them.
  net::IoThreads io(setup->options.threads);
  setup->options.io = &io.context();

  net::HttpClientOptions upstream_options;
  upstream_options.url = flags.upstream;
  upstream_options.connect_timeout = config->http.upstream_connect_timeout;
  upstream_options.response_timeout = config->http.upstream_timeout;
  upstream_options.max_idle = config->http.upstream_idle_timeout;
  upstream_options.max_idle_connections = config->http.max_idle_connections;
  upstream_options.max_response_bytes = config->http.max_response_bytes;
  upstream_options.verify_tls = config->http.upstream_verify_tls;
  upstream_options.ca_file = config->http.upstream_ca_file;
  upstream_options.ca_option = "upstream_ca_file";
  Result<std::unique_ptr<net::HttpClient>> upstream =
      net::HttpClient::Create(upstream_options, io.context());
  if (!upstream) {
    if (upstream.error().code == ErrorCode::kInvalidArgument) {
      return UsageError("http", upstream.error().message);
    }
    return Fail("http", upstream.error());
  }

  // Destroyed after everything below and before the client: what uses the
  // io_context goes first, then its threads stop, then the client closes.
  struct StopIo {
    net::IoThreads& io;
    ~StopIo() { io.Stop(); }
  } stop_io{io};

  StoreOptions store_options;
  store_options.io = &io.context();
  auto core =
      OpenFrontCore(globals, *config, "http", /*reconcile=*/nullptr, LogHttp, store_options);
  if (!core) return Fail("http", core.error());
  Ledger& ledger = *(*core)->ledger;
  // A gated request holds its connection until answered, so --max-connections bounds the
  // executions in flight.
  (*core)->metrics->SetInFlightLimit("http", setup->options.max_connections);

  // Blocking ledger work (Begin waits up to policy.wait; store writes) runs
  // here, never on an I/O thread.
  WorkerPool pool;
  proxy::ReverseProxyOptions proxy_options;
  proxy_options.plan.max_key_bytes = config->http.max_key_bytes;
  proxy_options.plan.max_json_depth = config->limits.max_depth;
  proxy_options.plan.max_body_bytes = config->limits.max_body_bytes;
  // With tokens configured, Authorization carries the idemgate token: it is
  // not the upstream's to see.
  proxy_options.forward_authorization = config->tenants.empty();
  proxy_options.verbose = flags.verbose;
  proxy_options.log = LogHttp;
  proxy::ReverseProxy reverse_proxy(ledger, *config, **upstream, pool, proxy_options);

  // /console: the operator console, its page public, its API admin-only.
  console::Console console(ledger, *config);
  for (const std::string& path : console::Console::PublicPaths()) {
    setup->options.public_paths.push_back(path);
  }
  http::AdminEndpoints admin;
  admin.ready = [&core] { return (*core)->probe->Check(); };
  admin.metrics = [&core] { return (*core)->metrics->Render(); };
  admin.log = LogHttp;
  // The console shares its origin with what the upstream answers: those
  // answers are sandboxed for browsers (docs/DESIGN.md §8, F8).
  auto listener = http::HttpListener::Start(
      setup->options,
      http::WithAdmin(admin, console.Wrap(http::SandboxAnswers(reverse_proxy.AsHandler()))));
  if (!listener) {
    if (listener.error().code == ErrorCode::kInvalidArgument) {
      return UsageError("http", listener.error().message);
    }
    return Fail("http", listener.error());
  }
  LogHttp(fmt::format("proxying to {}", flags.upstream));

  LogHttp(fmt::format("stopping on {}: finishing requests in flight (up to {})",
                      WaitForStopSignal(stop_signals), FormatDuration(drain)));
  if (!(*listener)->Drain(drain) || !reverse_proxy.Drain(drain)) {
    LogHttp(
        "some requests were still running after --drain-timeout; their answers are dropped "
        "and their records settle as their leases run out");
  }
  (*listener)->Stop();   // no more requests
  (*upstream)->Abort();  // exchanges still in flight end (maybe sent), none starts again
  // Their outcomes settle through the store (within its timeouts) while the
  // I/O threads still run; nothing may call into the proxy once it is gone.
  if (!reverse_proxy.Drain(drain)) LogHttp("some requests had not settled when stopping");
  pool.Shutdown();  // every store write already begun finishes
  ledger.Flush();   // and the audit log is written
  return kExitOk;
}

}  // namespace

void AddHttpCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<HttpFlags>();
  CLI::App* cmd = app.add_subcommand(
      "http",
      "Put idemgate in front of an HTTP API: retried POST/PATCH requests (Idempotency-Key "
      "or turn header) are answered from the store");
  cmd->footer(
      "Point the agent's HTTP tool client at idemgate instead of the API:\n"
      "  idemgate http --upstream https://api.vendor.example --listen 127.0.0.1:8788\n"
      "A request with an Idempotency-Key header (or the turn header, Idemgate-Turn-Id) runs once;\n"
      "retries get the stored answer with Idempotent-Replayed: true. Routes, key modes and\n"
      "upstream TLS/timeouts are set in the config ([[route]], [http]). With [[tenant]] tokens\n"
      "every request needs Authorization: Bearer TOKEN; without, it listens on loopback only\n"
      "unless --insecure-no-auth. /healthz, /readyz and /metrics are served beside the API.\n"
      "Stops gracefully on SIGINT/SIGTERM.");
  cmd->add_option("--upstream", flags->upstream,
                  "The API to proxy: http(s)://HOST[:PORT][/PATH] (required)")
      ->option_text("URL");
  AddListenerFlags(cmd, flags->listener, kHttpListen);  // --threads: the upstream's too
  cmd->add_flag("-v,--verbose", flags->verbose, "Log one line per gated request on stderr");
  cmd->callback(
      [&cli, flags] { cli.action = [&cli, flags] { return RunHttp(cli.globals, *flags); }; });
}

}  // namespace idem::cli
