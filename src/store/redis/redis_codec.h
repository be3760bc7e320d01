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
// The audit stream.
std::string AttemptStreamKey(std::string_view prefix);

// HMGET field order of a record: st fp tool turn fence cr le co ex oc ow [ob].
std::vector<std::string> RecordFieldNames(bool with_body);

// Decodes an HMGET-shaped array (see RecordFieldNames). nullopt if the
// record is absent (no state). kDataLoss if a field is missing or unreadable.
Result<std::optional<Record>> DecodeRecord(const RecordId& id, const redisReply& fields);

// The 9 values the append script stores per attempt, in its order.
std::vector<std::string> EncodeAttempt(const Attempt& a);
// Decodes the field list of one stream entry. kDataLoss if unreadable.
Result<Attempt> DecodeAttempt(const redisReply& fields);

}  // namespace idem::redis
