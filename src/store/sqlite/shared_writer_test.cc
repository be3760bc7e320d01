// The shared writer (shared_writer.h): the stores on one file hand their
// writes to the one that serves, which commits them together; a process that
// finds the server gone serves itself; a call whose server died before
// answering is settled from the file.
#include "shared_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "sqlite_store.h"
#include "test_support.h"
#include "write_lock.h"
#include "writer_protocol.h"

namespace idem::shared_writer_test {
namespace {

using testing::Eventually;
using testing::kTtl;
using testing::Req;

Outcome Ok(std::string body) { return Outcome{OutcomeClass::kSuccess, std::move(body)}; }

Attempt Entry(const std::string& key, AttemptOutcome outcome) {
  Attempt a;
  a.at = FromUnixMillis(1'767'225'600'000);
  a.tenant = "default";
  a.key = key;
  a.tool = "charge";
  a.turn = "turn-1";
  a.outcome = outcome;
  a.instance = "test";
  return a;
}

// A claim of `key` by the attempt with owner token "this-attempt".
ClaimRequest OwnedReq(const std::string& key) {
  ClaimRequest req = Req(key);
  req.owner = "this-attempt";
  return req;
}

class SharedWriterTest : public testing::SqliteFileTest {};

TEST_F(SharedWriterTest, TheFirstStoreServesAndTheSecondHandsItsWritesToIt) {
  auto first = Open();
  auto second = Open();
  ASSERT_TRUE(first && second);
  EXPECT_TRUE(first->serves_writes());
  EXPECT_FALSE(second->serves_writes());

  for (int i = 0; i < 5; ++i) {
    ClaimRequest req = Req("k" + std::to_string(i));
    req.owner = "owner-" + std::to_string(i);
    req.logged = Entry(req.id.key, AttemptOutcome::kClaimed);
    auto c = second->Claim(req);
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_TRUE(c->claimed);
    EXPECT_EQ(c->record.owner, req.owner);
    const Attempt done = Entry(req.id.key, AttemptOutcome::kExecuted);
    auto r = second->Complete(c->record.id, c->record.fence, Ok("body"), kTtl, &done);
    ASSERT_TRUE(r) << r.error().ToString();
    EXPECT_EQ(r->state, RecordState::kCompleted);
    EXPECT_EQ(r->outcome->body, "body");
  }
  ASSERT_TRUE(second->AppendAttempts({Entry("k0", AttemptOutcome::kReplayed)}));

  EXPECT_EQ(second->writes(), 0u);  // its own writer committed nothing
  EXPECT_EQ(second->writes_sent(), 11u);
  EXPECT_EQ(first->writes_served(), 11u);
  EXPECT_EQ(first->writes(), 11u);

  // Both see the records and one chain of 11 entries.
  auto seen = first->Get(RecordId{"default", "k4"});
  ASSERT_TRUE(seen && *seen);
  EXPECT_EQ((*seen)->state, RecordState::kCompleted);
  auto heads = second->ChainHeads(std::nullopt);
  ASSERT_TRUE(heads);
  ASSERT_EQ(heads->size(), 1u);
  EXPECT_EQ((*heads)[0].seq, 11u);

  // A fenced write through the server keeps its answer: a stale fence is
  // refused with the same error as a local write.
  auto c = second->Claim(Req("stale"));
  ASSERT_TRUE(c && c->claimed);
  auto stale = second->Complete(c->record.id, c->record.fence + 1, Ok("x"), kTtl);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, ErrorCode::kAborted) << stale.error().ToString();
}

// Deterministic: the write lock is held while the writes of both stores
// queue at the server's writer, so they share one transaction.
TEST_F(SharedWriterTest, WritesOfTwoStoresShareOneTransaction) {
  auto first = Open();
  auto second = Open();
  ASSERT_TRUE(first && second && first->serves_writes());
  auto lock = sqlite::WriteLock::Open(path_);
  ASSERT_TRUE(lock);
  ASSERT_TRUE((*lock)->Acquire());
  const uint64_t commits_before = first->commits();

  constexpr int kEach = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2 * kEach; ++i) {
    SqliteStore* store = i % 2 == 0 ? first.get() : second.get();
    threads.emplace_back([&, store, i] {
      auto c = store->Claim(Req("q" + std::to_string(i)));
      if (!c || !c->claimed) ++failures;
    });
  }
  ASSERT_TRUE(Eventually([&] { return first->pending_writes() == 2 * kEach; }));
  (*lock)->Release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // The writer may have taken the first write before it waited for the lock.
  EXPECT_LE(first->commits() - commits_before, 2u);
  EXPECT_EQ(first->writes_served(), static_cast<uint64_t>(kEach));
  EXPECT_EQ(second->commits(), 0u);
}

