// ResolveRecord on the memory store and a FakeClock.
#include "idem/resolve.h"

#include <gtest/gtest.h>

#include "memory_store.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

// Review H2: resolve stored its outcome with the tool's policy ttl (24 h),
// not the retention the claim decided and the record keeps: a record of a
// call without a turn id (the window, 1 h) resolved by an operator was kept
// 24 h. Every other step keeps the record's retention.
TEST(ResolveTest, AStoredOutcomeKeepsTheRecordsRetention) {
  FakeClock clock;
  std::unique_ptr<Store> store = NewMemoryStore(clock);
  const RecordId id{"default", "v1a.k"};
  ClaimRequest claim{id, "fp", "charge", ""};
  claim.retention = 1h;  // the window: no turn id came
  auto claimed = store->Claim(claim);
  ASSERT_TRUE(claimed && claimed->claimed);
  ASSERT_TRUE(store->MarkUnknown(id, claimed->record.fence, 1h));
  clock.Advance(10min);

  Policy policy;
  policy.ttl = 24h;
  ResolveRequest req;
  req.id = id;
  req.outcome = Outcome{OutcomeClass::kSuccess, "charged"};
  auto resolved = ResolveRecord(*store, clock, [&](const std::string&) { return policy; }, req,
                                Operator{"ops", "cli", "test"});
  ASSERT_TRUE(resolved) << resolved.error().ToString();
  ASSERT_EQ(resolved->kind, Resolution::Kind::kStored);
  EXPECT_EQ(resolved->record.expires_at, clock.Now() + 1h);
  EXPECT_EQ(resolved->record.retention, Duration(1h));
}

}  // namespace
}  // namespace idem
