// `idemgate hook`: the agent host's prompt hook (docs/hosts.md, "Prompt
// hook"). Claude Code runs it on UserPromptSubmit, Gemini CLI on
// BeforeAgent; it records a new turn for the host process that ran it, where
// the `idemgate mcp` proxies that host started read it (hook:turn).
//
//   idemgate hook [--config FILE]     (the host's JSON on stdin)
//
// It must never hurt the user: a host puts a hook's stdout into the model's
// context and blocks the prompt when the hook fails. So it always exits 0,
// prints nothing on stdout, and says what went wrong in one stderr line.
// It opens no store (--store is accepted like every command's, and unused):
// the turn is machine-local state, kept in a file (fronts/mcp/host_turn.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "fronts/mcp/host_turn.h"

namespace idem::cli {
namespace {

struct HookFlags {
  std::vector<std::string> extras;  // arguments it does not know, ignored
};

// Stdin's first `limit` bytes; the rest is read and thrown away, so that a
// host writing a long prompt never blocks on a full pipe. `cut` says if
// anything was thrown away.
std::string ReadBoundedStdin(size_t limit, bool& cut) {
  std::string text;
  cut = false;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const size_t keep = std::min(static_cast<size_t>(n), limit - text.size());
    text.append(buf, keep);
    if (keep < static_cast<size_t>(n)) cut = true;
  }
  return text;
}

int RunHook(const GlobalOptions& globals, const HookFlags& flags) {
  std::vector<std::string> problems;  // said in one line at the end
  if (!flags.extras.empty()) {
    std::string args;
    for (const std::string& a : flags.extras) args += (args.empty() ? "" : " ") + a;
    problems.push_back("ignored arguments it does not know: " + args);
  }
  Config config;
  if (Result<Config> loaded = LoadConfigFor(globals)) {
    config = std::move(*loaded);
  } else {
    problems.push_back(loaded.error().message + " (using the defaults)");
  }

  std::string input;
  bool cut = false;
  if (StdinIsTerminal()) {
    problems.push_back("reads the host's JSON on stdin; a host runs it (docs/hosts.md)");
  } else {
    input = ReadBoundedStdin(config.mcp.hook_max_input_bytes, cut);
  }
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const std::string random = mcp::RandomTurnHex();
  Result<mcp::HookTurn> turn = mcp::TurnFromHookInput(input, now_ms, random);
  if (!turn) {
    // The host ran the hook, so a prompt began: a new turn without a
    // session beats keeping the last prompt's turn, which would replay this
    // prompt's deliberate repeats of its calls.
    problems.push_back(
        (cut ? "stdin is longer than " + std::to_string(config.mcp.hook_max_input_bytes) +
                   " bytes ([mcp] hook_max_input_bytes) and its JSON is cut"
             : turn.error().message) +
        "; recorded a new turn without a session");
    turn = mcp::HookTurn{"unknown", "", "/" + random, now_ms};
  }

  if (Result<mcp::HostTurnFile> file = mcp::LocateHostTurnFile(config.mcp.hook_dir); !file) {
    problems.push_back("no turn recorded: " + file.error().message);
  } else {
    if (auto written = mcp::WriteTurnFile(file->dir, file->identity, *turn); !written) {
      problems.push_back("no turn recorded: " + written.error().message);
    }
    mcp::RemoveStaleTurnFiles(file->dir);
  }

  if (!problems.empty()) {
    std::string line;
    for (const std::string& p : problems) line += (line.empty() ? "" : "; ") + p;
    Say("hook", line);
  }
  return kExitOk;  // whatever happened: a failing hook blocks the user's prompt
}

}  // namespace

void AddHookCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<HookFlags>();
  CLI::App* cmd = app.add_subcommand(
      "hook", "Record a new turn on each user prompt: the prompt hook of Claude Code and Gemini CLI");
  cmd->footer(
      "An agent host runs it on every user prompt, with its JSON on stdin: Claude Code's\n"
      "UserPromptSubmit hook, Gemini CLI's BeforeAgent hook (told apart by hook_event_name).\n"
      "It records the prompt's turn for the host process that ran it, in\n"
      "$XDG_RUNTIME_DIR/idemgate/turn-PID-STARTTIME.json (else /tmp/idemgate-UID; [mcp] hook_dir),\n"
      "and the `idemgate mcp` proxies that host started scope gated calls by it (turn source\n"
      "\"hook:turn\", in the default [mcp] turn_id): a retry in the prompt replays, the same call\n"
      "in the next prompt runs again. Claude Code, in .claude/settings.json:\n"
      "  {\"hooks\": {\"UserPromptSubmit\": [{\"hooks\": [{\"type\": \"command\",\n"
      "                                   \"command\": \"idemgate hook\"}]}]}}\n"
      "Gemini CLI, in .gemini/settings.json:\n"
      "  {\"hooks\": {\"BeforeAgent\": [{\"hooks\": [{\"name\": \"idemgate\", \"type\": \"command\",\n"
      "                              \"command\": \"idemgate hook\"}]}]}}\n"
      "It never blocks a prompt: it prints nothing on stdout and exits 0 whatever happens; a\n"
      "problem (stdin that is not the host's JSON, a directory it may not use) is one line on\n"
      "stderr starting with \"idemgate hook: \". It opens no store. Exit status: always 0.");
  // An argument it does not know must not fail the prompt: kept as an extra
  // (and named on stderr) instead of a usage error. So it takes --config and
  // --store itself rather than falling through to the global ones, which
  // would refuse what they do not know.
  cmd->fallthrough(false);
  cmd->allow_extras();
  cmd->add_option("--config", cli.globals.config_path,
                  "Config file (idemgate.toml): [mcp] hook_dir, hook_max_input_bytes");
  cmd->add_option("--store", cli.globals.store_url, "Accepted like every command's; not opened");
  cmd->callback([&cli, flags, cmd] {
    flags->extras = cmd->remaining();
    cli.action = [&cli, flags] { return RunHook(cli.globals, *flags); };
  });
}

}  // namespace idem::cli
