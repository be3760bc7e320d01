// What every `idemgate` command shares: the global options, loading the
// config and opening the store in the documented order of precedence, and
// the small formatting helpers for people (tables, ISO-8601 times) and for
// scripts (JSON lines).
//
// Commands register themselves with Add<Family>Commands(app, cli). Parsing
// only records which command was chosen (Cli::action); main() runs it after
// parsing succeeded, so a usage error never half-runs a command.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/config.h"
#include "idem/error.h"
#include "idem/store.h"
#include "idem/store_clock.h"

namespace CLI {
class App;
}

namespace idem::cli {

// Exit codes: 0 success, 1 the command failed (message on stderr), 2 usage.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Options accepted by every command (before or after the command name).
struct GlobalOptions {
  std::string store_url;    // --store; empty: config `store`, else DefaultStoreUrl()
  std::string config_path;  // --config; empty: no file, built-in defaults
};

struct Cli {
  GlobalOptions globals;
  // Set by the chosen command's parse callback; returns the exit code.
  std::function<int()> action;
};

// One per command family (one .cc each).
void AddCanonCommand(CLI::App& app, Cli& cli);
void AddKeyCommand(CLI::App& app, Cli& cli);
void AddRecordCommands(CLI::App& app, Cli& cli);  // inspect, evict, resolve, purge
void AddAuditCommands(CLI::App& app, Cli& cli);   // audit, stats
void AddDemoCommand(CLI::App& app, Cli& cli);     // the quickstart's demo
void AddMcpCommand(CLI::App& app, Cli& cli);      // the MCP proxy
void AddHookCommand(CLI::App& app, Cli& cli);     // the hosts' prompt hook (hook:turn)
void AddServeCommand(CLI::App& app, Cli& cli);    // the ledger API (idemgate serve)
void AddHttpCommand(CLI::App& app, Cli& cli);     // the Idempotency-Key reverse proxy
void AddInstallCommand(CLI::App& app, Cli& cli);  // sets a host up (idemgate install)

// Prints "idemgate <command>: <message>" on stderr: a front's log line.
void Say(std::string_view command, std::string_view message);
// Says it and returns kExitFailure.
int Fail(std::string_view command, std::string_view message);
int Fail(std::string_view command, const Error& error);
// Prints the message and a pointer to --help; returns kExitUsage.
int UsageError(std::string_view command, std::string_view message);

// The config named by --config, or the built-in defaults without one.
Result<Config> LoadConfigFor(const GlobalOptions& globals);
// --store > config `store` > DefaultStoreUrl().
std::string StoreUrlFor(const GlobalOptions& globals, const Config& config);
// The clock this process decides by: the system clock corrected towards the
// store server's (StoreClock), synced by OpenStoreFor. Everything that judges
// a lease or an expiry uses it; the store it was synced to is the one open.
StoreClock& StoreTime();
// The first read of the store's clock, retried this many times with pauses
// of 250 ms doubling (about 4 s in all): long enough for a Redis Cluster
// slot or a PostgreSQL primary to come back from a failover, short enough
// that a store that never answers is reported at once.
inline constexpr int kFirstClockSyncAttempts = 5;
inline constexpr Duration kFirstClockSyncPause{250};
// Opens the store on StoreTime() and syncs that clock to the store's. A store
// whose clock cannot be read (kFirstClockSyncAttempts) is an error, not an
// uncorrected clock: its records might still be read (a Redis Cluster whose
// audit-stream node fails over while the others answer), and leases judged
// by this machine's clock would let a host that runs ahead take over live
// calls (docs/DESIGN.md §4). The error names the URL.
Result<std::unique_ptr<Store>> OpenStoreFor(const GlobalOptions& globals, const Config& config,
                                            const StoreOptions& options = {});

// Everything a store command needs, loaded in order: config, then store.
struct StoreSession {
  Config config;
  std::unique_ptr<Store> store;
};
Result<StoreSession> OpenSession(const GlobalOptions& globals);

// Reads all of stdin as bytes, stopping after `limit` bytes (so a caller can
// tell "too large" without buffering an unbounded stream).
Result<std::string> ReadStdin(size_t limit = SIZE_MAX);
// Reads a file as bytes ("-" is stdin), stopping after `limit` bytes.
Result<std::string> ReadFileBytes(const std::string& path, size_t limit);
// Writes bytes to stdout exactly; kUnavailable if stdout is closed.
Result<void> WriteStdout(std::string_view bytes);

bool StdoutIsTerminal();
bool StdinIsTerminal();
bool StderrIsTerminal();

// "2026-01-01T00:00:00.000Z"; "-" for the epoch (a time never set).
std::string FormatTime(TimePoint t);
// "1h" / "30m" (that long before `now`) or an ISO-8601 time
// ("2026-01-01", "2026-01-01T10:00:00Z", "2026-01-01T10:00:00.5+02:00";
// no zone means UTC). kInvalidArgument otherwise.
Result<TimePoint> ParseSince(std::string_view text, TimePoint now);

// True if `bytes` is well-formed UTF-8.
bool IsValidUtf8(std::string_view bytes);

// Builds one JSON object, in insertion order, for --json output (one object
// per line). Strings that are not valid UTF-8 get U+FFFD for bad bytes so the
// line is always valid JSON.
class JsonObject {
 public:
  JsonObject& Add(std::string_view name, std::string_view value);
  JsonObject& Add(std::string_view name, const char* value) {
    return Add(name, std::string_view(value));
  }
  JsonObject& Add(std::string_view name, int64_t value);
  JsonObject& Add(std::string_view name, uint64_t value);
  JsonObject& Add(std::string_view name, double value);
  JsonObject& Add(std::string_view name, bool value);
  JsonObject& AddNull(std::string_view name);
  std::string str() const { return out_ + "}"; }

 private:
  void Name(std::string_view name);
  std::string out_ = "{";
};

// `text` safe to print on a terminal: control characters (C0, DEL, and the
// C1 controls U+0080..U+009F in UTF-8) written as \xNN, so that a tool name
// or turn id a client chose cannot move the cursor, rewrite earlier lines,
// set the title or write the clipboard (OSC 52) of the operator who runs
// `idemgate audit` or `inspect` (security review F12). Other bytes, UTF-8
// text included, are kept.
std::string ForTerminal(std::string_view text);

// A plain-text table: columns padded to their widest cell, two spaces apart;
// every cell goes through ForTerminal.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) {
    for (std::string& cell : row) cell = ForTerminal(cell);
    rows_.push_back(std::move(row));
  }
  bool empty() const { return rows_.empty(); }
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace idem::cli
