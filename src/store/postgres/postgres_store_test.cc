// The PostgreSQL store against a real PostgreSQL 15 server: the contract
// suite, plus what only a shared server shows (several instances, NOTIFY,
// the server going away). CTest starts the server (fixture `postgres`,
// tests/servers/postgres.sh) and passes its URL file in
// IDEM_POSTGRES_URL_FILE; without it every test fails rather than skips.
#include "postgres_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attempt_rows.h"
#include "change_listener.h"
#include "idem/attempt_chain.h"
#include "idem/caching_store.h"
#include "idem/forwarding_store.h"
#include "pg_schema.h"
#include "store_contract.h"
#include "store_wrapper.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

constexpr Duration kLease = 30s;
constexpr Duration kTtl = 24h;

std::string ReadUrlFile(const std::string& path) {
  std::ifstream in(path);
  std::string url;
  std::getline(in, url);
  return url;
}

// The fixture server's URL, or "" after recording a failure.
std::string ServerUrl() {
  const char* file = std::getenv("IDEM_POSTGRES_URL_FILE");
  if (file == nullptr || *file == '\0') {
    ADD_FAILURE() << "IDEM_POSTGRES_URL_FILE is not set: run these tests through ctest (fixture "
                     "`postgres`), or start a server with `tests/servers/postgres.sh start DIR` "
                     "and set IDEM_POSTGRES_URL_FILE=DIR/url";
    return "";
  }
  std::string url = ReadUrlFile(file);
  if (url.empty()) {
    ADD_FAILURE() << "no server URL in " << file
                  << ": the PostgreSQL fixture (tests/servers/postgres.sh) did not start";
  }
  return url;
}

std::string UniqueSchema(std::string_view prefix) {
  static std::atomic<int> n{0};
  return fmt::format("{}_{}_{}", prefix, ::getpid(), n++);
}

std::string WithSchema(const std::string& url, const std::string& schema) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "schema=" + schema;
}

// Raw SQL for test set-up, on a libpq connection of its own.
// Undoes schema version 7 (the partial outcome index) in `schema`.
std::string RestoreTheOutcomeIndex(const std::string& schema) {
  return fmt::format(
      "DROP INDEX \"{0}\".idemgate_attempts_by_rare_outcome; "
      "CREATE INDEX idemgate_attempts_by_outcome ON \"{0}\".idemgate_attempts (outcome, at_ms, id)",
      schema);
}

// Undoes schema version 5 (the audit log's hash chain) in `schema`.
std::string DropTheChain(const std::string& schema) {
  return fmt::format(
      "DROP FUNCTION \"{0}\".idemgate_log_attempts; DROP FUNCTION \"{0}\".idemgate_chain_hash; "
      "DROP FUNCTION \"{0}\".idemgate_chain_text; DROP TABLE \"{0}\".idemgate_attempt_heads; "
      "ALTER TABLE \"{0}\".idemgate_attempts DROP COLUMN seq, DROP COLUMN prev_hash, "
      "DROP COLUMN hash",
      schema);
}

class Admin {
 public:
  explicit Admin(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    PQsetNoticeReceiver(
        conn_, [](void*, const PGresult*) {}, nullptr);
  }
  ~Admin() { PQfinish(conn_); }
  Admin(const Admin&) = delete;
  Admin& operator=(const Admin&) = delete;

  // Runs `sql`; returns the first column of the first row ("" if none), or
  // records a failure.
  std::string Exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    std::string out;
    const ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      ADD_FAILURE() << sql << ": " << PQerrorMessage(conn_);
    } else if (st == PGRES_TUPLES_OK && PQntuples(r) > 0) {
      out = PQgetvalue(r, 0, 0);
    }
    PQclear(r);
    return out;
  }

  // Runs `sql` and returns the first column of every row, one line each.
  std::string Lines(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    std::string out;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      ADD_FAILURE() << sql << ": " << PQerrorMessage(conn_);
    } else {
      for (int i = 0; i < PQntuples(r); ++i) out += std::string(PQgetvalue(r, i, 0)) + "\n";
    }
    PQclear(r);
    return out;
  }

 private:
  PGconn* conn_;
};

void DropSchema(const std::string& url, const std::string& schema) {
  Admin(url).Exec(fmt::format("DROP SCHEMA IF EXISTS \"{}\" CASCADE", schema));
}

// A PostgresStore in a schema of its own, dropped when the store closes: each
// contract test starts empty.
class TempSchemaStore : public ForwardingStore {
 public:
  TempSchemaStore(std::string url, std::string schema, std::unique_ptr<Store> store)
      : ForwardingStore(*store),
        url_(std::move(url)),
        schema_(std::move(schema)),
        store_(std::move(store)) {}
  ~TempSchemaStore() override {
    store_.reset();
    DropSchema(url_, schema_);
  }

 private:
  std::string url_;
  std::string schema_;
  std::unique_ptr<Store> store_;
};

// A fresh PostgresStore in a schema of its own, named after `label`, with
// `query` (such as "&read_before_claim=on") after the schema in its URL.
std::unique_ptr<Store> OpenInTempSchema(Clock& clock, const std::string& label,
                                        const std::string& query = "") {
  const std::string url = ServerUrl();
  if (url.empty()) return nullptr;
  const std::string schema = UniqueSchema(label);
  auto store = OpenPostgresStore(WithSchema(url, schema) + query, clock, StoreOptions{});
  if (!store) {
    ADD_FAILURE() << store.error().ToString();
    return nullptr;
  }
  return std::make_unique<TempSchemaStore>(url, schema, std::move(*store));
}

