// Routing inside one server session, with recording sinks instead of sockets.
#include "fronts/mcp/http_server_session.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>

namespace idem::mcp {
namespace {

class RecordingSink : public StreamSink {
 public:
  void Event(std::string message) override {
    std::lock_guard lock(mu);
    events.push_back(std::move(message));
  }
  void End() override {
    std::lock_guard lock(mu);
    ended = true;
  }
  void Json(std::string b) override {
    std::lock_guard lock(mu);
    json = std::move(b);
  }
  std::mutex mu;
  std::vector<std::string> events;
  bool ended = false;
  std::string json;
};

// Collects what the session delivers to McpSession.
struct Delivered {
  void Add(std::string m) {
    std::lock_guard lock(mu);
    messages.push_back(std::move(m));
    cv.notify_all();
  }
  void Closed(std::string r) {
    std::lock_guard lock(mu);
    reason = std::move(r);
    closed = true;
    cv.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return messages.size() >= n; });
  }
  bool WaitClosed() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return closed; });
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> messages;
  std::string reason;
  bool closed = false;
};

struct Post {
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::shared_ptr<Exchange> ex = std::make_shared<Exchange>();
  explicit Post(Exchange::Kind kind = Exchange::Kind::kPostSse) {
    ex->kind = kind;
    ex->sink = sink;
  }
};

MessageBatch Body(std::string_view text) {
  auto b = InspectBody(text, 64);
  EXPECT_TRUE(b) << text;
  return *b;
}

class ServerSessionTest : public ::testing::Test {
 protected:
  std::shared_ptr<ServerSession> Make(bool stateless) {
    auto s = std::make_shared<ServerSession>(
        HttpSessionInfo{stateless ? "" : "sid", "default", stateless}, 64, 2, nullptr);
    s->Start([this](std::string m) { delivered.Add(std::move(m)); },
             [this](std::string r) { delivered.Closed(std::move(r)); });
    return s;
  }
  Delivered delivered;
};

