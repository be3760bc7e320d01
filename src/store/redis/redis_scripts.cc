#include "redis_scripts.h"

#include <openssl/sha.h>

#include <cstdio>

namespace idem::redis {
namespace {

// Shared by every record script. Numbers are doubles in Redis's Lua: exact
// for integers below 2^53 (fences are microseconds, about 1.8e15 today), and
// always written with n2s so that stored fences compare exactly as text.
constexpr char kPrelude[] = R"lua(
local rec = KEYS[1]
local now = tonumber(ARGV[1])
local margin, tombstone_keep = tonumber(ARGV[2]), tonumber(ARGV[3])
local function n2s(x) return string.format('%.0f', x) end
local function fields()
  return redis.call('HMGET', rec, 'st', 'fp', 'tool', 'turn', 'fence', 'cr', 'le', 'co', 'ex', 'oc',
                    'ow', 'rt')
end
local function whole()
  return redis.call('HGETALL', rec)
end
local function changed(what)
  redis.call('PUBLISH', string.sub(rec, 1, -2) .. 'c', what)
end
-- Native TTL, for garbage collection only: the remaining logical lifetime
-- plus a margin.
local function keep(expires)
  redis.call('PEXPIRE', rec, n2s(math.max(expires - now, 0) + margin))
end
-- A fence above the record's (or its tombstone's) and above now in
-- microseconds.
local function next_fence(old)
  return math.max((tonumber(old) or 0) + 1, now * 1000)
end
-- Deletes the record but keeps its fence in a tombstone (a hash with only
-- 'fence'), so that the next claim's fence is greater.
local function bury(fence)
  redis.call('DEL', rec)
  redis.call('HSET', rec, 'fence', fence)
  redis.call('PEXPIRE', rec, n2s(tombstone_keep))
end
-- Appends one attempt to KEYS[2], the audit stream, if the caller sent it:
-- ARGV[at] the stream's MAXLEN, then EncodeAttempt's nine values. Inside the
-- record's own script, so the record and its entry are one write; before the
-- record's HSET, so an XADD that fails leaves the record untouched.
local function log_attempt(at)
  if not KEYS[2] then return end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[at], '*',
             'at', ARGV[at + 1], 'tenant', ARGV[at + 2], 'key', ARGV[at + 3], 'tool', ARGV[at + 4],
             'turn', ARGV[at + 5], 'outcome', ARGV[at + 6], 'latency', ARGV[at + 7],
             'instance', ARGV[at + 8], 'detail', ARGV[at + 9])
end
-- The live record's st, fence, ex, le if it carries `fence` and its state is
-- in `states`; else nil and the refusal to return.
local function owned(fence, states)
  local r = redis.call('HMGET', rec, 'st', 'fence', 'ex', 'le')
  if not r[1] or not r[3] or tonumber(r[3]) <= now then return nil, {'notfound'} end
  if r[2] ~= fence then return nil, {'aborted', r[2]} end
  if not states[r[1]] then return nil, {'state', r[1]} end
  return r
end
)lua";

constexpr char kClaim[] = R"lua(
local lease, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local cur = redis.call('HMGET', rec, 'st', 'ex', 'fence')
if cur[1] and tonumber(cur[2]) > now then return {'exists', whole()} end
local fence = next_fence(cur[3])
local expires = now + math.max(retention, lease)
log_attempt(10)
redis.call('DEL', rec)
redis.call('HSET', rec, 'st', 'in_progress', 'fp', ARGV[6], 'tool', ARGV[7], 'turn', ARGV[8],
           'fence', n2s(fence), 'cr', n2s(now), 'le', n2s(now + lease), 'co', '0',
           'ex', n2s(expires), 'ow', ARGV[9], 'rt', ARGV[5])
keep(expires)
changed('in_progress ' .. n2s(fence))
return {'claimed', whole()}
)lua";

constexpr char kHeartbeat[] = R"lua(
local r, refusal = owned(ARGV[4], {in_progress = true})
if not r then return refusal end
local le = now + tonumber(ARGV[5])
local ex = math.max(tonumber(r[3]), le)
redis.call('HSET', rec, 'le', n2s(le), 'ex', n2s(ex))
keep(ex)
return {'ok', n2s(le)}
)lua";

constexpr char kComplete[] = R"lua(
local r, refusal = owned(ARGV[4], {in_progress = true, unknown = true})
if not r then return refusal end
local ex = now + tonumber(ARGV[5])
-- ARGV[7]: '1' if the attempt follows (ARGV[8..17]); then the body's
-- field/value pairs (redis_codec.h EncodeOutcome).
local body_at = 8
if ARGV[7] == '1' then
  log_attempt(8)
  body_at = 18
