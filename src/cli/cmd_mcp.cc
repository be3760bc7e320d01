// `idemgate mcp`: the MCP proxy (docs/DESIGN.md §6.1). Wiring only: config →
// store → one Ledger for the process → the transports → McpSession.
//
//   idemgate mcp [--store URL] [--config FILE] [-v] -- CMD ARGS…
//
// The agent host starts this instead of CMD. The client side is our own
// stdio; the upstream is CMD as a child process whose stderr is ours. stdout
// carries only MCP messages (logs go to stderr).
//
// The stop (docs/DESIGN.md §6.1): on SIGINT, SIGTERM or SIGHUP, or when the
// client closes stdin, the proxy takes no new tool calls, gives the calls in
// flight [mcp] stop_grace to settle (one still running then is marked
// outcome unknown), stops the child (EOF after the client's EOF; EOF and
// SIGTERM after a signal), writes the audit log, closes the store and exits
// 0. The hosts wait only briefly before they kill their MCP servers, so the
// grace is short and the audit log is written first of all:
//  - Claude Code 2.1.328: SIGINT, SIGTERM 100 ms later, SIGKILL at 500 ms
//    (its stdio cleanup, "Sending SIGINT to MCP server process");
//  - Codex 0.169.0: SIGTERM to the server's process group (ours and the
//    child's), SIGKILL 2 s later (codex-rs/rmcp-client
//    stdio_server_launcher.rs, ProcessGroupGuard, PROCESS_GROUP_TERM_GRACE_PERIOD);
//  - Gemini CLI 0.61.0: SIGTERM (its bundled MCP SDK's StdioClientTransport
//    close() aborts the spawn signal), no SIGKILL;
//  - the MCP TypeScript SDK 2.x StdioClientTransport.close(): EOF, SIGTERM
//    2 s later, SIGKILL 2 s after that.
// docs/hosts.md has the citations. A second signal changes nothing (Claude
// Code's SIGTERM comes inside the grace).
//
// --listen HOST:PORT (Streamable HTTP clients) and --upstream-url URL (a
// Streamable HTTP upstream) use the transports of mcp/http_channels.h.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "front_core.h"
#include "fronts/console/console.h"
#include "idem/key.h"
#include "idem/ledger.h"
#include "listener_flags.h"  // ParsePositiveDuration
#include "stop_signals.h"
#include "fronts/mcp/child_channel.h"
#include "fronts/mcp/host_turn.h"
#include "fronts/mcp/http_channels.h"
#include "fronts/mcp/mcp_session.h"
#include "fronts/mcp/stdio_channel.h"

namespace idem::cli {
namespace {

struct McpFlags {
  std::vector<std::string> command;  // the MCP server to run, after --
  std::string listen;                // --listen HOST:PORT
  std::string upstream_url;          // --upstream-url URL
  std::string read_timeout = "30s";  // --read-timeout, with --listen
  size_t max_sessions = 64;              // --max-sessions, with --listen
  size_t max_sessions_per_tenant = 0;    // --max-sessions-per-tenant, with --listen; 0: none
  std::string session_lifetime = "24h";  // --session-lifetime, with --listen; 0: none
  bool insecure_no_auth = false;
  bool verbose = false;
};

// Writes one log line to stderr (never stdout: it carries MCP messages).
void LogMcp(std::string_view line) { Say("mcp", line); }

// What the proxy says when a stop signal arrives.
std::string StoppingLine(const char* signal, const Config& config) {
  return fmt::format(
      "stopping on {}: no new tool calls; calls in flight have {} ([mcp] stop_grace) to settle",
      signal, FormatDuration(config.mcp.stop_grace));
}

// Prints what idemgate gates once the upstream's tools are known
// (SessionOptions::on_tools_listed), once per distinct list: every session
// of --listen asks the same upstream, and a client may list tools often.
class GatingAnnouncer {
 public:
  void Announce(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + '\n';
    std::lock_guard g(mu_);
    if (text == last_) return;
    last_ = std::move(text);
    for (const std::string& line : lines) LogMcp(line);
  }

