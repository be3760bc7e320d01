// `idemgate audit` (the attempt log, docs/DESIGN.md §7) and `idemgate stats`
// (replay ratio per tool).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <array>
#include <memory>
#include <optional>
#include <string>

#include "cli_common.h"
#include "idem/attempt_chain.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem::cli {
namespace {

constexpr std::array<AttemptOutcome, 16> kAllOutcomes = {
    AttemptOutcome::kExecuted,    AttemptOutcome::kReplayed,    AttemptOutcome::kAttached,
    AttemptOutcome::kInProgress,  AttemptOutcome::kDrift,       AttemptOutcome::kUnknown,
    AttemptOutcome::kReleased,    AttemptOutcome::kError,       AttemptOutcome::kWouldReplay,
    AttemptOutcome::kWouldDrift,  AttemptOutcome::kWouldWait,   AttemptOutcome::kWouldUnknown,
    AttemptOutcome::kExecutedAgain,
    AttemptOutcome::kClaimed,
    AttemptOutcome::kResolved,
    AttemptOutcome::kEvicted,
};

std::string OutcomeList() {
  std::string out;
  for (AttemptOutcome o : kAllOutcomes) {
    if (!out.empty()) out += ", ";
    out += AttemptOutcomeName(o);
  }
  return out;
}

// Filters shared by audit and stats.
struct FilterFlags {
  std::string tenant;
  std::string tool;
  std::string since;
  bool json = false;
};

void AddFilterArgs(CLI::App* cmd, FilterFlags& flags) {
  cmd->add_option("--tenant", flags.tenant, "Only this tenant");
  cmd->add_option("--tool", flags.tool, "Only this tool (or \"METHOD /path\")");
  cmd->add_option("--since", flags.since,
                  "Only attempts since then: a duration back from now (30m, 1h, 2d) or an "
                  "ISO-8601 time (2026-01-01T10:00:00Z; no zone means UTC)");
  cmd->add_flag("--json", flags.json, "Print JSON lines (one object per line)");
}

// Fills `filter` from the flags; an error message for a bad --since.
std::optional<std::string> ToFilter(const FilterFlags& flags, AttemptFilter& filter) {
  if (!flags.tenant.empty()) filter.tenant = flags.tenant;
  if (!flags.tool.empty()) filter.tool = flags.tool;
  if (!flags.since.empty()) {
    Result<TimePoint> since = ParseSince(flags.since, SystemClock::Default().Now());
    if (!since) return since.error().message;
    filter.since = *since;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// audit

struct AuditFlags : FilterFlags {
  std::string key;
  std::string outcome;
  size_t limit = 100;
  bool verify = false;
  bool head = false;
};

std::string_view FaultKindName(ChainFault::Kind kind) {
  switch (kind) {
    case ChainFault::Kind::kEdited:
      return "edited";
    case ChainFault::Kind::kDeleted:
      return "deleted";
    case ChainFault::Kind::kInserted:
      return "inserted";
  }
  return "?";
}

// audit --verify: exit 0 if every chain holds, 1 naming the first break.
int RunVerify(Store& store, const AuditFlags& flags) {
  std::optional<std::string> tenant;
  if (!flags.tenant.empty()) tenant = flags.tenant;
  Result<ChainReport> report = VerifyChains(store, tenant);
  if (!report) return Fail("audit --verify", report.error());
  std::string out;
  if (flags.json) {
    JsonObject o;
    o.Add("ok", !report->fault)
        .Add("checked", uint64_t{report->checked})
        .Add("tenants", uint64_t{report->tenants})
        .Add("before_chain", uint64_t{report->before_chain})
        .Add("restarted", uint64_t{report->restarted});
    if (const auto& f = report->fault) {
      o.Add("fault", FaultKindName(f->kind))
          .Add("tenant", f->entry.tenant)
          .Add("seq", uint64_t{f->entry.seq})
          .Add("key", f->entry.key)
          .Add("at", FormatTime(f->entry.at))
          .Add("message", f->message);
    }
    out = o.str() + "\n";
  } else if (const auto& f = report->fault) {
    out = fmt::format("audit log tampered with: {}\n(checked {} entries before it)\n", f->message,
                      report->checked);
  } else {
    out = fmt::format("checked {} entries in {} tenant{}: every chain holds", report->checked,
                      report->tenants, report->tenants == 1 ? "" : "s");
    if (report->before_chain > 0) {
      out += fmt::format("; {} entries from before the chain were not checked",
                         report->before_chain);
    }
    if (report->restarted > 0) {
      out += fmt::format("; {} restart{} where a purge cut {}", report->restarted,
                         report->restarted == 1 ? "s" : "", report->restarted == 1 ? "it" : "them");
    }
    out += "\n";
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("audit", w.error());
  return report->fault ? kExitFailure : kExitOk;
}

// audit --head: each tenant's chain head, to keep somewhere the store's
// writers cannot reach (the external anchor, docs/DESIGN.md §7).
int RunHead(Store& store, const AuditFlags& flags) {
  std::optional<std::string> tenant;
  if (!flags.tenant.empty()) tenant = flags.tenant;
  Result<std::vector<ChainHead>> heads = store.ChainHeads(tenant);
  if (!heads) return Fail("audit --head", heads.error());
  std::string out;
  if (flags.json) {
    for (const ChainHead& h : *heads) {
      out += JsonObject()
                 .Add("tenant", h.tenant)
                 .Add("seq", uint64_t{h.seq})
                 .Add("hash", h.hash)
                 .Add("start_seq", uint64_t{h.start_seq})
                 .Add("start_prev", h.start_prev)
                 .str() +
             "\n";
    }
  } else if (heads->empty()) {
    fmt::print(stderr, "no chain yet\n");
  } else {
    Table table({"TENANT", "SEQ", "HASH", "START_SEQ"});
    for (const ChainHead& h : *heads) {
      table.AddRow({h.tenant, std::to_string(h.seq), h.hash, std::to_string(h.start_seq)});
    }
    out = table.str();
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("audit", w.error());
  return kExitOk;
}

int RunAudit(const GlobalOptions& globals, const AuditFlags& flags) {
  if (flags.verify || flags.head) {
    if (flags.verify && flags.head) {
      return UsageError("audit", "--verify and --head exclude each other");
    }
    if (!flags.key.empty() || !flags.outcome.empty() || !flags.tool.empty() ||
        !flags.since.empty()) {
      return UsageError("audit", "--verify and --head take only --tenant and --json");
    }
    Result<StoreSession> session = OpenSession(globals);
    if (!session) return Fail("audit", session.error());
    return flags.verify ? RunVerify(*session->store, flags) : RunHead(*session->store, flags);
  }
  AttemptFilter filter;
  if (std::optional<std::string> bad = ToFilter(flags, filter)) return UsageError("audit", *bad);
  if (!flags.key.empty()) filter.key = flags.key;
  if (!flags.outcome.empty()) {
    Result<AttemptOutcome> outcome = ParseAttemptOutcome(flags.outcome);
    if (!outcome) {
      return UsageError(
          "audit", "--outcome must be one of " + OutcomeList() + "; got \"" + flags.outcome + "\"");
    }
    filter.outcome = *outcome;
  }
  filter.limit = flags.limit;

  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("audit", session.error());
  bool cut = false;
  filter.cut = &cut;
  Result<std::vector<Attempt>> attempts = session->store->QueryAttempts(filter);
  if (!attempts) return Fail("audit", attempts.error());
  if (cut) {
    fmt::print(stderr,
               "note: the store stopped looking after its scan cap (Redis: ?attempts_scan=, "
               "default 10000 entries); older matches may exist: narrow with --since or raise "
               "the cap in --store's URL (0: no cap)\n");
  }

  std::string out;
  if (flags.json) {
    for (const Attempt& a : *attempts) {
      out += JsonObject()
                 .Add("at", FormatTime(a.at))
                 .Add("tenant", a.tenant)
                 .Add("key", a.key)
                 .Add("tool", a.tool)
                 .Add("turn", a.turn)
                 .Add("outcome", AttemptOutcomeName(a.outcome))
                 .Add("latency_ms", int64_t{a.latency.count()})
                 .Add("instance", a.instance)
                 .Add("detail", a.detail)
                 .str() +
             "\n";
    }
  } else if (attempts->empty()) {
    fmt::print(stderr, "no attempts match\n");
  } else {
    Table table({"TIME", "TENANT", "TOOL", "OUTCOME", "LATENCY", "TURN", "KEY", "DETAIL"});
    for (const Attempt& a : *attempts) {
      table.AddRow({FormatTime(a.at), a.tenant, a.tool, std::string(AttemptOutcomeName(a.outcome)),
                    fmt::format("{}ms", a.latency.count()), a.turn.empty() ? "-" : a.turn, a.key,
                    a.detail});
    }
    out = table.str();
    if (attempts->size() == flags.limit) {
      out += fmt::format("(newest {} shown; raise --limit for more)\n", flags.limit);
    }
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("audit", w.error());
  return kExitOk;
}

// ---------------------------------------------------------------------------
// stats

uint64_t Count(const ToolStats& s, AttemptOutcome o) {
  auto it = s.by_outcome.find(o);
  return it == s.by_outcome.end() ? 0 : it->second;
}

// (replayed + attached) / attempts: how often a call was answered without
// executing. 0 when there were no attempts.
double ReplayRatio(const ToolStats& s) {
  if (s.attempts == 0) return 0;
  return static_cast<double>(Count(s, AttemptOutcome::kReplayed) +
                             Count(s, AttemptOutcome::kAttached)) /
         static_cast<double>(s.attempts);
}

int RunStats(const GlobalOptions& globals, const FilterFlags& flags) {
  AttemptFilter filter;
  if (std::optional<std::string> bad = ToFilter(flags, filter)) return UsageError("stats", *bad);

  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("stats", session.error());
  Result<std::map<std::string, ToolStats>> summary = session->store->SummarizeAttempts(filter);
  if (!summary) return Fail("stats", summary.error());

  ToolStats total;
  for (const auto& [tool, s] : *summary) {
    total.attempts += s.attempts;
    for (const auto& [o, n] : s.by_outcome) total.by_outcome[o] += n;
  }

  std::string out;
  if (flags.json) {
    auto line = [&](std::string_view tool, const ToolStats& s) {
      JsonObject o;
      o.Add("tool", tool).Add("attempts", uint64_t{s.attempts});
      for (AttemptOutcome oc : kAllOutcomes) o.Add(AttemptOutcomeName(oc), Count(s, oc));
      o.Add("replay_ratio", ReplayRatio(s));
      out += o.str() + "\n";
    };
    for (const auto& [tool, s] : *summary) line(tool, s);
  } else if (summary->empty()) {
    fmt::print(stderr, "no attempts match\n");
  } else {
    std::vector<std::string> header = {"TOOL", "ATTEMPTS"};
    for (AttemptOutcome o : kAllOutcomes) {
      std::string name(AttemptOutcomeName(o));
      for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      header.push_back(name);
    }
    header.push_back("REPLAY_RATIO");
    Table table(std::move(header));
    auto row = [&](std::string_view tool, const ToolStats& s) {
      std::vector<std::string> cells = {std::string(tool), std::to_string(s.attempts)};
      for (AttemptOutcome o : kAllOutcomes) cells.push_back(std::to_string(Count(s, o)));
      cells.push_back(fmt::format("{:.3f}", ReplayRatio(s)));
      table.AddRow(std::move(cells));
    };
    for (const auto& [tool, s] : *summary) row(tool, s);
    if (summary->size() > 1) row("(all tools)", total);
    out = table.str();
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("stats", w.error());
  return kExitOk;
}

}  // namespace

void AddAuditCommands(CLI::App& app, Cli& cli) {
  {
    auto flags = std::make_shared<AuditFlags>();
    CLI::App* cmd = app.add_subcommand("audit", "List attempts from the audit log, newest first");
    cmd->footer(
        "Each attempt: time, tenant, tool, outcome, latency, turn, key. Arguments and results\n"
        "are never logged.\n"
        "--verify walks each tenant's hash chain and names the first entry edited, deleted or\n"
        "inserted out of order (exit 1); --head prints each chain's newest hash, to keep\n"
        "outside the store so that a rewrite of the whole log shows too.");
    AddFilterArgs(cmd, *flags);
    cmd->add_option("--key", flags->key, "Only this key");
    cmd->add_option("--outcome", flags->outcome, "Only this outcome: " + OutcomeList());
    cmd->add_option("--limit", flags->limit, "At most this many attempts")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
    cmd->add_flag("--verify", flags->verify,
                  "Check every tenant's hash chain (only --tenant's with --tenant): exit 0 if it "
                  "holds, 1 naming the first entry edited, deleted or inserted");
    cmd->add_flag("--head", flags->head,
                  "Print each tenant's chain head (seq and hash), to anchor it outside the store");
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunAudit(cli.globals, *flags); }; });
  }
  {
    auto flags = std::make_shared<FilterFlags>();
    CLI::App* cmd =
        app.add_subcommand("stats", "Attempts per tool by outcome, and the replay ratio");
    cmd->footer(
        "Replay ratio = (replayed + attached) / attempts. A high ratio means a network problem\n"
        "or a client retrying too hard.");
    AddFilterArgs(cmd, *flags);
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunStats(cli.globals, *flags); }; });
  }
}

}  // namespace idem::cli
