// JSON-RPC 2.0 as the MCP proxy needs it: the stdio framing (newline-
// delimited JSON), message classification and id handling, and the error
// answers idemgate sends itself.
//
// Nothing here does I/O: the framer takes bytes and returns complete
// messages, so it is tested without pipes. Pure functions and a framer value
// (one per stream, not thread-safe; the channel's reader thread owns it).
#pragma once

#include <boost/json/value.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "json/json_errors.h"
#include "json/json_text.h"

namespace idem::mcp {

// JSON-RPC error codes idemgate answers with. The standard ones, then its
// own in the implementation-defined server range (-32000..-32099). Each
// error's message says what happened and what to do.
enum RpcErrorCode : int {
  kRpcParseError = -32700,      // not JSON
  kRpcInvalidRequest = -32600,  // not a usable request (too large, ambiguous)
  kRpcInvalidParams = -32602,   // tools/call arguments refused (not I-JSON, bad key)
  kRpcInternalError = -32603,   // a bug or an unreadable stored outcome
  // The store could not be reached: nothing was executed; retry later.
  kRpcStoreUnavailable = -32001,
  // (-32002 is left unused: an outcome that became unknown is answered as
  // a tool result with _meta condition "outcome_unknown", so the model reads it.)
  // The tool answered but its outcome could not be stored: the action
  // probably happened; the result is withheld.
  kRpcOutcomeNotStored = -32003,
  // The upstream is gone (exited, disconnected) before answering a request
  // that has no record (not a gated tool call).
  kRpcUpstreamUnavailable = -32004,
  // Too many gated tool calls at once; retry later.
  kRpcOverloaded = -32005,
  // idemgate is stopping (a stop signal, or the client's end of input): the
  // tool call was not executed; retry once the server is back.
  kRpcStopping = -32006,
  // The upstream's answer to the request was larger than max_message_bytes
  // and was dropped: the request may have been acted on (a gated call's
  // record becomes outcome unknown); the answer is lost.
  kRpcAnswerTooLarge = -32007,
};

// Default limit on one framed message: 64 MiB. MCP results carry base64
// resources, so this is far above the 1 MiB limit on tool arguments.
inline constexpr size_t kDefaultMaxMessageBytes = size_t{64} << 20;
// Nesting accepted when classifying a message (Boost.JSON's default is 32).
inline constexpr size_t kMaxMessageDepth = 1024;

// Splits a byte stream into newline-delimited messages (MCP stdio: "messages
// are delimited by newlines, and MUST NOT contain embedded newlines"). A
// trailing "\r" is dropped (CRLF peers); blank lines are skipped. A message
// longer than the limit is dropped whole and reported once, as soon as it
// passes the limit: the framer never holds more than the limit (plus one
// byte) of it.
// The top level of one JSON text, fed in pieces of any size, kept small
// enough to hold whatever the text's size: nested containers are kept as
// "{}" or "[]", strings at the top level up to 1 KiB (a longer one is cut and
// marked with a control byte, so it is never taken for an id), and the whole
// skeleton up to 64 KiB. For the "id" of a message too large to hold,
// wherever in it the id comes.
class IdSkeleton {
 public:
  void Feed(std::string_view bytes);
  // RecoverIdText of what was fed.
  std::string IdText() const;
  // Whether what was fed has the top-level member `name` ("method": a
  // request or a notification, not an answer).
  bool HasMember(std::string_view name) const;

 private:
  void Keep(char c);

  std::string skeleton_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool cut_ = false;  // the current string is over its bound
  size_t string_bytes_ = 0;
};

class LineFramer {
 public:
  explicit LineFramer(size_t max_message_bytes = kDefaultMaxMessageBytes)
      : max_(max_message_bytes) {}

  struct Frame {
    std::string message;    // one JSON text, without the newline
    bool oversize = false;  // true: a message was dropped; `message` is empty
    // Of a dropped message: its top-level "id" as an IdSkeleton of the
    // whole line (its CR included) reads it, else "null". A dropped
    // message's frame comes at its end of line.
    std::string id_text = "null";
    // Of a dropped message: it had a top-level "method" (a request or a
    // notification), so its id is not one of the reader's requests.
    bool has_method = false;
  };

