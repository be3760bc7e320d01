// `idemgate demo`: the quickstart's proof on the embedded store. Runs a
// non-idempotent "charge" through the ledger the way an agent's retries would
// reach it — a call, its retry, eight racing duplicates, a retry with drifted
// arguments and a call whose owner dies — and shows that the charge happened
// once and every retry was answered with the stored outcome.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "idem/canonical_json.h"
#include "idem/key.h"
#include "idem/ledger.h"
#include "net/url_text.h"

namespace idem::cli {
namespace {

struct DemoFlags {
  std::string turn;
};

Result<Call> MakeCall(const Config& config, const std::string& turn, std::string_view args) {
  auto fp = Fingerprint(args);
  if (!fp) return std::unexpected(fp.error());
  auto key = DeriveKey(KeyInput{KeyMode::kTurn, turn, "charge", *fp, std::nullopt});
  if (!key) return std::unexpected(key.error());
  Call call;
  call.id = RecordId{"default", key->key};
  call.fingerprint = *fp;
  call.tool = "charge";
  call.turn = turn;
  call.policy = config.PolicyFor("charge");
  return call;
}

int RunDemo(const GlobalOptions& globals, const DemoFlags& flags) {
  auto session = OpenSession(globals);
  if (!session) return Fail("demo", session.error());
  Store& store = *session->store;
  Clock& clock = SystemClock::Default();
  Ledger ledger(store, clock, LedgerOptions{"idemgate-demo", nullptr, true});
  const std::string turn =
      flags.turn.empty() ? fmt::format("demo-{}", ToUnixMillis(clock.Now())) : flags.turn;
  std::atomic<int> charges{0};
  auto charge = [&] {
    int n = charges.fetch_add(1) + 1;
    return Execution{Execution::Kind::kSuccess,
                     fmt::format(R"({{"charge":"ch_{}","amount":4200,"currency":"eur"}})", n)};
  };
  auto show = [](std::string_view label, const Result<RunResult>& r) {
    if (!r) {
      fmt::print("  {:<34} error: {}\n", label, r.error().ToString());
      return;
    }
    std::string body = r->outcome ? r->outcome->body : r->body;
    fmt::print("  {:<34} {:<12} {}\n", label, DecisionKindName(r->decision.kind), body);
  };

  fmt::print("store: {}\nturn:  {}\n\n",
             net::WithoutPassword(StoreUrlFor(globals, session->config)), turn);
  auto call = MakeCall(session->config, turn, R"({"amount":4200,"currency":"eur"})");
  if (!call) return Fail("demo", call.error());
  fmt::print("key:   {}\n\n", call->id.key);

  show("1. the agent calls charge", ledger.Run(*call, charge));
  // The same arguments spelled differently: same canonical JSON, same key.
  auto respelled = MakeCall(session->config, turn, R"({ "currency": "eur", "amount": 4200.0 })");
  show("2. it retries (keys reordered)", ledger.Run(*respelled, charge));

  std::vector<Result<RunResult>> racing(8, MakeError(ErrorCode::kInternal, "not run"));
  {
    std::vector<std::jthread> threads;
    for (auto& slot : racing) threads.emplace_back([&] { slot = ledger.Run(*call, charge); });
  }
  for (size_t i = 0; i < racing.size(); ++i) {
    show(fmt::format("3.{} racing duplicate", i + 1), racing[i]);
  }

  auto other_turn = MakeCall(session->config, turn + "-next", R"({"amount":4200,"currency":"eur"})");
  show("4. the next turn asks again", ledger.Run(*other_turn, charge));

  // An owner that dies mid-call: claim, never complete, lease runs out.
  auto dying = MakeCall(session->config, turn, R"({"amount":100,"currency":"eur"})");
  dying->policy.lease = Duration(1);
  auto owner = ledger.Begin(*dying);
  if (!owner) return Fail("demo", owner.error());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a demo, not a test
  show("5. retry after its owner died", ledger.Run(*dying, charge));
  ledger.Flush();

  fmt::print("\n{} calls, {} charge(s) executed; every retry got the stored outcome.\n",
             2 + racing.size() + 2, charges.load());
  fmt::print("The dead owner's call is `unknown`: it may have happened, so it is not repeated.\n"
             "Settle it with: idemgate resolve {} --release   (or --outcome-file FILE)\n"
             "See every attempt with: idemgate audit    and the replay ratio with: idemgate stats\n",
             dying->id.key);
  return kExitOk;
}

}  // namespace

void AddDemoCommand(CLI::App& app, Cli& cli) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Show idemgate at work on the configured store: a charge, its retries, racing "
              "duplicates and a dead owner, executed once");
  cmd->add_option("--turn", flags->turn, "Turn id to use (default: a new one per run)");
  cmd->callback([&cli, flags] { cli.action = [&cli, flags] { return RunDemo(cli.globals, *flags); }; });
}

}  // namespace idem::cli
