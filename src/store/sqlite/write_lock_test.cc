// The write lock with real processes: writers of several processes on one
// file take turns without losing a write or claiming a key twice, and a
// writer asleep on the lock proceeds when its holder is killed.
#include "write_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "sqlite_store.h"
#include "test_support.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;
using testing::kTtl;
using testing::Req;
using testing::TempDir;

// A child process that takes the write lock of `db` with flock, says so on
// a pipe and sleeps until killed; only async-signal-safe calls after fork.
// Returns its pid once it holds the lock, or -1.
pid_t ChildHoldingTheLock(const std::string& db) {
  const std::string lock_path = sqlite::WriteLockPath(db);
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    const char held = 'h';
    if (::write(ready[1], &held, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char held = 0;
  const bool ok = pid > 0 && ::read(ready[0], &held, 1) == 1;
  ::close(ready[0]);
  return ok ? pid : -1;
}

TEST(WriteLockTest, AWriterAsleepOnTheLockProceedsWhenItsHolderIsKilled) {
  TempDir dir;
  const std::string db = dir.File("idem.db");
  const pid_t holder = ChildHoldingTheLock(db);
  ASSERT_GT(holder, 0);
  FakeClock clock;
  auto store = SqliteStore::Open(db, clock, {});
  ASSERT_TRUE(store) << store.error().ToString();

  Result<ClaimResult> claim = MakeError(ErrorCode::kInternal, "not run");
  std::thread writer([&] { claim = (*store)->Claim(Req("k")); });
  ASSERT_TRUE(Eventually([&] { return (*store)->write_lock_waits() == 1; }));
  EXPECT_EQ((*store)->commits(), 0u);
  EXPECT_EQ((*store)->pending_writes(), 1u);

  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(holder, &status, 0), holder);
  EXPECT_TRUE(WIFSIGNALED(status));
  writer.join();
  ASSERT_TRUE(claim) << claim.error().ToString();
  EXPECT_TRUE(claim->claimed);
  EXPECT_EQ((*store)->commits(), 1u);
}

TEST(WriteLockTest, TwoLocksOnOneFileInOneProcessExcludeEachOther) {
  TempDir dir;
  const std::string db = dir.File("idem.db");
  auto a = sqlite::WriteLock::Open(db);
  auto b = sqlite::WriteLock::Open(db);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE((*a)->Acquire());
  std::atomic<bool> b_held{false};
  std::thread other([&] { b_held = (*b)->Acquire().has_value(); });
  ASSERT_TRUE(Eventually([&] { return (*b)->waits() == 1; }));
  EXPECT_FALSE(b_held.load()) << "b went through while a held the lock";
  (*a)->Release();
  other.join();
  EXPECT_TRUE(b_held);
  (*b)->Release();
  EXPECT_EQ((*a)->waits(), 0u);
}

constexpr int kProcesses = 4;
constexpr int kOwnKeys = 25;
constexpr int kSharedKeys = 25;

// One contending process: claims and completes its own keys and tries to
// claim every shared key, completing those it wins. Its exit status is the
// number of shared keys it won, or 255 on an error.
[[noreturn]] void Contend(const std::string& db, int child) {
  auto store = OpenSqliteStore(db, SystemClock::Default(), {});
  if (!store) ::_exit(255);
  const std::string body = "child-" + std::to_string(child);
  int won = 0;
  for (int i = 0; i < std::max(kOwnKeys, kSharedKeys); ++i) {
    std::vector<std::string> keys;
    if (i < kOwnKeys) keys.push_back(body + "-key-" + std::to_string(i));
    if (i < kSharedKeys) keys.push_back("shared-" + std::to_string(i));
    for (const std::string& key : keys) {
      auto c = (*store)->Claim(Req(key));
      if (!c) ::_exit(255);
      if (!c->claimed) continue;
      if (!(*store)->Complete(c->record.id, c->record.fence, {OutcomeClass::kSuccess, body},
                              kTtl)) {
        ::_exit(255);
      }
      if (key.starts_with("shared-")) ++won;
    }
  }
  store->reset();
  ::_exit(won);
}

// Forks before this process opens anything, so each child starts with one
// thread and may start its store's threads.
TEST(WriteLockTest, ProcessesOnOneFileLoseNoWriteAndClaimEachKeyOnce) {
  TempDir dir;
  const std::string db = dir.File("idem.db");
  std::vector<pid_t> children;
  for (int child = 0; child < kProcesses; ++child) {
    const pid_t pid = ::fork();
    if (pid == 0) Contend(db, child);
    ASSERT_GT(pid, 0);
    children.push_back(pid);
  }
  int won = 0;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_NE(WEXITSTATUS(status), 255) << "a child's store failed";
    won += WEXITSTATUS(status);
  }
  EXPECT_EQ(won, kSharedKeys) << "each shared key is claimed exactly once";

  FakeClock clock;
  auto store = SqliteStore::Open(db, clock, {});
  ASSERT_TRUE(store) << store.error().ToString();
  EXPECT_EQ(*(*store)->CountRecords(), uint64_t{kProcesses * kOwnKeys + kSharedKeys});
  for (int child = 0; child < kProcesses; ++child) {
    const std::string body = "child-" + std::to_string(child);
    for (int i = 0; i < kOwnKeys; ++i) {
      auto got = (*store)->Get(RecordId{"default", body + "-key-" + std::to_string(i)});
      ASSERT_TRUE(got && got->has_value()) << body << " key " << i;
      EXPECT_EQ((*got)->state, RecordState::kCompleted);
      EXPECT_EQ((*got)->outcome->body, body);
    }
  }
  for (int i = 0; i < kSharedKeys; ++i) {
    auto got = (*store)->Get(RecordId{"default", "shared-" + std::to_string(i)});
    ASSERT_TRUE(got && got->has_value()) << "shared key " << i;
    EXPECT_EQ((*got)->state, RecordState::kCompleted);
  }
}

TEST(WriteLockTest, WriteLockNoneUsesNoLockFile) {
  TempDir dir;
  const std::string db = dir.File("idem.db");
  auto held = sqlite::WriteLock::Open(db);
  ASSERT_TRUE(held);
  ASSERT_TRUE((*held)->Acquire());  // would stop a store that takes the lock
  FakeClock clock;
  auto store = OpenSqliteStore(db + "?write_lock=none", clock, {});
  ASSERT_TRUE(store) << store.error().ToString();
  auto c = (*store)->Claim(Req("k"));
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->claimed);
  EXPECT_FALSE(std::filesystem::exists(db + "?write_lock=none"));
}

TEST(WriteLockTest, UnknownParameterIsInvalid) {
  TempDir dir;
  FakeClock clock;
  for (const char* params : {"?write_lock=maybe", "?busy=1", "?write_lock=none&x=y"}) {
    auto store = OpenSqliteStore(dir.File("idem.db") + params, clock, {});
    ASSERT_FALSE(store) << params;
    EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(store.error().message.find("write_lock=flock|none"), std::string::npos)
        << store.error().message;
  }
  auto explicit_default = OpenSqliteStore(dir.File("idem.db") + "?write_lock=flock", clock, {});
  EXPECT_TRUE(explicit_default) << explicit_default.error().ToString();
}

}  // namespace
}  // namespace idem
