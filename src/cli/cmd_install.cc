// `idemgate install HOST`: puts `idemgate mcp --` in front of a host's stdio
// MCP servers and adds the prompt hook, by editing the host's own settings
// files (docs/hosts.md, "Installing"). Finds the files, reads them, runs the
// pure edits of host_settings.h, shows the diff, then writes; any bad input
// stops it before a single file is written.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "host_settings.h"
#include "settings_file.h"
#include "unified_diff.h"

namespace idem::cli {
namespace {

namespace fs = std::filesystem;

// Settings files past this are not settings files (a corrupt or wrong path).
constexpr size_t kMaxSettingsBytes = 64 << 20;

struct InstallFlags {
  std::string host;
  std::string scope = "user";
  std::string project;
  std::vector<std::string> servers;
  std::string mcp_config;
  bool uninstall = false;
  bool dry_run = false;
};

enum class Format { kJsonServers, kJsonHook, kTomlServers };

// One file and the edits it gets, in order.
struct FilePlan {
  std::string path;
  std::vector<Format> edits;
};

struct HostPlan {
  std::vector<FilePlan> files;
  std::vector<std::string> notes;  // said once, after the diffs
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void Add(HostPlan& plan, const std::string& path, Format format) {
  for (FilePlan& f : plan.files) {
    if (f.path == path) {
      f.edits.push_back(format);
      return;
    }
  }
  plan.files.push_back({path, {format}});
}

// The files of each host, as the hosts' own code finds them (docs/hosts-evidence.md).
Result<HostPlan> PlanFiles(const InstallFlags& flags) {
  HostPlan plan;
  bool project = flags.scope == "project";
  std::string dir = flags.project.empty() ? fs::current_path().string()
                                          : fs::absolute(flags.project).lexically_normal().string();
  std::string home = Env("HOME");
  if (!project && home.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "HOME is not set, so the user's settings cannot be found; set it or use "
                     "--scope project");
  }
  if (flags.host == "claude-code") {
    // CLAUDE_CONFIG_DIR moves ~/.claude and ~/.claude.json alike.
    std::string config_dir = Env("CLAUDE_CONFIG_DIR");
    std::string settings_dir = config_dir.empty() ? home + "/.claude" : config_dir;
    std::string servers;
    if (!flags.mcp_config.empty()) {
      servers = fs::absolute(flags.mcp_config).lexically_normal().string();
    } else if (project) {
      servers = dir + "/.mcp.json";
      plan.notes.push_back(
          "Claude Code starts the servers of " + servers +
          " once you approve them (it asks when it starts in " + dir +
          "; `claude mcp list` shows \"Pending approval\" until then)");
    } else {
      // An older install keeps the user's state in ~/.claude/.config.json;
      // Claude Code reads that one while it has content.
      std::string legacy = settings_dir + "/.config.json";
      std::error_code ec;
      bool legacy_used = fs::is_regular_file(legacy, ec) && fs::file_size(legacy, ec) > 0;
      servers = legacy_used ? legacy : (config_dir.empty() ? home : config_dir) + "/.claude.json";
    }
    Add(plan, servers, Format::kJsonServers);
    Add(plan, (project ? dir + "/.claude" : settings_dir) + "/settings.json", Format::kJsonHook);
  } else if (flags.host == "gemini-cli") {
    std::string base = Env("GEMINI_CLI_HOME").empty() ? home : Env("GEMINI_CLI_HOME");
    std::string path = (project ? dir : base) + "/.gemini/settings.json";
    Add(plan, path, Format::kJsonServers);
    Add(plan, path, Format::kJsonHook);
    if (project) {
      plan.notes.push_back("Gemini CLI reads " + path +
                           " only in a trusted folder (it asks; or `/permissions`)");
    }
  } else {
    std::string codex_home = Env("CODEX_HOME").empty() ? home + "/.codex" : Env("CODEX_HOME");
    std::string path = (project ? dir + "/.codex" : codex_home) + "/config.toml";
    Add(plan, path, Format::kTomlServers);
    if (project) {
      plan.notes.push_back("Codex reads " + path + " only when " + dir +
                           " is a trusted project ([projects.\"" + dir +
                           "\"] trust_level = \"trusted\" in " + codex_home + "/config.toml)");
    }
  }
  return plan;
}

// `--store`/`--config` for the commands the host runs: from another working
// directory, so relative paths are made absolute.
Result<std::vector<std::string>> PassedOptions(const GlobalOptions& globals) {
  std::vector<std::string> options;
  if (!globals.store_url.empty()) {
    std::string url = globals.store_url;
    if (url.starts_with("sqlite:") && url.size() > 7 && url[7] != '/') {
      url = "sqlite:" + fs::absolute(url.substr(7)).lexically_normal().string();
    }
    options.insert(options.end(), {"--store", url});
  }
  if (!globals.config_path.empty()) {
    // A config the proxy would refuse is refused now, not at the host's next start.
    Result<Config> config = LoadConfigFor(globals);
    if (!config) return std::unexpected(config.error());
    options.insert(options.end(),
                   {"--config", fs::absolute(globals.config_path).lexically_normal().string()});
  }
  return options;
}

std::string SelfPath() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "idemgate" : self.string();
}

int RunInstall(const GlobalOptions& globals, const InstallFlags& flags) {
  constexpr std::string_view kCommand = "install";
  if (flags.host != "claude-code" && flags.host != "gemini-cli" && flags.host != "codex") {
    return UsageError(kCommand, "unknown host \"" + flags.host +
                                    "\"; the hosts are claude-code, gemini-cli and codex");
  }
  if (!flags.mcp_config.empty() && flags.host != "claude-code") {
    return UsageError(kCommand, "--mcp-config is for claude-code (the file of `claude "
                                "--mcp-config FILE`); " + flags.host + " has no such file");
  }
  Result<std::vector<std::string>> options = PassedOptions(globals);
  if (!options) return UsageError(kCommand, options.error().message);
  Result<HostPlan> plan = PlanFiles(flags);
  if (!plan) return UsageError(kCommand, plan.error().message);

  const InstallAction action =
      flags.uninstall ? InstallAction::kUninstall : InstallAction::kInstall;
  ServerEdit server_edit{action, flags.servers, SelfPath(), *options};
  HookEdit hook_edit{action,
                     flags.host == "gemini-cli" ? HookHost::kGeminiCli : HookHost::kClaudeCode,
                     HookCommand(server_edit.idemgate, *options)};

  // Everything is read and edited before anything is written.
  struct Edited {
    SettingsFile file;
    std::string text;
    bool changed = false;
  };
  std::vector<Edited> edited;
  std::vector<std::string> notes;
  for (const FilePlan& f : plan->files) {
    Result<SettingsFile> file = ReadSettingsFile(f.path, kMaxSettingsBytes);
    if (!file) return UsageError(kCommand, file.error().message);
    Edited e{*file, file->bytes, false};
    for (Format format : f.edits) {
      Result<EditOutcome> out =
          format == Format::kJsonServers  ? EditJsonServers(e.text, server_edit, f.path)
          : format == Format::kJsonHook   ? EditJsonHook(e.text, hook_edit, f.path)
                                          : EditTomlServers(e.text, server_edit, f.path);
      if (!out) {
        return UsageError(kCommand, out.error().message + "; no file was changed");
      }
      e.text = std::move(out->text);
      e.changed = e.changed || out->changed;
      notes.insert(notes.end(), out->notes.begin(), out->notes.end());
    }
    e.changed = e.changed && e.text != file->bytes;
    edited.push_back(std::move(e));
  }

  std::string shown;
  for (const Edited& e : edited) {
    if (!e.changed) {
      shown += e.file.path + ": already set up, nothing to change\n";
      continue;
    }
    shown += UnifiedDiff(e.file.bytes, e.text, e.file.exists ? e.file.path : "/dev/null",
                         e.file.path);
  }
  for (const std::string& note : notes) shown += "note: " + note + "\n";
  if (!flags.uninstall) {
    for (const std::string& note : plan->notes) shown += "note: " + note + "\n";
  }
  if (flags.dry_run) shown += "(--dry-run: no file was written)\n";
  if (Result<void> w = WriteStdout(shown); !w) return Fail(kCommand, w.error());
  if (flags.dry_run) return kExitOk;

  const bool project = flags.scope == "project";
  for (const Edited& e : edited) {
    if (!e.changed) continue;
    Result<void> written =
        ReplaceSettingsFile(e.file, e.text, project ? 0644 : 0600, project ? 0755 : 0700);
    if (!written) return Fail(kCommand, written.error());
  }
  return kExitOk;
}

}  // namespace

void AddInstallCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<InstallFlags>();
  CLI::App* cmd = app.add_subcommand(
      "install", "Put idemgate in front of an agent host's MCP servers, and add its prompt hook");
  cmd->footer(
      "Edits the host's own settings files in place:\n"
      "  claude-code  ~/.claude.json mcpServers (--scope project: .mcp.json; --mcp-config\n"
      "               FILE: that file) and the UserPromptSubmit hook in ~/.claude/settings.json\n"
      "               (project: .claude/settings.json)\n"
      "  gemini-cli   ~/.gemini/settings.json (project: .gemini/settings.json): mcpServers and\n"
      "               the BeforeAgent hook\n"
      "  codex        $CODEX_HOME/config.toml, default ~/.codex/config.toml (project:\n"
      "               .codex/config.toml): [mcp_servers.NAME]; no hook, Codex sends turn ids\n"
      "Each stdio server's command becomes `idemgate mcp [--store URL] [--config FILE] --\n"
      "COMMAND ARGS...` (the absolute path of this binary); the hook runs `idemgate hook` on every\n"
      "prompt so that a deliberate repeat in a new prompt runs again. HTTP servers are left as\n"
      "they are. Everything else in the files stays: JSON is rewritten with 2-space indentation\n"
      "in the same key order, TOML is edited in place, comments included. Prints a unified\n"
      "diff of each file; running it again changes nothing; --uninstall undoes it.\n"
      "Exit status: 0 done (or nothing to do), 1 a file could not be written, 2 bad input\n"
      "(unknown host or server, a file that is not valid JSON/TOML): then no file is changed.");
  cmd->add_option("host", flags->host, "claude-code, gemini-cli or codex")->required();
  cmd->add_option("--scope", flags->scope,
                  "user: the user's settings; project: the project's (see --project)")
      ->check(CLI::IsMember({"user", "project"}))
      ->capture_default_str();
  cmd->add_option("--project", flags->project,
                  "The project directory for --scope project (default: the current directory)")
      ->option_text("DIR");
  cmd->add_option("--server", flags->servers,
                  "Only this MCP server (repeatable; default: every stdio server in the file)")
      ->option_text("NAME");
  cmd->add_option("--mcp-config", flags->mcp_config,
                  "claude-code: the servers are in FILE (the file of `claude --mcp-config FILE`)")
      ->option_text("FILE");
  cmd->add_flag("--uninstall", flags->uninstall,
                "Unwrap the servers and remove idemgate's hook (other hooks stay)");
  cmd->add_flag("--dry-run", flags->dry_run, "Show the change, write nothing");
  cmd->callback([&cli, flags] {
    cli.action = [&cli, flags] { return RunInstall(cli.globals, *flags); };
  });
}

}  // namespace idem::cli