TEST_F(ServerSessionTest, ResponseGoesToThePostThatAsked) {
  auto s = Make(false);
  Post a, b;
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"jsonrpc":"2.0","id":1,"method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->BeginPost(b.ex, Body(R"({"jsonrpc":"2.0","id":2,"method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_TRUE(delivered.WaitFor(2));
  EXPECT_EQ(delivered.messages[0], R"({"jsonrpc":"2.0","id":1,"method":"tools/call"})");
  EXPECT_TRUE(s->Send(R"({"jsonrpc":"2.0","id":2,"result":{"b":1}})"));
  EXPECT_TRUE(s->Send(R"({"jsonrpc":"2.0","id":1,"result":{"a":1}})"));
  EXPECT_EQ(a.sink->events,
            std::vector<std::string>{R"({"jsonrpc":"2.0","id":1,"result":{"a":1}})"});
  EXPECT_EQ(b.sink->events,
            std::vector<std::string>{R"({"jsonrpc":"2.0","id":2,"result":{"b":1}})"});
  EXPECT_TRUE(a.sink->ended);
  EXPECT_TRUE(b.sink->ended);
}

TEST_F(ServerSessionTest, ProgressFollowsItsTokenAndOthersNeedExactlyOnePost) {
  auto s = Make(false);
  Post a, b, get(Exchange::Kind::kGet);
  ASSERT_EQ(s->BeginPost(
                a.ex, Body(R"({"id":1,"method":"x","params":{"_meta":{"progressToken":"pa"}}})")),
            ServerSession::Outcome::kOk);
  // One POST open: an unrelated server request goes to it.
  s->Send(R"({"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage"})");
  EXPECT_EQ(a.sink->events.size(), 1u);
  ASSERT_EQ(s->BeginPost(
                b.ex, Body(R"({"id":2,"method":"x","params":{"_meta":{"progressToken":"pb"}}})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->AttachGet(get.ex), ServerSession::AttachOutcome::kOk);
  s->Send(R"({"method":"notifications/progress","params":{"progressToken":"pb","progress":1}})");
  EXPECT_EQ(b.sink->events.size(), 1u);
  EXPECT_EQ(a.sink->events.size(), 1u);
  // Two POSTs open: anything unrelated goes to the GET stream.
  s->Send(R"({"method":"notifications/message","params":{}})");
  EXPECT_EQ(get.sink->events.size(), 1u);
  EXPECT_EQ(s->AttachGet(Post(Exchange::Kind::kGet).ex), ServerSession::AttachOutcome::kConflict);
}

TEST_F(ServerSessionTest, MessagesWithNoStreamWaitForTheGetStreamBounded) {
  auto s = Make(false);  // max_undelivered = 2
  s->Send(R"({"method":"n1"})");
  s->Send(R"({"method":"n2"})");
  s->Send(R"({"method":"n3"})");
  Post get(Exchange::Kind::kGet);
  ASSERT_EQ(s->AttachGet(get.ex), ServerSession::AttachOutcome::kOk);
  EXPECT_EQ(get.sink->events,
            (std::vector<std::string>{R"({"method":"n2"})", R"({"method":"n3"})"}));
}

TEST_F(ServerSessionTest, DuplicateWaitingIdIsRefused) {
  auto s = Make(false);
  Post a, b, c;
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"id":1,"method":"x"})")), ServerSession::Outcome::kOk);
  EXPECT_EQ(s->BeginPost(b.ex, Body(R"({"id":1,"method":"x"})")),
            ServerSession::Outcome::kDuplicateId);
  EXPECT_EQ(s->BeginPost(c.ex, Body(R"([{"id":5,"method":"x"},{"id":5,"method":"y"}])")),
            ServerSession::Outcome::kDuplicateId);
  ASSERT_TRUE(delivered.WaitFor(1));
  s->Shutdown("test over");
  ASSERT_TRUE(delivered.WaitClosed());
  EXPECT_EQ(delivered.messages.size(), 1u) << "refused posts deliver nothing";
}

TEST_F(ServerSessionTest, JsonModeAnswersABatchAsAnArray) {
  auto s = Make(false);
  Post p(Exchange::Kind::kPostJson);
  ASSERT_EQ(
      s->BeginPost(p.ex, Body(R"([{"id":1,"method":"a"},{"method":"n"},{"id":2,"method":"b"}])")),
      ServerSession::Outcome::kOk);
  ASSERT_TRUE(delivered.WaitFor(3));
  s->Send(R"({"id":2,"result":2})");
  EXPECT_TRUE(p.sink->json.empty());
  s->Send(R"({"id":1,"result":1})");
  EXPECT_EQ(p.sink->json, R"([{"id":2,"result":2},{"id":1,"result":1}])");
}

TEST_F(ServerSessionTest, StatelessSessionKeepsClientsApart) {
  auto s = Make(true);
  Post a, b;
  // Two sessionless clients that both use id 1.
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"jsonrpc":"2.0","id":1,"method":"server/discover"})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->BeginPost(b.ex, Body(R"({"jsonrpc":"2.0","id":1,"method":"tools/list"})")),
            ServerSession::Outcome::kOk);
  ASSERT_TRUE(delivered.WaitFor(2));
  EXPECT_EQ(delivered.messages[0],
            R"({"jsonrpc":"2.0","id":"idemgate-client-1","method":"server/discover"})");
  EXPECT_EQ(delivered.messages[1], R"({"jsonrpc":"2.0","id":"idemgate-client-2","method":"tools/list"})");
  s->Send(R"({"jsonrpc":"2.0","id":"idemgate-client-2","result":{"tools":[]}})");
  s->Send(R"({"jsonrpc":"2.0","id":"idemgate-client-1","result":{"supportedVersions":[]}})");
  EXPECT_EQ(a.sink->events, std::vector<std::string>{
                                R"({"jsonrpc":"2.0","id":1,"result":{"supportedVersions":[]}})"});
  EXPECT_EQ(b.sink->events,
            std::vector<std::string>{R"({"jsonrpc":"2.0","id":1,"result":{"tools":[]}})"});
  // Unrelated server messages reach no sessionless client.
  Post c;
  ASSERT_EQ(s->BeginPost(c.ex, Body(R"({"id":9,"method":"x"})")), ServerSession::Outcome::kOk);
  s->Send(R"({"method":"notifications/message"})");
  EXPECT_TRUE(c.sink->events.empty());
}

