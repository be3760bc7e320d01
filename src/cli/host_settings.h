// Editing an MCP host's own settings text for `idemgate install`: text in,
// edited text (or an error) out. No I/O: cmd_install.cc finds the files,
// reads them, shows the diff and writes.
//
// A *wrapped* server runs `IDEMGATE mcp [OPTIONS…] -- OLDCOMMAND OLDARGS…`
// instead of `OLDCOMMAND OLDARGS…`; everything else of its entry is kept.
// Unwrapping takes the command and arguments after the first `--` back.
// Servers reached over HTTP (`url`, `httpUrl`) are never wrapped: the edit
// says so in a note. Every edit is idempotent: applied to its own output it
// changes nothing.
//
// JSON (Claude Code, Gemini CLI) is re-serialised with 2-space indentation
// as the hosts write it, keeping key order; a file with comments is refused
// (they would be lost). TOML (Codex) is edited in place: only the values of
// `command` and `args` change, every other byte stays.
//
// Pure functions; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace idem::cli {

enum class InstallAction { kInstall, kUninstall };

// What to do to which servers.
struct ServerEdit {
  InstallAction action = InstallAction::kInstall;
  // Server names to edit; empty: every stdio server in the text. A name the
  // text does not have is an error (kInvalidArgument) that lists the names it has.
  std::vector<std::string> servers;
  // The idemgate binary to run (absolute) and the options that go between
  // `mcp` and `--` (e.g. {"--store", "sqlite:/x.db"}).
  std::string idemgate;
  std::vector<std::string> options;
};

// The prompt hook of a host that sends no turn id.
enum class HookHost {
  kClaudeCode,  // hooks.UserPromptSubmit[] = {"hooks":[{"type":"command","command":…}]}
  kGeminiCli,   // hooks.BeforeAgent[] = {"matcher":"*","hooks":[{"name":"idemgate",…}]}
};

struct HookEdit {
  InstallAction action = InstallAction::kInstall;
  HookHost host = HookHost::kClaudeCode;
  // The shell command line the host runs: `IDEMGATE hook [OPTIONS…]` (HookCommand).
  std::string command;
};

// The edited text. `changed` is false when the text already was as asked
// (then `text` is the input unchanged). `notes` are lines for the user:
// servers skipped and why.
struct EditOutcome {
  std::string text;
  bool changed = false;
  std::vector<std::string> notes;
};

// The settings JSON `text` (an object; empty or whitespace-only text counts as
// `{}`) with the servers of its top-level `mcpServers` wrapped or unwrapped.
// `source` names the file in messages. kInvalidArgument: not JSON (with
// line:column), JSON with comments, not an object, an unknown server name.
Result<EditOutcome> EditJsonServers(std::string_view text, const ServerEdit& edit,
                                    std::string_view source);

// The settings JSON `text` with idemgate's prompt hook added (kept once; an
// idemgate hook with another command line is updated) or removed (only
// idemgate's entries: other hooks stay). Errors as EditJsonServers.
Result<EditOutcome> EditJsonHook(std::string_view text, const HookEdit& edit,
                                 std::string_view source);

// Codex's config.toml `text` with its `[mcp_servers.NAME]` servers wrapped or
// unwrapped in place. kInvalidArgument: not TOML (line:column), an unknown
// server name, a server whose values cannot be spliced safely (an inline
// table without `args`, a command or args that are not a string / an array
// of strings).
Result<EditOutcome> EditTomlServers(std::string_view text, const ServerEdit& edit,
                                    std::string_view source);

// `IDEMGATE hook OPTIONS…` as a shell command line (words quoted where needed).
std::string HookCommand(const std::string& idemgate, const std::vector<std::string>& options);

// The rules both formats share (host_settings.cc).
namespace host_settings {

// True if `command` names an idemgate binary (its basename is `idemgate`, or
// it is `idemgate`), and `args` start with `mcp`: a server already wrapped.
bool IsWrapped(std::string_view command, const std::vector<std::string>& args);
// The index of the original command in a wrapped server's args (the element
// after the first `--`), or npos if there is none.
size_t OriginalCommandIndex(const std::vector<std::string>& args);
// The args of a wrapped server: {"mcp", OPTIONS…, "--", command, args…}.
std::vector<std::string> WrappedArgs(const ServerEdit& edit, std::string_view command,
                                     const std::vector<std::string>& args);
// True if the shell command line runs `idemgate hook` (any path, any options).
bool IsIdemgateHookCommand(std::string_view command);
// "no MCP server named "x" in FILE; it has: a, b" (or "it has none").
std::string UnknownServerMessage(std::string_view name, std::string_view source,
                                 const std::vector<std::string>& known);
// The note for a server reached over HTTP, which install leaves alone.
std::string HttpServerNote(std::string_view name, std::string_view source);

}  // namespace host_settings
}  // namespace idem::cli