INSTANTIATE_TEST_SUITE_P(
    Postgres, StoreContractTest,
    ::testing::Values(StoreContractParam{
        "postgres", [](Clock& clock) { return OpenInTempSchema(clock, "contract"); }}),
    [](const ::testing::TestParamInfo<StoreContractParam>& info) { return info.param.name; });

// The contract again with a read before each claim (read_before_claim=on),
// which answers duplicates outside the batches.
INSTANTIATE_TEST_SUITE_P(PostgresReadFirst, StoreContractTest,
                         ::testing::Values(StoreContractParam{"postgres_read_first",
                                                              [](Clock& clock) {
                                                                return OpenInTempSchema(
                                                                    clock, "read_first",
                                                                    "&read_before_claim=on");
                                                              }}),
                         [](const ::testing::TestParamInfo<StoreContractParam>& info) {
                           return info.param.name;
                         });

// The contract again through the replay cache that every front puts above a
// PostgreSQL store: answering from memory changes no answer.
INSTANTIATE_TEST_SUITE_P(
    PostgresCached, StoreContractTest,
    ::testing::Values(StoreContractParam{
        "postgres_cached",
        [](Clock& clock) -> std::unique_ptr<Store> {
          auto store = OpenInTempSchema(clock, "cached");
          if (!store) return nullptr;
          return testing::WithReplayCache(std::move(store), clock);
        },
        /*reads_some_async=*/true}),
    [](const ::testing::TestParamInfo<StoreContractParam>& info) { return info.param.name; });

ClaimRequest Req(const std::string& key) {
  ClaimRequest r;
  r.id = RecordId{"default", key};
  r.fingerprint = "fp";
  r.tool = "charge";
  r.turn = "turn-1";
  r.lease = kLease;
  r.retention = kTtl;
  return r;
}

Outcome Ok(std::string body) { return Outcome{OutcomeClass::kSuccess, std::move(body)}; }

// The system clock, counting the threads blocked in WaitUntil, so a test can
// act once a waiter is parked without sleeping.
class ObservedClock final : public Clock {
 public:
  TimePoint Now() override { return SystemClock::Default().Now(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override {
    {
      std::lock_guard g(mu_);
      ++waiting_;
      changed_.notify_all();
    }
    SystemClock::Default().WaitUntil(cv, lock, deadline);
    std::lock_guard g(mu_);
    --waiting_;
  }
  void AwaitWaiters(int n) {
    std::unique_lock g(mu_);
    changed_.wait(g, [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int waiting_ = 0;
};

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ServerUrl();
    ASSERT_FALSE(base_.empty());
    schema_ = UniqueSchema("t");
    url_ = WithSchema(base_, schema_);
  }
  void TearDown() override {
    if (!base_.empty()) DropSchema(base_, schema_);
  }

  // Two instances on the schema that re-read only every 10 s, so that a
  // waiter woken well before that was woken by NOTIFY.
  struct TwoInstances {
    std::unique_ptr<PostgresStore> owner, other;
  };
  TwoInstances OpenTwoSlowPolling(Clock& clock) {
    StoreOptions slow_poll;
    slow_poll.poll_interval = 10s;
    return TwoInstances{Open(clock, slow_poll), Open(clock, slow_poll)};
  }

  std::unique_ptr<PostgresStore> Open(Clock& clock, StoreOptions options = {}) {
    auto store = PostgresStore::Open(url_, clock, options);
    if (!store) {
      ADD_FAILURE() << store.error().ToString();
      return nullptr;
    }
    return std::move(*store);
  }

  std::string base_;
  std::string schema_;
  std::string url_;
  FakeClock clock_;
};

TEST_F(PostgresStoreTest, ReopeningKeepsSchemaAndData) {
  {
    auto store = Open(clock_);
    ASSERT_NE(store, nullptr);
    auto c = store->Claim(Req("k"));
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("kept"), kTtl));
  }
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  auto got = store->Get(RecordId{"default", "k"});
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  EXPECT_EQ((*got)->outcome->body, "kept");
  EXPECT_EQ(Admin(base_).Exec(fmt::format(
                "SELECT value FROM \"{}\".idemgate_meta WHERE name = 'schema_version'", schema_)),
            std::to_string(postgres::kSchemaVersion));
}

// A schema written before claims carried owner tokens (version 1) is
// migrated in place: its records stay readable, with no owner, so no
// Abandon can delete them; new claims store their token.
TEST_F(PostgresStoreTest, VersionOneSchemaMigratesAndItsRecordsHaveNoOwner) {
  {
    auto store = Open(clock_);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Claim(Req("old")));
  }
  // A version 1 table: without the columns of versions 2 (owner), 3 (watched)
  // and 4 (retention_ms), nor the chain of 5.
  Admin(base_).Exec(RestoreTheOutcomeIndex(schema_));
  Admin(base_).Exec(DropTheChain(schema_));
  Admin(base_).Exec(
      fmt::format("ALTER TABLE \"{0}\".idemgate_records DROP COLUMN owner, DROP COLUMN watched, "
                  "DROP COLUMN retention_ms; "
                  "UPDATE \"{0}\".idemgate_meta SET value = 1 "
                  "WHERE name = 'schema_version'",
                  schema_));
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  ExpectOwnerlessRecordAndOwnedClaims(*store);
  EXPECT_EQ(Admin(base_).Exec(fmt::format(
                "SELECT value FROM \"{}\".idemgate_meta WHERE name = 'schema_version'", schema_)),
            std::to_string(postgres::kSchemaVersion));
}

Attempt Logged(const std::string& tenant, const std::string& key, int64_t at_ms) {
  Attempt a = AuditEntry(tenant, key, at_ms);
  a.detail = "détail ✓";  // the SQL encoding is ChainHash's for any UTF-8
  return a;
}