TEST_F(SharedWriterTest, WhenTheServerGoesTheNextStoreToWriteServes) {
  auto first = Open();
  auto second = Open();
  auto third = Open();
  ASSERT_TRUE(first && second && third);
  auto c = second->Claim(Req("before"));
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(first->writes_served(), 1u);

  first.reset();
  auto after = second->Claim(Req("after"));
  ASSERT_TRUE(after) << after.error().ToString();
  EXPECT_TRUE(after->claimed);
  EXPECT_TRUE(second->serves_writes());
  EXPECT_EQ(second->writes(), 1u);  // written itself, as the new server

  auto third_claim = third->Claim(Req("third"));
  ASSERT_TRUE(third_claim && third_claim->claimed);
  EXPECT_FALSE(third->serves_writes());
  EXPECT_EQ(second->writes_served(), 1u);
}

// The reply holds the record with its outcome: one larger than the
// socket's buffer is sent in part by the writer and the rest by a thread of
// its own.
TEST_F(SharedWriterTest, AReplyLargerThanTheSocketBufferArrivesWhole) {
  auto first = Open();
  auto second = Open();
  ASSERT_TRUE(first && second && first->serves_writes());
  std::string body(4 << 20, 'x');
  for (size_t i = 0; i < body.size(); i += 4096) body[i] = static_cast<char>('a' + i / 4096 % 26);
  auto c = second->Claim(Req("big"));
  ASSERT_TRUE(c && c->claimed);
  auto r = second->Complete(c->record.id, c->record.fence, Ok(body), kTtl);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->outcome->body, body);
  EXPECT_EQ(first->writes_served(), 2u);
}

TEST_F(SharedWriterTest, SharedWriterOffWritesItself) {
  auto first = Open();
  auto second = Open("?shared_writer=off");
  ASSERT_TRUE(first && second);
  auto c = second->Claim(Req("k"));
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(second->writes(), 1u);
  EXPECT_EQ(first->writes_served(), 0u);
  EXPECT_FALSE(second->serves_writes());
}

TEST_F(SharedWriterTest, AConnectionPastTheLimitWritesItself) {
  auto first = Open("?shared_writer_clients=1");
  auto second = Open();
  auto third = Open();
  ASSERT_TRUE(first && second && third);
  ASSERT_TRUE(second->Claim(Req("a")));  // holds the one connection
  auto c = third->Claim(Req("b"));
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ(first->writes_served(), 1u);
  EXPECT_EQ(third->writes(), 1u);
}

TEST_F(SharedWriterTest, APathTooLongForASocketCommitsAlone) {
  const std::string deep = dir_.File(std::string(100, 'd')) + "/idem.db";
  auto first = SqliteStore::Open(deep, clock_, StoreOptions{});
  auto second = SqliteStore::Open(deep, clock_, StoreOptions{});
  ASSERT_TRUE(first && second);
  EXPECT_FALSE((*first)->serves_writes());
  auto c = (*second)->Claim(Req("k"));
  ASSERT_TRUE(c && c->claimed);
  EXPECT_EQ((*second)->writes(), 1u);
  EXPECT_EQ((*second)->writes_sent(), 0u);
}

TEST_F(SharedWriterTest, BadParametersAreRefused) {
  for (const char* params : {"?shared_writer=maybe", "?shared_writer_clients=0",
                             "?shared_writer_clients=many", "?shared_writer_clients="}) {
    auto store = SqliteStore::Open(path_ + params, clock_, StoreOptions{});
    ASSERT_FALSE(store) << params;
    EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(store.error().message.find("shared_writer"), std::string::npos)
        << store.error().message;
  }
}

