// The console's API without sockets: requests go straight to the handler, on
// a memory store and a fake clock. The page itself is driven in a real
// browser by tests/integration/console/.
#include "fronts/console/console.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "handler_call.h"
#include "store/memory/memory_store.h"

namespace idem::console {
namespace {

namespace json = boost::json;

const http::Principal kAdmin{"ops", true};

class ConsoleTest : public ::testing::Test {
 protected:
  http::Response Send(const std::string& method, const std::string& target,
                      const std::string& body = {}, http::Principal who = kAdmin) {
    return Answer(testing::MakeRequest(method, target, body, std::move(who)));
  }
  http::Response Answer(http::Request r) {
    return testing::CallHandler(
        [this](http::Request q, http::Responder respond) {
          console_.Handle(std::move(q), std::move(respond));
        },
        std::move(r));
  }
  json::object Body(const http::Response& r) { return json::parse(r.body).as_object(); }
  std::string Header(const http::Response& r, std::string_view name) {
    for (const auto& h : r.headers) {
      if (h.name == name) return h.value;
    }
    return "";
  }

  // An unknown record of tool "charge" in tenant "acme": claimed, then marked
  // unknown as the ledger does when its owner dies mid-call.
  Record MakeUnknown(const std::string& key) {
    Call call;
    call.id = RecordId{"acme", key};
    call.fingerprint = "fp";
    call.tool = "charge";
    auto d = ledger_.Begin(call);
    EXPECT_TRUE(d && d->kind == Decision::Kind::kExecute);
    auto marked = ledger_.MarkUnknown(call, *d);
    EXPECT_TRUE(marked);
    return *marked;
  }

