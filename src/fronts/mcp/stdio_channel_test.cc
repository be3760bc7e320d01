// StdioChannel over real pipes: the client side of `idemgate mcp`.
#include "fronts/mcp/stdio_channel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace idem::mcp {
namespace {

// Writes all of `bytes` to `fd` (blocking).
void WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    ASSERT_GT(n, 0);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads `fd` up to and without the first newline.
std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

// Regression: the client side framed messages up to a fixed 64 MiB, so a
// 100 MB argument object made the process hold 64 MiB (VmHWM +127 MB) before
// it was refused, with an error (id null) that named neither the configured
// limit nor the setting.
TEST(StdioChannelTest, AMessageOverTheLimitIsDroppedUnreadAndAnsweredByIdNamingTheSetting) {
  int in[2], out[2];
  ASSERT_EQ(::pipe(in), 0);
  ASSERT_EQ(::pipe(out), 0);
  StdioOptions options;
  options.max_message_bytes = 1 << 20;
  options.protect_stdout = false;
  options.in_fd = in[0];
  options.out_fd = out[1];
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> delivered;
  bool closed = false;
  {
    StdioChannel channel(options);
    ::close(out[1]);  // the channel writes through its own copy
    channel.Start(
        [&](std::string message) {
          std::lock_guard g(mu);
          delivered.push_back(std::move(message));
        },
        [&](std::string) {
          std::lock_guard g(mu);
          closed = true;
          cv.notify_all();
        });
    std::thread client([&] {
      WriteAll(in[1], R"({"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"t",)"
                      R"("arguments":{"blob":")");
      const std::string mib(1 << 20, 'a');
      for (int i = 0; i < 16; ++i) WriteAll(in[1], mib);
      WriteAll(in[1], "\"}}}\n{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"ping\"}\n");
      ::close(in[1]);
    });
    boost::json::value answer = boost::json::parse(ReadLine(out[0]));
    client.join();
    EXPECT_EQ(answer.at("id"), 41);
    EXPECT_EQ(answer.at("error").at("code"), kRpcInvalidRequest);
    std::string message(answer.at("error").at("message").as_string());
    EXPECT_NE(message.find("larger than the limit of 1048576 bytes (limits.max_body_bytes)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("nothing in it was executed"), std::string::npos) << message;
    std::unique_lock g(mu);
    ASSERT_TRUE(cv.wait_for(g, std::chrono::seconds(20), [&] { return closed; }));
    EXPECT_EQ(delivered, std::vector<std::string>{R"({"jsonrpc":"2.0","id":42,"method":"ping"})"});
    g.unlock();
    channel.Close();
  }
  ::close(in[0]);
  ::close(out[0]);
}

}  // namespace
}  // namespace idem::mcp