// A server that answers the hello, takes one call, optionally runs it on
// `store` (a store of its own that writes the file itself), and then closes
// the connection without a reply: a server that died between its commit
// and its answer, or before it ran the call at all. With `hold`, it waits for
// it first: a server stopped (SIGSTOP) with the call in hand, which its
// client gives up on and which goes on later.
class DyingServer {
 public:
  DyingServer(const std::string& path, SqliteStore* store, std::shared_future<void> hold = {})
      : store_(store), hold_(std::move(hold)) {
    lock_fd_ =
        ::open(sqlite::SharedWriterLockPath(path).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) std::abort();
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socket_path_ = sqlite::SharedWriterSocketPath(path);
    ::unlink(socket_path_.c_str());
    const std::string& socket_path = socket_path_;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 4) != 0) {
      std::abort();
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~DyingServer() {
    Join();
    ::close(listen_fd_);
    ::unlink(socket_path_.c_str());
    ::close(lock_fd_);
  }

 private:
  static std::string Read(int fd) {
    uint32_t n = 0;
    if (::recv(fd, &n, 4, MSG_WAITALL) != 4) return {};
    std::string body(n, '\0');
    if (n > 0 && ::recv(fd, body.data(), n, MSG_WAITALL) != static_cast<ssize_t>(n)) return {};
    return body;
  }
  static void Write(int fd, std::string_view body) {
    const auto n = static_cast<uint32_t>(body.size());
    ::send(fd, &n, 4, MSG_NOSIGNAL);
    ::send(fd, body.data(), body.size(), MSG_NOSIGNAL);
  }
  void Run() {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    Read(fd);  // the hello
    Write(fd, "\x01");
    auto call = sqlite::wire::DecodeCall(Read(fd));
    if (hold_.valid()) hold_.wait();
    if (store_ && call) {
      if (auto* c = std::get_if<sqlite::wire::ClaimCall>(&*call)) {
        auto r = store_->Claim(c->req);
        late_claimed = r && r->claimed;
      }
      if (auto* c = std::get_if<sqlite::wire::CompleteCall>(&*call)) {
        late_completed = store_->Complete(c->id, c->fence, c->outcome, c->retention).has_value();
      }
    }
    ::close(fd);
  }

 public:
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // What running the call did (read after Join).
  bool late_claimed = false;
  bool late_completed = false;

 private:
  SqliteStore* store_;
  std::shared_future<void> hold_;
  std::string socket_path_;
  int lock_fd_ = -1;
  int listen_fd_ = -1;
  std::thread thread_;
};

TEST_F(SharedWriterTest, AClaimWhoseServerDiedAfterCommittingIsTheCallersOwn) {
  auto direct = Open("?shared_writer=off");
  ASSERT_TRUE(direct);
  DyingServer server(path_, direct.get());
  auto client = Open();
  ASSERT_TRUE(client && !client->serves_writes());
  const ClaimRequest req = OwnedReq("k");
  auto c = client->Claim(req);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
  EXPECT_EQ(c->record.owner, "this-attempt");
  EXPECT_EQ(direct->writes(), 1u);  // the dead server's commit
  EXPECT_EQ(client->writes(), 0u);  // and nothing written again
}

TEST_F(SharedWriterTest, AClaimWhoseServerDiedBeforeRunningItIsWrittenByTheCaller) {
  DyingServer server(path_, nullptr);
  auto client = Open();
  ASSERT_TRUE(client && !client->serves_writes());
  const ClaimRequest req = OwnedReq("k");
  auto c = client->Claim(req);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
  EXPECT_EQ(client->writes(), 1u);
}

TEST_F(SharedWriterTest, ACompletionWhoseServerDiedIsSettledFromTheFile) {
  auto direct = Open("?shared_writer=off");
  ASSERT_TRUE(direct);
  auto c = direct->Claim(Req("committed"));
  auto d = direct->Claim(Req("not-run"));
  ASSERT_TRUE(c && c->claimed && d && d->claimed);
  {
    DyingServer server(path_, direct.get());
    auto client = Open();
    ASSERT_TRUE(client);
    auto r = client->Complete(c->record.id, c->record.fence, Ok("once"), kTtl);
    ASSERT_TRUE(r) << r.error().ToString();
    EXPECT_EQ(r->outcome->body, "once");
    EXPECT_EQ(client->writes(), 0u);
    EXPECT_EQ(direct->writes(), 3u);
  }
  DyingServer server(path_, nullptr);
  auto client = Open();
  ASSERT_TRUE(client);
  auto r = client->Complete(d->record.id, d->record.fence, Ok("mine"), kTtl);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->state, RecordState::kCompleted);
  EXPECT_EQ(client->writes(), 1u);
}