  FakeClock clock_;
  std::unique_ptr<Store> store_ = NewMemoryStore(clock_);
  Ledger ledger_{*store_, clock_, LedgerOptions{"serve-1", nullptr, true}};
  Config config_;
  Console console_{ledger_, config_};
};

TEST_F(ConsoleTest, ThePageIsServedWithItsScriptAndAPolicyThatAllowsNoInlineScript) {
  http::Response page = Send("GET", "/console", {}, http::Principal{"", false});
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<script src=\"/console/console.js\""), std::string::npos);
  EXPECT_NE(Header(page, "Content-Security-Policy").find("script-src 'self'"), std::string::npos);
  EXPECT_EQ(Header(page, "X-Content-Type-Options"), "nosniff");
  http::Response js = Send("GET", "/console/console.js", {}, http::Principal{"", false});
  ASSERT_EQ(js.status, 200);
  EXPECT_EQ(Header(js, "Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(Send("GET", "/console/nope").status, 404);
}

TEST_F(ConsoleTest, TheApiNeedsAnAdminToken) {
  EXPECT_EQ(Send("GET", "/console/api/unknown", {}, http::Principal{"", false}).status, 401);
  EXPECT_EQ(Send("GET", "/console/api/unknown", {}, http::Principal{"acme", false}).status, 403);
  EXPECT_EQ(Send("POST", "/console/api/release", R"({"tenant":"acme","key":"k","fence":1})",
                 http::Principal{"acme", false})
                .status,
            403);
  EXPECT_EQ(Send("GET", "/console/api/whoami").status, 200);
}

TEST_F(ConsoleTest, ListsUnknownRecordsAndReleasesOneWithItsFenceLoggingWhoDidIt) {
  Record r = MakeUnknown("k1");
  http::Response list = Send("GET", "/console/api/unknown");
  ASSERT_EQ(list.status, 200) << list.body;
  json::array records = Body(list)["records"].as_array();
  ASSERT_EQ(records.size(), 1u) << list.body;
  EXPECT_EQ(records[0].at("key"), "k1");
  EXPECT_EQ(records[0].at("tenant"), "acme");
  EXPECT_EQ(records[0].at("fence").to_number<uint64_t>(), r.fence);

  // A stale fence (what another operator saw before) changes nothing.
  http::Response stale = Send("POST", "/console/api/release",
                              R"({"tenant":"acme","key":"k1","fence":)" +
                                  std::to_string(r.fence + 1) + "}");
  EXPECT_EQ(stale.status, 409) << stale.body;
  ASSERT_TRUE(*store_->Get(r.id));

  http::Response done = Send("POST", "/console/api/release",
                             R"({"tenant":"acme","key":"k1","fence":)" + std::to_string(r.fence) +
                                 "}");
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(Body(done)["released"], true);
  EXPECT_FALSE(*store_->Get(r.id));
  EXPECT_EQ(Body(Send("GET", "/console/api/unknown"))["records"].as_array().size(), 0u);

  AttemptFilter f;
  f.tenant.reset();
  f.outcome = AttemptOutcome::kResolved;
  auto logged = store_->QueryAttempts(f);
  ASSERT_TRUE(logged);
  ASSERT_EQ(logged->size(), 1u);
  EXPECT_EQ((*logged)[0].detail, "released by ops (console)");
  EXPECT_EQ((*logged)[0].key, "k1");
  EXPECT_EQ((*logged)[0].instance, "serve-1");
}

TEST_F(ConsoleTest, SetsAnOutcomeThatRetriesReplayAndEvicts) {
  Record r = MakeUnknown("k2");
  http::Response done = Send("POST", "/console/api/set-outcome",
                             R"({"tenant":"acme","key":"k2","fence":)" + std::to_string(r.fence) +
                                 R"(,"class":"success","body":"{\"id\":7}"})");
  ASSERT_EQ(done.status, 200) << done.body;
  auto stored = store_->Get(r.id);
  ASSERT_TRUE(stored && *stored);
  EXPECT_EQ((*stored)->state, RecordState::kCompleted);
  EXPECT_EQ((*stored)->outcome->body, "{\"id\":7}");

  http::Response page = Send("GET", "/console/api/record?tenant=acme&key=k2");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(Body(page)["record"].at("outcome_body"), "{\"id\":7}");

  ASSERT_EQ(Send("POST", "/console/api/evict", R"({"tenant":"acme","key":"k2"})").status, 200);
  EXPECT_FALSE(*store_->Get(r.id));
  AttemptFilter f;
  f.tenant.reset();
  f.outcome = AttemptOutcome::kEvicted;
  auto logged = store_->QueryAttempts(f);
  ASSERT_TRUE(logged && logged->size() == 1u);
  EXPECT_EQ((*logged)[0].detail,
            "evicted (was completed, fence " + std::to_string(r.fence) + ") by ops (console)");
}

TEST_F(ConsoleTest, ActionsMustBeJsonFromThisOrigin) {
  http::Request r;
  r.method = "POST";
  r.path = r.target = "/console/api/evict";
  r.body = R"({"tenant":"acme","key":"k"})";
  r.headers = {{"Content-Type", "text/plain"}};
  r.principal = kAdmin;
  EXPECT_EQ(Answer(r).status, 415);
  r.headers = {{"Content-Type", "application/json"}, {"Host", "127.0.0.1:8787"},
               {"Origin", "https://evil.example"}};
  EXPECT_EQ(Answer(r).status, 403);
}

TEST_F(ConsoleTest, TheReplayChartCountsReplaysPerBucket) {
  Call call;
  call.id = RecordId{"acme", "k3"};
  call.fingerprint = "fp";
  call.tool = "charge";
  auto ran = ledger_.Run(call, [] { return Execution{Execution::Kind::kSuccess, "ok"}; });
  ASSERT_TRUE(ran);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ledger_.Run(call, [] { return Execution{}; }));
  clock_.Advance(Duration(1));
  http::Response chart = Send("GET", "/console/api/replay?since=1h");
  ASSERT_EQ(chart.status, 200) << chart.body;
  json::array tools = Body(chart)["tools"].as_array();
  ASSERT_EQ(tools.size(), 1u) << chart.body;
  EXPECT_EQ(tools[0].at("tool"), "charge");
  json::array points = tools[0].at("points").as_array();
  ASSERT_EQ(points.size(), config_.console.chart_buckets);
  const json::value& last = points.back();
  EXPECT_EQ(last.at("answers").to_number<uint64_t>(), 4u) << chart.body;
  EXPECT_EQ(last.at("replays").to_number<uint64_t>(), 3u);
}

}  // namespace
}  // namespace idem::console
