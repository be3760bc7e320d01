// What `hook:turn` costs a gated call (docs/hosts.md, "Prompt hook"): ReadTurnFile, one open
// and one read of the prompt hook's turn file and its parse, when the file is there and when it
// is not (a host without the hook: every call that reaches hook:turn tries the open). The
// kernel's share is in these times; callgrind's counts (bench/mcp/instructions.py --cases
// replay,hook) leave it out.
//
//   host_turn_bench [--benchmark_min_time=1] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "fronts/mcp/host_turn.h"

namespace {

// A private temporary directory with one turn file as `idemgate hook` writes it for Claude Code.
struct TurnDir {
  std::string dir;
  std::string file;
  TurnDir() {
    std::string tmpl = "/tmp/idem-host-turn-bench-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir = tmpl;
    const idem::mcp::HookTurn turn{"claude-code", "3f1c9a52-8d0e-4b7a-9c51-0e2f6d7b8a41",
                                   "3f1c9a52-8d0e-4b7a-9c51-0e2f6d7b8a41/6b0d5e7c-2f1a-4c3e-9d8b",
                                   1781120000123};
    if (!idem::mcp::WriteTurnFile(dir, "4242-123456", turn)) std::abort();
    file = idem::mcp::TurnFilePath(dir, "4242-123456");
  }
  ~TurnDir() {
    ::unlink(file.c_str());
    ::rmdir(dir.c_str());
  }
};

void BM_ReadTurnFile(benchmark::State& state) {
  TurnDir d;
  for (auto _ : state) {
    auto turn = idem::mcp::ReadTurnFile(d.file);
    if (!turn) state.SkipWithError("no turn read");
    benchmark::DoNotOptimize(turn);
  }
}
BENCHMARK(BM_ReadTurnFile);

void BM_ReadTurnFileMissing(benchmark::State& state) {
  TurnDir d;
  const std::string missing = d.dir + "/turn-1-1.json";
  for (auto _ : state) {
    auto turn = idem::mcp::ReadTurnFile(missing);
    benchmark::DoNotOptimize(turn);
  }
}
BENCHMARK(BM_ReadTurnFileMissing);

// The parse alone, without the system calls.
void BM_ParseTurnFile(benchmark::State& state) {
  const std::string text = idem::mcp::TurnFileText(
      {"claude-code", "3f1c9a52-8d0e-4b7a-9c51-0e2f6d7b8a41",
       "3f1c9a52-8d0e-4b7a-9c51-0e2f6d7b8a41/6b0d5e7c-2f1a-4c3e-9d8b", 1781120000123});
  for (auto _ : state) benchmark::DoNotOptimize(idem::mcp::ParseTurnFile(text));
}
BENCHMARK(BM_ParseTurnFile);

}  // namespace

BENCHMARK_MAIN();