TEST(WriterProtocolTest, CallsAndRepliesRoundTripAndEveryTruncationIsRefused) {
  ClaimRequest req = Req("k");
  req.owner = "o";
  req.logged = Entry("k", AttemptOutcome::kClaimed);
  const TimePoint now = FromUnixMillis(1'767'225'600'123);
  const std::string call = sqlite::wire::EncodeClaim(req, now);
  auto decoded = sqlite::wire::DecodeCall(call);
  ASSERT_TRUE(decoded);
  const auto& claim = std::get<sqlite::wire::ClaimCall>(*decoded);
  EXPECT_EQ(claim.now, now);
  EXPECT_EQ(claim.req.id, req.id);
  EXPECT_EQ(claim.req.owner, "o");
  EXPECT_EQ(claim.req.lease, req.lease);
  ASSERT_TRUE(claim.req.logged);
  EXPECT_EQ(claim.req.logged->outcome, AttemptOutcome::kClaimed);
  for (size_t n = 0; n < call.size(); ++n) {
    EXPECT_FALSE(sqlite::wire::DecodeCall(call.substr(0, n))) << n;
  }
  EXPECT_FALSE(sqlite::wire::DecodeCall(call + "x"));

  Record r;
  r.id = req.id;
  r.state = RecordState::kCompleted;
  r.fence = 42;
  r.outcome = Ok(std::string("a\0b", 3));
  const std::string reply = sqlite::wire::EncodeReply(Result<Record>(r));
  auto back = sqlite::wire::DecodeRecordReply(reply);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->fence, 42u);
  EXPECT_EQ(back->outcome->body, std::string("a\0b", 3));
  for (size_t n = 0; n < reply.size(); ++n) {
    auto cut = sqlite::wire::DecodeRecordReply(reply.substr(0, n));
    ASSERT_FALSE(cut) << n;
    EXPECT_EQ(cut.error().code, ErrorCode::kInternal);
  }

  const std::string error = sqlite::wire::EncodeReply(
      Result<Record>(std::unexpected(Error{ErrorCode::kAborted, "fence moved"})));
  auto failed = sqlite::wire::DecodeRecordReply(error);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, ErrorCode::kAborted);
  EXPECT_EQ(failed.error().message, "fence moved");
}

// A server that does not answer (stopped) is given up on after the reply
// timeout (the busy timeout); the caller settles the call from the file and
// writes it itself, and the server's late copy of it changes nothing.
TEST_F(SharedWriterTest, AServerThatDoesNotAnswerInTimeIsGivenUpOnAndItsLateWritesChangeNothing) {
  auto direct = Open("?shared_writer=off");
  ASSERT_TRUE(direct);
  StoreOptions options;
  options.sqlite_busy_timeout = std::chrono::milliseconds(100);
  const ClaimRequest req = OwnedReq("k");

  std::promise<void> release_claim;
  auto server =
      std::make_unique<DyingServer>(path_, direct.get(), release_claim.get_future().share());
  auto client = Open("", options);
  ASSERT_TRUE(client);
  auto c = client->Claim(req);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
  EXPECT_EQ(client->writes(), 1u);  // written itself
  // Given up on for a while: the next write does not ask it again.
  auto other = client->Claim(Req("other"));
  ASSERT_TRUE(other && other->claimed);
  EXPECT_EQ(client->writes(), 2u);
  EXPECT_EQ(client->writes_sent(), 1u);
  release_claim.set_value();
  server->Join();
  EXPECT_FALSE(server->late_claimed);  // it found the caller's record
  server.reset();
  client.reset();

  // The same for a completion, whose late copy is refused by its fence.
  std::promise<void> release_completion;
  server =
      std::make_unique<DyingServer>(path_, direct.get(), release_completion.get_future().share());
  client = Open("", options);
  ASSERT_TRUE(client);
  auto r = client->Complete(c->record.id, c->record.fence, Ok("once"), kTtl);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->outcome->body, "once");
  release_completion.set_value();
  server->Join();
  EXPECT_FALSE(server->late_completed);
  auto stored = direct->Get(c->record.id);
  ASSERT_TRUE(stored && *stored);
  EXPECT_EQ((*stored)->outcome->body, "once");
}

// Found by fuzz/shared_writer_protocol_fuzz.cc: an append whose count asked
// for more entries than the bytes could hold was taken for a call.
TEST(WriterProtocolTest, AnAppendWhoseCountExceedsTheBytesIsRefused) {
  const std::string bytes("\x03\x7b\x05\x00\x00\x00\x00\x00\x00", 9);
  auto call = sqlite::wire::DecodeCall(bytes);
  ASSERT_FALSE(call);
  EXPECT_EQ(call.error().code, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(sqlite::wire::DecodeCall(std::string_view("\x07", 1)));  // no such call
}

}  // namespace
}  // namespace idem::shared_writer_test
