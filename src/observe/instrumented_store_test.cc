// InstrumentedStore: every call reaches the wrapped store, is timed by
// operation, and its errors are counted by code.
#include "observe/instrumented_store.h"

#include <gtest/gtest.h>

#include "memory_store.h"
#include "observe/exposition_lines.h"
#include "store_wrapper.h"

namespace idem {
namespace {

TEST(InstrumentedStoreTest, TimesEveryOperationAndCountsErrorsByCode) {
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  MetricsRegistry registry;
  InstrumentedStore store(*memory, registry);

  RecordId id{"default", "k1"};
  auto claim = store.Claim(ClaimRequest{id, "fp", "charge", "turn"});
  ASSERT_TRUE(claim && claim->claimed);
  ASSERT_TRUE(store.Complete(id, claim->record.fence, Outcome{}, Duration(60'000)));
  auto got = store.Get(id);
  ASSERT_TRUE(got && got->has_value());
  // A stale fence: the wrapped store's error comes back unchanged, and counted.
  auto stale = store.Release(id, claim->record.fence + 7);
  ASSERT_FALSE(stale);
  const ErrorCode code = stale.error().code;
  ASSERT_TRUE(store.CountRecords());

  const std::string text = registry.Render();
  EXPECT_TRUE(Has(text, R"(idemgate_store_operation_duration_seconds_count{op="claim"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_store_operation_duration_seconds_count{op="complete"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_store_operation_duration_seconds_count{op="get"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_store_operation_duration_seconds_count{op="release"} 1)"));
  EXPECT_TRUE(Has(text, R"(idemgate_store_operation_duration_seconds_count{op="abandon"} 0)"));
  EXPECT_TRUE(Has(text, R"(idemgate_store_errors_total{op="release",code=")" +
                            std::string(ErrorCodeName(code)) + R"("} 1)"));
  EXPECT_EQ(text.find("idemgate_store_errors_total{op=\"claim\""), std::string::npos);
}

TEST(InstrumentedStoreTest, UnavailableStoreIsCounted) {
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  testing::FailingStore failing(*memory, /*fail_at=*/1);
  MetricsRegistry registry;
  InstrumentedStore store(failing, registry);
  auto claim = store.Claim(ClaimRequest{RecordId{"default", "k"}, "fp", "t", ""});
  ASSERT_FALSE(claim);
  EXPECT_EQ(claim.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(
      Has(registry.Render(), R"(idemgate_store_errors_total{op="claim",code="unavailable"} 1)"));
}

TEST(InstrumentedStoreTest, AsynchronousReadsAreTimedAsGets) {
  FakeClock clock;
  std::unique_ptr<Store> memory = NewMemoryStore(clock);
  testing::InlineAsyncReads reads(*memory);
  MetricsRegistry registry;
  InstrumentedStore store(reads, registry);
  bool answered = false;
  ASSERT_TRUE(store.GetAsync(RecordId{"default", "absent"}, [&](Result<std::optional<Record>> r) {
    answered = r && !r->has_value();
  })) << "the wrapper passes the read on";
  EXPECT_TRUE(answered);
  EXPECT_TRUE(
      Has(registry.Render(), R"(idemgate_store_operation_duration_seconds_count{op="get"} 1)"));
}

}  // namespace
}  // namespace idem
