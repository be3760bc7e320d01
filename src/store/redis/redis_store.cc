#include "redis_store.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "change_listener.h"
#include "idem/attempt_chain.h"
#include "pipeline.h"
#include "redis_client.h"
#include "redis_codec.h"
#include "redis_scripts.h"

namespace idem {
namespace {

using redis::Reply;
using SteadyClock = std::chrono::steady_clock;

// Redis deletes a record (native TTL) this long after its logical expiry by
// the writer's clock, so that an instance whose clock lags a little still
// sees the record expire by its own reckoning first. Only garbage
// collection: expiry decisions use the stored expires_at.
constexpr Duration kGcMargin{60'000};
// SCAN batch and stream page sizes.
constexpr int kScanCount = 1000;
constexpr int kStreamPage = 512;
constexpr size_t kAttemptsPerScript = 256;
// How long a write whose audit entry no longer follows its tenant's chain
// head (another instance appended first) is recomputed and sent again.
constexpr std::chrono::seconds kChainPatience{2};
// ReadChain with a tenant: entries scanned per call at most.
constexpr size_t kChainScan = 8 * kStreamPage;

// 64 random bits in hex.
std::string NewToken() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool Differs(const Record& seen, const Record& now) {
  return now.fence != seen.fence || now.state != seen.state;
}

bool Matches(const AttemptFilter& f, const Attempt& a) {
  return (!f.tenant || *f.tenant == a.tenant) && (!f.key || *f.key == a.key) &&
         (!f.tool || *f.tool == a.tool) && (!f.outcome || *f.outcome == a.outcome) &&
         (!f.since || a.at >= *f.since);
}

std::string_view Str(const redisReply& r) { return redis::Text(r); }

Error Unexpected(std::string_view script, std::string_view what) {
  return Error{ErrorCode::kInternal, "redis store: the " + std::string(script) +
                                         " script answered " + std::string(what) +
                                         "; is another version of idemgate using this prefix?"};
}

class RedisStore final : public Store {
 public:
  RedisStore(std::unique_ptr<redis::RedisClient> client, Clock& clock, const StoreOptions& options)
      : client_(std::move(client)),
        clock_(clock),
        options_(options),
        prefix_(client_->config().prefix),
        listener_([c = client_.get()] { return c->ConnectAny(); }) {
    // One server: the asynchronous operations share one pipelined
    // connection. (In a cluster a command goes where its slot lives, with
    // redirections: the blocking calls.) Writes only when no WAIT follows
    // them (wait_replicas = 0).
    if (!client_->config().cluster) {
      const redis::NodeAddress node = client_->Masters().front();
      pipeline_ = std::make_unique<redis::Pipeline>(node, client_->connect_options(),
                                                    client_->BackoffFor(node), options.io);
    }
  }

  // Store:
  // One server: in the record's script. A cluster's audit stream lives in
  // another slot than the record, which one script cannot write.
  bool LogsWithRecords() const override { return !client_->config().cluster; }
  // A pipelined claim that finds the record writes nothing and answers with
  // it (the claim script's 'exists'), in the one round trip a read would take.
  bool ReadsBeforeClaim() const override { return !PipelinedWrites(); }

  // A claim or completion that logs its entry sends it chained from this
  // process's cached head of the tenant; the script refuses it ('stale')
  // if another write moved the head first, and it is sent again.
  Result<ClaimResult> Claim(const ClaimRequest& req) override {
    if (Ordered(req.logged)) {
      return Await<ClaimResult>([&](ClaimDone done) { ClaimAsync(req, std::move(done)); });
    }
    const auto keys = redis::KeysOf(prefix_, req.id);
    const auto give_up = SteadyClock::now() + kChainPatience;
    for (int round = 0; SteadyClock::now() < give_up; ++round) {
      uint64_t lessons = 0;
      const std::optional<Attempt> entry = Chained(req.logged ? &*req.logged : nullptr, &lessons);
      auto reply = client_->Eval(redis::ClaimScript(), ScriptKeys(keys, entry.has_value()),
                                 ScriptArgs(clock_.Now(), ClaimArgs(req, entry)), /*write=*/true);
      if (!reply) return std::unexpected(reply.error());
      if (Refused(**reply, round, lessons)) continue;
      return Claimed(req, keys, entry, **reply);
    }
    return std::unexpected(ChainBusy(req.id.tenant));
  }

  bool ClaimAsync(const ClaimRequest& req, ClaimDone done) override {
    if (!PipelinedWrites()) return false;
    SubmitClaim(std::make_shared<const ClaimRequest>(req), std::move(done),
                SteadyClock::now() + kChainPatience);
    return true;
  }

  Result<TimePoint> Heartbeat(const RecordId& id, uint64_t fence, Duration lease) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply =
        RunScript(redis::HeartbeatScript(), keys, clock_.Now(), {std::to_string(fence), Ms(lease)});
    if (!reply) return std::unexpected(reply.error());
    const redisReply& r = **reply;
    if (Status(r) != "ok") return std::unexpected(Refusal(id, fence, r, "heartbeat"));
    int64_t ms = 0;
    if (r.elements < 2 || !ToInt(Str(*r.element[1]), &ms)) {
      return std::unexpected(Unexpected("heartbeat", "no lease"));
    }
    return FromUnixMillis(ms);
  }

  Result<Record> Complete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                          Duration retention, const Attempt* logged = nullptr) override {
    if (Ordered(logged)) {
      return Await<Record>([&](CompleteDone done) {
        CompleteAsync(id, fence, outcome, retention, std::move(done), logged);
      });
    }
    const auto keys = redis::KeysOf(prefix_, id);
    const auto give_up = SteadyClock::now() + kChainPatience;
    for (int round = 0; SteadyClock::now() < give_up; ++round) {
      uint64_t lessons = 0;
      const std::optional<Attempt> entry = Chained(logged, &lessons);
      auto reply =
          client_->Eval(redis::CompleteScript(), ScriptKeys(keys, entry.has_value()),
                        ScriptArgs(clock_.Now(), CompleteArgs(fence, outcome, retention, entry)),
                        /*write=*/true);
      if (!reply) return std::unexpected(reply.error());
      if (Refused(**reply, round, lessons)) continue;
      return Completed(id, fence, outcome, keys, **reply);
    }
    return std::unexpected(ChainBusy(id.tenant));
  }

