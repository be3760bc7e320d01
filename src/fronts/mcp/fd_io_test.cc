// FdWriter: messages arrive whole and in order whether Send writes them from
// the caller's thread or leaves (part of) them to the writer thread.
#include "fronts/mcp/fd_io.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

namespace idem::mcp {
namespace {

// Reads `fd` to EOF.
std::string ReadAll(int fd) {
  std::string out;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// A line of `size` bytes that names its sender and sequence number.
std::string Line(int sender, int seq, size_t size) {
  std::string line = std::to_string(sender) + ":" + std::to_string(seq) + ":";
  line.resize(size - 1, 'x');
  return line + "\n";
}

// Every sender's lines are whole and in that sender's order.
void ExpectOrderedLines(const std::string& text, int senders, int per_sender, size_t size) {
  std::vector<int> next(senders, 0);
  size_t pos = 0;
  int lines = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "a line was cut short";
    std::string line = text.substr(pos, end - pos + 1);
    int sender = std::stoi(line);
    int seq = std::stoi(line.substr(line.find(':') + 1));
    ASSERT_LT(sender, senders);
    EXPECT_EQ(seq, next[sender]) << "sender " << sender << " out of order";
    EXPECT_EQ(line, Line(sender, seq, size));
    next[sender] = seq + 1;
    ++lines;
    pos = end + 1;
  }
  EXPECT_EQ(lines, senders * per_sender);
}

class FdWriterTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    previous_ = ::signal(SIGPIPE, GetParam() ? SIG_IGN : SIG_DFL);
    ASSERT_EQ(::pipe(fds_), 0);
  }
  void TearDown() override {
    if (fds_[0] >= 0) ::close(fds_[0]);
    ::signal(SIGPIPE, previous_);
  }
  int fds_[2] = {-1, -1};
  sighandler_t previous_ = SIG_DFL;
};

// Lines larger than the pipe's buffer, from four threads at once, while the
// reader drains slowly: Send writes what fits and queues the rest.
TEST_P(FdWriterTest, ConcurrentSendersKeepEachOthersLinesWholeAndInOrder) {
  constexpr int kSenders = 4, kPerSender = 50;
  constexpr size_t kSize = 100 * 1024;
  std::string received;
  std::thread reader([&] { received = ReadAll(fds_[0]); });
  {
    FdWriter writer(fds_[1]);
    std::vector<std::thread> senders;
    for (int s = 0; s < kSenders; ++s) {
      senders.emplace_back([&, s] {
        for (int i = 0; i < kPerSender; ++i) ASSERT_TRUE(writer.Send(Line(s, i, kSize)));
      });
    }
    for (std::thread& t : senders) t.join();
    writer.Close();
    EXPECT_TRUE(writer.AwaitClosed(std::chrono::seconds(30)));
  }
  reader.join();
  ExpectOrderedLines(received, kSenders, kPerSender, kSize);
}

TEST_P(FdWriterTest, SmallLinesArriveInOrderAndCloseGivesEof) {
  std::string received;
  std::thread reader([&] { received = ReadAll(fds_[0]); });
  {
    FdWriter writer(fds_[1]);
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(writer.Send(Line(0, i, 64)));
    writer.Close();
    EXPECT_FALSE(writer.Send(Line(0, 1000, 64))) << "Send after Close must refuse";
    EXPECT_TRUE(writer.AwaitClosed(std::chrono::seconds(30)));
  }
  reader.join();
  ExpectOrderedLines(received, 1, 1000, 64);
}

// A peer that closed its end: Send reports it (EPIPE), never kills the
// process, whichever thread writes.
TEST_P(FdWriterTest, PeerClosedMakesSendFail) {
  ::close(fds_[0]);
  fds_[0] = -1;
  FdWriter writer(fds_[1]);
  bool refused = false;
  for (int i = 0; i < 10000 && !refused; ++i) {
    refused = !writer.Send(Line(0, i, 4096));
    if (!refused) std::this_thread::yield();
  }
  EXPECT_TRUE(refused);
  EXPECT_TRUE(writer.AwaitClosed(std::chrono::seconds(30)));
}

INSTANTIATE_TEST_SUITE_P(SigpipeIgnoredOrNot, FdWriterTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "InlineWrites" : "WriterThreadOnly";
                         });

}  // namespace
}  // namespace idem::mcp