  // Appends `bytes` (any chunking) and returns the frames completed by them,
  // in order.
  std::vector<Frame> Feed(std::string_view bytes);
  // End of stream: the last message if it had no final newline.
  std::vector<Frame> Finish();

  size_t max_message_bytes() const { return max_; }

 private:
  void Complete(std::vector<Frame>& out);

  const size_t max_;
  std::string partial_;
  bool discarding_ = false;  // inside a line that is already over the limit
  IdSkeleton skeleton_;      // of the line being discarded
};

// One message framed for stdio: `message` plus "\n". A raw CR or LF can only
// occur in valid JSON as whitespace between tokens, so each becomes a space
// (messages from an HTTP peer may be pretty-printed); other bytes are kept.
std::string FrameLine(std::string message);

// One classified JSON-RPC message.
struct Message {
  enum class Kind {
    kRequest,       // "method" (a string) and "id"
    kNotification,  // "method", no "id"
    kResult,        // "id" and "result", no "method"
    kError,         // "id" and "error", no "method"
    kBatch,         // a JSON array (JSON-RPC batch, MCP 2025-03-26)
    kOther,         // valid JSON that is none of these
  };
  Kind kind = Kind::kOther;
  // Nothing of the message is copied into a tree: a reader looks into the
  // text through json_text::View (one parse per message, docs/DESIGN.md
  // §6.1), so the bytes nobody reads, such as a tool's arguments, are only
  // validated once and then skipped.
  //
  std::vector<json_text::Member> members;
  std::string method;       // requests and notifications
  std::string id_text;      // the id's bytes as received ("null" if none)
  std::string id_key;       // IdKey(id): requests and responses match on it
};

// Parses and classifies one message. kInvalidArgument (with the reason and
// its byte offset, DescribeJsonError) if `text` is not JSON or if a member
// that routing depends on ("id", "method") appears twice; kResourceExhausted
// if it nests deeper than `max_depth`.
Result<Message> ParseMessage(std::string_view text, size_t max_depth = kMaxMessageDepth);

// The JSON toolkit's error phrase (json/json_errors.h), by its old name.
using json_text::DescribeJsonError;

// Why the parsed message `message` is not a JSON-RPC 2.0 message an MCP peer
// can act on, or nullopt if it is. A request or notification needs
// "jsonrpc": "2.0", a string "method", an object "params" if any, and (a
// request) a string or number "id"; anything else needs an "id" and a
// "result" or "error" (responses are not checked further). A peer drops a
// message that breaks these without answering, so whoever sent a request
// would wait for ever: the proxy answers it instead.
std::optional<std::string> JsonRpcEnvelopeProblem(json_text::View message);
// The same for an object whose top-level members were already found
// (Message::members of `object`), without scanning it again.
std::optional<std::string> JsonRpcEnvelopeProblem(std::string_view object,
                                                  const std::vector<json_text::Member>& members);

// The "id" of a message that could not be parsed or was cut short (`text`
// may be any prefix of it): the JSON text of its top-level "id" member when
// that is whole within `text` and a string or a number, else "null". Lets an
// error answer reach the request it is about.
std::string RecoverIdText(std::string_view text);

// A key that is equal for equal ids however they are spelled: "s:" + the
// string, "n:" + an integer (1, 1.0 and 1e0 agree), "j:" + the JSON of
// anything else (null, a fraction, an object).
std::string IdKey(const boost::json::value& id);
// IdKey of an id's JSON text; "j:" + the text if it is not JSON.
std::string IdKeyOfText(std::string_view id_text);

// {"jsonrpc":"2.0","id":<id_text>,"error":{"code":..,"message":..[,"data":..]}}.
// `id_text` is JSON ("7", "\"a\"", "null"); `data_json` a JSON value or empty.
std::string ErrorResponse(std::string_view id_text, int code, std::string_view message,
                          std::string_view data_json = {});
// {"jsonrpc":"2.0","id":<id_text>,"result":<result_json>}.
std::string ResultResponse(std::string_view id_text, std::string_view result_json);
// The -32700 answer to a message that could not be parsed, for the request
// `id_text` ("null" when unknown); `detail` completes "the message is …".
std::string ParseErrorResponse(std::string_view id_text, std::string_view detail);

}  // namespace idem::mcp
