// Tests of the parts that need no Redis server: URLs, cluster slots, key
// names, decoding, and the pipeline facing a server that never answers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "cluster_slots.h"
#include "net/io_threads.h"
#include "pipeline.h"
#include "redis_codec.h"
#include "redis_connection.h"
#include "redis_url.h"

namespace idem::redis {
namespace {

// The pool and the pipeline of a node share one backoff: once either has
// reached a restarted server, the other tries at once instead of refusing
// calls with its stale error until its own backoff ends.
TEST(ConnectBackoffTest, AFailureDefersAttemptsAndAnySuccessEndsIt) {
  ConnectBackoff backoff;
  EXPECT_FALSE(backoff.Check());
  backoff.Failed(Error{ErrorCode::kUnavailable, "redis store 127.0.0.1:1 is unreachable"});
  std::optional<Error> wait = backoff.Check();
  ASSERT_TRUE(wait);
  EXPECT_EQ(wait->code, ErrorCode::kUnavailable);
  EXPECT_TRUE(wait->unreached);
  EXPECT_NE(wait->message.find("is unreachable (next connect attempt in "), std::string::npos)
      << wait->message;
  backoff.Reached();  // the other user of the node connected
  EXPECT_FALSE(backoff.Check());
}

// A "server" whose kernel completes the TCP handshake but which never reads
// or answers: a connection's setup (SELECT) waits for its timeout.
class SilentServer {
 public:
  SilentServer() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentServer() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// On the caller's io_context, a connection being opened (here: a SELECT
// that never gets its answer) does not hold up the io_context's threads, even
// with one: it is opened on a thread of its own. The commands queued
// meanwhile fail once the connect does, naming the server.
TEST(PipelineTest, AConnectThatHangsDoesNotHoldUpTheIoContext) {
  SilentServer server;
  net::IoThreads io(1);
  ConnectOptions options;
  options.db = 1;  // so that Open sends SELECT and waits for its answer
  options.connect_timeout = Duration(1'000);
  options.command_timeout = Duration(1'000);
  std::vector<std::string> order;
  std::mutex mu;
  auto note = [&](std::string what) {
    std::lock_guard g(mu);
    order.push_back(std::move(what));
  };
  std::promise<Error> failed;
  {
    Pipeline pipeline(NodeAddress{"127.0.0.1", server.port()}, options, nullptr, &io.context());
    pipeline.Submit({"PING"}, [&](Result<Reply> r) {
      note("reply");
      failed.set_value(r ? Error{ErrorCode::kInternal, "a reply from a silent server"} : r.error());
    });
    // Posted once the connect has started: it runs while the connect waits.
    boost::asio::post(io.context(), [&] { note("other work"); });
    const Error e = failed.get_future().get();
    EXPECT_EQ(e.code, ErrorCode::kUnavailable) << e.message;
    EXPECT_NE(e.message.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos)
        << e.message;
  }
  io.Stop();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "other work") << "the connect held up the io_context's only thread";
}

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
  EXPECT_EQ(c->body_field_bytes, 64u);
  auto split = ParseRedisUrl("redis://h?body_field_bytes=0");
  ASSERT_TRUE(split) << split.error().ToString();
  EXPECT_EQ(split->body_field_bytes, 0u);
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
  EXPECT_EQ(c->attempts_scan, 10'000u);
  auto capped = ParseRedisUrl("redis://localhost?attempts_scan=500");
  ASSERT_TRUE(capped);
  EXPECT_EQ(capped->attempts_scan, 500u);
  EXPECT_FALSE(ParseRedisUrl("redis://localhost?attempts_scan=lots"));
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
        "redis://h?wait_replicas=1&wait_timeout=5s&timeout=2s", "http://h",
        "redis://h?body_field_bytes=-1", "redis://h?body_field_bytes=99999999"}) {
    auto c = ParseRedisUrl(bad);
    EXPECT_FALSE(c) << bad;
    if (!c) {
      EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << bad;
    }
  }
}

TEST(RedisUrlTest, TlsOptions) {
  auto c = ParseRedisUrl(
      "rediss://h:6380?tls_ca=/etc/ca%20dir/ca.pem&tls_cert=/c.pem&tls_key=/k.pem"
      "&tls_server_name=redis.internal&tls_verify=false");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->tls.enabled);
  EXPECT_FALSE(c->cluster);
  EXPECT_EQ(c->tls.ca_file, "/etc/ca dir/ca.pem");
  EXPECT_EQ(c->tls.cert_file, "/c.pem");
  EXPECT_EQ(c->tls.key_file, "/k.pem");
  EXPECT_EQ(c->tls.server_name, "redis.internal");
  EXPECT_FALSE(c->tls.verify);

