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
-- fields() indices of st, fence, co, ex, oc.
local F_ST, F_FENCE, F_CO, F_EX, F_OC = 1, 5, 8, 9, 10
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
-- The attempt a record script writes with its record: KEYS[2] the audit
-- stream and KEYS[3] its heads if the caller sent one, ARGV[at] the
-- stream's MAXLEN, ARGV[at + 1] the writer's token, then the entry's 12
-- values (kChain). log_stale: nil if the entry follows its tenant's head (or
-- there is none), else the refusal, checked before any write. log_attempt:
-- appends it, inside the record's own script, so the record and its entry
-- are one write.
local function log_stale(at)
  if not KEYS[2] then return nil end
  return chain_stale(KEYS[3], at + 2, 1, ARGV[at + 1], now)
end
local function log_attempt(at)
  if not KEYS[2] then return end
  chain_append(KEYS[2], KEYS[3], at + 2, 1, tonumber(ARGV[at]))
end
-- For a script that ends without writing its entry (the claim found a live
-- record, the completion was refused): gives up this writer's reservation
-- of the entry's head, if it holds one, and returns the head ('' if none or
-- no entry) for the caller's cache.
local function log_head(at)
  if not KEYS[2] then return '' end
  local t = ARGV[at + 3]
  local s, h, ss, sp, tok = head_of(KEYS[3], t)
  if tok ~= '' and tok == ARGV[at + 1] then set_head(KEYS[3], t, s, h, ss, sp) end
  return redis.call('HGET', KEYS[3], t) or ''
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
-- As owned, but reads and returns all of fields() (a missing one is
-- false), for a script that answers with the record it changed without
-- reading it again.
local function owned_fields(fence, states)
  local r = fields()
  if not r[F_ST] or not r[F_EX] or tonumber(r[F_EX]) <= now then return nil, {'notfound'} end
  if r[F_FENCE] ~= fence then return nil, {'aborted', r[F_FENCE]} end
  if not states[r[F_ST]] then return nil, {'state', r[F_ST]} end
  return r
end
)lua";

// The audit log's hash chain (docs/DESIGN.md §7), shared by the scripts that
// append entries. An entry travels as 12 values from ARGV[b]: at tenant key
// tool turn outcome latency instance detail seq prev hash, its chain fields
// computed by the caller from its cached head of the tenant (Redis's Lua
// has no SHA-256; redis.sha1hex would be a weaker hash). The script checks,
// atomically, that each entry follows its tenant's head in the heads hash
// (redis_codec.h AttemptHeadsKey): seq = head seq + 1 and prev = head hash.
// If one does not, it writes nothing and answers {'stale', tenant, head, …}
// with the current heads, for the caller to recompute and send again.
constexpr char kChain[] = R"lua(
local function cnum(x) return string.format('%.0f', x) end
-- How long a writer refused as stale is first in line for the heads it
-- needs (ms): others are refused ('reserved') until it has written, so that
-- a writer whose competitor writes back to back cannot be starved.
local reserve_ms = 50
-- Each tenant's restart point (start_seq, start_prev) as chain_stale read
-- it, for chain_append: a script reads a tenant's head once.
local restart = {}
-- seq, hash, start_seq, start_prev of `tenant`'s head, and who reserved it
-- until when ('' and 0 if nobody).
local function head_of(heads, tenant)
  local v = redis.call('HGET', heads, tenant)
  if not v then return 0, '', 1, '', '', 0 end
  local s, h, ss, sp, tok, untl = string.match(v, '^(%d+) (%x*) (%d+) (%x*) ?(%w*) ?(%d*)$')
  if not s then error({err = 'malformed chain head of tenant ' .. tenant}) end
  return tonumber(s), h, tonumber(ss), sp, tok, tonumber(untl) or 0
end
local function set_head(heads, tenant, s, h, ss, sp, tok, untl)
  local v = cnum(s) .. ' ' .. h .. ' ' .. cnum(ss) .. ' ' .. sp
  if tok and tok ~= '' then v = v .. ' ' .. tok .. ' ' .. cnum(untl) end
  redis.call('HSET', heads, tenant, v)
