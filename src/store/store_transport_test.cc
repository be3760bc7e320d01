#include "store_transport.h"

#include <gtest/gtest.h>

namespace idem {
namespace {

// Security review F17: a store on another host reached without verified TLS
// started silently (libpq's sslmode=prefer can be stripped by an attacker on
// the way; redis:// is plain text).
TEST(StoreTransportTest, ARemoteStoreWithoutVerifiedTlsIsWarnedAbout) {
  for (const char* url : {"redis://db.internal:6379", "redis://:secret@10.0.0.5/1",
                          "rediss://db.internal:6380?tls_verify=false",
                          "redis+cluster://10.0.0.5:7000,10.0.0.6:7000",
                          "postgres://idemgate@db.internal/idemgate",
                          "postgres://idemgate@db.internal/idemgate?sslmode=require",
                          "postgresql://idemgate@127.0.0.1,db.internal/idemgate?sslmode=verify-ca"}) {
    std::optional<std::string> warning = UnverifiedStoreTransport(url);
    ASSERT_TRUE(warning) << url;
    EXPECT_TRUE(warning->starts_with("warning: the store ")) << *warning;
    EXPECT_EQ(warning->find("secret"), std::string::npos) << *warning;
    EXPECT_EQ(warning->find('\n'), std::string::npos) << "one line";
  }
  for (const char* url : {"memory:", "sqlite:/var/lib/idemgate/idemgate.db", "redis://127.0.0.1:6379",
                          "redis://localhost", "redis://[::1]:6379", "rediss://db.internal:6380",
                          "postgres://idemgate@localhost/idemgate",
                          "postgres://idemgate@db.internal/idemgate?sslmode=verify-full",
                          "postgres:///idemgate?host=/run/postgresql", "postgres:///idemgate",
                          "redis://db.internal:notaport"}) {
    EXPECT_EQ(UnverifiedStoreTransport(url), std::nullopt) << url;
  }
}

}  // namespace
}  // namespace idem
