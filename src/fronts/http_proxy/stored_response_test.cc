#include "fronts/http_proxy/stored_response.h"

#include <gtest/gtest.h>

namespace idem::proxy {
namespace {

TEST(StoredResponseTest, RoundTripsStatusHeadersAndBodyBytes) {
  StoredResponse in;
  in.status = 201;
  in.headers = {{"Content-Type", "application/json"},
                {"X-Empty", ""},
                {"X-Colon", "a: b"},
                {"Set-Cookie", "a=1"},
                {"Set-Cookie", "b=2"}};
  in.body = std::string("{\"id\":\"ch_1\"}\n\n\0\xff binary", 24);
  const std::string bytes = EncodeStoredResponse(in);
  EXPECT_TRUE(bytes.starts_with("idemgate-http/1 201\nContent-Type: application/json\n"));
  Result<StoredResponse> out = DecodeStoredResponse(bytes);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->status, 201);
  ASSERT_EQ(out->headers.size(), in.headers.size());
  for (size_t i = 0; i < in.headers.size(); ++i) {
    EXPECT_EQ(out->headers[i].name, in.headers[i].name);
    EXPECT_EQ(out->headers[i].value, in.headers[i].value);
  }
  EXPECT_EQ(out->body, in.body);
}

TEST(StoredResponseTest, EmptyBodyAndNoHeaders) {
  Result<StoredResponse> out = DecodeStoredResponse(EncodeStoredResponse({204, {}, {}}));
  ASSERT_TRUE(out);
  EXPECT_EQ(out->status, 204);
  EXPECT_TRUE(out->headers.empty());
  EXPECT_TRUE(out->body.empty());
}

TEST(StoredResponseTest, RefusesOtherBytesAsDataLoss) {
  for (std::string_view bad :
       {"", "{\"content\":[]}", "idemgate-http/1 abc\n\n", "idemgate-http/1 200\nNoColon\n\n",
        "idemgate-http/1 200\nA: b\n", "idemgate-http/1 42\n\n"}) {
    Result<StoredResponse> out = DecodeStoredResponse(bad);
    ASSERT_FALSE(out) << bad;
    EXPECT_EQ(out.error().code, ErrorCode::kDataLoss);
  }
}

// Security review F13: outcomes an operator sets (console set-outcome,
// resolve) are replayed byte for byte, so what cannot be a final HTTP answer
// is refused when read: a 1xx or a status past 599, a header line with a
// bare CR or another control character (a second header, smuggled), a name
// that is not a token.
TEST(StoredResponseTest, RefusesWhatCannotBeReplayedAsAnAnswer) {
  for (std::string_view bad : {
           std::string_view("idemgate-http/1 101\n\n"),
           std::string_view("idemgate-http/1 100\n\n"),
           std::string_view("idemgate-http/1 600\n\n"),
           std::string_view("idemgate-http/1 999\n\n"),
           std::string_view("idemgate-http/1 200\nX: a\rSet-Cookie: s=1\n\nbody"),
           std::string_view("idemgate-http/1 200\nX: a\0b\n\n", 28),
           std::string_view("idemgate-http/1 200\nX: a\x1b]0;t\x07\n\n"),
           std::string_view("idemgate-http/1 200\nBad Name: v\n\n"),
           std::string_view("idemgate-http/1 200\nX\r: v\n\n"),
       }) {
    auto r = DecodeStoredResponse(bad);
    EXPECT_FALSE(r) << "replayable: " << bad;
    if (!r) {
      EXPECT_EQ(r.error().code, ErrorCode::kDataLoss);
    }
  }
  auto ok = DecodeStoredResponse("idemgate-http/1 201\nX-Tab: a\tb\nX-Latin: caf\xe9\n\n{}");
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->status, 201);
  EXPECT_EQ(ok->headers.size(), 2u);
}

TEST(StoredResponseTest, DropsHopByHopHeadersAndThoseConnectionNames) {
  std::vector<http::Header> in = {
      {"Content-Type", "text/plain"},
      {"connection", "keep-alive, X-Private"},
      {"Keep-Alive", "timeout=5"},
      {"Transfer-Encoding", "chunked"},
      {"content-length", "5"},
      {"x-private", "1"},
      {"TE", "trailers"},
      {"Upgrade", "h2c"},
      {"X-Request-Id", "r1"},
  };
  std::vector<http::Header> out = EndToEndHeaders(in, "keep-alive, X-Private");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "Content-Type");
  EXPECT_EQ(out[1].name, "X-Request-Id");
  EXPECT_TRUE(IsHopByHop("PROXY-AUTHORIZATION"));
  EXPECT_FALSE(IsHopByHop("Authorization"));
}

// Regression: the Connection value passed in may live in one of the headers
// being filtered (a short value sits inside the string object, which the
// erase moves over).
TEST(StoredResponseTest, ConnectionValueMayPointIntoTheHeaders) {
  std::vector<http::Header> in = {{"Connection", "X-A"}, {"X-B", "1"}, {"X-C", "2"}, {"X-A", "3"}};
  std::string_view connection = in[0].value;
  std::vector<http::Header> out = EndToEndHeaders(std::move(in), connection);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "X-B");
  EXPECT_EQ(out[1].name, "X-C");
}

}  // namespace
}  // namespace idem::proxy