// A schema whose audit log predates the chain (version 4): its entries are
// before the chain, never tampering; new ones chain, hashed by SQL exactly as
// ChainHash does.
TEST_F(PostgresStoreTest, VersionFourAttemptsAreBeforeTheChain) {
  {
    auto store = Open(clock_);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendAttempts({Logged("t", "old", 1000)}));
  }
  Admin(base_).Exec(RestoreTheOutcomeIndex(schema_) + "; " + DropTheChain(schema_) +
                    fmt::format("; UPDATE \"{}\".idemgate_meta SET value = 4 "
                                "WHERE name = 'schema_version'",
                                schema_));
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AppendAttempts({Logged("t", "new", 2000), Logged("u", "new", 2000)}));
  auto report = VerifyChains(*store, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->before_chain, 1u);
  EXPECT_EQ(report->checked, 2u);
}

// The plan PostgreSQL makes for the audit query of `filter` as the store
// prepares it, generic (as a prepared statement's plan becomes) and with
// sequential scans priced out, so that the plan shows which index can serve.
std::string GenericPlanOf(const std::string& url, const std::string& schema,
                          const AttemptFilter& filter, const std::string& args) {
  Admin admin(url);
  admin.Exec(
      fmt::format("SET search_path = \"{}\"; SET plan_cache_mode = force_generic_plan; "
                  "SET enable_seqscan = off",
                  schema));
  admin.Exec("PREPARE q AS " + postgres::SelectAttemptsSql(filter));
  return admin.Lines("EXPLAIN EXECUTE q(" + args + ")");
}

// Schema 7 indexes the outcomes an operator looks for, not the three every
// call writes: a query for one of those others can use the partial index
// under a generic plan, and one for `executed` reads the newest entries by
// time.
TEST_F(PostgresStoreTest, AQueryForAnOutcomeFewEntriesHaveCanUseThePartialIndex) {
  ASSERT_NE(Open(clock_), nullptr);
  AttemptFilter rare;
  rare.outcome = AttemptOutcome::kUnknown;
  const std::string plan = GenericPlanOf(base_, schema_, rare, "'unknown', 10");
  EXPECT_NE(plan.find("idemgate_attempts_by_rare_outcome"), std::string::npos) << plan;
  AttemptFilter common;
  common.outcome = AttemptOutcome::kExecuted;
  const std::string by_time = GenericPlanOf(base_, schema_, common, "'executed', 10");
  EXPECT_NE(by_time.find("idemgate_attempts_by_at"), std::string::npos) << by_time;
}

// A schema of version 6 trades its outcome index for the partial one, and
// its entries are found by outcome as before.
TEST_F(PostgresStoreTest, VersionSixSchemaMigratesToThePartialOutcomeIndex) {
  {
    auto store = Open(clock_);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendAttempts({AuditEntry("t", "a", 1000, "", AttemptOutcome::kExecuted),
                                       AuditEntry("t", "b", 2000, "", AttemptOutcome::kUnknown)}));
  }
  Admin(base_).Exec(RestoreTheOutcomeIndex(schema_) +
                    fmt::format("; UPDATE \"{}\".idemgate_meta SET value = 6 "
                                "WHERE name = 'schema_version'",
                                schema_));
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Admin(base_).Exec(fmt::format(
                "SELECT value FROM \"{}\".idemgate_meta WHERE name = 'schema_version'", schema_)),
            "7");
  EXPECT_EQ(Admin(base_).Exec(fmt::format(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = '{}' AND indexname = "
                "'idemgate_attempts_by_outcome'",
                schema_)),
            "0");
  ExpectEntriesFoundByOutcome(*store);
}

// Tampering with the tables directly, as someone with write access would.
TEST_F(PostgresStoreTest, VerifyNamesRowsEditedDeletedOrInsertedInTheTable) {
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  std::vector<Attempt> batch;
  for (int i = 1; i <= 5; ++i) batch.push_back(Logged("t", "k" + std::to_string(i), 1000 + i));
  ASSERT_TRUE(store->AppendAttempts(batch));
  auto fault = [&] {
    auto report = VerifyChains(*store, std::nullopt, 2);
    EXPECT_TRUE(report) << report.error().ToString();
    return report ? report->fault : std::nullopt;
  };
  ASSERT_FALSE(fault());
  const std::string t = fmt::format("\"{}\".idemgate_attempts", schema_);
  Admin(base_).Exec("UPDATE " + t + " SET latency_ms = 99 WHERE key = 'k2'");
  auto edited = fault();
  ASSERT_TRUE(edited);
  EXPECT_EQ(edited->kind, ChainFault::Kind::kEdited);
  EXPECT_NE(edited->message.find("tenant \"t\" seq 2 (key \"k2\""), std::string::npos)
      << edited->message;
  Admin(base_).Exec("DELETE FROM " + t + " WHERE key = 'k2'");
  auto deleted = fault();
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->kind, ChainFault::Kind::kDeleted);
  EXPECT_EQ(deleted->entry.seq, 3u);
  Admin(base_).Exec("INSERT INTO " + t +
                    " (at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, detail, "
                    "seq, prev_hash, hash) SELECT at_ms, tenant, 'k2', tool, turn, outcome, "
                    "latency_ms, instance, detail, 2, prev_hash, hash FROM " +
                    t + " WHERE key = 'k3'");
  auto inserted = fault();
  ASSERT_TRUE(inserted);
  EXPECT_EQ(inserted->kind, ChainFault::Kind::kEdited) << inserted->message;
  EXPECT_EQ(inserted->entry.seq, 2u);
}

