// Tests of the parts that do no I/O: URLs, cluster slots, key names, decoding.
#include <gtest/gtest.h>

#include "cluster_slots.h"
#include "redis_codec.h"
#include "redis_url.h"

namespace idem::redis {
namespace {

TEST(RedisUrlTest, SingleServerWithEverything) {
  auto c = ParseRedisUrl(
      "redis://alice:s%40cret@db.example:6380/3?connect_timeout=500ms&timeout=3s&prefix=app%3A&"
      "pool=4&attempts_maxlen=1000&wait_replicas=1&wait_timeout=250ms&fence_floor_keep=1d");
  ASSERT_TRUE(c) << c.error().ToString();
  ASSERT_EQ(c->nodes.size(), 1u);
  EXPECT_EQ(c->nodes[0], (NodeAddress{"db.example", 6380}));
  EXPECT_FALSE(c->cluster);
  EXPECT_EQ(c->user, "alice");
  EXPECT_EQ(c->password, "s@cret");
  EXPECT_EQ(c->db, 3);
  EXPECT_EQ(c->connect_timeout, Duration(500));
  EXPECT_EQ(c->command_timeout, Duration(3000));
  EXPECT_EQ(c->prefix, "app:");
  EXPECT_EQ(c->pool, 4u);
  EXPECT_EQ(c->attempts_maxlen, 1000u);
  EXPECT_EQ(c->wait_replicas, 1);
  EXPECT_EQ(c->wait_timeout, Duration(250));
  EXPECT_EQ(c->fence_floor_keep, Duration(86'400'000));
}

TEST(RedisUrlTest, Defaults) {
  auto c = ParseRedisUrl("redis://localhost");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->nodes[0], (NodeAddress{"localhost", 6379}));
  EXPECT_EQ(c->db, 0);
  EXPECT_TRUE(c->password.empty());
  EXPECT_EQ(c->connect_timeout, Duration(1000));
  EXPECT_EQ(c->command_timeout, Duration(2000));
  EXPECT_EQ(c->attempts_maxlen, 1'000'000u);
}

TEST(RedisUrlTest, PasswordOnlyForms) {
  auto a = ParseRedisUrl("redis://:pw@h:1/0");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->user, "");
  EXPECT_EQ(a->password, "pw");
  auto b = ParseRedisUrl("redis://pw@h");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->password, "pw");
}

TEST(RedisUrlTest, ClusterSeedsAndIpv6) {
  auto c = ParseRedisUrl("redis+cluster://127.0.0.1:7000,[::1]:7001,h3?timeout=1s");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->cluster);
  ASSERT_EQ(c->nodes.size(), 3u);
  EXPECT_EQ(c->nodes[1], (NodeAddress{"::1", 7001}));
  EXPECT_EQ(c->nodes[1].ToString(), "[::1]:7001");
  EXPECT_EQ(c->nodes[2].port, 6379);
}

TEST(RedisUrlTest, Refusals) {
  for (const char* bad :
       {"redis://", "redis://h:0", "redis://h:x", "redis://h/abc", "redis://a,b",
        "redis+cluster://a:1/2", "redis://h?nope=1", "redis://h?timeout=fast", "redis://h?pool=0",
        "redis://h?prefix=%7Bx", "redis://h?timeout", "redis+cluster://a:1,",
        "redis://h?wait_replicas=1&wait_timeout=5s&timeout=2s", "http://h"}) {
    auto c = ParseRedisUrl(bad);
    EXPECT_FALSE(c) << bad;
    if (!c) {
      EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << bad;
    }
  }
}

TEST(RedisUrlTest, TlsIsRefusedWithTheReason) {
  auto c = ParseRedisUrl("rediss://h:6380");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(c.error().message.find("hiredis 0.14"), std::string::npos) << c.error().message;
  EXPECT_TRUE(IsRedisUrl("rediss+cluster://h"));
  EXPECT_FALSE(IsRedisUrl("sqlite:x"));
}

TEST(ClusterSlotsTest, KeySlotMatchesRedis) {
  // Values from redis-cli CLUSTER KEYSLOT.
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("123456789"), 12739);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), KeySlot("foo{}{bar}"));  // empty tag: the whole key
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));
}

TEST(ClusterSlotsTest, RecordAndChannelShareOneSlot) {
  for (const RecordId& id : {RecordId{"t", "k"}, RecordId{"a:b", "c}d{e"}, RecordId{"%", "{}"}}) {
    RecordKeys k = KeysOf("pre:", id);
    EXPECT_EQ(KeySlot(k.record), KeySlot(k.channel));
  }
}

TEST(RedisCodecTest, KeyNamesNeverCollideAcrossTenants) {
  EXPECT_NE(KeysOf("", {"a:b", "c"}).record, KeysOf("", {"a", "b:c"}).record);
  EXPECT_NE(KeysOf("", {"a", "%7B"}).record, KeysOf("", {"a", "{"}).record);
  EXPECT_EQ(KeysOf("p:", {"t", "k"}).record, "p:idem:{t:k}:r");
  EXPECT_EQ(RecordKeyPattern("a*b:"), "a\\*b:idem:{*}:r");
}

TEST(RedisCodecTest, AttemptRoundTrip) {
  Attempt a;
  a.at = FromUnixMillis(1'767'225'600'123);
  a.tenant = "t";
  a.key = "k";
  a.tool = "charge";
  a.turn = "turn";
  a.outcome = AttemptOutcome::kDrift;
  a.latency = Duration(42);
  a.instance = "i-1";
  a.detail = "d";
  const char* names[] = {"at",      "tenant",  "key",      "tool",  "turn",
                         "outcome", "latency", "instance", "detail"};
  std::vector<std::string> values = EncodeAttempt(a);
  ASSERT_EQ(values.size(), 9u);
  // Build the reply a stream entry would carry.
  std::vector<redisReply> items(18);
  std::vector<redisReply*> ptrs;
  std::vector<std::string> storage;
  storage.reserve(18);
  for (int i = 0; i < 9; ++i) {
    storage.push_back(names[i]);
    storage.push_back(values[i]);
  }
  for (int i = 0; i < 18; ++i) {
    items[i] = redisReply{REDIS_REPLY_STRING, 0, storage[i].size(), storage[i].data(), 0, nullptr};
    ptrs.push_back(&items[i]);
  }
  redisReply array{REDIS_REPLY_ARRAY, 0, 0, nullptr, ptrs.size(), ptrs.data()};
  auto back = DecodeAttempt(array);
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(back->at, a.at);
  EXPECT_EQ(back->outcome, AttemptOutcome::kDrift);
  EXPECT_EQ(back->latency, Duration(42));
  EXPECT_EQ(back->instance, "i-1");
}

}  // namespace
}  // namespace idem::redis
