// StoreProbe: ready when the store answers, not ready when it errs or hangs.
#include "observe/store_probe.h"

#include <gtest/gtest.h>

#include <future>

#include "memory_store.h"
#include "store_wrapper.h"

namespace idem {
namespace {

// A store whose Get blocks until released (a hung backend), or fails.
class StuckStore : public testing::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::optional<Record>> Get(const RecordId& id) override {
    if (fail) return MakeError(ErrorCode::kUnavailable, "connection refused");
    if (stuck) release.get_future().wait();
    return StoreWrapper::Get(id);
  }
  bool fail = false;
  bool stuck = false;
  std::promise<void> release;
};

TEST(StoreProbeTest, ReadyWhenTheStoreAnswers) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  StoreProbe probe(*memory, clock);
  EXPECT_TRUE(probe.Check());
  EXPECT_TRUE(probe.Check());
}

TEST(StoreProbeTest, TheStoresErrorWhenItFails) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  StuckStore store(*memory);
  store.fail = true;
  StoreProbe probe(store, clock);
  auto r = probe.Check();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
}

TEST(StoreProbeTest, DeadlineExceededWhileTheStoreHangs) {
  FakeClock clock;
  auto memory = NewMemoryStore(clock);
  StuckStore store(*memory);
  store.stuck = true;
  StoreProbe probe(store, clock, Duration(2'000));
  auto checking = std::async(std::launch::async, [&] { return probe.Check(); });
  clock.AwaitWaiters(1);
  clock.Advance(Duration(2'000));
  auto r = checking.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded);
  // The read still hangs: the next check answers at once.
  auto again = probe.Check();
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kDeadlineExceeded);
  store.release.set_value();
}

}  // namespace
}  // namespace idem
