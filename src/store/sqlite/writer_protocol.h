// The messages between a process and the shared writer of its SQLite file
// (shared_writer.h): a call is one write of SqliteStore (a claim, a
// completion, audit entries) with the caller's clock reading; a reply is that
// write's result. Binary, little-endian: integers of fixed width, strings as
// a 32-bit length and the bytes. Both ends are the same idemgate build
// (the hello checks kProtocolVersion), so there is no optional field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem::sqlite::wire {

// Bumped whenever a message's layout or a write's meaning changes; a client
// and a server of different versions do not talk (the client writes itself).
inline constexpr uint32_t kProtocolVersion = 1;

struct ClaimCall {
  ClaimRequest req;
  TimePoint now;
};
struct CompleteCall {
  RecordId id;
  uint64_t fence = 0;
  Outcome outcome;
  Duration retention{0};
  std::optional<Attempt> logged;
  TimePoint now;
};
struct AppendCall {
  std::vector<Attempt> attempts;
};
using Call = std::variant<ClaimCall, CompleteCall, AppendCall>;

std::string EncodeClaim(const ClaimRequest& req, TimePoint now);
std::string EncodeComplete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                           Duration retention, const Attempt* logged, TimePoint now);
std::string EncodeAppend(const std::vector<Attempt>& attempts);
// kInvalidArgument for bytes that are not a call of this version.
Result<Call> DecodeCall(std::string_view bytes);

std::string EncodeReply(const Result<ClaimResult>& result);
std::string EncodeReply(const Result<Record>& result);
std::string EncodeReply(const Result<void>& result);
// The result a reply carries (the write's own error, if it failed), or
// kInternal for bytes that are not such a reply.
Result<ClaimResult> DecodeClaimReply(std::string_view bytes);
Result<Record> DecodeRecordReply(std::string_view bytes);
Result<void> DecodeVoidReply(std::string_view bytes);

}  // namespace idem::sqlite::wire
