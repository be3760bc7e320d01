// The SQLite shared writer's messages (src/store/sqlite/writer_protocol.h):
// the calls a serving process decodes from its clients and the replies a
// client decodes from the server. The first byte picks what the rest is: 'c'
// a call, 'l' a claim reply, 'r' a record reply, 'v' a void reply (others
// pick by value).
// Properties: bytes that are not a message are refused (a call as
// kInvalidArgument, a reply as kInternal), never a crash or a read past the
// input; bytes that decode are exactly the encoding of what they decoded to
// (one encoding per message, so nothing is lost or invented on the way).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "fuzz_check.h"
#include "sqlite/writer_protocol.h"

namespace {

namespace wire = idem::sqlite::wire;

std::string Encode(const wire::Call& call) {
  if (const auto* c = std::get_if<wire::ClaimCall>(&call)) return wire::EncodeClaim(c->req, c->now);
  if (const auto* c = std::get_if<wire::CompleteCall>(&call)) {
    return wire::EncodeComplete(c->id, c->fence, c->outcome, c->retention,
                                c->logged ? &*c->logged : nullptr, c->now);
  }
  return wire::EncodeAppend(std::get<wire::AppendCall>(call).attempts);
}

// A reply that decoded (to a value or to the error it carries) encodes back
// to its bytes; one that did not is kInternal.
template <typename T>
void CheckReply(std::string_view bytes, const idem::Result<T>& decoded) {
  if (!decoded && decoded.error().code == idem::ErrorCode::kInternal &&
      decoded.error().message.find("cannot read") != std::string::npos) {
    return;
  }
  FUZZ_CHECK_EQ(wire::EncodeReply(decoded), bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  char selector = static_cast<char>(data[0]);
  if (std::string_view("clrv").find(selector) == std::string_view::npos) {
    selector = "clrv"[data[0] % 4];
  }
  switch (selector) {
    case 'c': {
      auto call = wire::DecodeCall(bytes);
      if (!call) {
        FUZZ_CHECK(call.error().code == idem::ErrorCode::kInvalidArgument);
        FUZZ_CHECK(!call.error().message.empty());
        break;
      }
      FUZZ_CHECK_EQ(Encode(*call), bytes);
      break;
    }
    case 'l':
      CheckReply(bytes, wire::DecodeClaimReply(bytes));
      break;
    case 'r':
      CheckReply(bytes, wire::DecodeRecordReply(bytes));
      break;
    default:
      CheckReply(bytes, wire::DecodeVoidReply(bytes));
      break;
  }
  return 0;
}