 private:
  std::mutex mu_;
  std::string last_;
};

// Makes the upstream of one session: a new child process, or a new session
// with the upstream URL.
using UpstreamFactory = std::function<Result<std::shared_ptr<mcp::Channel>>()>;

mcp::UpstreamDelivery ClassifyHttpDelivery(std::string_view response) {
  std::optional<mcp::DeliveryFailure> failure = mcp::ClassifyDeliveryFailure(response);
  if (!failure) return mcp::UpstreamDelivery::kAnswered;
  return *failure == mcp::DeliveryFailure::kNotSent ? mcp::UpstreamDelivery::kNotSent
                                                    : mcp::UpstreamDelivery::kMaybeSent;
}

// The sessions of an HTTP listener: each client session gets its own
// upstream and McpSession; a janitor thread destroys ended sessions (a
// session may not be destroyed from its own threads).
class HttpSessions {
 public:
  HttpSessions(Ledger& ledger, const Config& config, mcp::SessionOptions base,
               UpstreamFactory make_upstream)
      : ledger_(ledger),
        config_(config),
        base_(std::move(base)),
        make_upstream_(std::move(make_upstream)),
        janitor_([this] { Janitor(); }) {}

  ~HttpSessions() {
    {
      std::lock_guard g(mu_);
      state_ = State::kDestroying;
    }
    cv_.notify_all();
    janitor_.join();
  }

  // HttpSessionFactory: runs on the new client session's thread.
  void Open(std::shared_ptr<mcp::Channel> client, const mcp::HttpSessionInfo& info) {
    {
      std::lock_guard g(mu_);
      if (state_ != State::kServing) {
        client->Close();  // stopping: no new session
        return;
      }
    }
    auto upstream = make_upstream_();
    if (!upstream) {
      LogMcp("cannot open an upstream for a new client session: " + upstream.error().message);
      client->Close();  // refuses the session; its waiting requests get an error
      return;
    }
    auto entry = std::make_shared<Entry>();
    entry->client = std::move(client);
    entry->upstream = std::move(*upstream);
    mcp::SessionOptions options = base_;
    options.tenant = info.tenant;
    options.on_ended = [this] {
      std::lock_guard g(mu_);
      cv_.notify_all();
    };
    entry->session = std::make_unique<mcp::McpSession>(*entry->client, *entry->upstream, ledger_,
                                                       config_, options);
    std::lock_guard g(mu_);
    if (state_ != State::kServing) {
      entry->client->Close();  // StopAll came while the upstream started
      return;
    }
    entries_.push_back(entry);
    // Under mu_, so StopAll never finds a session it cannot stop yet.
    entry->session->Start();
  }

  // Stops every session (McpSession::Stop) and refuses new ones; returns at
  // once (AwaitAllEnded then waits).
  void StopAll() {
    std::lock_guard g(mu_);
    state_ = State::kStopping;
    for (const auto& entry : entries_) entry->session->Stop();
  }

  // Blocks until every session has ended and been destroyed.
  void AwaitAllEnded() {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return entries_.empty(); });
  }

 private:
  struct Entry {
    std::shared_ptr<mcp::Channel> client;
    std::shared_ptr<mcp::Channel> upstream;
    std::unique_ptr<mcp::McpSession> session;
  };

