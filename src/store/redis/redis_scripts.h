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

// ARGV[4..] lease_ms retention_ms fingerprint tool turn owner confirm ('1':
// a completed record found is written again as it is, so that a WAIT after
// the script covers it; wait_replicas), then (with KEYS[2] the audit stream
// and KEYS[3] its heads) maxlen, the writer's token and the claim's audit
// entry, 12 values with its chain fields.
// → {'claimed', the hash}, {'exists', the hash, the entry's tenant's head}
// or, writing no record, {'stale' | 'reserved', tenant, head} (the entry does
// not follow the head, or another writer is first in line for it).
const Script& ClaimScript();
// No ARGV of its own. A completed record is written again as it is (its
// state, to itself), so that a WAIT after the script covers the completion,
// whoever wrote it; any other record is left alone. → the hash.
const Script& ConfirmScript();
// ARGV[4..] fence lease_ms. → {'ok', lease_expires_at_ms}.
const Script& HeartbeatScript();
// ARGV[4..] fence retention_ms 'oc' '0'|'1', with '1' (KEYS[2], KEYS[3] as
// for the claim) maxlen, the token and the 12 values of the entry, then the
// body's field/value pairs (redis_codec.h EncodeOutcome). → {'ok', fields}
// or {'stale' | 'reserved', tenant, head}.
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
// KEYS[1] the attempt stream, KEYS[2] its heads (one slot); ARGV[1] maxlen,
// ARGV[2] now (ms), ARGV[3] the writer's token, then 12 values per attempt:
// at tenant key tool turn outcome latency instance detail seq prev hash.
// → {'ok', count}, or, appending nothing, {'stale' | 'reserved', tenant,
// head, …} for every tenant of the batch when an entry does not follow its
// tenant's head (the writer is then first in line for those heads for a
// moment) or another writer is first in line. Trims the stream to maxlen,
// recording where each trimmed chain restarts.
const Script& AppendAttemptsScript();
// KEYS[1] the stream, KEYS[2] its heads; ARGV (id tenant seq hash)… the
// entries to delete. → how many were deleted.
const Script& PurgeAttemptsScript();

}  // namespace idem::redis