// Several instances (connection pools) appending to one schema at once,
// batches and claims with their entries: one valid chain per tenant.
TEST_F(PostgresStoreTest, InstancesAppendingAtOnceKeepOneChain) {
  constexpr int kInstances = 3;
  std::vector<std::unique_ptr<PostgresStore>> stores;
  for (int i = 0; i < kInstances; ++i) stores.push_back(Open(clock_));
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int i = 0; i < kInstances; ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < 20; ++r) {
        const std::string key = fmt::format("i{}-{}", i, r);
        if (!stores[i]->AppendAttempts({Logged("t", key, r), Logged("u", key, r)})) ++errors;
        ClaimRequest req = Req(key);
        req.id.tenant = "u";
        req.logged = Logged("u", key, r);
        req.logged->outcome = AttemptOutcome::kClaimed;
        if (auto c = stores[i]->Claim(req); !c || !c->claimed) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(errors.load(), 0);
  auto report = VerifyChains(*stores[0], std::nullopt, 16);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, static_cast<uint64_t>(kInstances * 20 * 3));
}

// Two instances whose hosts' clocks are 25 s apart agree on a lease by the
// server's clock (clock_timestamp(), through StoreClock).
TEST_F(PostgresStoreTest, InstancesWithSkewedClocksJudgeLeasesByTheServersClock) {
  ExpectSkewedInstancesAgreeOnLeases(
      [&](Clock& clock) -> std::unique_ptr<Store> { return Open(clock); });
}

TEST_F(PostgresStoreTest, InstancesStartingTogetherMigrateOnce) {
  constexpr int kInstances = 4;
  std::latch start(kInstances);
  std::vector<std::unique_ptr<PostgresStore>> stores(kInstances);
  std::vector<std::thread> threads;
  for (int i = 0; i < kInstances; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      stores[i] = Open(clock_);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& s : stores) ASSERT_NE(s, nullptr);
  auto c = stores[0]->Claim(Req("k"));
  ASSERT_TRUE(c && c->claimed);
  auto seen = stores[3]->Claim(Req("k"));
  ASSERT_TRUE(seen);
  EXPECT_FALSE(seen->claimed);
}

TEST_F(PostgresStoreTest, NewerSchemaVersionIsRefusedAndLeftUntouched) {
  ASSERT_NE(Open(clock_), nullptr);
  Admin(base_).Exec(fmt::format(
      "UPDATE \"{}\".idemgate_meta SET value = 99 WHERE name = 'schema_version'", schema_));
  auto store = PostgresStore::Open(url_, clock_, {});
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(store.error().message.find("newer"), std::string::npos) << store.error().message;
  EXPECT_NE(store.error().message.find("99"), std::string::npos) << store.error().message;
  EXPECT_EQ(Admin(base_).Exec(fmt::format(
                "SELECT value FROM \"{}\".idemgate_meta WHERE name = 'schema_version'", schema_)),
            "99");
}

TEST_F(PostgresStoreTest, UnknownStateInARowIsDataLossNamingTheKey) {
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  Admin(base_).Exec(fmt::format(
      "INSERT INTO \"{}\".idemgate_records (tenant, key, state, fingerprint, tool, turn, fence, "
      "created_at_ms, lease_expires_at_ms, completed_at_ms, expires_at_ms) VALUES ('default', "
      "'weird-key', 'exploded', 'fp', 'charge', 't', 1, 0, 0, 0, {})",
      schema_, ToUnixMillis(clock_.Now() + 1h)));
  auto got = store->Get(RecordId{"default", "weird-key"});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, ErrorCode::kDataLoss);
  EXPECT_NE(got.error().message.find("weird-key"), std::string::npos) << got.error().message;
  EXPECT_NE(got.error().message.find("exploded"), std::string::npos) << got.error().message;
  auto claim = store->Claim(Req("weird-key"));
  ASSERT_FALSE(claim);
  EXPECT_EQ(claim.error().code, ErrorCode::kDataLoss);
  // An operator's way out: evict it, and the key works again.
  auto evicted = store->Evict(RecordId{"default", "weird-key"});
  ASSERT_TRUE(evicted && *evicted);
  auto fresh = store->Claim(Req("weird-key"));
  ASSERT_TRUE(fresh && fresh->claimed);
}

TEST_F(PostgresStoreTest, TextTheDatabaseRefusesIsInvalidArgumentAndHarmless) {
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  ClaimRequest bad = Req("k");
  bad.tool = "not utf-8 \xff";
  auto c = store->Claim(bad);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << c.error().ToString();
  auto good = store->Claim(Req("k"));
  ASSERT_TRUE(good) << good.error().ToString();
  EXPECT_TRUE(good->claimed);
}

