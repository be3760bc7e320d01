// `idemgate serve`: the ledger API (docs/DESIGN.md §6.3) and the admin endpoints
// (§6.4) on one HTTP listener. Wiring only: config → store → metrics → one
// Ledger → LedgerApi behind WithAdmin → HttpListener.
//
//   idemgate serve [--listen HOST:PORT] [--store URL] [--config FILE] [--insecure-no-auth]
//
// Runs until SIGINT, SIGTERM or SIGHUP (stop_signals.h), then stops
// gracefully: no new connections, requests in flight get their answers (up
// to --drain-timeout), buffered audit lines are written; exit status 0.
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
#include "fronts/ledger_api/ledger_api.h"
#include "idem/ledger.h"
#include "listener_flags.h"
#include "stop_signals.h"
#include "net/cross_site.h"
#include "net/http_listener.h"
#include "net/io_threads.h"

namespace idem::cli {
namespace {

// The listen address when neither --listen nor [listen] address is given.
constexpr char kServeListen[] = "127.0.0.1:8787";

void LogServe(std::string_view line) { Say("serve", line); }

int RunServe(const GlobalOptions& globals, const ListenerFlags& flags) {
  // Before any thread starts (BlockStopSignals).
  const sigset_t stop_signals = BlockStopSignals();
  ::signal(SIGPIPE, SIG_IGN);

  Result<Config> config = LoadConfigFor(globals);
  if (!config) return Fail("serve", config.error());
  Result<ListenerSetup> setup = ListenerSetupFor(flags, *config, "serve", kServeListen);
  if (!setup) return UsageError("serve", setup.error().message);

  // One io_context runs the listener and the store's pipelined connection
  // (Redis): a begin or a complete is read, written to the store and answered
  // by these threads alone (docs/DESIGN.md §6.3). Declared before the
  // store, which closes through it.
  net::IoThreads io(setup->options.threads);
  setup->options.io = &io.context();
  StoreOptions store_options;
  store_options.io = &io.context();
  auto core = OpenFrontCore(globals, *config, "serve", nullptr, LogServe, store_options);
  if (!core) return Fail("serve", core.error());
  Ledger& ledger = *(*core)->ledger;

  // Blocking ledger work (Begin waits up to policy.wait) runs here, never on
  // an I/O thread. At most one task per connection (max_connections).
  WorkerPool pool;
  http::LedgerApi api(ledger, *config, pool);
  // /console: the operator console, its page public, its API admin-only.
  console::Console console(ledger, *config);
  for (const std::string& path : console::Console::PublicPaths()) {
    setup->options.public_paths.push_back(path);
  }
  http::AdminEndpoints admin;
  admin.ready = [&core] { return (*core)->probe->Check(); };
  admin.metrics = [&core] { return (*core)->metrics->Render(); };
  admin.log = LogServe;
  // The ledger API refuses what a browser sends for another site: without
  // tokens every caller is admin (docs/DESIGN.md §8, F7).
  auto listener = http::HttpListener::Start(
      setup->options,
      http::WithAdmin(admin, console.Wrap(http::RefuseCrossSite(api.handler()))));
  if (!listener) {
    if (listener.error().code == ErrorCode::kInvalidArgument) {
      return UsageError("serve", listener.error().message);
    }
    return Fail("serve", listener.error());
  }

  LogServe(fmt::format("stopping on {}: finishing requests in flight (up to {})",
                      WaitForStopSignal(stop_signals), FormatDuration(setup->drain_timeout)));
  if (!(*listener)->Drain(setup->drain_timeout)) {
    LogServe("some requests were still running after --drain-timeout; their answers are dropped");
  }
  pool.Shutdown();      // every request already begun finishes its store work
  (*listener)->Stop();  // then the I/O threads go
  ledger.Flush();       // and the audit log is written
  return kExitOk;
}

}  // namespace

void AddServeCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<ListenerFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve the ledger API (begin/complete over HTTP/JSON) and /healthz, /readyz, /metrics");
  cmd->footer(
      "For agent runtimes that run tools in-process: POST /v1/calls/begin before the side\n"
      "effect, /v1/calls/complete after it; a retry replays the stored outcome.\n"
      "  idemgate serve --listen 127.0.0.1:8787 --store redis://127.0.0.1:6379/0\n"
      "With [[tenant]] tokens in the config every request needs Authorization: Bearer TOKEN\n"
      "and records are kept per tenant; without, it listens on loopback only unless\n"
      "--insecure-no-auth. Stops gracefully on SIGINT/SIGTERM.");
  AddListenerFlags(cmd, *flags, kServeListen);
  cmd->callback(
      [&cli, flags] { cli.action = [&cli, flags] { return RunServe(cli.globals, *flags); }; });
}

}  // namespace idem::cli
