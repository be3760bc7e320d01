// `idemgate canon`: RFC 8785 canonical JSON of stdin on stdout.
//
// Kept to pure I/O around Canonicalize: it never reads the config or opens a
// store, because conformance checkers start it hundreds of times.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli_common.h"
#include "idem/canonical_json.h"

namespace idem::cli {
namespace {

struct CanonOptionsFlags {
  bool strict = false;
  bool exact_numbers = false;
  std::string max_bytes = "1MiB";
  size_t max_depth = 128;
};

int RunCanon(const CanonOptionsFlags& flags) {
  CanonOptions options;
  options.strict = flags.strict;
  options.exact_numbers = flags.exact_numbers;
  options.max_depth = flags.max_depth;
  Result<size_t> max_bytes = ParseSize(flags.max_bytes);
  if (!max_bytes) return UsageError("canon", "--max-bytes: " + max_bytes.error().message);
  options.max_bytes = *max_bytes;

  // One byte past the limit is enough for the canonicalizer to say "too
  // large" without buffering an unbounded stream.
  size_t read_limit = options.max_bytes == SIZE_MAX ? SIZE_MAX : options.max_bytes + 1;
  Result<std::string> input = ReadStdin(read_limit);
  if (!input) return Fail("canon", input.error());
  if (input->size() > options.max_bytes) {
    // Only the first max_bytes + 1 were read, so the real size is unknown.
    return Fail("canon", "JSON input is larger than the limit of " +
                             std::to_string(options.max_bytes) +
                             " bytes; send a smaller text or raise --max-bytes");
  }
  Result<std::string> canonical = Canonicalize(*input, options);
  if (!canonical) return Fail("canon", canonical.error());
  // Exactly the canonical bytes (pipe them into a hash); a newline only for
  // a person at a terminal.
  if (StdoutIsTerminal()) canonical->push_back('\n');
  if (Result<void> w = WriteStdout(*canonical); !w) return Fail("canon", w.error());
  return kExitOk;
}

}  // namespace

void AddCanonCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<CanonOptionsFlags>();
  CLI::App* cmd =
      app.add_subcommand("canon", "Write the RFC 8785 canonical form of the JSON text on stdin");
  cmd->footer(
      "Reads ONE JSON text on stdin and writes its RFC 8785 (JCS) canonical bytes on stdout\n"
      "(no trailing newline unless stdout is a terminal). Input that is not I-JSON is\n"
      "rejected: invalid UTF-8, lone surrogates, duplicate member names, NaN/Infinity,\n"
      "nesting past --max-depth, input past --max-bytes.\n"
      "Exit status: 0 canonical form written, 1 input rejected (reason on stderr), 2 usage.");
  cmd->add_flag("--strict", flags->strict,
                "Strict I-JSON profile: also reject Unicode noncharacters, a leading BOM and "
                "numbers that underflow to zero");
  cmd->add_flag("--exact-numbers", flags->exact_numbers,
                "Keep numbers a double cannot hold exactly (as the fingerprint does) instead of "
                "rounding them as RFC 8785 does");
  cmd->add_option("--max-bytes", flags->max_bytes,
                  "Reject input larger than this (bytes, or 512KiB, 1MiB, 1MB)")
      ->capture_default_str();
  cmd->add_option("--max-depth", flags->max_depth, "Reject nesting deeper than this")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  cmd->callback([&cli, flags] { cli.action = [flags] { return RunCanon(*flags); }; });
}

}  // namespace idem::cli