  bool CompleteAsync(const RecordId& id, uint64_t fence, const Outcome& outcome, Duration retention,
                     CompleteDone done, const Attempt* logged = nullptr) override {
    if (!PipelinedWrites()) return false;
    auto call = std::make_shared<const CompleteCall>(CompleteCall{
        id, fence, outcome, retention, logged ? std::optional<Attempt>(*logged) : std::nullopt});
    SubmitComplete(std::move(call), std::move(done), SteadyClock::now() + kChainPatience);
    return true;
  }

  Result<void> Release(const RecordId& id, uint64_t fence) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply = RunScript(redis::ReleaseScript(), keys, clock_.Now(), {std::to_string(fence)});
    if (!reply) return std::unexpected(reply.error());
    if (Status(**reply) != "ok") return std::unexpected(Refusal(id, fence, **reply, "release"));
    listener_.Notify(keys.channel);
    return {};
  }

  Result<void> Abandon(const RecordId& id, std::string_view owner) override {
    if (owner.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "redis store: abandon needs the claim's owner token");
    }
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply = RunScript(redis::AbandonScript(), keys, clock_.Now(), {std::string(owner)});
    if (!reply) return std::unexpected(reply.error());
    const redisReply& r = **reply;
    if (Status(r) == "aborted") {
      return MakeError(ErrorCode::kAborted, "record " + id.key +
                                                " was claimed by another attempt; it is not this "
                                                "attempt's to abandon");
    }
    if (Status(r) != "ok") return std::unexpected(Refusal(id, 0, r, "abandon"));
    listener_.Notify(keys.channel);
    return {};
  }

  Result<Record> MarkUnknown(const RecordId& id, uint64_t fence, Duration retention) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply = RunScript(redis::MarkUnknownScript(), keys, clock_.Now(),
                           {std::to_string(fence), Ms(retention)});
    if (!reply) return std::unexpected(reply.error());
    auto record = RecordFrom(id, fence, **reply, "mark_unknown");
    if (record) listener_.Notify(keys.channel);
    return record;
  }

  Result<Record> TakeOver(const RecordId& id, uint64_t fence, Duration lease) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply =
        RunScript(redis::TakeOverScript(), keys, clock_.Now(), {std::to_string(fence), Ms(lease)});
    if (!reply) return std::unexpected(reply.error());
    auto record = RecordFrom(id, fence, **reply, "take_over");
    if (record) listener_.Notify(keys.channel);
    return record;
  }

  // Under wait_replicas a completion read is confirmed before it is
  // returned (Confirms): a second round trip, for completions only.
  Result<std::optional<Record>> Get(const RecordId& id) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply = client_->Execute(keys.record, ReadRecord(keys), /*resend_safe=*/true);
    if (!reply) return std::unexpected(reply.error());
    auto record = Live(id, **reply);
    if (!record || !*record || (*record)->state != RecordState::kCompleted || !Confirms()) {
      return record;
    }
    auto confirmed = RunScript(redis::ConfirmScript(), keys, clock_.Now(), {});
    if (!confirmed) return std::unexpected(confirmed.error());
    return Live(id, **confirmed);
  }

  // Not under wait_replicas: a completion read must be confirmed, by a
  // write and a WAIT that would hold up every command behind it.
  bool GetAsync(const RecordId& id, GetDone done) override {
    if (!pipeline_ || Confirms()) return false;
    const auto keys = redis::KeysOf(prefix_, id);
    pipeline_->Submit(ReadRecord(keys), [this, id, done = std::move(done)](Result<Reply> reply) {
      if (!reply) return done(std::unexpected(reply.error()));
      if (redis::IsError(**reply)) {
        return done(std::unexpected(Error{
            ErrorCode::kUnavailable, "redis store: read refused: " + std::string(Str(**reply))}));
      }
      done(Live(id, **reply));
    });
    return true;
  }

  Result<bool> Evict(const RecordId& id) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto reply =
        RunScript(redis::EvictScript(), keys, clock_.Now(), {redis::EvictionChannel(prefix_)});
    if (!reply) return std::unexpected(reply.error());
    if ((*reply)->type != REDIS_REPLY_INTEGER) return std::unexpected(Unexpected("evict", "?"));
    const bool existed = (*reply)->integer == 1;
    if (existed) listener_.Notify(keys.channel);
    return existed;
  }

  bool WatchEvictions(EvictionFeed on_change) override {
    listener_.WatchEvictions(redis::EvictionChannel(prefix_), std::move(on_change));
    return true;
  }

  Result<void> WaitForChange(const RecordId& id, const Record& seen, TimePoint deadline) override {
    const auto keys = redis::KeysOf(prefix_, id);
    auto watch = listener_.Subscribe(keys.channel);
    // Subscribed before the first read: a change after it is announced.
    watch->AwaitSubscribed(std::min<std::chrono::milliseconds>(client_->config().command_timeout,
                                                               std::chrono::milliseconds(1000)));
    for (;;) {
      auto current = Get(id);
      if (!current) return std::unexpected(current.error());
      if (!*current || Differs(seen, **current)) return {};
      const TimePoint now = clock_.Now();
      if (now >= deadline) return {};
      watch->WaitUntil(clock_, std::min(deadline, now + options_.poll_interval));
    }
  }

  Result<size_t> PurgeExpired(size_t limit) override {
    size_t purged = 0;
    if (limit == 0) return purged;
    const TimePoint now = clock_.Now();
    const std::string pattern = redis::RecordKeyPattern(prefix_);
    for (const redis::NodeAddress& node : client_->Masters()) {
      std::string cursor = "0";
      do {
        auto page = ScanPage(node, cursor, pattern);
        if (!page) return std::unexpected(page.error());
        // One round trip reads the expiry of the whole page; only the expired
        // ones are deleted, each by a script that checks again.
        std::vector<redis::Command> reads;
        for (const std::string& key : page->keys) reads.push_back({"HGET", key, "ex"});
        auto expiries = client_->PipelineOn(node, reads);  // a tombstone has no "ex"
        if (!expiries) return std::unexpected(expiries.error());
        for (size_t i = 0; i < page->keys.size(); ++i) {
          int64_t ex = 0;
          if (!ToInt(Str(*(*expiries)[i]), &ex) || FromUnixMillis(ex) > now) continue;
          auto reply = Eval(redis::PurgeIfExpiredScript(), page->keys[i], now, {});
          if (!reply) return std::unexpected(reply.error());
          if ((*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer == 1) {
            if (++purged >= limit) return purged;
          }
        }
        cursor = page->cursor;
      } while (cursor != "0");
    }
    return purged;
  }

  // TIME of the node that holds the audit stream: one node for every
  // instance, so that all of them correct their clocks towards the same one
  // (a cluster's nodes may disagree among themselves; the scripts take their
  // time from the caller, so only the instances' agreement matters).
  Result<std::optional<TimePoint>> ReadServerClock() override {
    auto reply = client_->Execute(redis::AttemptStreamKey(prefix_), {"TIME"}, /*resend_safe=*/true);
    if (!reply) return std::unexpected(reply.error());
    auto t = redis::DecodeTime(**reply);
    if (!t) return std::unexpected(t.error());
    return *t;
  }

  Result<uint64_t> CountRecords() override {
    // O(records): a SCAN of every master; tombstones do not count.
    uint64_t count = 0;
    const std::string pattern = redis::RecordKeyPattern(prefix_);
    for (const redis::NodeAddress& node : client_->Masters()) {
      std::string cursor = "0";
      do {
        auto page = ScanPage(node, cursor, pattern);
        if (!page) return std::unexpected(page.error());
        std::vector<redis::Command> reads;
        for (const std::string& key : page->keys) reads.push_back({"HEXISTS", key, "st"});
        auto exists = client_->PipelineOn(node, reads);
        if (!exists) return std::unexpected(exists.error());
        for (const Reply& r : *exists) {
          if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) ++count;
        }
        cursor = page->cursor;
      } while (cursor != "0");
    }
    return count;
  }

  // One script per kAttemptsPerScript entries, chained from the cached
  // heads: one round trip unless another instance moved a head first.
  Result<void> AppendAttempts(const std::vector<Attempt>& attempts) override {
    const std::vector<std::string> keys = {redis::AttemptStreamKey(prefix_),
                                           redis::AttemptHeadsKey(prefix_)};
    std::lock_guard one_batch(append_mu_);  // this process's batches do not race each other
    for (size_t start = 0; start < attempts.size(); start += kAttemptsPerScript) {
      const size_t end = std::min(attempts.size(), start + kAttemptsPerScript);
      const auto give_up = SteadyClock::now() + kChainPatience;
      for (int round = 0;; ++round) {
        if (SteadyClock::now() >= give_up)
          return std::unexpected(ChainBusy(attempts[start].tenant));
        std::vector<std::string> args = {std::to_string(client_->config().attempts_maxlen),
                                         std::to_string(ToUnixMillis(clock_.Now())), token_};
        {
          std::lock_guard g(chain_mu_);
          for (size_t i = start; i < end; ++i) {
            Attempt a = attempts[i];
            Predict(a);
            for (std::string& v : redis::EncodeAttempt(a)) args.push_back(std::move(v));
          }
        }
        auto reply = client_->Eval(redis::AppendAttemptsScript(), keys, args, /*write=*/true);
        if (!reply) return std::unexpected(reply.error());
        if (Refused(**reply, round)) continue;
        if (Status(**reply) != "ok") {
          return std::unexpected(Unexpected("append_attempts", Status(**reply)));
        }
        break;
      }
    }
    return {};
  }

  Result<std::vector<ChainHead>> ChainHeads(const std::optional<std::string>& tenant) override {
    const std::string key = redis::AttemptHeadsKey(prefix_);
    std::vector<ChainHead> heads;
    if (tenant) {
      auto reply = client_->Execute(key, {"HGET", key, *tenant}, /*resend_safe=*/true);
      if (!reply) return std::unexpected(reply.error());
      if ((*reply)->type == REDIS_REPLY_NIL) return heads;
      auto head = redis::ParseChainHead(*tenant, Str(**reply));
      if (!head) return std::unexpected(head.error());
      heads.push_back(std::move(*head));
      return heads;
    }
    auto reply = client_->Execute(key, {"HGETALL", key}, /*resend_safe=*/true);
    if (!reply) return std::unexpected(reply.error());
    const redisReply& r = **reply;
    for (size_t i = 0; r.type == REDIS_REPLY_ARRAY && i + 1 < r.elements; i += 2) {
      auto head = redis::ParseChainHead(Str(*r.element[i]), Str(*r.element[i + 1]));
      if (!head) return std::unexpected(head.error());
      heads.push_back(std::move(*head));
    }
    std::sort(heads.begin(), heads.end(),
              [](const ChainHead& a, const ChainHead& b) { return a.tenant < b.tenant; });
    return heads;
  }

  // In stream order, which is each tenant's chain order (the scripts append
  // atomically); the cursor is the last stream ID read. With a tenant, the
  // whole stream is scanned (kChainScan entries a call): O(entries).
  Result<ChainPage> ReadChain(const std::optional<std::string>& tenant, const std::string& cursor,
                              size_t limit) override {
    const std::string stream = redis::AttemptStreamKey(prefix_);
    ChainPage page;
    std::string last = cursor;
    size_t scanned = 0;
    while (page.entries.size() < limit && scanned < kChainScan) {
      const size_t want =
          tenant ? static_cast<size_t>(kStreamPage)
                 : std::min(limit - page.entries.size(), static_cast<size_t>(kStreamPage));
      auto reply = client_->Execute(
          stream,
          {"XRANGE", stream, last.empty() ? "-" : "(" + last, "+", "COUNT", std::to_string(want)},
          /*resend_safe=*/true);
      if (!reply) return std::unexpected(reply.error());
      const redisReply& r = **reply;
      if (r.type != REDIS_REPLY_ARRAY) return std::unexpected(Unexpected("XRANGE", "?"));
      size_t i = 0;
      for (; i < r.elements && page.entries.size() < limit; ++i) {
        auto a = EntryAttempt(*r.element[i]);
        if (!a) return std::unexpected(a.error());
        last = std::string(Str(*r.element[i]->element[0]));
        ++scanned;
        if (!tenant || a->tenant == *tenant) page.entries.push_back(std::move(*a));
      }
      if (i == r.elements && r.elements < want) return page;  // the end of the stream
    }
    page.next = last;
    return page;
  }

  // Each tenant's oldest run of entries older than `before`, found by a scan
  // of the stream from its start, deleted by a script that moves the heads.
  Result<size_t> PurgeAttempts(TimePoint before, size_t limit) override {
    const std::string stream = redis::AttemptStreamKey(prefix_);
    const std::vector<std::string> keys = {stream, redis::AttemptHeadsKey(prefix_)};
    std::vector<std::string> victims;  // (id, tenant, seq, hash)…
    std::map<std::string, bool> stopped;
    std::string last;
    while (victims.size() / 4 < limit) {
      auto reply = client_->Execute(stream,
                                    {"XRANGE", stream, last.empty() ? "-" : "(" + last, "+",
                                     "COUNT", std::to_string(kStreamPage)},
                                    /*resend_safe=*/true);
      if (!reply) return std::unexpected(reply.error());
      const redisReply& r = **reply;
      if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) break;
      for (size_t i = 0; i < r.elements && victims.size() / 4 < limit; ++i) {
        auto a = EntryAttempt(*r.element[i]);
        if (!a) return std::unexpected(a.error());
        last = std::string(Str(*r.element[i]->element[0]));
        bool& done = stopped[a->tenant];
        const bool old = a->at < before;
        if (a->seq != 0 && (done || !old)) {
          done = true;
          continue;
        }
        if (!old) continue;
        victims.insert(victims.end(), {last, a->tenant, std::to_string(a->seq), a->hash});
      }
      if (r.elements < static_cast<size_t>(kStreamPage)) break;
    }
    size_t purged = 0;
    for (size_t at = 0; at < victims.size(); at += 4 * kAttemptsPerScript) {
      const size_t end = std::min(victims.size(), at + 4 * kAttemptsPerScript);
      std::vector<std::string> args(victims.begin() + static_cast<std::ptrdiff_t>(at),
                                    victims.begin() + static_cast<std::ptrdiff_t>(end));
      auto reply = client_->Eval(redis::PurgeAttemptsScript(), keys, args, /*write=*/true);
      if (!reply) return std::unexpected(reply.error());
      if ((*reply)->type != REDIS_REPLY_INTEGER) {
        return std::unexpected(Unexpected("purge_attempts", Str(**reply)));
      }
      purged += static_cast<size_t>((*reply)->integer);
    }
    return purged;
  }

  // Filters scan the stream newest first, at most attempts_scan entries
  // (security review F4: any tenant's query for a key that does not exist
  // scanned the whole stream, up to attempts_maxlen entries, and kept the
  // shared server busy); stopping there sets filter.cut.
  Result<std::vector<Attempt>> QueryAttempts(const AttemptFilter& filter) override {
    std::vector<Attempt> out;
    const std::string stream = redis::AttemptStreamKey(prefix_);
    const size_t cap = client_->config().attempts_scan;
    std::string end = "+";
    size_t scanned = 0;
    while (out.size() < filter.limit) {
      if (cap != 0 && scanned >= cap) {
        if (filter.cut) *filter.cut = true;
        break;
      }
      const size_t page = cap == 0 ? kStreamPage : std::min<size_t>(kStreamPage, cap - scanned);
      auto reply = client_->Execute(
          stream, {"XREVRANGE", stream, end, "-", "COUNT", std::to_string(page)}, true);
      if (!reply) return std::unexpected(reply.error());
      const redisReply& r = **reply;
      if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) break;
      for (size_t i = 0; i < r.elements && out.size() < filter.limit; ++i) {
        auto a = EntryAttempt(*r.element[i]);
        if (!a) return std::unexpected(a.error());
        if (Matches(filter, *a)) out.push_back(std::move(*a));
      }
      scanned += r.elements;
      end = "(" + std::string(Str(*r.element[r.elements - 1]->element[0]));
      if (r.elements < page) break;  // the oldest entry
    }
    return out;
  }

  // A scan of the whole stream: O(entries).
  Result<std::map<std::string, ToolStats>> SummarizeAttempts(const AttemptFilter& filter) override {
    std::map<std::string, ToolStats> out;
    const std::string stream = redis::AttemptStreamKey(prefix_);
    std::string start = "-";
    for (;;) {
      auto reply = client_->Execute(
          stream, {"XRANGE", stream, start, "+", "COUNT", std::to_string(kStreamPage)}, true);
      if (!reply) return std::unexpected(reply.error());
      const redisReply& r = **reply;
      if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) break;
      for (size_t i = 0; i < r.elements; ++i) {
        auto a = EntryAttempt(*r.element[i]);
        if (!a) return std::unexpected(a.error());
        if (!Matches(filter, *a)) continue;
        ToolStats& s = out[a->tool];
        ++s.attempts;
        ++s.by_outcome[a->outcome];
      }
      start = "(" + std::string(Str(*r.element[r.elements - 1]->element[0]));
      if (r.elements < static_cast<size_t>(kStreamPage)) break;
    }
    return out;
  }

 private:
  // The claim script's reply as Claim's result.
  Result<ClaimResult> Claimed(const ClaimRequest& req, const redis::RecordKeys& keys,
                              const std::optional<Attempt>& entry, const redisReply& r) {
    const std::string_view status = Status(r);
    if ((status != "claimed" && status != "exists") || r.elements < 2) {
      return std::unexpected(Unexpected("claim", status));
    }
    if (status == "exists" && entry && r.elements > 2) Unpredict(*entry, Str(*r.element[2]));
    auto record = redis::DecodeRecordHash(req.id, *r.element[1]);
    if (!record) return std::unexpected(record.error());
    if (!*record) return std::unexpected(Unexpected("claim", "no record"));
    if (status == "claimed") listener_.Notify(keys.channel);
    return ClaimResult{status == "claimed", std::move(**record)};
  }

  std::vector<std::string> ClaimArgs(const ClaimRequest& req,
                                     const std::optional<Attempt>& entry) const {
    std::vector<std::string> args = {Ms(req.lease), Ms(req.retention), req.fingerprint,
                                     req.tool,      req.turn,           req.owner,
                                     Confirms() ? "1" : "0"};
    if (entry) AddAttempt(args, *entry);
    return args;
  }

  // ClaimAsync, sent again at once (on a thread that runs the pipeline's
  // callbacks, which must not wait) while its entry is refused.
  void SubmitClaim(std::shared_ptr<const ClaimRequest> req, ClaimDone done,
                   SteadyClock::time_point give_up) {
    const auto keys = redis::KeysOf(prefix_, req->id);
    // Chained as the command is queued: entries reach the server in the
    // order they were chained.
    auto entry = std::make_shared<std::optional<Attempt>>();
    auto lessons = std::make_shared<uint64_t>(0);
    auto args = [this, &req, &entry, &lessons] {
      *entry = Chained(req->logged ? &*req->logged : nullptr, lessons.get());
      return ClaimArgs(*req, *entry);
    };
    SubmitScript(redis::ClaimScript(), ScriptKeys(keys, Logs(req->logged)), args,
                 [this, req, keys, entry, lessons, give_up, done](Result<Reply> reply) {
                   if (!reply) return done(std::unexpected(reply.error()));
                   if (Refused(**reply, /*round=*/-1, *lessons)) {
                     if (SteadyClock::now() >= give_up) {
                       return done(std::unexpected(ChainBusy(req->id.tenant)));
                     }
                     return SubmitClaim(req, done, give_up);
                   }
                   done(Claimed(*req, keys, *entry, **reply));
                 });
  }

  struct CompleteCall {
    RecordId id;
    uint64_t fence;
    Outcome outcome;
    Duration retention;
    std::optional<Attempt> logged;
  };

  void SubmitComplete(std::shared_ptr<const CompleteCall> call, CompleteDone done,
                      SteadyClock::time_point give_up) {
    const auto keys = redis::KeysOf(prefix_, call->id);
    auto lessons = std::make_shared<uint64_t>(0);
    auto args = [this, &call, &lessons] {  // chained as queued, as in SubmitClaim
      const std::optional<Attempt> entry =
          Chained(call->logged ? &*call->logged : nullptr, lessons.get());
      return CompleteArgs(call->fence, call->outcome, call->retention, entry);
    };
    SubmitScript(redis::CompleteScript(), ScriptKeys(keys, Logs(call->logged)), args,
                 [this, call, keys, lessons, give_up, done](Result<Reply> reply) {
                   if (!reply) return done(std::unexpected(reply.error()));
                   if (Refused(**reply, /*round=*/-1, *lessons)) {
                     if (SteadyClock::now() >= give_up) {
                       return done(std::unexpected(ChainBusy(call->id.tenant)));
                     }
                     return SubmitComplete(call, done, give_up);
                   }
                   done(Completed(call->id, call->fence, call->outcome, keys, **reply));
                 });
  }

  // `logged` as the next entry of its tenant's chain by the cached head
  // (which moves to it), if the record's script writes it (Logs); else none.
  // `lessons` gets the cache's CachedHead::lessons of the tenant then.
  std::optional<Attempt> Chained(const Attempt* logged, uint64_t* lessons) {
    if (!Logs(logged)) return std::nullopt;
    Attempt a = *logged;
    std::lock_guard g(chain_mu_);
    Predict(a);
    *lessons = chain_heads_[a.tenant].lessons;
    return a;
  }

  // Under chain_mu_: chains `a` on the cached head of its tenant, and moves
  // the cache to it, so that the next write of this process follows it.
  void Predict(Attempt& a) {
    CachedHead& cached = chain_heads_[a.tenant];
    ChainHead head{a.tenant, cached.seq, cached.hash};
    ChainAppend(head, a);
    cached.seq = head.seq;
    cached.hash = head.hash;
  }

  // Takes the heads of a refusal into the cache: 'stale' (this writer is
  // now first in line for them: send again at once) or 'reserved' (another
  // writer is: a blocking caller, round >= 0, waits a little, longer each
  // round, with jitter). False for any other reply. With `lessons` (those of
  // the refused entry's chaining), a tenant's head is taken only if no
  // refusal was taken since that entry was chained: one taken later is
  // newer than this reply, and the cache holds the entries sent again
  // since, which taking this reply would make stale in turn.
  bool Refused(const redisReply& r, int round, std::optional<uint64_t> lessons = std::nullopt) {
    const std::string_view status = Status(r);
    if (status != "stale" && status != "reserved") return false;
    {
      std::lock_guard g(chain_mu_);
      for (size_t i = 1; i + 1 < r.elements; i += 2) {
        CachedHead& cached = chain_heads_[std::string(Str(*r.element[i]))];
        if (lessons && *lessons != cached.lessons) continue;
        Learn(Str(*r.element[i]), Str(*r.element[i + 1]));
        ++cached.lessons;
      }
    }
    if (status == "reserved" && round >= 0) {
      thread_local std::minstd_rand jitter(std::random_device{}());
      const int cap = 100 << std::min(round, 5);  // up to 3.2 ms
      std::this_thread::sleep_for(std::chrono::microseconds(50 + jitter() % cap));
    }
    return true;
  }

  // Under chain_mu_: the cache's head of `tenant` is `value` (a heads-hash
  // value, "" for none).
  void Learn(std::string_view tenant, std::string_view value) {
    CachedHead& cached = chain_heads_[std::string(tenant)];
    auto head =
        value.empty() ? Result<ChainHead>(ChainHead{}) : redis::ParseChainHead(tenant, value);
    cached.seq = head ? head->seq : 0;
    cached.hash = head ? head->hash : std::string();
  }

  // A claim that found a live record wrote no entry: the cache, if nothing
  // was chained on top of `entry` since, goes back to the store's head.
  void Unpredict(const Attempt& entry, std::string_view head) {
    std::lock_guard g(chain_mu_);
    const CachedHead& cached = chain_heads_[entry.tenant];
    if (cached.seq == entry.seq && cached.hash == entry.hash) Learn(entry.tenant, head);
  }

  static Error ChainBusy(const std::string& tenant) {
    return Error{ErrorCode::kUnavailable, "redis store: the audit chain of tenant \"" + tenant +
                                              "\" kept moving for " +
                                              std::to_string(kChainPatience.count()) +
                                              " s while an entry was being appended; retryable"};
  }

  // Whether a script writes `entry` with its record: given, and this store
  // can (LogsWithRecords); otherwise it is ignored (Store::Complete).
  template <typename Entry>
  bool Logs(const Entry& entry) const {
    return static_cast<bool>(entry) && LogsWithRecords();
  }

  // The complete script's reply as Complete's result.
  Result<Record> Completed(const RecordId& id, uint64_t fence, const Outcome& outcome,
                           const redis::RecordKeys& keys, const redisReply& reply) {
    auto record = RecordFrom(id, fence, reply, "complete");
    if (!record) return record;
    record->outcome = outcome;  // the script does not send the body back
    listener_.Notify(keys.channel);
    return record;
  }

  std::vector<std::string> CompleteArgs(uint64_t fence, const Outcome& outcome, Duration retention,
                                        const std::optional<Attempt>& entry) const {
    redis::OutcomeFields stored = redis::EncodeOutcome(outcome, client_->config().body_field_bytes);
    std::vector<std::string> args = {std::to_string(fence), Ms(retention), std::move(stored.cls),
                                     entry ? "1" : "0"};
    if (entry) AddAttempt(args, *entry);
    args.insert(args.end(), std::make_move_iterator(stored.pairs.begin()),
                std::make_move_iterator(stored.pairs.end()));
    return args;
  }

  // The stream's MAXLEN, this writer's token and the attempt's values, as
  // the scripts' log_attempt reads them.
  void AddAttempt(std::vector<std::string>& args, const Attempt& a) const {
    args.push_back(std::to_string(client_->config().attempts_maxlen));
    args.push_back(token_);
    for (std::string& v : redis::EncodeAttempt(a)) args.push_back(std::move(v));
  }

  // A record script's keys: the record, and the audit stream and its heads
  // when the script appends the attempt (LogsWithRecords).
  std::vector<std::string> ScriptKeys(const redis::RecordKeys& keys, bool logged) const {
    if (!logged) return {keys.record};
    return {keys.record, redis::AttemptStreamKey(prefix_), redis::AttemptHeadsKey(prefix_)};
  }

  static redis::Command ReadRecord(const redis::RecordKeys& keys) {
    return {"HGETALL", keys.record};
  }

  // The record in a reply of ReadRecord, unless past retention.
  Result<std::optional<Record>> Live(const RecordId& id, const redisReply& hash) {
    auto record = redis::DecodeRecordHash(id, hash);
    if (!record) return std::unexpected(record.error());
    if (*record && (*record)->expires_at <= clock_.Now()) return std::optional<Record>();
    return record;
  }

  struct ScanResult {
    std::string cursor;
    std::vector<std::string> keys;
  };

  static std::string Ms(Duration d) { return std::to_string(d.count()); }

  static bool ToInt(std::string_view s, int64_t* out) {
    if (s.empty()) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
    return ec == std::errc() && p == s.data() + s.size();
  }

  // The first element of a script's reply array: its status.
  static std::string_view Status(const redisReply& r) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return "(not an array)";
    return Str(*r.element[0]);
  }

  // The arguments of a record script (redis_scripts.h): now, the
  // garbage-collection margin, the tombstone keep, then the script's own.
  std::vector<std::string> ScriptArgs(TimePoint now, std::vector<std::string> extra) const {
    std::vector<std::string> args = {std::to_string(ToUnixMillis(now)), Ms(kGcMargin),
                                     Ms(client_->config().fence_floor_keep)};
    args.insert(args.end(), std::make_move_iterator(extra.begin()),
                std::make_move_iterator(extra.end()));
    return args;
  }

  // Runs a record script on `record_key`'s node.
  Result<Reply> Eval(const redis::Script& script, const std::string& record_key, TimePoint now,
                     std::vector<std::string> extra) {
    const std::vector<std::string> keys = {record_key};
    return client_->Eval(script, keys, ScriptArgs(now, std::move(extra)), /*write=*/true);
  }

  // Whether a completion is served only once confirmed (wait_replicas, guarantees F4):
  // on the master it may not be on any replica yet (its writer's WAIT failed,
  // or has not returned), and a failover would lose what was served. WAIT
  // covers only the writes of its own connection, so a reader that finds a
  // completion writes it again as it is (ConfirmScript, or the claim
  // script's confirm) and WAITs: that covers everything before its write in
  // the replication stream, the completion included. Fewer
  // acknowledgements: kUnavailable, never the completion.
  bool Confirms() const { return client_->config().wait_replicas > 0; }

  // Whether writes may go through the pipeline: one server, and no WAIT to
  // follow them.
  bool PipelinedWrites() const { return pipeline_ && client_->config().wait_replicas == 0; }

  // Whether a blocking Claim or Complete that writes `entry` goes through
  // the pipeline and waits: then this process's entries reach the server in
  // the order they were chained, where calls on pooled connections race
  // each other and are refused as stale, again and again under load. Not
  // on a thread that runs the pipeline's callbacks, which may be the one to
  // read the reply (Pipeline::OnPipelineThread).
  template <typename Entry>
  bool Ordered(const Entry& entry) const {
    return Logs(entry) && PipelinedWrites() && !pipeline_->OnPipelineThread();
  }

  // Starts an asynchronous call with a `done` that hands its result over,
  // and waits for it: `done` runs exactly once (Store::ClaimAsync).
  template <typename T, typename Start>
  static Result<T> Await(Start start) {
    std::promise<Result<T>> result;
    std::future<Result<T>> ready = result.get_future();
    start([&result](Result<T> r) { result.set_value(std::move(r)); });
    return ready.get();
  }

  // Eval through the pipeline: EVALSHA, then EVAL once if the server does not
  // have the script yet. `extra` (the script's own arguments) runs as the
  // command is queued (Pipeline::SubmitBuilt). `done` (on the pipeline's
  // strand) gets the reply, or the error that an error reply means.
  void SubmitScript(const redis::Script& script, const std::vector<std::string>& keys,
                    const std::function<std::vector<std::string>()>& extra,
                    std::function<void(Result<Reply>)> done) {
    auto sent = std::make_shared<redis::Command>();  // kept for a NOSCRIPT retry
    auto make = [&] {
      redis::Command command = {"EVALSHA", script.sha1, std::to_string(keys.size())};
      command.insert(command.end(), keys.begin(), keys.end());
      std::vector<std::string> args = ScriptArgs(clock_.Now(), extra());
      command.insert(command.end(), std::make_move_iterator(args.begin()),
                     std::make_move_iterator(args.end()));
      *sent = command;
      return command;
    };
    auto answer = [this, done](Result<Reply> reply) {
      if (reply && redis::IsError(**reply)) {
        return done(std::unexpected(redis::ReplyError(client_->Masters().front(), Str(**reply))));
      }
      done(std::move(reply));
    };
    // The scripts are static: `script` outlives every command.
    auto on_reply = [this, &script, sent, answer](Result<Reply> reply) {
      if (reply && redis::IsError(**reply, "NOSCRIPT")) {
        redis::Command retry = std::move(*sent);
        retry[0] = "EVAL";
        retry[1] = script.source;
        return pipeline_->Submit(std::move(retry), answer);
      }
      answer(std::move(reply));
    };
    pipeline_->SubmitBuilt(make, std::move(on_reply));
  }

  Result<Reply> RunScript(const redis::Script& script, const redis::RecordKeys& keys, TimePoint now,
                          std::vector<std::string> extra) {
    return Eval(script, keys.record, now, std::move(extra));
  }

  // A script's refusal as the error the Store contract names.
  static Error Refusal(const RecordId& id, uint64_t fence, const redisReply& r,
                       std::string_view script) {
    const std::string_view status = Status(r);
    const std::string detail = r.elements > 1 ? std::string(Str(*r.element[1])) : "";
    if (status == "notfound") return Error{ErrorCode::kNotFound, "no record for key " + id.key};
    if (status == "aborted") {
      return Error{ErrorCode::kAborted, "record " + id.key + " is owned by fence " + detail +
                                            ", not " + std::to_string(fence) +
                                            ": this owner lost it"};
    }
    if (status == "state") {
      return Error{ErrorCode::kFailedPrecondition, "record " + id.key + " is " + detail};
    }
    if (status == "live") {
      return Error{ErrorCode::kFailedPrecondition,
                   "record " + id.key + " has a live owner; it cannot be taken over"};
    }
    return Unexpected(script, status);
  }

  // {'ok', fields} → the record; a refusal → its error.
  static Result<Record> RecordFrom(const RecordId& id, uint64_t fence, const redisReply& r,
                                   std::string_view script) {
    if (Status(r) != "ok") return std::unexpected(Refusal(id, fence, r, script));
    if (r.elements < 2) return std::unexpected(Unexpected(script, "no record"));
    auto record = redis::DecodeRecord(id, *r.element[1]);
    if (!record) return std::unexpected(record.error());
    if (!*record) return std::unexpected(Unexpected(script, "an empty record"));
    return std::move(**record);
  }

  Result<ScanResult> ScanPage(const redis::NodeAddress& node, const std::string& cursor,
                              const std::string& pattern) {
    auto reply = client_->RunOn(
        node, {"SCAN", cursor, "MATCH", pattern, "COUNT", std::to_string(kScanCount)});
    if (!reply) return std::unexpected(reply.error());
    const redisReply& r = **reply;
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 || r.element[1]->type != REDIS_REPLY_ARRAY) {
      return MakeError(ErrorCode::kInternal,
                       "redis store " + node.ToString() + ": unexpected SCAN reply");
    }
    ScanResult page{std::string(Str(*r.element[0])), {}};
    for (size_t i = 0; i < r.element[1]->elements; ++i) {
      page.keys.emplace_back(Str(*r.element[1]->element[i]));
    }
    return page;
  }

  static Result<Attempt> EntryAttempt(const redisReply& entry) {
    if (entry.type != REDIS_REPLY_ARRAY || entry.elements != 2) {
      return MakeError(ErrorCode::kDataLoss, "redis store: a bad entry in the audit stream");
    }
    return redis::DecodeAttempt(*entry.element[1]);
  }

  std::unique_ptr<redis::RedisClient> client_;
  Clock& clock_;
  const StoreOptions options_;
  const std::string prefix_;
  redis::ChangeListener listener_;
  // Names this instance to the scripts, for its reservations of chain heads.
  const std::string token_ = NewToken();
  std::mutex append_mu_;  // one AppendAttempts at a time
  // The last head this process wrote or learnt per tenant: a hint for
  // chaining entries, checked by every script (never trusted).
  std::mutex chain_mu_;
  struct CachedHead {
    uint64_t seq = 0;
    std::string hash;
    uint64_t lessons = 0;  // refusals whose heads were taken (Refused)
  };
  std::map<std::string, CachedHead> chain_heads_;
  std::unique_ptr<redis::Pipeline> pipeline_;  // one server only; destroyed first
};

}  // namespace

Result<std::unique_ptr<Store>> OpenRedisStore(std::string_view url, Clock& clock,
                                              const StoreOptions& options) {
  auto config = redis::ParseRedisUrl(url);
  if (!config) return std::unexpected(config.error());
  auto client = redis::RedisClient::Open(*config);
  if (!client) return std::unexpected(client.error());
  return std::unique_ptr<Store>(new RedisStore(std::move(*client), clock, options));
}

}  // namespace idem
