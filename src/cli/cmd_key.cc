// `idemgate key`: the key a call would get (docs/DESIGN.md §3), without touching a
// store. Reads the config only when --config is given and --mode is not.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "idem/canonical_json.h"
#include "idem/key.h"

namespace idem::cli {
namespace {

struct KeyFlags {
  std::string turn;
  std::string tool;
  std::string mode;  // empty: from --config, else "turn"
  std::vector<std::string> fields;
  std::string key;
  std::string scope;  // empty: unscoped
  std::optional<std::string> args;
  bool verbose = false;
  bool json = false;
};

// The arguments JSON: --args, else stdin. With an explicit --key the
// arguments are optional (the key wins); they still give the fingerprint
// stored for drift detection.
Result<std::optional<std::string>> ReadArguments(const KeyFlags& flags, size_t max_bytes) {
  if (flags.args) return std::optional<std::string>(*flags.args);
  if (!flags.key.empty() && StdinIsTerminal()) return std::optional<std::string>();
  if (StdinIsTerminal()) {
    std::fputs("idemgate key: reading the arguments JSON from stdin (end with Ctrl-D)\n", stderr);
  }
  Result<std::string> input = ReadStdin(max_bytes + 1);
  if (!input) return std::unexpected(input.error());
  if (input->size() > max_bytes) {
    return MakeError(ErrorCode::kResourceExhausted, "the arguments are larger than the limit of " +
                                                        std::to_string(max_bytes) +
                                                        " bytes ([limits] max_body_bytes)");
  }
  if (!flags.key.empty() && input->empty()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(*input));
}

int RunKey(const GlobalOptions& globals, const KeyFlags& flags) {
  KeyInput input;
  input.turn = flags.turn;
  input.tool = flags.tool;
  std::vector<std::string> fields = flags.fields;
  CanonOptions canon;

  if (!flags.mode.empty()) {
    Result<KeyMode> mode = ParseKeyMode(flags.mode);
    if (!mode) {
      return UsageError("key", "--mode must be one of turn, args, fields, explicit, off; got \"" +
                                   flags.mode + "\"");
    }
    input.mode = *mode;
  } else if (!globals.config_path.empty()) {
    // The mode the config gives this tool, as a gated (mutating) tool.
    Result<Config> config = LoadConfigFor(globals);
    if (!config) return Fail("key", config.error());
    input.mode = config->ModeFor(flags.tool, /*mutating=*/true);
    if (const ToolRule* rule = config->RuleFor(flags.tool); rule && fields.empty()) {
      fields = rule->fields;
    }
    canon.max_bytes = config->limits.max_body_bytes;
    canon.max_depth = config->limits.max_depth;
  }
  if (input.mode == KeyMode::kOff) {
    return Fail("key", "tool \"" + flags.tool +
                           "\" is not gated (mode off): its calls pass through without a key");
  }
  if (input.mode == KeyMode::kFields && fields.empty()) {
    return UsageError("key",
                      "mode fields needs --fields /pointer[,/pointer...], e.g. --fields /email");
  }
  if (input.mode != KeyMode::kFields && !flags.fields.empty()) {
    return UsageError("key", "--fields is used only with --mode fields");
  }
  if (input.mode == KeyMode::kExplicit && flags.key.empty()) {
    return UsageError("key", "mode explicit takes only a caller-sent key: give --key KEY");
  }
  if (!flags.key.empty()) input.explicit_key = flags.key;

  Result<std::optional<std::string>> args = ReadArguments(flags, canon.max_bytes);
  if (!args) return Fail("key", args.error());
  std::string fingerprint;  // of the full arguments (drift is judged on it)
  if (*args) {
    Result<std::string> fp = Fingerprint(**args, canon);
    if (!fp) return Fail("key", "the arguments are not valid I-JSON: " + fp.error().message);
    fingerprint = *fp;
    if (input.mode == KeyMode::kFields) {
      Result<std::string> selected = FingerprintFields(**args, fields, canon);
      if (!selected) return Fail("key", selected.error());
      input.fingerprint = *selected;
    } else {
      input.fingerprint = fingerprint;
    }
  }

  Result<DerivedKey> derived = DeriveKey(input);
  if (!derived) return Fail("key", derived.error());
  if (!flags.scope.empty()) {
    if (Result<void> ok = ValidateScope(flags.scope); !ok) return UsageError("key", ok.error().message);
    derived->key = ScopedKey(flags.scope, derived->key);
  }

  std::string out;
  if (flags.json) {
    JsonObject o;
    o.Add("key", derived->key).Add("mode", KeyModeName(derived->mode));
    if (fingerprint.empty()) {
      o.AddNull("fingerprint");
    } else {
      o.Add("fingerprint", fingerprint);
    }
    if (input.mode == KeyMode::kFields) o.Add("fields_fingerprint", input.fingerprint);
    o.Add("turn_fallback", derived->turn_fallback);
    out = o.str() + "\n";
  } else if (flags.verbose) {
    out = fmt::format("key            {}\nmode           {}\nfingerprint    {}\n", derived->key,
                      KeyModeName(derived->mode), fingerprint.empty() ? "-" : fingerprint);
    if (input.mode == KeyMode::kFields) {
      out += fmt::format("fields fp      {}\n", input.fingerprint);
    }
    out += fmt::format("turn_fallback  {}\n", derived->turn_fallback ? "true" : "false");
    if (derived->turn_fallback) {
      out +=
          "note: no --turn in turn mode: the key falls back to args mode and the record is kept "
          "for the shorter `window`\n";
    }
  } else {
    out = derived->key + "\n";
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("key", w.error());
  return kExitOk;
}

}  // namespace

void AddKeyCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<KeyFlags>();
  CLI::App* cmd = app.add_subcommand("key", "Print the idempotency key a call would get");
  cmd->footer(
      "Reads the call's arguments (JSON) on stdin unless --args is given. With --config and\n"
      "no --mode, uses the mode and fields of the first [[tool]] rule that matches --tool.\n"
      "Example: echo '{\"title\":\"x\"}' | idemgate key --turn t-1 --tool create_ticket -v");
  cmd->add_option("--turn", flags->turn,
                  "Turn id (turn mode); without one, turn mode falls back to args mode");
  cmd->add_option("--tool", flags->tool, "Tool name (or \"METHOD /path\" for the HTTP front)")
      ->required();
  cmd->add_option("--mode", flags->mode, "Key mode: turn (default), args, fields, explicit, off");
  cmd->add_option("--fields", flags->fields,
                  "JSON Pointers for mode fields, comma-separated (/email,/org/id)")
      ->delimiter(',');
  cmd->add_option("--key", flags->key, "A caller-sent key: always wins (explicit mode)");
  cmd->add_option("--args", flags->args, "The arguments JSON (instead of stdin)");
  cmd->add_option("--scope", flags->scope,
                  "The record key within this scope (an `idemgate mcp` proxy's records are "
                  "scoped to its upstream: `mcp --verbose` prints the scope, [mcp] scope sets it)");
  cmd->add_flag("-v,--verbose", flags->verbose, "Also print mode, fingerprint and turn fallback");
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->callback(
      [&cli, flags] { cli.action = [&cli, flags] { return RunKey(cli.globals, *flags); }; });
}

}  // namespace idem::cli
