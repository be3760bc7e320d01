// How records and attempts are laid out in Redis, and decoded from replies.
// No I/O.
#pragma once

#include <hiredis/hiredis.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "idem/record.h"

namespace idem::redis {

// The names of one record. Both share the hash tag {<tenant>:<key>}, so the
// channel is announced from the record's own slot. The tenant is %-escaped for '%', ':', '{' and
// '}', the key for '%', '{' and '}', so that no two (tenant, key) pairs share
// a name and the hash tag is never cut short.
struct RecordKeys {
  std::string record;   // <prefix>idem:{…}:r  the hash (or a tombstone: only 'fence')
  std::string channel;  // <prefix>idem:{…}:c  pub/sub
};
RecordKeys KeysOf(std::string_view prefix, const RecordId& id);
// SCAN MATCH pattern for every record key under `prefix`.
std::string RecordKeyPattern(std::string_view prefix);
// Where every eviction is announced (Store::WatchEvictions): one channel
// for all records, since evictions are rare.
std::string EvictionChannel(std::string_view prefix);
// The audit stream.
std::string AttemptStreamKey(std::string_view prefix);
// The chain heads of the audit stream's tenants (docs/DESIGN.md §7): a hash,
// field = tenant, value = ChainHeadValue. Named with the stream's whole name
// as its hash tag, so that it lives in the stream's slot and one script
// writes both, in a cluster too (a prefix holds no braces: redis_url.cc).
std::string AttemptHeadsKey(std::string_view prefix);
// A head as the heads hash keeps it: "seq hash start_seq start_prev", then
// " token until_ms" while a writer is first in line for it (the scripts).
std::string ChainHeadValue(const ChainHead& head);
// Parses ChainHeadValue for `tenant` (a reservation is ignored); kDataLoss
// if malformed.
Result<ChainHead> ParseChainHead(std::string_view tenant, std::string_view value);

// HMGET field order of a record without its outcome body: st fp tool turn
// fence cr le co ex oc ow.
std::vector<std::string> RecordFieldNames();

// How an outcome is laid out in the record hash. Redis keeps a small hash as
// one compact listpack only while every value has at most
// hash-max-listpack-value bytes (64 by default) and it has at most
// hash-max-listpack-entries fields (128); one longer value turns the hash into
// a hashtable, about twice the memory (measured 1377 against 721 bytes per
// record) and more cache misses per read. So a body of at most
// kMaxBodyFields × field_bytes bytes is split into the fields o1, o2, … of at
// most field_bytes bytes each, and the class is written "<class>/fields". A
// longer body, whose hash could not stay a listpack anyway, or field_bytes 0,
// keeps the whole body in the field 'ob', as records written before this
// layout do. The suffix makes an older idemgate, which reads only 'ob', refuse
// a split record as corrupt instead of replaying an empty body.
inline constexpr size_t kMaxBodyFields = 100;
struct OutcomeFields {
  std::string cls;                 // the value of 'oc'
  std::vector<std::string> pairs;  // field, value, field, value, …: the body
};
OutcomeFields EncodeOutcome(const Outcome& outcome, size_t field_bytes);

// Decodes an HMGET-shaped array (see RecordFieldNames): the record without
// its outcome body. nullopt if the record is absent (no state). kDataLoss if a
// field is missing or unreadable.
Result<std::optional<Record>> DecodeRecord(const RecordId& id, const redisReply& fields);
// Decodes an HGETALL reply: the whole record, body included.
Result<std::optional<Record>> DecodeRecordHash(const RecordId& id, const redisReply& hash);

// The 12 values the scripts store per attempt, in their order: at tenant key
// tool turn outcome latency instance detail seq prev hash.
std::vector<std::string> EncodeAttempt(const Attempt& a);
// Decodes the field list of one stream entry. kDataLoss if unreadable.
Result<Attempt> DecodeAttempt(const redisReply& fields);

// Decodes the reply of TIME (seconds and microseconds, as text) to the
// millisecond. kInternal if it has another shape.
Result<TimePoint> DecodeTime(const redisReply& reply);

}  // namespace idem::redis
