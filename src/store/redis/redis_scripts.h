// The Lua scripts that change records (docs/DESIGN.md §4, §5). Each runs
// atomically on the node that owns the record's slot and touches one key,
// the record's hash, so it never meets Redis Cluster's multi-key limits
// (TRYAGAIN for the whole of a slot migration):
//
//   KEYS[1]  <prefix>idem:{<tenant>:<key>}:r   the record (a hash)
//   channel  <prefix>idem:{<tenant>:<key>}:c   PUBLISHed on every state change
//
// Fences: a new fence is max(old fence + 1, now in microseconds). When a
// record is deleted (release, evict, purge) its hash is replaced by a
// tombstone holding only 'fence', kept for fence_floor_keep, so the next
// claim's fence is greater even at the same microsecond or from an instance
// whose clock lags. When native TTL removes a record (retention + margin
// after it ended), the next fence is now in microseconds: greater than the
// old one unless the instances' clocks disagree by more than that.
//
// Every script takes ARGV[1] = now (Unix ms by the store's Clock: Redis's own
// time is never used for a decision), ARGV[2] = the garbage-collection margin
// and ARGV[3] = how long a tombstone is kept (both ms). Expiry is decided
// from the stored `ex` against that now; native TTL (PEXPIRE of the
// remaining lifetime + margin) only collects garbage.
//
// Business outcomes are replies, never Lua errors: {'notfound'},
// {'aborted', current_fence}, {'state', current_state}, {'live'}, or a
// success shape documented on each script.
#pragma once

#include <string>

namespace idem::redis {

struct Script {
  std::string name;
  std::string source;
  std::string sha1;  // lowercase hex, for EVALSHA
};

// "fields" below: the record without its outcome body, an HMGET in the
// order of redis_codec.h RecordFieldNames; "the hash": HGETALL, body
// included (redis_codec.h DecodeRecordHash).

// ARGV[4..] lease_ms retention_ms fingerprint tool turn owner.
// → {'claimed', the hash} or {'exists', the hash}.
const Script& ClaimScript();
// ARGV[4..] fence lease_ms. → {'ok', lease_expires_at_ms}.
const Script& HeartbeatScript();
// ARGV[4..] fence retention_ms 'oc', then the body's field/value pairs
// (redis_codec.h EncodeOutcome). → {'ok', fields}.
const Script& CompleteScript();
// ARGV[4..] fence. → {'ok'}.
const Script& ReleaseScript();
// ARGV[4..] owner. Deletes (to a tombstone) the live in-progress record
// whose 'ow' is `owner`. → {'ok'}.
const Script& AbandonScript();
// ARGV[4..] fence retention_ms. → {'ok', fields}.
const Script& MarkUnknownScript();
// ARGV[4..] fence lease_ms. Clears 'ow'. → {'ok', fields} or {'live'}.
const Script& TakeOverScript();
// → 1 if a record (not a tombstone) was deleted, else 0.
const Script& EvictScript();
// → 1 if the record was past its logical expiry and was deleted, else 0.
const Script& PurgeIfExpiredScript();
// KEYS[1] the attempt stream; ARGV[1] maxlen, then 9 fields per attempt:
// at tenant key tool turn outcome latency instance detail. → count.
const Script& AppendAttemptsScript();

}  // namespace idem::redis
