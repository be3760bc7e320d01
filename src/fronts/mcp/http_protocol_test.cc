#include "fronts/mcp/http_protocol.h"

#include <gtest/gtest.h>

#include <set>

#include "fronts/mcp/http_jsonrpc.h"

namespace idem::mcp {
namespace {

TEST(ProtocolVersion, KnownVersionsOnly) {
  for (std::string_view v :
       {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"}) {
    EXPECT_TRUE(IsSupportedProtocolVersion(v)) << v;
  }
  for (std::string_view v : {"", "2025-01-01", "1900-01-01", "not-a-version", "2025-06-18 "}) {
    EXPECT_FALSE(IsSupportedProtocolVersion(v)) << v;
  }
  EXPECT_TRUE(IsStatelessProtocolVersion("2026-07-28"));
  EXPECT_FALSE(IsStatelessProtocolVersion("2025-11-25"));
  EXPECT_FALSE(IsStatelessProtocolVersion("2099-01-01")) << "unknown is not stateless";
  EXPECT_NE(SupportedProtocolVersionList().find("2024-11-05, 2025-03-26"), std::string::npos);
}

TEST(Accept, MediaRanges) {
  std::string_view both = "application/json, text/event-stream";
  EXPECT_TRUE(AcceptsMediaType(both, "application/json"));
  EXPECT_TRUE(AcceptsMediaType(both, "text/event-stream"));
  EXPECT_FALSE(AcceptsMediaType("application/json", "text/event-stream"));
  EXPECT_TRUE(AcceptsMediaType("*/*", "text/event-stream"));
  EXPECT_TRUE(AcceptsMediaType("text/*;q=0.5", "text/event-stream"));
  EXPECT_FALSE(AcceptsMediaType("text/*", "application/json"));
  EXPECT_TRUE(AcceptsMediaType("Application/JSON; charset=utf-8", "application/json"));
  EXPECT_FALSE(AcceptsMediaType("application/json;q=0, text/html", "application/json"));
  EXPECT_FALSE(AcceptsMediaType("application/json; q=0.0", "application/json"));
  EXPECT_TRUE(AcceptsMediaType("application/json; q=0.1", "application/json"));
  EXPECT_TRUE(AcceptsMediaType("", "application/json")) << "no Accept header accepts anything";
  EXPECT_FALSE(AcceptsMediaType("text/html", "application/json"));
  EXPECT_FALSE(AcceptsMediaType("application/jsonx", "application/json"));
}

TEST(ContentType, IgnoresParametersAndCase) {
  EXPECT_TRUE(IsMediaType("application/json", "application/json"));
  EXPECT_TRUE(IsMediaType("Application/Json; charset=utf-8", "application/json"));
  EXPECT_FALSE(IsMediaType("text/plain", "application/json"));
  EXPECT_FALSE(IsMediaType("", "application/json"));
}

TEST(SessionId, NewIdsAreValidUniqueAndUnguessableLength) {
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    Result<std::string> id = NewSessionId();
    ASSERT_TRUE(id);
    EXPECT_EQ(id->size(), 43u);
    EXPECT_TRUE(IsValidSessionId(*id));
    EXPECT_TRUE(seen.insert(*id).second);
  }
}

TEST(SessionId, OnlyVisibleAscii) {
  EXPECT_TRUE(IsValidSessionId("abc-DEF_123.~!"));
  EXPECT_FALSE(IsValidSessionId(""));
  EXPECT_FALSE(IsValidSessionId("has space"));
  EXPECT_FALSE(IsValidSessionId("tab\t"));
  EXPECT_FALSE(IsValidSessionId("crlf\r\nInjected: 1"));
  EXPECT_FALSE(IsValidSessionId("caf\xC3\xA9"));
  EXPECT_FALSE(IsValidSessionId(std::string(1025, 'a')));
}

TEST(Loopback, Hosts) {
  for (std::string_view h : {"localhost", "LOCALHOST", "localhost.", "app.localhost", "127.0.0.1",
                             "127.8.9.10", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (std::string_view h : {"", "example.com", "localhost.example.com", "10.0.0.1", "0.0.0.0",
                             "::", "[::2]", "evil-localhost", "128.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(Authority, Host) {
  EXPECT_EQ(HostOfAuthority("example.com:8080"), "example.com");
  EXPECT_EQ(HostOfAuthority("[::1]:8080"), "::1");
  EXPECT_EQ(HostOfAuthority("[::1]"), "::1");
  EXPECT_EQ(HostOfAuthority("localhost"), "localhost");
  EXPECT_EQ(HostOfAuthority("user@host:1"), "host");
}

TEST(Origin, LoopbackAndListedOnly) {
  std::vector<std::string> none;
  EXPECT_TRUE(IsOriginAllowed("http://localhost:6274", none));
  EXPECT_TRUE(IsOriginAllowed("http://127.0.0.1:3000", none));
  EXPECT_TRUE(IsOriginAllowed("https://[::1]:8443", none));
  EXPECT_TRUE(IsOriginAllowed("http://localhost", none));
  EXPECT_FALSE(IsOriginAllowed("http://evil.example", none));
  EXPECT_FALSE(IsOriginAllowed("http://localhost.evil.example", none));
  EXPECT_FALSE(IsOriginAllowed("null", none));
  EXPECT_FALSE(IsOriginAllowed("file://localhost", none));
  EXPECT_FALSE(IsOriginAllowed("garbage", none));
  std::vector<std::string> listed = {"https://app.example"};
  EXPECT_TRUE(IsOriginAllowed("https://APP.example", listed));
  EXPECT_FALSE(IsOriginAllowed("https://app.example:444", listed));
}

TEST(Host, LoopbackListenerRefusesForeignNames) {
  std::vector<std::string> none;
  EXPECT_TRUE(IsHostAllowedOnLoopback("127.0.0.1:8080", none));
  EXPECT_TRUE(IsHostAllowedOnLoopback("localhost:8080", none));
  EXPECT_TRUE(IsHostAllowedOnLoopback("[::1]:8080", none));
  EXPECT_FALSE(IsHostAllowedOnLoopback("attacker.example:8080", none));
  std::vector<std::string> listed = {"devbox"};
  EXPECT_TRUE(IsHostAllowedOnLoopback("DevBox:8080", listed));
}

TEST(HostPort, Parse) {
  auto hp = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(hp);
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 8080);
  hp = ParseHostPort("[::1]:0");
  ASSERT_TRUE(hp);
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 0);
  hp = ParseHostPort("localhost:65535");
  ASSERT_TRUE(hp);
  for (std::string_view bad :
       {"", "127.0.0.1", ":80", "host:", "host:65536", "host:-1", "::1:80", "[::1]80", "host:8o"}) {
    auto r = ParseHostPort(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("HOST:PORT"), std::string::npos);
  }
  EXPECT_EQ(FormatHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(FormatHostPort("127.0.0.1", 80), "127.0.0.1:80");
}

// Found by fuzz/mcp_http_protocol_fuzz: "[[]:8" parsed as host "[", which
// FormatHostPort wrote as "[:8", an address ParseHostPort refuses.
TEST(HostPort, RefusesBracketsInsideTheHost) {
  for (std::string_view bad : {"[[]:8", "[[::1]:80", "[a[b]:80", "x]:80", "a[b:80"}) {
    auto r = ParseHostPort(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("HOST:PORT"), std::string::npos);
  }
}

TEST(Base64, RoundTrip) {
  for (std::string_view s : {"", "a", "ab", "abc", "abcd", "Hello, \xE4\xB8\x96\xE7\x95\x8C"}) {
    Result<std::string> back = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(back) << s;
    EXPECT_EQ(*back, s);
  }
  EXPECT_EQ(Base64Encode("Hello, \xE4\xB8\x96\xE7\x95\x8C"), "SGVsbG8sIOS4lueVjA==");
  EXPECT_FALSE(Base64Decode("abc"));
  EXPECT_FALSE(Base64Decode("ab=c"));
  EXPECT_FALSE(Base64Decode("a==="));
  EXPECT_FALSE(Base64Decode("ab!d"));
}

TEST(MirroredHeader, EncodesWhatIsNotPlainAscii) {
  EXPECT_EQ(EncodeMirroredHeaderValue("us-west1"), "us-west1");
  EXPECT_EQ(EncodeMirroredHeaderValue("Hello, \xE4\xB8\x96\xE7\x95\x8C"),
            "=?base64?SGVsbG8sIOS4lueVjA==?=");
  EXPECT_EQ(EncodeMirroredHeaderValue(" padded "), "=?base64?IHBhZGRlZCA=?=");
  EXPECT_EQ(EncodeMirroredHeaderValue("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
  EXPECT_EQ(EncodeMirroredHeaderValue("=?base64?literal?="), "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=");
  for (std::string_view v : {"us-west1", " padded ", "=?base64?literal?=", "line1\nline2"}) {
    Result<std::string> back = DecodeMirroredHeaderValue(EncodeMirroredHeaderValue(v));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, v);
  }
  EXPECT_FALSE(DecodeMirroredHeaderValue("=?base64?!!?="));
}

TEST(Excerpt, OnlyPrintableAscii) {
  EXPECT_EQ(PrintableExcerpt("a\nb\x01\xFF"), "a?b??");
  EXPECT_EQ(PrintableExcerpt("abcdef", 3), "abc...");
}

}  // namespace
}  // namespace idem::mcp