TEST_F(PostgresStoreTest, TwoStoresSixteenThreadsEachHaveExactlyOneClaimWinner) {
  auto a = Open(SystemClock::Default());
  auto b = Open(SystemClock::Default());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kPerStore = 16;
  for (int round = 0; round < 5; ++round) {
    const std::string key = "race-" + std::to_string(round);
    std::latch start(2 * kPerStore);
    std::atomic<int> winners{0}, errors{0};
    std::mutex mu;
    std::set<uint64_t> fences;
    std::vector<std::thread> threads;
    for (int i = 0; i < 2 * kPerStore; ++i) {
      Store* store = i % 2 ? a.get() : b.get();
      threads.emplace_back([&, store] {
        start.arrive_and_wait();
        auto c = store->Claim(Req(key));
        if (!c) {
          ++errors;
          ADD_FAILURE() << c.error().ToString();
          return;
        }
        if (c->claimed) ++winners;
        std::lock_guard g(mu);
        fences.insert(c->record.fence);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(winners.load(), 1) << key;
    EXPECT_EQ(fences.size(), 1u) << "every loser sees the winner's record";
  }
}

// Under SERIALIZABLE the server may abort a racing claim with a
// serialization failure; the store runs it again instead of failing.
TEST_F(PostgresStoreTest, ClaimRacesUnderSerializableIsolationStillHaveOneWinnerAndNoErrors) {
  url_ += "&options=-c%20default_transaction_isolation%3Dserializable";
  auto a = Open(clock_);
  auto b = Open(clock_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int round = 0; round < 5; ++round) {
    const std::string key = "serializable-" + std::to_string(round);
    constexpr int kThreads = 16;
    std::latch start(kThreads);
    std::atomic<int> winners{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      Store* store = i % 2 ? a.get() : b.get();
      threads.emplace_back([&, store] {
        start.arrive_and_wait();
        auto c = store->Claim(Req(key));
        ASSERT_TRUE(c) << c.error().ToString();
        if (c->claimed) {
          ++winners;
          ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("x"), 1h));
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1) << key;
  }
}

TEST_F(PostgresStoreTest, TwoStoresReplacingAnExpiredRecordHaveExactlyOneWinner) {
  auto a = Open(clock_);
  auto b = Open(clock_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int round = 0; round < 5; ++round) {
    const std::string key = "expired-" + std::to_string(round);
    auto old = a->Claim(Req(key));
    ASSERT_TRUE(old && old->claimed);
    ASSERT_TRUE(a->Complete(old->record.id, old->record.fence, Ok("old"), 1h));
    clock_.Advance(2h);

    constexpr int kThreads = 32;
    std::latch start(kThreads);
    std::atomic<int> winners{0};
    std::atomic<uint64_t> winning_fence{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      Store* store = i % 2 ? a.get() : b.get();
      threads.emplace_back([&, store] {
        start.arrive_and_wait();
        auto c = store->Claim(Req(key));
        ASSERT_TRUE(c) << c.error().ToString();
        if (c->claimed) {
          ++winners;
          winning_fence = c->record.fence;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1) << key;
    EXPECT_GT(winning_fence.load(), old->record.fence);
    auto got = b->Get(old->record.id);
    ASSERT_TRUE(got && got->has_value());
    EXPECT_EQ((*got)->state, RecordState::kInProgress);
    EXPECT_FALSE((*got)->outcome.has_value()) << "the replaced record keeps no old outcome";
  }
}

TEST_F(PostgresStoreTest, FencesNeverRepeatAcrossStoresEvictionAndPurge) {
  auto a = Open(clock_);
  auto b = Open(clock_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::set<uint64_t> fences;
  uint64_t last = 0;
  for (int i = 0; i < 20; ++i) {
    Store& s = i % 2 ? *a : *b;
    auto c = s.Claim(Req("k"));
    ASSERT_TRUE(c && c->claimed);
    EXPECT_GT(c->record.fence, last);
    last = c->record.fence;
    EXPECT_TRUE(fences.insert(c->record.fence).second);
    if (i % 3 == 0) {
      ASSERT_TRUE(s.Evict(c->record.id));
    } else if (i % 3 == 1) {
      ASSERT_TRUE(s.Release(c->record.id, c->record.fence));
    } else {
      ASSERT_TRUE(s.Complete(c->record.id, c->record.fence, Ok("x"), 1s));
      clock_.Advance(2s);
      auto purged = s.PurgeExpired(10);
      ASSERT_TRUE(purged);
      EXPECT_EQ(*purged, 1u);
    }
  }
}

TEST_F(PostgresStoreTest, AnotherInstancesCompletionWakesAWaiterViaNotify) {
  ObservedClock clock;
  auto two = OpenTwoSlowPolling(clock);
  ASSERT_TRUE(two.owner && two.other && two.other->listening());

  auto c = two.owner->Claim(Req("k"));
  ASSERT_TRUE(c && c->claimed);
  std::chrono::steady_clock::time_point woke;
  std::thread waiter([&] {
    auto w = two.other->WaitForChange(c->record.id, c->record, clock.Now() + 30s);
    woke = std::chrono::steady_clock::now();
    EXPECT_TRUE(w) << w.error().ToString();
  });
  clock.AwaitWaiters(1);
  const auto before = std::chrono::steady_clock::now();
  auto done = two.owner->Complete(c->record.id, c->record.fence, Ok("done"), kTtl);
  const auto committed = std::chrono::steady_clock::now();
  waiter.join();
  ASSERT_TRUE(done) << done.error().ToString();
  const auto latency = std::chrono::duration_cast<std::chrono::microseconds>(woke - before);
  std::cout << "cross-instance wake-up: waiter returned " << latency.count()
            << " us after Complete was called; Complete itself took "
            << std::chrono::duration_cast<std::chrono::microseconds>(committed - before).count()
            << " us\n";
  RecordProperty("wake_up_latency_us", std::to_string(latency.count()));
  EXPECT_LT(latency, 2s) << "woken by polling, not by NOTIFY";
  auto got = two.other->Get(c->record.id);
  ASSERT_TRUE(got && got->has_value());
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
}

// Two instances, each with its replay cache: an eviction through one, in
// this schema, empties the other's cache by NOTIFY, and the next attempt
// there executes.
TEST_F(PostgresStoreTest, AnEvictionReachesEveryInstancesReplayCache) {
  auto a_store = Open(SystemClock::Default());
  auto b_store = Open(SystemClock::Default());
  ASSERT_TRUE(a_store && b_store && b_store->listening());
  CachingStore a(*a_store, SystemClock::Default(), 1 << 20);
  CachingStore b(*b_store, SystemClock::Default(), 1 << 20);
  ASSERT_TRUE(a.active() && b.active());

  auto c = a.Claim(Req("evicted"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(a.Complete(c->record.id, c->record.fence, Ok("first"), kTtl));
  ASSERT_TRUE(b.Get(c->record.id));  // read from PostgreSQL, kept
  auto replay = b.Claim(Req("evicted"));
  ASSERT_TRUE(replay);
  EXPECT_FALSE(replay->claimed);
  EXPECT_EQ(b.stats().hits, 1u) << "the retry at B was answered from memory";

  const uint64_t drops = b.stats().drops;
  const auto start = std::chrono::steady_clock::now();
  auto evicted = a.Evict(c->record.id);
  ASSERT_TRUE(evicted && *evicted);
  while (b.stats().drops == drops) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, 10s) << "B never heard of the eviction";
    std::this_thread::sleep_for(1ms);
  }
  std::cout << "eviction reached the other instance's cache in "
            << std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count()
            << " us (Evict included)\n";
  auto again = b.Claim(Req("evicted"));
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_TRUE(again->claimed) << "B replayed an evicted outcome";
}

// LISTENs on the stores' channel over a libpq connection of its own.
class RawListener {
 public:
  explicit RawListener(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    PGresult* r = PQexec(conn_, fmt::format("LISTEN {}", postgres::kChangeChannel).c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK) ADD_FAILURE() << PQerrorMessage(conn_);
    PQclear(r);
  }
  ~RawListener() { PQfinish(conn_); }
  RawListener(const RawListener&) = delete;
  RawListener& operator=(const RawListener&) = delete;

  // The payloads received, in order, up to and including `last`; records a
  // failure if `last` did not come within 10 s.
  std::vector<std::string> Until(const std::string& last) {
    std::vector<std::string> out;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < give_up) {
      PQconsumeInput(conn_);
      while (PGnotify* n = PQnotifies(conn_)) {
        out.emplace_back(n->extra);
        PQfreemem(n);
        if (out.back() == last) return out;
      }
      pollfd p{PQsocket(conn_), POLLIN, 0};
      ::poll(&p, 1, 100);  // wakes when a notification arrives
    }
    ADD_FAILURE() << "no notification \"" << last << "\" within 10 s";
    return out;
  }

 private:
  PGconn* conn_;
};

// A call without duplicates costs no NOTIFY: a completion is announced to the
// other instances only if one of them waits for the record (it marks it
// watched first). bench/README.md, store_bench: the announcements were a
// third of the transactions of a claim->complete.
TEST_F(PostgresStoreTest, CompletionIsAnnouncedOnlyWhenAnotherInstanceWaitsForTheRecord) {
  ObservedClock clock;
  auto two = OpenTwoSlowPolling(clock);
  ASSERT_TRUE(two.owner && two.other && two.other->listening());
  RawListener notifications(base_);

  auto alone = two.owner->Claim(Req("alone"));
  ASSERT_TRUE(alone && alone->claimed);
  auto done = two.owner->Complete(alone->record.id, alone->record.fence, Ok("a"), kTtl);
  ASSERT_TRUE(done) << done.error().ToString();

  auto watched = two.owner->Claim(Req("watched"));
  ASSERT_TRUE(watched && watched->claimed);
  std::thread waiter([&] {
    auto w = two.other->WaitForChange(watched->record.id, watched->record, clock.Now() + 30s);
    EXPECT_TRUE(w) << w.error().ToString();
  });
  clock.AwaitWaiters(1);
  done = two.owner->Complete(watched->record.id, watched->record.fence, Ok("w"), kTtl);
  ASSERT_TRUE(done) << done.error().ToString();
  waiter.join();

  // Notifications arrive in commit order and the announcer sends them in
  // order: had "alone" been announced, it would have come before "watched".
  const std::string alone_payload = postgres::ChangePayload(schema_, alone->record.id);
  for (const std::string& payload :
       notifications.Until(postgres::ChangePayload(schema_, watched->record.id))) {
    EXPECT_NE(payload, alone_payload) << "a completion nobody waited for was announced";
  }
}

// Shared commits (BatchWriter): with the one writer held up by a row lock, a
// crowd of claims and completions queues, then runs as one transaction, and
// each write still gets its own answer: one winner and three duplicates of a
// key, fresh keys, a completion, a stale fence, text the server refuses in a
// record and in an audit entry. Nothing of a refused write is applied.
TEST_F(PostgresStoreTest, OneBatchGivesEachWriteItsOwnAnswer) {
  url_ += "&batch_writers=1&batch_size=64";
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  auto blocker = store->Claim(Req("blocker"));
  auto to_complete = store->Claim(Req("to-complete"));
  auto stale = store->Claim(Req("stale"));
  auto refused_log = store->Claim(Req("refused-log"));
  ASSERT_TRUE(blocker && to_complete && stale && refused_log);

  // The writer's next batch (the blocker's completion) waits for this row.
  Admin lock(base_);
  lock.Exec("BEGIN");
  lock.Exec(fmt::format("SELECT 1 FROM \"{}\".idemgate_records WHERE key = 'blocker' FOR UPDATE",
                        schema_));
  std::thread first([&] {
    EXPECT_TRUE(store->Complete(blocker->record.id, blocker->record.fence, Ok("b"), kTtl));
  });
  Admin watch(base_);
  while (watch.Exec("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()") == "0") {
    std::this_thread::yield();
  }

  auto logged = [](const std::string& key, const std::string& detail = "") {
    return AuditEntry("default", key, 1000, detail, AttemptOutcome::kExecuted);
  };
  std::vector<std::thread> crowd;
  constexpr int kDuplicates = 4, kFresh = 3;
  std::atomic<int> winners{0};
  std::mutex mu;
  std::set<uint64_t> dup_fences;
  for (int i = 0; i < kDuplicates; ++i) {
    crowd.emplace_back([&] {
      ClaimRequest r = Req("dup");
      r.logged = logged("dup");
      auto c = store->Claim(r);
      ASSERT_TRUE(c) << c.error().ToString();
      if (c->claimed) ++winners;
      std::lock_guard g(mu);
      dup_fences.insert(c->record.fence);
    });
  }
  for (int i = 0; i < kFresh; ++i) {
    crowd.emplace_back([&, i] {
      ClaimRequest r = Req("fresh-" + std::to_string(i));
      r.logged = logged(r.id.key);
      auto c = store->Claim(r);
      ASSERT_TRUE(c) << c.error().ToString();
      EXPECT_TRUE(c->claimed);
    });
  }
  crowd.emplace_back([&] {
    const Attempt entry = logged("to-complete");
    auto done = store->Complete(to_complete->record.id, to_complete->record.fence, Ok("done"),
                                kTtl, &entry);
    ASSERT_TRUE(done) << done.error().ToString();
    EXPECT_EQ(done->outcome->body, "done");
  });
  crowd.emplace_back([&] {
    auto late = store->Complete(stale->record.id, stale->record.fence + 1, Ok("late"), kTtl);
    ASSERT_FALSE(late);
    EXPECT_EQ(late.error().code, ErrorCode::kAborted) << late.error().ToString();
  });
  crowd.emplace_back([&] {
    ClaimRequest bad = Req("bad-tool");
    bad.tool = "not utf-8 \xff";
    auto c = store->Claim(bad);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << c.error().ToString();
  });
  crowd.emplace_back([&] {
    const Attempt entry = logged("refused-log", "not utf-8 \xff");
    auto c = store->Complete(refused_log->record.id, refused_log->record.fence, Ok("x"), kTtl,
                             &entry);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << c.error().ToString();
  });
  const size_t writes = crowd.size();
  while (store->batch_counts().queued < writes) std::this_thread::yield();
  const auto before = store->batch_counts();
  lock.Exec("COMMIT");
  first.join();
  for (auto& t : crowd) t.join();

  const auto after = store->batch_counts();
  EXPECT_EQ(after.commits - before.commits, 2u) << "the blocker's batch, then the crowd's";
  EXPECT_EQ(after.writes - before.writes, 1 + writes - 2) << "all but the two refused writes";
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(dup_fences.size(), 1u) << "every duplicate sees the winner's record";
  auto state_of = [&](const std::string& key) {
    auto got = store->Get(RecordId{"default", key});
    EXPECT_TRUE(got && got->has_value()) << key;
    return got && got->has_value() ? (*got)->state : RecordState::kUnknown;
  };
  EXPECT_EQ(state_of("to-complete"), RecordState::kCompleted);
  EXPECT_EQ(state_of("stale"), RecordState::kInProgress);
  EXPECT_EQ(state_of("refused-log"), RecordState::kInProgress) << "nothing half-applied";
  auto bad = store->Get(RecordId{"default", "bad-tool"});
  ASSERT_TRUE(bad);
  EXPECT_FALSE(bad->has_value());
  // The audit entries of the writes that committed: the winner's, the fresh
  // claims', the completion's; one chain.
  auto entries = store->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(entries) << entries.error().ToString();
  EXPECT_EQ(entries->size(), 1u + kFresh + 1u);
  auto report = VerifyChains(*store, std::nullopt);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_FALSE(report->fault) << report->fault->message;
  EXPECT_EQ(report->checked, 1u + kFresh + 1u);
}

// A lone write is not held back for company, and batch_size=1 turns shared
// commits off: each write commits on its own, as before them.
TEST_F(PostgresStoreTest, BatchSizeOneRunsEachWriteInItsOwnTransaction) {
  url_ += "&batch_size=1";
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  auto c = store->Claim(Req("alone"));
  ASSERT_TRUE(c && c->claimed);
  ASSERT_TRUE(store->Complete(c->record.id, c->record.fence, Ok("x"), kTtl));
  const auto counts = store->batch_counts();
  EXPECT_EQ(counts.commits, 0u);
  EXPECT_EQ(counts.writes, 0u);
}

TEST_F(PostgresStoreTest, AttemptsWithAwkwardTextRoundTrip) {
  auto store = Open(clock_);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> awkward = {
      "",    "NULL",     "plain",     "with \"quotes\"", "back\\slash", "{braces}",
      "a,b", " spaced ", "ünïcødé ✓", "line\nbreak",     "'single'"};
  std::vector<Attempt> batch;
  for (size_t i = 0; i < 300; ++i) {
    Attempt a;
    a.at = clock_.Now() + Duration(static_cast<int64_t>(i));
    a.tenant = i % 2 ? "t1" : "t2";
    a.key = "k" + std::to_string(i % 7);
    a.tool = awkward[i % awkward.size()];
    a.turn = awkward[(i + 3) % awkward.size()];
    a.outcome = i % 5 == 0 ? AttemptOutcome::kReplayed : AttemptOutcome::kExecuted;
    a.latency = Duration(static_cast<int64_t>(i));
    a.instance = "inst";
    a.detail = awkward[(i + 5) % awkward.size()];
    batch.push_back(a);
  }
  ASSERT_TRUE(store->AppendAttempts(batch));
  AttemptFilter all;
  all.limit = 1000;
  auto got = store->QueryAttempts(all);
  ASSERT_TRUE(got) << got.error().ToString();
  ASSERT_EQ(got->size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const Attempt& want = batch[batch.size() - 1 - i];  // newest first
    const Attempt& have = (*got)[i];
    EXPECT_EQ(have.at, want.at);
    EXPECT_EQ(have.tenant, want.tenant);
    EXPECT_EQ(have.key, want.key);
    EXPECT_EQ(have.tool, want.tool);
    EXPECT_EQ(have.turn, want.turn);
    EXPECT_EQ(have.outcome, want.outcome);
    EXPECT_EQ(have.latency, want.latency);
    EXPECT_EQ(have.detail, want.detail);
  }

  AttemptFilter combined;
  combined.tenant = "t1";
  combined.key = "k3";
  combined.outcome = AttemptOutcome::kExecuted;
  combined.since = clock_.Now() + 100ms;
  auto some = store->QueryAttempts(combined);
  ASSERT_TRUE(some);
  size_t expected = 0;
  for (const Attempt& a : batch) {
    expected += a.tenant == "t1" && a.key == "k3" && a.outcome == AttemptOutcome::kExecuted &&
                a.at >= *combined.since;
  }
  EXPECT_EQ(some->size(), expected);
  auto stats = store->SummarizeAttempts(combined);
  ASSERT_TRUE(stats);
  uint64_t counted = 0;
  for (const auto& [tool, s] : *stats) counted += s.attempts;
  EXPECT_EQ(counted, expected);
}

TEST(PostgresStoreOpenTest, UnreachableServerIsUnavailableNamingHostAndPort) {
  // A port nobody listens on: bind it, note it, let it go.
  std::string port;
  {
    FILE* p = ::popen(
        "python3 -c 'import socket; s = socket.socket(); "
        "s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'",
        "r");
    ASSERT_NE(p, nullptr);
    char buf[32] = {};
    ASSERT_NE(std::fgets(buf, sizeof buf, p), nullptr);
    ::pclose(p);
    port = std::string(buf, std::strcspn(buf, "\n"));
  }
  const auto start = std::chrono::steady_clock::now();
  auto store = OpenPostgresStore("postgres://postgres@127.0.0.1:" + port + "/idemgate",
                                 SystemClock::Default(), {});
  ASSERT_FALSE(store);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(store.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(store.error().retryable());
  EXPECT_NE(store.error().message.find("127.0.0.1:" + port), std::string::npos)
      << store.error().message;
  EXPECT_NE(store.error().message.find("retryable"), std::string::npos) << store.error().message;
}

// A PostgreSQL cluster of the test's own (tests/servers/postgres.sh), so it
// can be crashed and restarted without disturbing the other tests.
class OwnServer {
 public:
  OwnServer() {
    char tmpl[] = "/tmp/idem_pg_own_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    dir_ = tmpl;
  }
  ~OwnServer() { Script("stop"); }
  OwnServer(const OwnServer&) = delete;
  OwnServer& operator=(const OwnServer&) = delete;

  // Runs postgres.sh `command` on this server's directory; true on success.
  bool Script(const std::string& command) {
    const std::string line = fmt::format("bash '{}' {} '{}'", IDEM_POSTGRES_SH, command, dir_);
    return std::system(line.c_str()) == 0;
  }
  std::string url() const { return ReadUrlFile(dir_ + "/url"); }

 private:
  std::string dir_;
};

TEST(PostgresServerDownTest, FailsFastWhileDownAndRecoversAfterRestart) {
  OwnServer server;
  ASSERT_TRUE(server.Script("start")) << "could not start a PostgreSQL server";
  const std::string url = server.url();
  ASSERT_FALSE(url.empty());
  const std::string host_port = url.substr(url.find('@') + 1, url.rfind('/') - url.find('@') - 1);
  auto opened = PostgresStore::Open(url, SystemClock::Default(), {});
  ASSERT_TRUE(opened) << opened.error().ToString();
  PostgresStore& store = **opened;

  auto kept = store.Claim(Req("kept"));
  ASSERT_TRUE(kept && kept->claimed);
  ASSERT_TRUE(store.Complete(kept->record.id, kept->record.fence, Ok("acknowledged"), kTtl));
  auto busy = store.Claim(Req("busy"));
  ASSERT_TRUE(busy && busy->claimed);

  ASSERT_TRUE(server.Script("crash"));
  for (int i = 0; i < 3; ++i) {  // a dead pooled connection, then the backoff path
    const auto start = std::chrono::steady_clock::now();
    auto got = store.Get(kept->record.id);
    const auto took = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, ErrorCode::kUnavailable) << got.error().ToString();
    EXPECT_NE(got.error().message.find(host_port), std::string::npos) << got.error().message;
    EXPECT_NE(got.error().message.find("retryable"), std::string::npos) << got.error().message;
    EXPECT_LT(took, 2s);
  }
  const auto start = std::chrono::steady_clock::now();
  auto refused = store.Claim(Req("while-down"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kUnavailable);
  auto completion = store.Complete(busy->record.id, busy->record.fence, Ok("late"), kTtl);
  ASSERT_FALSE(completion);
  EXPECT_EQ(completion.error().code, ErrorCode::kUnavailable);
  auto waited =
      store.WaitForChange(busy->record.id, busy->record, SystemClock::Default().Now() + 30s);
  ASSERT_FALSE(waited) << "a wait cannot watch a record it cannot read";
  EXPECT_EQ(waited.error().code, ErrorCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);

  ASSERT_TRUE(server.Script("start"));
  Result<std::optional<Record>> got = std::nullopt;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  do {  // the pool backs off for up to a second between connection attempts
    got = store.Get(kept->record.id);
    if (!got) std::this_thread::sleep_for(50ms);
  } while (!got && std::chrono::steady_clock::now() < give_up);
  ASSERT_TRUE(got) << got.error().ToString();
  ASSERT_TRUE(got->has_value()) << "an acknowledged completion survives a crash";
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  EXPECT_EQ((*got)->outcome->body, "acknowledged");
  auto after = store.Claim(Req("after"));
  ASSERT_TRUE(after) << after.error().ToString();
  EXPECT_TRUE(after->claimed);
  ASSERT_TRUE(store.Complete(busy->record.id, busy->record.fence, Ok("late"), kTtl));
  while (!store.listening() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(store.listening()) << "the LISTEN connection came back";
}

}  // namespace
}  // namespace idem
