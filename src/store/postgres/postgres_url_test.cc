#include "postgres_url.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace idem::postgres {
namespace {

std::map<std::string, std::string> AsMap(const PostgresUrl& url) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : url.conninfo) m[k] = v;
  return m;
}

TEST(PostgresUrlTest, DefaultsForSchemaPoolAndTimeouts) {
  auto url = ParsePostgresUrl("postgres://app@db.example:6543/ledger");
  ASSERT_TRUE(url) << url.error().ToString();
  EXPECT_EQ(url->schema, "public");
  EXPECT_EQ(url->pool_size, 16u);
  EXPECT_EQ(url->batch_size, 16u);
  EXPECT_EQ(url->batch_writers, 2u);
  EXPECT_FALSE(url->read_before_claim);
  auto m = AsMap(*url);
  EXPECT_EQ(m["host"], "db.example");
  EXPECT_EQ(m["port"], "6543");
  EXPECT_EQ(m["dbname"], "ledger");
  EXPECT_EQ(m["user"], "app");
  EXPECT_EQ(m["connect_timeout"], "5");
  EXPECT_EQ(m["application_name"], "idemgate");
  EXPECT_EQ(m["tcp_user_timeout"], "30000");
  EXPECT_EQ(url->where, "db.example:6543/ledger schema public");
}

TEST(PostgresUrlTest, OwnParametersAreTakenOutAndTheRestGoToLibpq) {
  auto url = ParsePostgresUrl(
      "postgresql://app@127.0.0.1/ledger?sslmode=disable&schema=team%20a&pool_size=3&"
      "connect_timeout=2");
  ASSERT_TRUE(url) << url.error().ToString();
  EXPECT_EQ(url->schema, "team a");
  EXPECT_EQ(url->pool_size, 3u);
  auto m = AsMap(*url);
  EXPECT_EQ(m["sslmode"], "disable");
  EXPECT_EQ(m["connect_timeout"], "2") << "a value from the URL wins over the default";
  EXPECT_EQ(m.count("schema"), 0u);
  EXPECT_EQ(m.count("pool_size"), 0u);
}

TEST(PostgresUrlTest, BatchParametersAreTakenOutAndWritersAreCappedAtThePool) {
  auto url = ParsePostgresUrl("postgres://h/db?batch_size=1&batch_writers=3&pool_size=4");
  ASSERT_TRUE(url) << url.error().ToString();
  EXPECT_EQ(url->batch_size, 1u);
  EXPECT_EQ(url->batch_writers, 3u);
  auto m = AsMap(*url);
  EXPECT_EQ(m.count("batch_size"), 0u);
  EXPECT_EQ(m.count("batch_writers"), 0u);
  auto capped = ParsePostgresUrl("postgres://h/db?pool_size=1");
  ASSERT_TRUE(capped) << capped.error().ToString();
  EXPECT_EQ(capped->batch_writers, 1u) << "each writer holds a pooled connection";
  auto reads = ParsePostgresUrl("postgres://h/db?read_before_claim=on");
  ASSERT_TRUE(reads) << reads.error().ToString();
  EXPECT_TRUE(reads->read_before_claim);
  EXPECT_EQ(AsMap(*reads).count("read_before_claim"), 0u);
}

TEST(PostgresUrlTest, BadOwnParametersAreInvalid) {
  for (const char* bad :
       {"postgres://h/db?pool_size=0", "postgres://h/db?pool_size=x",
        "postgres://h/db?pool_size=257", "postgres://h/db?batch_size=0",
        "postgres://h/db?batch_size=1025", "postgres://h/db?batch_writers=0",
        "postgres://h/db?batch_writers=2x", "postgres://h/db?read_before_claim=yes",
        "postgres://h/db?read_before_claim=", "postgres://h/db?schema=",
        "postgres://h/db?schema=%zz",
        "postgres://h/db?schema=0123456789012345678901234567890123456789"
        "012345678901234567890123"}) {
    auto url = ParsePostgresUrl(bad);
    ASSERT_FALSE(url) << bad;
    EXPECT_EQ(url.error().code, ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(PostgresUrlTest, UnknownParameterIsInvalidWithoutLeakingThePassword) {
  auto url = ParsePostgresUrl("postgres://app:s3cret@h/db?colour=blue");
  ASSERT_FALSE(url);
  EXPECT_EQ(url.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(url.error().message.find("colour"), std::string::npos) << url.error().message;
  EXPECT_EQ(url.error().message.find("s3cret"), std::string::npos) << url.error().message;
}

TEST(PostgresUrlTest, WhereNeverHoldsThePassword) {
  auto url = ParsePostgresUrl("postgres://app:s3cret@h:5432/db");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->where.find("s3cret"), std::string::npos);
  EXPECT_EQ(AsMap(*url)["password"], "s3cret");
}

}  // namespace
}  // namespace idem::postgres
