// Fingerprint throughput against raw SHA-256 of the same bytes (docs/DESIGN.md §3).
//
// The fingerprint parses, validates, canonicalizes and hashes; SHA-256 of the raw bytes is the
// floor no fingerprint can beat. The target is fingerprint >= 20% of raw SHA-256 throughput on a
// 4 KiB argument object. After the usual table this prints the ratio per size.
//
//   fingerprint_bench [--benchmark_min_time=1] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "idem/canonical_json.h"

namespace {

// A tool-call argument object of at most `limit` bytes (and close to it): nested objects,
// arrays, member names out of order, strings with escapes and non-ASCII text, integers and
// decimals, formatted the way models and SDKs send them (", " and ": ").
std::string MakeArguments(size_t limit) {
  std::string head =
      R"({"customer": {"id": "cus_8f3a", "email": "zoe@example.com"}, "amount": 129.95, )"
      R"("currency": "EUR", "items": [)";
  const std::string tail = R"(], "confirm": true})";
  std::string items;
  for (int i = 0;; ++i) {
    std::string item = (i == 0 ? "" : ", ");
    item += R"({"sku": "SKU-)" + std::to_string(100000 + i * 7919) + R"(", "qty": )" +
            std::to_string(1 + i % 9);
    if (i % 2 == 1) {
      item += R"(, "unit_price": )" + std::to_string(i % 97) + ".99" +
              R"(, "name": "Kaffeebohnen – 1 kg ☕ Zo\u00eb's \"Hausmischung\"", )"
              R"("tags": ["food", "bulk", null], "meta": {"warehouse": "DE-BER-2", )"
              R"("weight_kg": 1.25e0, "gift": false, "note": "Bitte\nnicht knicken\t/ 謝謝"})";
    }
    item += "}";
    if (head.size() + items.size() + item.size() + tail.size() > limit) break;
    items += item;
  }
  return head + items + tail;
}

const std::string& Arguments(int64_t limit) {
  static std::map<int64_t, std::string> cache;
  auto [it, inserted] = cache.try_emplace(limit);
  if (inserted) it->second = MakeArguments(static_cast<size_t>(limit));
  return it->second;
}

void BM_Fingerprint(benchmark::State& state) {
  const std::string& args = Arguments(state.range(0));
  for (auto _ : state) {
    auto fingerprint = idem::Fingerprint(args);
    if (!fingerprint) {
      state.SkipWithError(fingerprint.error().message.c_str());
      break;
    }
    benchmark::DoNotOptimize(fingerprint);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * args.size()));
  state.SetLabel(std::to_string(args.size()) + " B");
}

void BM_Canonicalize(benchmark::State& state) {
  const std::string& args = Arguments(state.range(0));
  for (auto _ : state) {
    auto canonical = idem::Canonicalize(args);
    benchmark::DoNotOptimize(canonical);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * args.size()));
  state.SetLabel(std::to_string(args.size()) + " B");
}

void BM_Sha256Raw(benchmark::State& state) {
  const std::string& args = Arguments(state.range(0));
  for (auto _ : state) {
    std::string digest = idem::Sha256Hex(args);
    benchmark::DoNotOptimize(digest);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * args.size()));
  state.SetLabel(std::to_string(args.size()) + " B");
}

constexpr int64_t kSizes[] = {200, 4096, 1 << 20};

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t size : kSizes) b->Arg(size);
}

BENCHMARK(BM_Sha256Raw)->Apply(Sizes);
BENCHMARK(BM_Fingerprint)->Apply(Sizes);
BENCHMARK(BM_Canonicalize)->Apply(Sizes);

// Console output as usual, plus the bytes/second of every run (the median when repeated) so
// the ratios can be printed at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool aggregate = run.run_type == Run::RT_Aggregate;
      if (aggregate && run.aggregate_name != "median") continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      const std::string name = run.run_name.function_name + "/" + run.run_name.args;
      if (aggregate || !medians_.contains(name)) rates_[name] = it->second.value;
      if (aggregate) medians_[name] = true;
    }
  }

  void PrintRatios() const {
    std::printf("\nfingerprint / raw SHA-256 throughput (target >= 0.20 at 4096):\n");
    std::printf("%10s %14s %14s %14s %8s\n", "size", "sha256 MB/s", "fingerpr MB/s", "canon MB/s",
                "ratio");
    for (int64_t size : kSizes) {
      const std::string arg = std::to_string(size);
      const double raw = Rate("BM_Sha256Raw/" + arg);
      const double fp = Rate("BM_Fingerprint/" + arg);
      const double canon = Rate("BM_Canonicalize/" + arg);
      if (raw <= 0 || fp <= 0) continue;
      std::printf("%10s %14.1f %14.1f %14.1f %8.3f\n", arg.c_str(), raw / 1e6, fp / 1e6,
                  canon / 1e6, fp / raw);
    }
  }

 private:
  double Rate(const std::string& name) const {
    const auto it = rates_.find(name);
    return it == rates_.end() ? 0 : it->second;
  }

  std::map<std::string, double> rates_;
  std::map<std::string, bool> medians_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintRatios();
  benchmark::Shutdown();
  return 0;
}
