// The store contract suite (docs/DESIGN.md §5): every backend instantiates it
// unchanged with an opener for a fresh, empty store:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, StoreContractTest,
//       testing::Values(StoreContractParam{"sqlite", [](idem::Clock& c) { ... }}));
//
// Time is a FakeClock: leases and retention are exercised without sleeping.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "idem/clock.h"
#include "idem/store.h"

struct StoreContractParam {
  std::string name;
  std::function<std::unique_ptr<idem::Store>(idem::Clock&)> open;
  // GetAsync may take some reads and refuse others: a CachingStore answers
  // what it holds even above a store that has no asynchronous read.
  bool reads_some_async = false;
};

inline std::string PrintToString(const StoreContractParam& p) { return p.name; }

class StoreContractTest : public testing::TestWithParam<StoreContractParam> {
 protected:
  void SetUp() override {
    store_ = GetParam().open(clock_);
    ASSERT_NE(store_, nullptr);
  }
  idem::FakeClock clock_;
  std::unique_ptr<idem::Store> store_;
};

// An audit entry of `tenant` for the chain tests (tool "charge", turn-1,
// instance i-1, latency 3 ms).
idem::Attempt AuditEntry(const std::string& tenant, const std::string& key, int64_t at_ms,
                         const std::string& detail = "",
                         idem::AttemptOutcome outcome = idem::AttemptOutcome::kReplayed);

// For the backends' migration tests: `store` holds the in-progress record
// default/"old" written before claims carried owner tokens. It reads with no
// owner and no token abandons it; a new claim carries its owner, who can.
void ExpectOwnerlessRecordAndOwnedClaims(idem::Store& store);

// For the backends' migrations of the outcome index: `store` holds an
// `executed` entry of key "a" and an `unknown` one of "b" written before
// the migration, and a query by each outcome finds its own alone.
void ExpectEntriesFoundByOutcome(idem::Store& store);

// For stores that instances on several machines share (Redis, PostgreSQL):
// `open(clock)` opens one more instance on the same data, fresh for this test
// (its first open finds no record "skew" or "skew-control"). Two instances whose
// clocks are 25 s apart: deciding by their own clocks, the one ahead takes a
// live owner's call over (the control, which must show the hazard); with
// StoreClocks synced to the server they agree that the lease is live, and
// still take over once it has really run out.
void ExpectSkewedInstancesAgreeOnLeases(
    const std::function<std::unique_ptr<idem::Store>(idem::Clock&)>& open);