end
redis.call('HSET', rec, 'st', 'completed', 'oc', ARGV[6], 'co', n2s(now), 'ex', n2s(ex),
           unpack(ARGV, body_at))
keep(ex)
changed('completed ' .. r[2])
return {'ok', fields()}
)lua";

constexpr char kRelease[] = R"lua(
local r, refusal = owned(ARGV[4], {in_progress = true, unknown = true})
if not r then return refusal end
bury(r[2])
changed('released ' .. r[2])
return {'ok'}
)lua";

constexpr char kAbandon[] = R"lua(
local r = redis.call('HMGET', rec, 'st', 'fence', 'ex', 'ow')
if not r[1] or not r[3] or tonumber(r[3]) <= now then return {'notfound'} end
if r[4] ~= ARGV[4] then return {'aborted', r[2]} end
if r[1] ~= 'in_progress' then return {'state', r[1]} end
bury(r[2])
changed('released ' .. r[2])
return {'ok'}
)lua";

constexpr char kMarkUnknown[] = R"lua(
local r, refusal = owned(ARGV[4], {in_progress = true})
if not r then return refusal end
local ex = now + tonumber(ARGV[5])
redis.call('HSET', rec, 'st', 'unknown', 'co', n2s(now), 'ex', n2s(ex))
keep(ex)
changed('unknown ' .. r[2])
return {'ok', fields()}
)lua";

constexpr char kTakeOver[] = R"lua(
local r, refusal = owned(ARGV[4], {in_progress = true, unknown = true})
if not r then return refusal end
if r[1] == 'in_progress' and tonumber(r[4]) > now then return {'live'} end
local fence = next_fence(r[2])
local le = now + tonumber(ARGV[5])
local ex = math.max(tonumber(r[3]), le)
redis.call('HSET', rec, 'st', 'in_progress', 'fence', n2s(fence), 'le', n2s(le), 'ex', n2s(ex),
           'ow', '')
keep(ex)
changed('in_progress ' .. n2s(fence))
return {'ok', fields()}
)lua";

constexpr char kEvict[] = R"lua(
local cur = redis.call('HMGET', rec, 'st', 'fence')
if not cur[1] then return 0 end
bury(cur[2] or '0')
changed('evicted ' .. (cur[2] or '0'))
-- Every instance's cache of completed records drops what it holds.
redis.call('PUBLISH', ARGV[4], rec)
return 1
)lua";

constexpr char kPurgeIfExpired[] = R"lua(
local cur = redis.call('HMGET', rec, 'st', 'ex', 'fence')
if not cur[1] or not cur[2] or tonumber(cur[2]) > now then return 0 end
bury(cur[3] or '0')
return 1
)lua";

constexpr char kAppendAttempts[] = R"lua(
local n = (#ARGV - 1) / 9
for i = 0, n - 1 do
  local b = 1 + i * 9
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*',
             'at', ARGV[b + 1], 'tenant', ARGV[b + 2], 'key', ARGV[b + 3], 'tool', ARGV[b + 4],
             'turn', ARGV[b + 5], 'outcome', ARGV[b + 6], 'latency', ARGV[b + 7],
             'instance', ARGV[b + 8], 'detail', ARGV[b + 9])
end
return n
)lua";

Script Make(std::string name, std::string source) {
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(source.data()), source.size(), digest);
  std::string hex;
  char buf[3];
  for (unsigned char b : digest) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return Script{std::move(name), std::move(source), std::move(hex)};
}

Script RecordScript(std::string name, const char* body) {
  return Make(std::move(name), std::string(kPrelude) + body);
}

}  // namespace

const Script& ClaimScript() {
  static const Script s = RecordScript("claim", kClaim);
  return s;
}
const Script& HeartbeatScript() {
  static const Script s = RecordScript("heartbeat", kHeartbeat);
  return s;
}
const Script& CompleteScript() {
  static const Script s = RecordScript("complete", kComplete);
  return s;
}
const Script& ReleaseScript() {
  static const Script s = RecordScript("release", kRelease);
  return s;
}
const Script& AbandonScript() {
  static const Script s = RecordScript("abandon", kAbandon);
  return s;
}
const Script& MarkUnknownScript() {
  static const Script s = RecordScript("mark_unknown", kMarkUnknown);
  return s;
}
const Script& TakeOverScript() {
  static const Script s = RecordScript("take_over", kTakeOver);
  return s;
}
const Script& EvictScript() {
  static const Script s = RecordScript("evict", kEvict);
  return s;
}
const Script& PurgeIfExpiredScript() {
  static const Script s = RecordScript("purge_if_expired", kPurgeIfExpired);
  return s;
}
const Script& AppendAttemptsScript() {
  static const Script s = Make("append_attempts", kAppendAttempts);
  return s;
}

}  // namespace idem::redis
