// SqliteStore group commit against bare SQLite doing the same row writes.
//
//   sqlite_baseline_bench [--seconds N] [--rounds N] [--dir DIR]
//                         [--synchronous full|normal|off]
//
// A claim→complete call is two row writes: an INSERT of the in-progress row,
// then an UPDATE of that row with the outcome. Bare SQLite (bare_sqlite.h: same
// row shape, WAL, synchronous=FULL, prepared statements) does them (a) with one commit
// per write and (b) with 100 writes per commit; SqliteStore does claim →
// complete with 1, 16 and 64 concurrent callers. Prints calls/s per case and the
// ratios the group-commit targets are stated in: store16 / one-commit (goal
// ≥ 3) and store16 / batched (goal ≥ 0.5). DIR (default $TMPDIR or /tmp)
// should be on the disk being measured: tmpfs makes fsync free.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bare_sqlite.h"
#include "sqlite_store.h"

namespace {

using Clock = std::chrono::steady_clock;

const std::string kBody(200, 'r');  // a small tool result

double Rate(uint64_t calls, Clock::time_point start) {
  return calls / std::chrono::duration<double>(Clock::now() - start).count();
}

// The bare-SQLite baselines write rows shaped like the store's claims.
idem_bench::BareCalls BareRows() {
  return idem_bench::BareCalls{
      .key = [](uint64_t n) { return "key-" + std::to_string(n); },
      .fingerprint = [](uint64_t) { return std::string("fp"); },
      .body = kBody,
  };
}

struct StoreRun {
  double calls_per_second = 0;
  double writes_per_commit = 0;
};

StoreRun StoreClaimComplete(const std::string& path, const std::string& synchronous, int callers,
                            double seconds) {
  idem::StoreOptions options;
  options.sqlite_synchronous = synchronous;
  auto opened = idem::SqliteStore::Open(path, idem::SystemClock::Default(), options);
  if (!opened) {
    std::fprintf(stderr, "sqlite_baseline_bench: %s\n", opened.error().ToString().c_str());
    std::exit(1);
  }
  idem::SqliteStore& store = **opened;
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      idem::ClaimRequest req;
      req.fingerprint = "fp";
      req.tool = "charge";
      req.turn = "turn";
      for (uint64_t i = 0; Clock::now() < end; ++i) {
        req.id.key = "key-" + std::to_string(t) + "-" + std::to_string(i);
        auto c = store.Claim(req);
        if (!c || !c->claimed) {
          failed = true;
          return;
        }
        auto done = store.Complete(req.id, c->record.fence,
                                   idem::Outcome{idem::OutcomeClass::kSuccess, kBody},
                                   idem::Duration(86'400'000));
        if (!done) {
          failed = true;
          return;
        }
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double rate = Rate(calls.load(), start);
  if (failed) {
    std::fprintf(stderr, "sqlite_baseline_bench: a store call failed\n");
    std::exit(1);
  }
  return StoreRun{rate,
                  static_cast<double>(store.writes()) / std::max<uint64_t>(store.commits(), 1)};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  int rounds = 3;
  std::string base;
  std::string synchronous = "full";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--synchronous") == 0 && i + 1 < argc) {
      synchronous = argv[++i];
    } else if (std::strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      base = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: sqlite_baseline_bench [--seconds N] [--rounds N] [--dir DIR] "
                   "[--synchronous full|normal|off]\n");
      return 2;
    }
  }
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp && *tmp ? tmp : "/tmp";
  }
  std::string tmpl = base + "/idem_sqlite_bench_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("sqlite_baseline_bench: mkdtemp");
    return 1;
  }
  const std::filesystem::path dir(tmpl);

  // The cases alternate over the rounds so that a burst of disk activity from
  // elsewhere hits them alike; the table shows each case's median.
  std::vector<double> one, batched, store1, store16, store64, store1_batch, store16_batch,
      store64_batch;
  for (int round = 0; round < rounds; ++round) {
    const std::string tag = std::to_string(round);
    one.push_back(idem_bench::BareOneCommitPerWrite((dir / ("one" + tag + ".db")).string(),
                                                    synchronous, seconds, BareRows()));
    batched.push_back(idem_bench::BareBatched((dir / ("batched" + tag + ".db")).string(),
                                              synchronous, seconds, BareRows()));
    const StoreRun s1 =
        StoreClaimComplete((dir / ("store1" + tag + ".db")).string(), synchronous, 1, seconds);
    const StoreRun s16 =
        StoreClaimComplete((dir / ("store16" + tag + ".db")).string(), synchronous, 16, seconds);
    store1.push_back(s1.calls_per_second);
    store1_batch.push_back(s1.writes_per_commit);
    store16.push_back(s16.calls_per_second);
    store16_batch.push_back(s16.writes_per_commit);
    const StoreRun s64 =
        StoreClaimComplete((dir / ("store64" + tag + ".db")).string(), synchronous, 64, seconds);
    store64.push_back(s64.calls_per_second);
    store64_batch.push_back(s64.writes_per_commit);
  }
  std::filesystem::remove_all(dir);

  std::printf(
      "claim→complete calls/s, median of %d rounds of %.1f s per case, synchronous=%s, "
      "WAL, dir %s\n",
      rounds, seconds, synchronous.c_str(), base.c_str());
  std::printf("%-40s %12s %14s\n", "case", "calls/s", "writes/commit");
  std::printf("%-40s %12.0f %14d\n", "bare sqlite, one commit per write", Median(one), 1);
  std::printf("%-40s %12.0f %14d\n", "bare sqlite, 100 writes per commit", Median(batched),
              2 * idem_bench::kCallsPerBatchedCommit);
  std::printf("%-40s %12.0f %14.1f\n", "SqliteStore, 1 caller", Median(store1),
              Median(store1_batch));
  std::printf("%-40s %12.0f %14.1f\n", "SqliteStore, 16 callers", Median(store16),
              Median(store16_batch));
  std::printf("%-40s %12.0f %14.1f\n", "SqliteStore, 64 callers", Median(store64),
              Median(store64_batch));
  std::printf("store16 / one-commit: %.2fx (goal >= 3)\n", Median(store16) / Median(one));
  std::printf("store16 / batched:    %.2f (goal >= 0.5)\n", Median(store16) / Median(batched));
  return 0;
}
