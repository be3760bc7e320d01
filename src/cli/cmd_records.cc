// Operator commands on records: inspect, evict, resolve, purge.
//
// `resolve` is how a person settles a record whose outcome is unknown
// (docs/DESIGN.md §4 step 4): release it (the action did not happen, so the next
// attempt executes) or store the outcome that did happen (retries replay it).
// Every write is conditional on the record's fence, so a resolve never
// overwrites an owner or a reconcile that got there first.
#include <fmt/format.h>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cli_common.h"
#include "idem/record.h"
#include "idem/resolve.h"
#include "idem/store.h"

namespace idem::cli {
namespace {

struct RecordFlags {
  std::string key;
  std::string tenant = "default";
};

// Adds KEY and --tenant to a record command.
void AddRecordArgs(CLI::App* cmd, RecordFlags& flags) {
  cmd->add_option("KEY", flags.key, "The record's key (as `idemgate key` or `audit` prints it)")
      ->required();
  cmd->add_option("--tenant", flags.tenant, "Tenant the record belongs to")->capture_default_str();
}

RecordId IdOf(const RecordFlags& flags) { return RecordId{flags.tenant, flags.key}; }

std::string NoRecord(const RecordFlags& flags) {
  return fmt::format(
      "no record for key {} in tenant \"{}\" (never claimed, or past retention and gone); check "
      "the key and --tenant, or list recent keys with `idemgate audit`",
      flags.key, flags.tenant);
}

// Reads the live record; kNotFound (with NoRecord's message) when absent.
Result<Record> GetRecord(Store& store, const RecordFlags& flags) {
  Result<std::optional<Record>> got = store.Get(IdOf(flags));
  if (!got) return std::unexpected(got.error());
  if (!*got) return MakeError(ErrorCode::kNotFound, NoRecord(flags));
  return std::move(**got);
}

// Who acts from the command line, for the audit log: the user running it.
Operator CliOperator() {
  const char* user = std::getenv("USER");
  return Operator{user && *user ? user : "uid " + std::to_string(::getuid()), "cli",
                  "cli-" + std::to_string(::getpid())};
}

// The act was done but its audit entry could not be written.
void WarnAudit(const std::optional<Error>& audit_error) {
  if (!audit_error) return;
  fmt::print(stderr, "warning: the audit log entry could not be written: {}\n",
             audit_error->message);
}

// ---------------------------------------------------------------------------
// inspect

struct InspectFlags : RecordFlags {
  bool json = false;
  bool show_outcome = false;
};

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// A sentence for people on what the state means and what they can do.
std::string StateNote(const Record& r, TimePoint now) {
  switch (r.state) {
    case RecordState::kCompleted:
      return "completed: retries replay the stored outcome until it expires";
    case RecordState::kUnknown: {
      std::string target = r.id.key;
      if (r.id.tenant != "default") target += " --tenant " + r.id.tenant;
      return fmt::format(
          "unknown: the owner died mid-call, so the action may or may not have happened. If it "
          "did not, run `idemgate resolve {0} --release`; if it did, `idemgate resolve {0} "
          "--outcome-file FILE`",
          target);
    }
    case RecordState::kInProgress:
      if (r.lease_expires_at <= now) {
        return "in progress, but the owner's lease has expired: the owner is presumed dead and "
               "the outcome is unknown";
      }
      return "in progress: an owner holds the lease and is executing the call";
  }
  return "";
}

int RunInspect(const GlobalOptions& globals, const InspectFlags& flags) {
  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("inspect", session.error());
  Result<Record> record = GetRecord(*session->store, flags);
  if (!record) return Fail("inspect", record.error());
  const Record& r = *record;
  TimePoint now = StoreTime().Now();
  bool in_progress = r.state == RecordState::kInProgress;

  std::string out;
  if (flags.json) {
    JsonObject o;
    o.Add("tenant", r.id.tenant)
        .Add("key", r.id.key)
        .Add("state", RecordStateName(r.state))
        .Add("fence", uint64_t{r.fence})
        .Add("tool", r.tool)
        .Add("turn", r.turn)
        .Add("fingerprint", r.fingerprint)
        .Add("created_at", FormatTime(r.created_at));
    if (in_progress) {
      o.Add("lease_expires_at", FormatTime(r.lease_expires_at))
          .Add("lease_expired", r.lease_expires_at <= now);
    } else {
      o.Add("completed_at", FormatTime(r.completed_at));
    }
    o.Add("expires_at", FormatTime(r.expires_at));
    if (r.outcome) {
      o.Add("outcome_class", OutcomeClassName(r.outcome->cls))
          .Add("outcome_bytes", uint64_t{r.outcome->body.size()});
      if (flags.show_outcome) {
        if (IsValidUtf8(r.outcome->body)) {
          o.Add("outcome_body", r.outcome->body);
        } else {
          o.Add("outcome_body_base64", Base64(r.outcome->body));
        }
      }
    }
    out = o.str() + "\n";
  } else {
    auto line = [&](std::string_view name, std::string_view value) {
      out += fmt::format("{:<13}{}\n", name, value.empty() ? "-" : ForTerminal(value));
    };
    line("key", r.id.key);
    line("tenant", r.id.tenant);
    line("state", RecordStateName(r.state));
    line("fence", std::to_string(r.fence));
    line("tool", r.tool);
    line("turn", r.turn);
    line("fingerprint", r.fingerprint);
    line("created", FormatTime(r.created_at));
    if (in_progress) {
      line("lease until",
           FormatTime(r.lease_expires_at) + (r.lease_expires_at <= now ? " (expired)" : ""));
    } else {
      line("completed", FormatTime(r.completed_at));
    }
    line("expires", FormatTime(r.expires_at));
    if (r.outcome) {
      line("outcome",
           fmt::format("{}, {} bytes", OutcomeClassName(r.outcome->cls), r.outcome->body.size()));
    }
    out += "\n" + StateNote(r, now) + "\n";
    if (r.outcome && flags.show_outcome) {
      out += "\n" + r.outcome->body;
      if (!r.outcome->body.ends_with('\n')) out += "\n";
    } else if (r.outcome && !r.outcome->body.empty()) {
      out += "(the outcome body is not shown: it can hold secrets; add --show-outcome)\n";
    }
  }
  if (Result<void> w = WriteStdout(out); !w) return Fail("inspect", w.error());
  return kExitOk;
}

// ---------------------------------------------------------------------------
// evict

int RunEvict(const GlobalOptions& globals, const RecordFlags& flags) {
  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("evict", session.error());
  std::optional<Error> audit_error;
  Result<bool> evicted =
      EvictRecord(*session->store, StoreTime(), IdOf(flags), CliOperator(), &audit_error);
  if (!evicted) return Fail("evict", evicted.error());
  if (!*evicted) return Fail("evict", NoRecord(flags) + "; nothing was evicted");
  fmt::print("evicted {} (tenant \"{}\"): the next attempt of this call will execute\n", flags.key,
             flags.tenant);
  WarnAudit(audit_error);
  return kExitOk;
}

// ---------------------------------------------------------------------------
// resolve

struct ResolveFlags : RecordFlags {
  bool release = false;
  std::string outcome_file;
  std::string outcome_class = "success";
  std::string ttl;  // empty: the policy's ttl for the record's tool
  bool force = false;
};

// Why a resolve was refused, in words an operator can act on; empty when it
// was done.
std::string Refusal(const Resolution& res, const ResolveFlags& flags,
                    const std::string& outcome_file) {
  const Record& r = res.record;
  switch (res.kind) {
    case Resolution::Kind::kReleased:
    case Resolution::Kind::kStored:
      return "";
    case Resolution::Kind::kNoRecord:
      return NoRecord(flags);
    case Resolution::Kind::kCompleted:
      return fmt::format(
          "record {} is completed (at {}): retries replay its outcome and there is nothing to "
          "resolve. To forget it so that the next attempt executes, run `idemgate evict {}`",
          r.id.key, FormatTime(r.completed_at), r.id.key);
    case Resolution::Kind::kRunning:
      return fmt::format(
          "record {} is in progress and its owner's lease runs until {}: the call may still be "
          "executing. Wait for it to finish, or for the lease to expire",
          r.id.key, FormatTime(r.lease_expires_at));
    case Resolution::Kind::kLeaseExpired:
      return fmt::format(
          "record {} is in progress but its owner's lease expired at {}: the owner is presumed "
          "dead and the outcome is unknown. If you know what happened, run again with --force",
          r.id.key, FormatTime(r.lease_expires_at));
    case Resolution::Kind::kTooLarge:
      return fmt::format(
          "{} is larger than max_result_bytes ({} bytes) for tool \"{}\"; store a smaller "
          "outcome or raise max_result_bytes in the config",
          outcome_file, res.policy.max_result_bytes, r.tool);
    case Resolution::Kind::kChanged:
      return fmt::format("record {} changed while it was being resolved; nothing was written",
                         r.id.key);
  }
  return "";
}

std::string Explain(const Error& e, const RecordFlags& flags) {
  if (e.code == ErrorCode::kAborted) {
    return fmt::format(
        "record {} changed while it was being resolved (someone else took it first): nothing "
        "was written; run `idemgate inspect {}` and decide again",
        flags.key, flags.key);
  }
  if (e.code == ErrorCode::kNotFound) return NoRecord(flags);
  return e.message;
}

int RunResolve(const GlobalOptions& globals, const ResolveFlags& flags) {
  if (flags.release == !flags.outcome_file.empty()) {
    return UsageError("resolve",
                      "give exactly one of --release (the action did not happen) or "
                      "--outcome-file FILE (it happened; FILE holds its outcome)");
  }
  Result<OutcomeClass> cls = ParseOutcomeClass(flags.outcome_class);
  if (!cls || *cls == OutcomeClass::kTooLarge) {
    return UsageError("resolve",
                      "--class must be success or tool_error; got \"" + flags.outcome_class + "\"");
  }
  std::optional<Duration> ttl;
  if (!flags.ttl.empty()) {
    Result<Duration> d = ParseDuration(flags.ttl);
    if (!d || d->count() == 0) {
      return UsageError("resolve",
                        "--ttl: " + (d ? "must be longer than zero" : d.error().message));
    }
    ttl = *d;
  }

  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("resolve", session.error());
  Store& store = *session->store;

  ResolveRequest req;
  req.id = IdOf(flags);
  req.force = flags.force;
  req.ttl = ttl;
  const Config& config = session->config;
  if (!flags.release) {
    // Read the outcome before touching the record, so a bad file changes
    // nothing, and no more of it than the tool's max_result_bytes allows
    // (ResolveRecord refuses a larger one).
    Result<Record> record = GetRecord(store, flags);
    if (!record) return Fail("resolve", record.error());
    const size_t limit = config.PolicyFor(record->tool).max_result_bytes;
    Result<std::string> bytes = ReadFileBytes(flags.outcome_file, limit + 1);
    if (!bytes) return Fail("resolve", bytes.error());
    req.outcome = Outcome{*cls, std::move(*bytes)};
  }
  Result<Resolution> res = ResolveRecord(
      store, StoreTime(), [&config](const std::string& tool) { return config.PolicyFor(tool); },
      req, CliOperator());
  if (!res) return Fail("resolve", Explain(res.error(), flags));
  if (std::string why = Refusal(*res, flags, flags.outcome_file); !why.empty()) {
    return Fail("resolve", why);
  }
  if (res->kind == Resolution::Kind::kReleased) {
    fmt::print("released {}: the record is gone and the next attempt of this call will execute\n",
               flags.key);
  } else {
    const Record& done = res->record;
    fmt::print("resolved {} as {} ({} bytes): retries replay this outcome until {}\n", flags.key,
               OutcomeClassName(*cls), done.outcome ? done.outcome->body.size() : 0,
               FormatTime(done.expires_at));
  }
  WarnAudit(res->audit_error);
  return kExitOk;
}

// ---------------------------------------------------------------------------
// purge

struct PurgeFlags {
  size_t batch = 1000;
  std::string attempts_before;
};

// purge --attempts-before: the audit log's old entries, each chain cut at
// its newest entry older than that and restarting there (Store::PurgeAttempts).
int RunPurgeAttempts(Store& store, const PurgeFlags& flags) {
  Result<TimePoint> before = ParseSince(flags.attempts_before, SystemClock::Default().Now());
  if (!before) return UsageError("purge", "--attempts-before: " + before.error().message);
  uint64_t purged = 0;
  for (;;) {
    Result<size_t> n = store.PurgeAttempts(*before, flags.batch);
    if (!n) {
      return Fail("purge",
                  fmt::format("{} (after purging {} audit entries)", n.error().message, purged));
    }
    if (*n == 0) break;
    purged += *n;
  }
  fmt::print("purged {} audit entries older than {}; each chain restarts where it was cut\n",
             purged, FormatTime(*before));
  return kExitOk;
}

int RunPurge(const GlobalOptions& globals, const PurgeFlags& flags) {
  Result<StoreSession> session = OpenSession(globals);
  if (!session) return Fail("purge", session.error());
  Store& store = *session->store;
  if (!flags.attempts_before.empty()) return RunPurgeAttempts(store, flags);
  Result<uint64_t> at_start = store.CountRecords();
  if (!at_start) return Fail("purge", at_start.error());
  bool tty = StderrIsTerminal();
  uint64_t purged = 0;
  for (;;) {
    Result<size_t> n = store.PurgeExpired(flags.batch);
    if (!n) {
      if (tty) fmt::print(stderr, "\n");
      return Fail("purge", fmt::format("{} (after purging {} records)", n.error().message, purged));
    }
    if (*n == 0) break;
    purged += *n;
    fmt::print(stderr, "{}purged {} of {} records stored at start{}", tty ? "\r" : "", purged,
               *at_start, tty ? "" : "\n");
  }
  if (tty && purged > 0) fmt::print(stderr, "\n");
  fmt::print("purged {} expired records; {} were stored at start\n", purged, *at_start);
  return kExitOk;
}

}  // namespace

void AddRecordCommands(CLI::App& app, Cli& cli) {
  {
    auto flags = std::make_shared<InspectFlags>();
    CLI::App* cmd = app.add_subcommand("inspect", "Show the record of a key");
    cmd->footer(
        "Shows state, fence, tool, turn, fingerprint, times (ISO-8601 UTC) and the outcome's\n"
        "class and size; the body only with --show-outcome. Exit status 1 if there is no\n"
        "record for KEY.");
    AddRecordArgs(cmd, *flags);
    cmd->add_flag("--json", flags->json, "Print one JSON object");
    cmd->add_flag("--show-outcome", flags->show_outcome,
                  "Also print the stored outcome body (it can hold secrets)");
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunInspect(cli.globals, *flags); }; });
  }
  {
    auto flags = std::make_shared<RecordFlags>();
    CLI::App* cmd = app.add_subcommand(
        "evict", "Remove the record of a key, so that the next attempt executes");
    cmd->footer("Removes the record whatever its state. Exit status 1 if there was none.");
    AddRecordArgs(cmd, *flags);
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunEvict(cli.globals, *flags); }; });
  }
  {
    auto flags = std::make_shared<ResolveFlags>();
    CLI::App* cmd = app.add_subcommand("resolve", "Settle a record whose outcome is unknown");
    cmd->footer(
        "For a record whose owner died mid-call (state unknown):\n"
        "  --release              the action did not happen: delete the record so the next\n"
        "                         attempt executes\n"
        "  --outcome-file FILE    the action happened: store FILE as its outcome so retries\n"
        "                         replay it (retention: the tool's ttl from the config, or --ttl)\n"
        "Refuses a completed record, and an in-progress one whose lease is alive; one whose\n"
        "lease expired needs --force.");
    AddRecordArgs(cmd, *flags);
    CLI::Option* release =
        cmd->add_flag("--release", flags->release, "The action did not happen: release the record");
    CLI::Option* file = cmd->add_option("--outcome-file", flags->outcome_file,
                                        "The action happened: its outcome bytes (- for stdin)");
    release->excludes(file);
    cmd->add_option("--class", flags->outcome_class, "Outcome class: success or tool_error")
        ->capture_default_str();
    cmd->add_option("--ttl", flags->ttl,
                    "Keep the outcome this long (e.g. 24h); default: the tool's ttl");
    cmd->add_flag("--force", flags->force,
                  "Also resolve an in-progress record whose owner's lease has expired");
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunResolve(cli.globals, *flags); }; });
  }
  {
    auto flags = std::make_shared<PurgeFlags>();
    CLI::App* cmd =
        app.add_subcommand("purge", "Delete every record past its retention (progress on stderr)");
    cmd->add_option("--batch", flags->batch, "Records deleted per store call")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
    cmd->add_option("--attempts-before", flags->attempts_before,
                    "Instead of records, delete audit entries older than this (30d, or an "
                    "ISO-8601 time); each tenant's chain restarts where it was cut, and "
                    "audit --verify still checks the rest");
    cmd->callback(
        [&cli, flags] { cli.action = [&cli, flags] { return RunPurge(cli.globals, *flags); }; });
  }
}

}  // namespace idem::cli