end
-- nil if the n entries from ARGV[at] follow their tenants' heads and no
-- other writer (`token` names this one) holds a live reservation of one of
-- them; else the refusal, {'stale' or 'reserved', tenant, head, …}. A
-- stale writer reserves the heads it needs until now + reserve_ms.
local function chain_stale(heads, at, n, token, now)
  if n == 1 then
    -- One entry (a claim's or a completion's, the common case) that passes
    -- is checked without the tables below; any other goes the long way,
    -- which reads its head again.
    local t = ARGV[at + 1]
    local s, h, ss, sp, tok, untl = head_of(heads, t)
    if (tok == '' or tok == token or untl <= now) and tonumber(ARGV[at + 9]) == s + 1 and
        ARGV[at + 10] == h then
      restart[t] = {ss, sp}
      return nil
    end
  end
  local first, order, expect, reserved, bad = {}, {}, {}, false, false
  for i = 0, n - 1 do
    local b = at + i * 12
    local t = ARGV[b + 1]
    if not first[t] then
      local s, h, ss, sp, tok, untl = head_of(heads, t)
      first[t] = {s, h, ss, sp}
      restart[t] = {ss, sp}
      order[#order + 1] = t
      expect[t] = {s, h}
      if tok ~= '' and tok ~= token and untl > now then reserved = true end
    end
    if tonumber(ARGV[b + 9]) ~= expect[t][1] + 1 or ARGV[b + 10] ~= expect[t][2] then
      bad = true
    end
    expect[t] = {expect[t][1] + 1, ARGV[b + 11]}
  end
  if not bad and not reserved then return nil end
  local out = {reserved and 'reserved' or 'stale'}
  for _, t in ipairs(order) do
    local f = first[t]
    if not reserved then set_head(heads, t, f[1], f[2], f[3], f[4], token, now + reserve_ms) end
    out[#out + 1] = t
    out[#out + 1] = redis.call('HGET', heads, t) or ''
  end
  return out
end
-- Trims the stream to maxlen entries, oldest first (at most 1000 a call),
-- and moves each trimmed tenant's restart point past its last entry trimmed,
-- so that what is left still verifies: MAXLEN trimming is a purge.
local function chain_trim(stream, heads, maxlen)
  local over = redis.call('XLEN', stream) - maxlen
  if over <= 0 then return end
  if over > 1000 then over = 1000 end
  local old = redis.call('XRANGE', stream, '-', '+', 'COUNT', over)
  local cut, ids = {}, {}
  for _, e in ipairs(old) do
    ids[#ids + 1] = e[1]
    local f, t, s, h = e[2], nil, nil, ''
    for k = 1, #f, 2 do
      if f[k] == 'tenant' then t = f[k + 1]
      elseif f[k] == 'seq' then s = tonumber(f[k + 1])
      elseif f[k] == 'hash' then h = f[k + 1] end
    end
    if t and s and s > 0 then cut[t] = {s, h} end
  end
  for t, c in pairs(cut) do
    local hs, hh, ss, _, tok, untl = head_of(heads, t)
    if c[1] + 1 > ss then set_head(heads, t, hs, hh, c[1] + 1, c[2], tok, untl) end
  end
  redis.call('XDEL', stream, unpack(ids))
end
-- Appends the n entries from ARGV[at], moves their heads (ending any
-- reservation: this writer held it or it had lapsed), trims.
local function chain_append(stream, heads, at, n, maxlen)
  for i = 0, n - 1 do
    local b = at + i * 12
    redis.call('XADD', stream, '*', 'at', ARGV[b], 'tenant', ARGV[b + 1], 'key', ARGV[b + 2],
               'tool', ARGV[b + 3], 'turn', ARGV[b + 4], 'outcome', ARGV[b + 5],
               'latency', ARGV[b + 6], 'instance', ARGV[b + 7], 'detail', ARGV[b + 8],
               'seq', ARGV[b + 9], 'prev', ARGV[b + 10], 'hash', ARGV[b + 11])
    local t = ARGV[b + 1]
    if not restart[t] then
      local _, _, ss, sp = head_of(heads, t)
      restart[t] = {ss, sp}
    end
    set_head(heads, t, tonumber(ARGV[b + 9]), ARGV[b + 11], restart[t][1], restart[t][2])
  end
  chain_trim(stream, heads, maxlen)
end
)lua";

constexpr char kClaim[] = R"lua(
local lease, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local cur = redis.call('HMGET', rec, 'st', 'ex', 'fence')
if cur[1] and tonumber(cur[2]) > now then
  -- ARGV[10] '1' (wait_replicas): a completion found is written again as it
  -- is, so that the WAIT after this script covers it (WAIT waits for this
  -- connection's own writes, and everything before them in the stream).
  if ARGV[10] == '1' and cur[1] == 'completed' then redis.call('HSET', rec, 'st', cur[1]) end
  return {'exists', whole(), log_head(11)}
end
local stale = log_stale(11)
if stale then return stale end
local fence = next_fence(cur[3])
local expires = now + math.max(retention, lease)
log_attempt(11)
-- An expired record or a tombstone is replaced. An absent key (the common
-- case, a new key) has nothing to delete and nobody to tell: a waiter
-- returns as soon as the record it waits on is gone (Store::WaitForChange),
-- and deletions that leave no tombstone come retention + margin after the
-- record's lease, past every waiter's deadline.
local existed = cur[1] or cur[3]
if existed then redis.call('DEL', rec) end
local hash = {'st', 'in_progress', 'fp', ARGV[6], 'tool', ARGV[7], 'turn', ARGV[8],
              'fence', n2s(fence), 'cr', n2s(now), 'le', n2s(now + lease), 'co', '0',
              'ex', n2s(expires), 'ow', ARGV[9], 'rt', ARGV[5]}
redis.call('HSET', rec, unpack(hash))
keep(expires)
if existed then changed('in_progress ' .. n2s(fence)) end
-- What HGETALL would answer now: the hash holds exactly these fields.
return {'claimed', hash}
)lua";

// A completed record written again as it is (only the state, to itself),
// so that the WAIT after this script covers the completion; anything else
// is left alone. The hash either way.
constexpr char kConfirm[] = R"lua(
local st = redis.call('HGET', rec, 'st')
if st == 'completed' then redis.call('HSET', rec, 'st', st) end
return whole()
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
local r, refusal = owned_fields(ARGV[4], {in_progress = true, unknown = true})
if not r then
  if ARGV[7] == '1' then log_head(8) end
  return refusal
end
local ex = now + tonumber(ARGV[5])
-- ARGV[7]: '1' if the attempt follows (ARGV[8..21]); then the body's
-- field/value pairs (redis_codec.h EncodeOutcome).
local body_at = 8
if ARGV[7] == '1' then
  local stale = log_stale(8)
  if stale then return stale end
  log_attempt(8)
  body_at = 22
end
redis.call('HSET', rec, 'st', 'completed', 'oc', ARGV[6], 'co', n2s(now), 'ex', n2s(ex),
           unpack(ARGV, body_at))
keep(ex)
changed('completed ' .. r[F_FENCE])
r[F_ST], r[F_OC], r[F_CO], r[F_EX] = 'completed', ARGV[6], n2s(now), n2s(ex)
return {'ok', r}
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
local n = (#ARGV - 3) / 12
local stale = chain_stale(KEYS[2], 4, n, ARGV[3], tonumber(ARGV[2]))
if stale then return stale end
chain_append(KEYS[1], KEYS[2], 4, n, tonumber(ARGV[1]))
return {'ok', n}
)lua";

// KEYS[1] the stream, KEYS[2] its heads; ARGV: (id, tenant, seq, hash) per
// entry to delete. Deletes those still there and moves each tenant's
// restart point past the last one.
constexpr char kPurgeAttempts[] = R"lua(
local gone, cut = 0, {}
for i = 1, #ARGV, 4 do
  if #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i], 'COUNT', 1) == 1 then
    gone = gone + redis.call('XDEL', KEYS[1], ARGV[i])
  end
  local s = tonumber(ARGV[i + 2])
  if s > 0 and (not cut[ARGV[i + 1]] or cut[ARGV[i + 1]][1] < s) then
    cut[ARGV[i + 1]] = {s, ARGV[i + 3]}
  end
end
for t, c in pairs(cut) do
  local hs, hh, ss, _, tok, untl = head_of(KEYS[2], t)
  if c[1] + 1 > ss then set_head(KEYS[2], t, hs, hh, c[1] + 1, c[2], tok, untl) end
end
return gone
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
  return Make(std::move(name), std::string(kPrelude).insert(0, kChain) + body);
}

}  // namespace

const Script& ClaimScript() {
  static const Script s = RecordScript("claim", kClaim);
  return s;
}
const Script& ConfirmScript() {
  static const Script s = RecordScript("confirm", kConfirm);
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
  static const Script s = Make("append_attempts", std::string(kChain) + kAppendAttempts);
  return s;
}
const Script& PurgeAttemptsScript() {
  static const Script s = Make("purge_attempts", std::string(kChain) + kPurgeAttempts);
  return s;
}

}  // namespace idem::redis
