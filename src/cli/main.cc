// idemgate: flags and wiring only. Each command family registers itself
// (cmd_*.cc); parsing records the chosen command and main() runs it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "core/fault_point.h"

int main(int argc, char** argv) {
#ifdef IDEM_FAULT_POINTS
  // The test build's binary (CMake IDEM_FAULT_POINTS); the packaged one,
  // linked from the same objects, leaves them unarmed (src/cli/CMakeLists.txt).
  idem::ArmFaultPoints();
#endif
  using namespace idem::cli;
  Cli cli;
  CLI::App app{
      "idemgate makes AI-agent tool calls safe to retry: a retried call is answered with the "
      "stored outcome of the first instead of being executed again.",
      "idemgate"};
  app.set_version_flag("--version", "idemgate " IDEM_VERSION);
  app.require_subcommand(1);
  // Global options are accepted after the command name too:
  // `idemgate inspect KEY --store sqlite:x.db`.
  app.fallthrough();
  app.add_option("--store", cli.globals.store_url,
                 "Store URL: sqlite:PATH, redis://HOST:PORT[/DB], rediss:// (TLS), "
                 "redis+cluster://HOST:PORT,..., postgres://USER@HOST/DB, memory:; default: the "
                 "config's `store`, else sqlite: in $XDG_STATE_HOME/idemgate "
                 "(~/.local/state/idemgate)");
  app.add_option("--config", cli.globals.config_path,
                 "Config file (idemgate.toml); default: none, built-in defaults");

  AddCanonCommand(app, cli);
  AddKeyCommand(app, cli);
  AddRecordCommands(app, cli);
  AddAuditCommands(app, cli);
  AddDemoCommand(app, cli);
  AddMcpCommand(app, cli);
  AddHookCommand(app, cli);
  AddServeCommand(app, cli);
  AddHttpCommand(app, cli);
  AddInstallCommand(app, cli);
  // Each command's --help also names the options every command takes.
  for (CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; })) {
    std::string footer = cmd->get_footer();
    if (!footer.empty()) footer += "\n\n";
    cmd->footer(footer +
                "Every command also takes --store URL, --config FILE and --version (see "
                "idemgate --help).");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every real parse error is a usage error.
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (auto faults = idem::CheckFaultPointSetting(); !faults) {
    std::fprintf(stderr, "idemgate: %s\n", faults.error().message.c_str());
    return kExitFailure;
  }
  return cli.action ? cli.action() : kExitUsage;
}
