// ChildChannel with a real child process (sh): what reaches the session when
// the upstream sends a message over max_message_bytes.
#include "fronts/mcp/child_channel.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace idem::mcp {
namespace {

namespace json = boost::json;

// Runs `script` under sh as the upstream, with a 100-byte limit, and
// collects what the channel delivers until the child has closed.
std::vector<std::string> DeliveredBy(const std::string& script) {
  ChildOptions options;
  options.max_message_bytes = 100;
  auto child = ChildChannel::Spawn({"sh", "-c", script}, options);
  EXPECT_TRUE(child) << child.error().message;
  if (!child) return {};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> messages;
  bool closed = false;
  (*child)->Start(
      [&](std::string m) {
        std::lock_guard g(mu);
        messages.push_back(std::move(m));
      },
      [&](std::string) {
        std::lock_guard g(mu);
        closed = true;
        cv.notify_all();
      });
  std::unique_lock g(mu);
  cv.wait(g, [&] { return closed; });
  return messages;
}

// The script line that prints a JSON-RPC message whose `pad` member holds
// 300 bytes: over the 100-byte limit.
std::string PrintOversize(const std::string& head) {
  return "printf '" + head + ",\"pad\":\"%s\"}\\n' \"$(printf 'a%.0s' $(seq 300))\"; ";
}

// Guarantees review F9: an answer over the limit was logged and dropped, so
// the gated call it answered waited for ever (in progress for every retry).
// Its id is recovered and the request gets an error in its place, which
// ClassOfJsonRpcError takes as "may have acted".
TEST(ChildChannelTest, AnAnswerOverTheLimitIsAnsweredWithAnErrorForItsId) {
  std::vector<std::string> got =
      DeliveredBy(PrintOversize(R"({"jsonrpc":"2.0","id":7,"result":{"ok":true})") +
                  R"(echo '{"jsonrpc":"2.0","id":8,"result":{}}')");
  ASSERT_EQ(got.size(), 2u);
  json::value error = json::parse(got[0]);
  EXPECT_EQ(error.at("id"), 7);
  EXPECT_EQ(error.at("error").at("code"), kRpcAnswerTooLarge);
  EXPECT_NE(std::string(error.at("error").at("message").as_string()).find("max_message_bytes"),
            std::string::npos);
  EXPECT_EQ(json::parse(got[1]).at("id"), 8);  // the channel reads on
}

// A request or a notification from the upstream over the limit has an id
// (or none) that names none of our requests: dropped, nothing delivered.
TEST(ChildChannelTest, ARequestOverTheLimitIsDroppedWithoutAnAnswer) {
  std::vector<std::string> got = DeliveredBy(
      PrintOversize(R"({"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{})") +
      PrintOversize(R"({"jsonrpc":"2.0","method":"notifications/message","params":{})"));
  EXPECT_TRUE(got.empty()) << got.front();
}

}  // namespace
}  // namespace idem::mcp