  void Janitor() {
    std::unique_lock g(mu_);
    while (true) {
      std::vector<std::shared_ptr<Entry>> ended;
      for (auto it = entries_.begin(); it != entries_.end();) {
        if ((*it)->session->ended()) {
          ended.push_back(*it);
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      if (!ended.empty()) {
        g.unlock();
        ended.clear();  // session first (Entry member order), then its channels
        g.lock();
        cv_.notify_all();
        continue;
      }
      if (state_ == State::kDestroying && entries_.empty()) return;
      cv_.wait(g);
    }
  }

  Ledger& ledger_;
  const Config& config_;
  const mcp::SessionOptions base_;
  const UpstreamFactory make_upstream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<std::shared_ptr<Entry>> entries_;
  enum class State {
    kServing,     // sessions open as clients come
    kStopping,    // StopAll: sessions stop, no new one opens
    kDestroying,  // the janitor returns once every session is gone
  };
  State state_ = State::kServing;  // under mu_
  std::thread janitor_;
};

// Serves Streamable HTTP clients until a stop signal, with /readyz
// (`probe`) and /metrics (`metrics`) beside /mcp.
int RunHttpListener(const McpFlags& flags, Duration read_timeout, Duration session_lifetime,
                    Ledger& ledger,
                    const Config& config, mcp::SessionOptions options,
                    UpstreamFactory make_upstream, GatewayMetrics& metrics, StoreProbe& probe,
                    const sigset_t& stop_signals) {
  HttpSessions sessions(ledger, config, std::move(options), std::move(make_upstream));
  mcp::HttpServerOptions server_options;
  server_options.listen = flags.listen;
  server_options.max_body_bytes = config.limits.max_body_bytes;
  server_options.max_json_depth = config.limits.max_depth + mcp::kEnvelopeDepth;
  server_options.insecure_no_auth = flags.insecure_no_auth;
  server_options.read_timeout = read_timeout;
  // One tenant must not hold every session (security review F6).
  server_options.max_sessions = flags.max_sessions;
  server_options.max_sessions_per_tenant = flags.max_sessions_per_tenant;
  server_options.session_lifetime = session_lifetime;
  for (const auto* sources : {&config.mcp.turn_id, &config.mcp.session_id, &config.mcp.call_id,
                              &config.mcp.key}) {
    for (const IdSource& source : *sources) {
      if (source.kind == IdSource::Kind::kHeader) server_options.carried_headers.push_back(source.name);
    }
  }
  if (!config.tenants.empty()) {
    server_options.authenticate = [&config](std::string_view token) -> std::optional<std::string> {
      const Tenant* tenant = config.TenantForToken(token);
      if (tenant == nullptr) return std::nullopt;
      return tenant->name;
    };
    server_options.is_admin = [&config](std::string_view token) {
      const Tenant* tenant = config.TenantForToken(token);
      return tenant != nullptr && tenant->admin;
    };
  }
  server_options.ready = [&probe] { return probe.Check(); };
  server_options.metrics = [&metrics] { return metrics.Render(); };
  // /console: the operator console, its page public, its API admin-only.
  console::Console console(ledger, config);
  server_options.public_paths = console::Console::PublicPaths();
  server_options.console = [&console](http::Request request, http::Responder respond) {
    console.Handle(std::move(request), std::move(respond));
  };
  auto server = mcp::HttpMcpServer::Start(
      server_options,
      [&sessions](std::shared_ptr<mcp::Channel> client, const mcp::HttpSessionInfo& info) {
        sessions.Open(std::move(client), info);
      });
  if (!server) return Fail("mcp", server.error());
  const char* signal = WaitForStopSignal(stop_signals);
  // Each session drains (its calls in flight have [mcp] stop_grace) and
  // terminates its upstream; a session that ends closes its client session.
  sessions.StopAll();
  LogMcp(StoppingLine(signal, config));
  ledger.Flush();  // what was already answered is logged now, not in the next batch
  sessions.AwaitAllEnded();
  (*server)->Stop();
  return kExitOk;
}

// One session between our stdio and `upstream`, until the client leaves, a
// stop signal comes, or the upstream goes away.
int RunStdio(Ledger& ledger, const Config& config, const mcp::SessionOptions& options,
             std::shared_ptr<mcp::Channel> upstream, const sigset_t& stop_signals) {
  mcp::StdioOptions stdio;
  stdio.max_message_bytes = config.limits.max_body_bytes;
  mcp::StdioChannel client(stdio);
  mcp::SessionEnd end;
  {
    mcp::McpSession session(client, *upstream, ledger, config, options);
    session.Start();
    StopSignalWatcher watcher(stop_signals, [&](const char* name, bool first) {
      if (!first) {
        LogMcp(fmt::format("{} while stopping: the stop goes on as it began", name));
        return;
      }
      session.Stop();  // returns at once: from now on no call is taken
      LogMcp(StoppingLine(name, config));
      // What was already answered (a replay, say) is logged now, not in the
      // next batch: the host may kill us soon.
      ledger.Flush();
    });
    end = session.Wait();
  }
  if (end.upstream_closed_first) {
    LogMcp(end.upstream_reason + "; the client was told about every request left unanswered");
    return kExitFailure;
  }
  return kExitOk;
}

int RunMcp(const GlobalOptions& globals, const McpFlags& flags) {
  if (flags.command.empty() && flags.upstream_url.empty()) {
    return UsageError("mcp",
                      "give the MCP server to run after --, e.g. `idemgate mcp -- node "
                      "server.js`, or an --upstream-url");
  }
  if (!flags.command.empty() && !flags.upstream_url.empty()) {
    return UsageError("mcp", "give either a command after -- or --upstream-url, not both");
  }
  Result<Duration> read_timeout = ParsePositiveDuration("--read-timeout", flags.read_timeout);
  if (!read_timeout) return UsageError("mcp", read_timeout.error().message);
  Result<Duration> session_lifetime = ParseDuration(flags.session_lifetime);
  if (!session_lifetime) {
    return UsageError("mcp", "--session-lifetime: " + session_lifetime.error().message);
  }

  // A client or child that closes its pipe gives EPIPE, not a dead proxy;
  // children are reaped by their channel.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  // The stop signals are taken by sigwait (--listen) or a StopSignalWatcher
  // (stdio). Blocked before the store and the ledger start their threads
  // (threads inherit the mask), or the kernel may hand one to such a thread
  // and its default action would kill the process with the audit batch
  // unwritten. Children reset their mask (ChildChannel).
  const sigset_t stop_signals = BlockStopSignals();

  Result<Config> config = LoadConfigFor(globals);
  if (!config) return Fail("mcp", config.error());
  // Metrics and the replay alert (docs/DESIGN.md §7). The alert (log line,
  // webhook) works in every mode; the metrics are exposed only by --listen.
  auto core = OpenFrontCore(globals, *config, "mcp", nullptr, LogMcp);
  if (!core) return Fail("mcp", core.error());
  Ledger& ledger = *(*core)->ledger;

  mcp::SessionOptions options;
  options.verbose = flags.verbose;
  options.log = LogMcp;
  options.budget = std::make_shared<mcp::CallBudget>(config->mcp.max_in_flight);
  (*core)->metrics->SetInFlightLimit("mcp", config->mcp.max_in_flight);
  auto announcer = std::make_shared<GatingAnnouncer>();
  options.on_tools_listed = [announcer](const std::vector<std::string>& lines) {
    announcer->Announce(lines);
  };
  // Records are scoped to the upstream (docs/DESIGN.md §3): two servers
  // behind one host, on the default store, never answer from each other's.
  if (config->mcp.scope) {
    options.scope = *config->mcp.scope;
  } else if (!flags.command.empty()) {
    std::string identity;
    for (const std::string& arg : flags.command) identity.append(arg).push_back('\0');
    options.scope = ScopeOfUpstream(identity);
  } else {
    options.scope = ScopeOfUpstream(flags.upstream_url);
  }
  // The environment the env: id sources read, once (docs/hosts.md).
  for (const auto* sources : {&config->mcp.turn_id, &config->mcp.session_id, &config->mcp.call_id,
                              &config->mcp.key}) {
    for (const IdSource& source : *sources) {
      if (source.kind != IdSource::Kind::kEnv) continue;
      if (const char* value = std::getenv(source.name.c_str())) options.env[source.name] = value;
    }
  }
  // The turn file hook:turn reads: the one `idemgate hook` writes for the
  // host that started this proxy (docs/hosts.md, "Prompt hook"). Not with
  // --listen: its clients are not children of this proxy's parent, and the
  // turn of whatever started it would scope every client's calls.
  bool reads_hook = false;
  for (const auto* sources : {&config->mcp.turn_id, &config->mcp.session_id, &config->mcp.call_id,
                              &config->mcp.key}) {
    for (const IdSource& source : *sources) reads_hook |= source.kind == IdSource::Kind::kHook;
  }
  if (reads_hook && !flags.listen.empty()) {
    if (flags.verbose) LogMcp("hook:turn is not read with --listen: its clients are not its host's");
  } else if (reads_hook) {
    if (auto file = mcp::LocateHostTurnFile(config->mcp.hook_dir)) {
      options.hook_turn_file = file->path;
      if (flags.verbose) LogMcp("hook:turn reads " + file->path);
    } else {
      LogMcp("hook:turn is off (turns come from the other sources): " + file.error().message);
    }
  }
  if (flags.verbose) {
    LogMcp("records are scoped to \"" + options.scope + "\"" +
            (config->mcp.scope ? " ([mcp] scope)" : " (this upstream's; [mcp] scope names it)"));
  }

  UpstreamFactory make_upstream;
  if (!flags.command.empty()) {
    make_upstream = [command = flags.command]() -> Result<std::shared_ptr<mcp::Channel>> {
      mcp::ChildOptions child_options;
      child_options.log = LogMcp;
      auto child = mcp::ChildChannel::Spawn(command, child_options);
      if (!child) return std::unexpected(child.error());
      return std::shared_ptr<mcp::Channel>(std::move(*child));
    };
  }
  if (!flags.upstream_url.empty()) {
    options.classify_delivery = ClassifyHttpDelivery;
    make_upstream = [url = flags.upstream_url]() { return mcp::ConnectHttpUpstream(url); };
  }
  if (!flags.listen.empty()) {
    int code = RunHttpListener(flags, *read_timeout, *session_lifetime, ledger, *config, options, make_upstream,
                               *(*core)->metrics, *(*core)->probe, stop_signals);
    ledger.Flush();
    return code;
  }

  auto upstream = make_upstream();
  if (!upstream) return Fail("mcp", upstream.error());
  int code = RunStdio(ledger, *config, options, std::move(*upstream), stop_signals);
  ledger.Flush();
  return code;
}

}  // namespace

void AddMcpCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<McpFlags>();
  CLI::App* cmd = app.add_subcommand(
      "mcp", "Run an MCP server behind idemgate: retried tool calls are answered from the store");
  cmd->footer(
      "In the agent host's config, replace the server command X with `idemgate mcp -- X`:\n"
      "  idemgate mcp -- node server.js\n"
      "  idemgate mcp --config idemgate.toml -- npx -y @modelcontextprotocol/server-filesystem .\n"
      "Tools that are not read-only are gated: a repeated call with the same arguments in the\n"
      "same turn (_meta \"dev.idemgate/turnId\") returns the first call's stored result. stdout\n"
      "carries only MCP messages; the server's stderr and idemgate's logs go to stderr.\n"
      "It stops on SIGINT, SIGTERM, SIGHUP or the end of stdin: calls in flight get\n"
      "[mcp] stop_grace (300ms) to settle, then the server is stopped and the audit log written.\n"
      "Exit status: 0 stopped (stdin closed, or a signal), 1 the server could not be started or\n"
      "went away.");
  cmd->add_option("command", flags->command,
                  "The MCP server to run and its arguments, after -- (stdio transport)");
  cmd->add_option("--listen", flags->listen,
                  "Serve Streamable HTTP clients at http://HOST:PORT/mcp instead of stdio")
      ->option_text("HOST:PORT");
  cmd->add_option("--upstream-url", flags->upstream_url,
                  "Proxy to the Streamable HTTP MCP server at URL instead of a command")
      ->option_text("URL");
  cmd->add_flag("--insecure-no-auth", flags->insecure_no_auth,
                "With --listen: allow a non-loopback address without tenant tokens configured");
  cmd->add_option("--read-timeout", flags->read_timeout,
                  "With --listen: a whole request must arrive within this (idle keep-alive "
                  "included); a slower client is disconnected")
      ->capture_default_str();
  cmd->add_option("--max-sessions", flags->max_sessions,
                  "With --listen: sessions at once; an initialize beyond gets 503")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd->add_option("--max-sessions-per-tenant", flags->max_sessions_per_tenant,
                  "With --listen: sessions one tenant may hold at once (0: only --max-sessions)")
      ->capture_default_str();
  cmd->add_option("--session-lifetime", flags->session_lifetime,
                  "With --listen: a session ends this long after it began, even with a stream "
                  "open; the client starts a new one (0s: never)")
      ->capture_default_str();
  cmd->add_flag("-v,--verbose", flags->verbose, "Log one line per gated tool call on stderr");
  cmd->callback(
      [&cli, flags] { cli.action = [&cli, flags] { return RunMcp(cli.globals, *flags); }; });
}

}  // namespace idem::cli
