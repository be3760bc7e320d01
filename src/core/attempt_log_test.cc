#include "core/attempt_log.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>

#include "idem/forwarding_store.h"
#include "memory_store.h"

namespace idem {
namespace {

// A store whose audit appends wait until Open(), as a store that writes
// more slowly than calls arrive would make them.
class SlowAppends final : public ForwardingStore {
 public:
  explicit SlowAppends(Store& target) : ForwardingStore(target) {}

  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override {
    {
      std::unique_lock g(mu_);
      ++entered_;
      cv_.notify_all();
      cv_.wait(g, [&] { return open_; });
    }
    return target_.AppendAttempts(attempts);
  }

  void AwaitEntered(int n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return entered_ >= n; });
  }

  void Open() {
    std::lock_guard g(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  bool open_ = false;
};

Attempt AttemptOf(const std::string& key) {
  Attempt a;
  a.at = FromUnixMillis(1'767'225'600'000);
  a.tenant = "default";
  a.key = key;
  a.tool = "charge";
  return a;
}

TEST(AttemptLogTest, AttemptsPastTheBacklogWhileTheStoreIsSlowAreDroppedAndReported) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  SlowAppends slow(*memory);
  ::testing::internal::CaptureStderr();
  {
    AttemptLog log(slow, /*batch=*/1, Duration(200), /*max_backlog=*/3);
    log.Append(AttemptOf("first"));  // taken by the flusher, which waits in the store
    slow.AwaitEntered(1);
    for (int i = 0; i < 5; ++i) log.Append(AttemptOf("k" + std::to_string(i)));
    EXPECT_EQ(log.drops().backlog, 2u);
    EXPECT_EQ(log.drops().refused, 0u);
    slow.Open();
  }  // flushes what waits
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("dropped 2 attempts: 3 were already waiting"), std::string::npos) << err;
  EXPECT_NE(err.find("max_audit_backlog"), std::string::npos) << err;
  auto kept = memory->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(kept);
  ASSERT_EQ(kept->size(), 4u);  // the first, and the three that waited: k0, k1, k2
  EXPECT_EQ(kept->front().key, "k2");
  EXPECT_EQ(kept->back().key, "first");
}

// A store that refuses every batch of audit entries.
class RefusingAppends final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<void> AppendAttempts(const std::vector<Attempt>&) override {
    return std::unexpected(Error{ErrorCode::kUnavailable, "the disk is full"});
  }
};

TEST(AttemptLogTest, BatchesTheStoreRefusesAreCountedAndReported) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  RefusingAppends refusing(*memory);
  ::testing::internal::CaptureStderr();
  {
    AttemptLog log(refusing, /*batch=*/100, Duration(200), /*max_backlog=*/100);
    log.Append(AttemptOf("a"));
    log.Append(AttemptOf("b"));
    log.Flush();
    log.Append(AttemptOf("c"));
    log.Flush();
    EXPECT_EQ(log.drops().refused, 3u);
    EXPECT_EQ(log.drops().backlog, 0u);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("dropped 2 attempts: "), std::string::npos) << err;
  EXPECT_NE(err.find("the disk is full"), std::string::npos) << err;
}

TEST(AttemptLogTest, AStoreThatKeepsUpDropsNothing) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  ::testing::internal::CaptureStderr();
  {
    AttemptLog log(*memory, /*batch=*/2, Duration(200), /*max_backlog=*/2);
    for (int i = 0; i < 10; ++i) {
      log.Append(AttemptOf("k" + std::to_string(i)));
      log.Flush();
    }
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  auto kept = memory->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->size(), 10u);
}

}  // namespace
}  // namespace idem