  auto cluster = ParseRedisUrl("rediss+cluster://a:1,b:2");
  ASSERT_TRUE(cluster) << cluster.error().message;
  EXPECT_TRUE(cluster->cluster);
  EXPECT_TRUE(cluster->tls.enabled);
  EXPECT_TRUE(cluster->tls.verify);
  EXPECT_EQ(cluster->nodes.size(), 2u);
  EXPECT_FALSE(ParseRedisUrl("redis://h")->tls.enabled);
  EXPECT_TRUE(IsRedisUrl("rediss+cluster://h"));
  EXPECT_FALSE(IsRedisUrl("sqlite:x"));
}

TEST(RedisUrlTest, TlsOptionMistakesAreRefusedWithTheFix) {
  const std::pair<const char*, const char*> cases[] = {
      {"redis://h?tls_ca=/ca.pem", "needs TLS: write rediss://"},
      {"rediss://h?tls_cert=/c.pem", "tls_cert and tls_key go together"},
      {"rediss://h?tls_key=/k.pem", "tls_cert and tls_key go together"},
      {"rediss://h?tls_verify=no", "tls_verify must be true or false"},
      {"rediss://h?tls_ca=", "tls_ca is empty"},
      {"rediss://h?tls_bogus=1", "unknown option"},
  };
  for (const auto& [url, why] : cases) {
    auto c = ParseRedisUrl(url);
    ASSERT_FALSE(c) << url;
    EXPECT_EQ(c.error().code, ErrorCode::kInvalidArgument) << url;
    EXPECT_NE(c.error().message.find(why), std::string::npos) << url << ": " << c.error().message;
  }
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

// A reply of strings, as hiredis would build it (the strings must outlive it).
class FlatReply {
 public:
  explicit FlatReply(const std::vector<std::string>& values) : values_(values) {
    items_.reserve(values_.size());
    for (std::string& v : values_) {
      items_.push_back(redisReply{REDIS_REPLY_STRING, 0, v.size(), v.data(), 0, nullptr});
    }
    for (redisReply& item : items_) ptrs_.push_back(&item);
    array_ = redisReply{REDIS_REPLY_ARRAY, 0, 0, nullptr, ptrs_.size(), ptrs_.data()};
  }
  const redisReply& get() const { return array_; }

 private:
  std::vector<std::string> values_;
  std::vector<redisReply> items_;
  std::vector<redisReply*> ptrs_;
  redisReply array_{};
};

// HGETALL of a completed record whose outcome EncodeOutcome laid out.
std::vector<std::string> CompletedHash(const Outcome& o, size_t field_bytes) {
  std::vector<std::string> hash = {"st", "completed", "fp", "f",  "tool", "charge", "turn",
                                   "t",  "fence",     "7",  "cr", "1",    "le",     "2",
                                   "co", "3",         "ex", "4",  "ow",   "o"};
  OutcomeFields fields = EncodeOutcome(o, field_bytes);
  hash.insert(hash.end(), {"oc", fields.cls});
  // HGETALL gives no order: put the body first and backwards.
  for (size_t i = fields.pairs.size(); i >= 2; i -= 2) {
    hash.insert(hash.begin(), {fields.pairs[i - 2], fields.pairs[i - 1]});
  }
  return hash;
}

TEST(RedisCodecTest, BodySplitIntoListpackSizedFieldsComesBackWhole) {
  std::string body;
  for (int i = 0; i < 200; ++i) body += static_cast<char>(i);
  const Outcome o{OutcomeClass::kSuccess, body};
  OutcomeFields fields = EncodeOutcome(o, 64);
  EXPECT_EQ(fields.cls, "success/fields");
  ASSERT_EQ(fields.pairs.size(), 8u);  // 64 + 64 + 64 + 8 bytes
  EXPECT_EQ(fields.pairs[0], "o1");
  EXPECT_EQ(fields.pairs[6], "o4");
  EXPECT_EQ(fields.pairs[7].size(), 8u);
  FlatReply hash(CompletedHash(o, 64));
  auto r = DecodeRecordHash({"t", "k"}, hash.get());
  ASSERT_TRUE(r && r->has_value()) << (r ? "absent" : r.error().ToString());
  ASSERT_TRUE((*r)->outcome);
  EXPECT_EQ((*r)->outcome->cls, OutcomeClass::kSuccess);
  EXPECT_EQ((*r)->outcome->body, body);
  EXPECT_EQ((*r)->fence, 7u);
  EXPECT_EQ((*r)->owner, "o");
}

TEST(RedisCodecTest, EmptyAndLongBodiesAndTheOldLayout) {
  const Outcome empty{OutcomeClass::kToolError, ""};
  EXPECT_TRUE(EncodeOutcome(empty, 64).pairs.empty());
  FlatReply e(CompletedHash(empty, 64));
  auto r = DecodeRecordHash({"t", "k"}, e.get());
  ASSERT_TRUE(r && r->has_value() && (*r)->outcome);
  EXPECT_EQ((*r)->outcome->cls, OutcomeClass::kToolError);
  EXPECT_EQ((*r)->outcome->body, "");
  // Too long to stay a listpack anyway, or splitting turned off: one field,
  // as every record written before the split layout has.
  const Outcome long_body{OutcomeClass::kSuccess, std::string(kMaxBodyFields * 64 + 1, 'x')};
  for (const auto& [o, bytes] : {std::pair{long_body, size_t{64}}, std::pair{long_body, size_t{0}},
                                 std::pair{Outcome{OutcomeClass::kSuccess, "abc"}, size_t{0}}}) {
    OutcomeFields fields = EncodeOutcome(o, bytes);
    EXPECT_EQ(fields.cls, "success");
    ASSERT_EQ(fields.pairs.size(), 2u);
    EXPECT_EQ(fields.pairs[0], "ob");
    FlatReply hash(CompletedHash(o, bytes));
    auto back = DecodeRecordHash({"t", "k"}, hash.get());
    ASSERT_TRUE(back && back->has_value() && (*back)->outcome);
    EXPECT_EQ((*back)->outcome->body, o.body);
  }
}

TEST(RedisCodecTest, SplitBodyWithAGapIsCorruptAndHmgetLeavesItOut) {
  std::vector<std::string> fields =
      CompletedHash({OutcomeClass::kSuccess, std::string(130, 'y')}, 64);
  const auto o2 = std::find(fields.begin(), fields.end(), "o2");
  ASSERT_NE(o2, fields.end());
  fields.erase(o2, o2 + 2);
  FlatReply gap(fields);
  auto r = DecodeRecordHash({"t", "k"}, gap.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDataLoss);
  // The scripts' HMGET of the fields without the body: the class is read
  // through the suffix.
  FlatReply hmget(
      {"completed", "f", "charge", "t", "7", "1", "2", "3", "4", "success/fields", "o",
       "86400000"});
  auto h = DecodeRecord({"t", "k"}, hmget.get());
  ASSERT_TRUE(h && h->has_value() && (*h)->outcome) << (h ? "" : h.error().ToString());
  EXPECT_EQ((*h)->outcome->cls, OutcomeClass::kSuccess);
  EXPECT_EQ((*h)->retention, Duration(86'400'000));
  // A tombstone holds only the fence: no record.
  FlatReply tombstone({"fence", "9"});
  auto t = DecodeRecordHash({"t", "k"}, tombstone.get());
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->has_value());
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
  a.seq = 7;
  a.prev_hash = "ab";
  a.hash = "cd";
  const char* names[] = {"at",      "tenant",   "key",    "tool", "turn", "outcome",
                         "latency", "instance", "detail", "seq",  "prev", "hash"};
  std::vector<std::string> values = EncodeAttempt(a);
  ASSERT_EQ(values.size(), 12u);
  // The reply a stream entry would carry.
  std::vector<std::string> entry;
  for (int i = 0; i < 12; ++i) entry.insert(entry.end(), {names[i], values[i]});
  FlatReply array(entry);
  auto back = DecodeAttempt(array.get());
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(back->at, a.at);
  EXPECT_EQ(back->outcome, AttemptOutcome::kDrift);
  EXPECT_EQ(back->latency, Duration(42));
  EXPECT_EQ(back->instance, "i-1");
  EXPECT_EQ(back->seq, 7u);
  EXPECT_EQ(back->prev_hash, "ab");
  EXPECT_EQ(back->hash, "cd");
}

TEST(RedisCodecTest, ChainHeadsLiveInTheStreamsSlotAndRoundTrip) {
  for (std::string_view prefix : {"", "app1:", "a%b:"}) {
    EXPECT_EQ(KeySlot(AttemptHeadsKey(prefix)), KeySlot(AttemptStreamKey(prefix))) << prefix;
  }
  const ChainHead head{"t", 12, "ab12", 5, "ff00"};
  auto back = ParseChainHead("t", ChainHeadValue(head));
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(*back, head);
  auto fresh = ParseChainHead("t", ChainHeadValue(ChainHead{"t", 1, "ab", 1, ""}));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->start_prev, "");
  auto reserved = ParseChainHead("t", "3 ab 1  f00d 1767225600000");
  ASSERT_TRUE(reserved) << reserved.error().ToString();
  EXPECT_EQ(reserved->seq, 3u);
  EXPECT_EQ(reserved->start_prev, "");
  EXPECT_FALSE(ParseChainHead("t", "x y"));
}

}  // namespace
}  // namespace idem::redis
