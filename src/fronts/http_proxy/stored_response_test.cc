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