// Review F11: the stateless session rewrote request ids but delivered
// notifications/cancelled raw, so a client's own cancel named an id the
// upstream never saw, and a cancel naming a private id cancelled another
// client's call. A cancel now names the private id of the one request with
// that client id; one that names no such request, or several, is dropped.
TEST_F(ServerSessionTest, StatelessCancelIsTranslatedToThePrivateIdOfItsRequest) {
  auto s = Make(true);
  Post a, b, c;
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"jsonrpc":"2.0","id":7,"method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->BeginPost(b.ex, Body(R"({"jsonrpc":"2.0","id":"x","method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->BeginPost(c.ex, Body(R"({"jsonrpc":"2.0","id":"x","method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_TRUE(delivered.WaitFor(3));
  ASSERT_TRUE(s->Deliver(Body(
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"r"}})")));
  ASSERT_TRUE(delivered.WaitFor(4));
  EXPECT_EQ(delivered.messages[3],
            R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"idemgate-client-1","reason":"r"}})");
  // Another client's private id, an id no request has, and an id two
  // clients share are all dropped.
  for (std::string_view id : {R"("idemgate-client-1")", "8", R"("x")"}) {
    ASSERT_TRUE(s->Deliver(Body(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":)" +
                                std::string(id) + "}}")));
  }
  const std::string marker = R"({"jsonrpc":"2.0","method":"notifications/initialized"})";
  ASSERT_TRUE(s->Deliver(Body(marker)));
  ASSERT_TRUE(delivered.WaitFor(5));
  EXPECT_EQ(delivered.messages[4], marker);
  EXPECT_EQ(delivered.messages.size(), 5u);
}

TEST_F(ServerSessionTest, ShutdownAnswersWaitingRequestsAndEndsStreams) {
  auto s = Make(false);
  Post a, get(Exchange::Kind::kGet);
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"id":"q","method":"tools/call"})")),
            ServerSession::Outcome::kOk);
  ASSERT_EQ(s->AttachGet(get.ex), ServerSession::AttachOutcome::kOk);
  s->Shutdown("the client ended the session");
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_NE(a.sink->events[0].find(R"("id":"q")"), std::string::npos);
  EXPECT_NE(a.sink->events[0].find("the session ended"), std::string::npos);
  EXPECT_TRUE(a.sink->ended);
  EXPECT_TRUE(get.sink->ended);
  EXPECT_FALSE(s->Send(R"({"id":"q","result":{}})"));
  ASSERT_TRUE(delivered.WaitClosed());
  EXPECT_EQ(delivered.reason, "the client ended the session");
  Post late;
  EXPECT_EQ(s->BeginPost(late.ex, Body(R"({"id":2,"method":"x"})")),
            ServerSession::Outcome::kClosed);
}

TEST_F(ServerSessionTest, DetachedPostLosesItsAnswers) {
  auto s = Make(false);
  Post a;
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"id":1,"method":"x"})")), ServerSession::Outcome::kOk);
  s->Detach(a.ex);
  EXPECT_TRUE(s->Send(R"({"id":1,"result":{}})"));
  EXPECT_TRUE(a.sink->events.empty());
  // The id is free again.
  Post b;
  EXPECT_EQ(s->BeginPost(b.ex, Body(R"({"id":1,"method":"x"})")), ServerSession::Outcome::kOk);
}

TEST_F(ServerSessionTest, CloseFromTheProxyTellsTheServerOnce) {
  int ended = 0;
  auto s = std::make_shared<ServerSession>(HttpSessionInfo{"sid", "default", false}, 64, 8,
                                           [&](ServerSession*) { ++ended; });
  s->Start([](std::string) {}, [this](std::string r) { delivered.Closed(std::move(r)); });
  s->Close();
  s->Close();
  EXPECT_EQ(ended, 1);
  ASSERT_TRUE(delivered.WaitClosed());
  EXPECT_EQ(delivered.reason, "closed by the proxy");
}

TEST_F(ServerSessionTest, MessagesWaitForStartAndTasksRunFirst) {
  auto s =
      std::make_shared<ServerSession>(HttpSessionInfo{"sid", "default", false}, 64, 8, nullptr);
  Post a;
  std::promise<void> factory_ran;
  ASSERT_TRUE(s->RunOnSessionThread([&, s] {
    // The factory starts the channel, as McpSession does.
    s->Start([this](std::string m) { delivered.Add(std::move(m)); },
             [this](std::string r) { delivered.Closed(std::move(r)); });
    factory_ran.set_value();
  }));
  ASSERT_EQ(s->BeginPost(a.ex, Body(R"({"id":1,"method":"x"})")), ServerSession::Outcome::kOk);
  factory_ran.get_future().wait();
  ASSERT_TRUE(delivered.WaitFor(1));
  s->Shutdown("done");
  ASSERT_TRUE(delivered.WaitClosed());
}

}  // namespace
}  // namespace idem::mcp
