// What the HTTP transports need to know about a JSON-RPC text to route it:
// its kind, method, id and a few MCP fields, plus byte-exact surgery on the
// top-level "id" member.
//
// The transports never re-serialise a message: a parse-and-print round trip
// through a JSON library would change numbers it cannot hold exactly (an
// integer beyond 2^64, a long decimal) and so change the arguments the ledger
// fingerprints. Inspection parses to read; rewriting edits the original bytes.
//
// Pure functions, no I/O, safe from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "json/json_text.h"

namespace boost::json {
class object;
class value;
}  // namespace boost::json

namespace idem::mcp {

enum class MessageKind {
  kRequest,       // has "method" and "id"
  kNotification,  // has "method", no "id"
  kResponse,      // has "result" or "error", no "method"
  kInvalid,       // an object that is none of these, or not an object
};

// One JSON-RPC message, as the transports see it.
struct MessageInfo {
  MessageKind kind = MessageKind::kInvalid;
  std::string raw;     // the message's own bytes (a batch element's bytes for batches)
  std::string method;  // requests and notifications
  // The id serialised canonically ("1", "\"abc\""): equal ids give equal
  // keys whatever their spelling in the text. Empty when there is no id;
  // "null" for a null id.
  std::string id_key;
  // params._meta.progressToken, serialised like id_key; empty if absent.
  std::string progress_token;
  // params.name (tools/call, prompts/get) or params.uri (resources/read); empty otherwise.
  std::string name;
  // params._meta["io.modelcontextprotocol/protocolVersion"] (2026-07-28 dialect); empty if absent.
  std::string meta_protocol_version;
  // result.protocolVersion of a response (the initialize result); empty if absent.
  std::string result_protocol_version;
  // Why the message is not JSON-RPC 2.0 a peer can act on
  // (JsonRpcEnvelopeProblem); empty if it is. Always set for kInvalid.
  std::string problem;

  bool is_request() const { return kind == MessageKind::kRequest; }
  bool is_response() const { return kind == MessageKind::kResponse; }
};

// An HTTP body: one message or a batch (a JSON array of messages).
struct MessageBatch {
  bool is_batch = false;
  std::vector<MessageInfo> messages;  // in body order; never empty on success
};

// Parses one HTTP body. kInvalidArgument if it is not JSON (saying where and
// why: DescribeJsonError), is an empty batch, or an element is not an
// object; kResourceExhausted if it nests deeper than `max_depth`.
Result<MessageBatch> InspectBody(std::string_view body, size_t max_depth);

// Parses one message (not a batch). kInvalidArgument as InspectBody; a batch
// is refused.
Result<MessageInfo> InspectMessage(std::string_view text, size_t max_depth);

// The bytes of the top-level member `name` of the JSON object `object_text`
// (the value only, without surrounding whitespace), or nullopt if the text is
// not an object, has no such member or has it more than once (json_text::View).
// `object_text` may be cut short: a member before the cut is found.
std::optional<std::string_view> FindTopLevelMember(std::string_view object_text,
                                                   std::string_view name);

// Splits a JSON array into the bytes of its elements. nullopt if `array_text`
// is not a well-formed array.
std::optional<std::vector<std::string_view>> SplitTopLevelArray(std::string_view array_text);

// `message` with the value of its top-level "id" replaced by `new_id_json`
// (a JSON value, e.g. "\"idemgate-7\""), every other byte unchanged.
// kInvalidArgument if the message has no top-level "id".
Result<std::string> ReplaceId(std::string_view message, std::string_view new_id_json);

// MCP 2026-07-28 "x-mcp-header": a tool parameter whose value a client
// mirrors into an "Mcp-Param-<header>" request header.
struct MirroredParam {
  std::string header;             // the annotation's value: "Region" → Mcp-Param-Region
  std::vector<std::string> path;  // property names from the arguments object down
};

// The mirrored parameters of each tool in a tools/list response, read from
// the x-mcp-header annotations reachable through "properties" alone. Tools
// without any are left out; annotations that are not header tokens are
// ignored (they could inject headers). Empty for anything else.
std::map<std::string, std::vector<MirroredParam>> ParseMirroredParams(
    std::string_view tools_list_response, size_t max_depth);

// The mirrored parameters of one tool's inputSchema (as ParseMirroredParams).
std::vector<MirroredParam> MirroredParamsOfSchema(const boost::json::object& input_schema);

// The value a client mirrors into the header of one parameter: a string as
// it is, an integer in decimal, a boolean as true / false; nullopt for an
// absent or null value, or one of any other type (it gets no header).
std::optional<std::string> MirroredText(json_text::View value);

// The Streamable HTTP server hands the request headers idemgate reads with
// a tools/call to the session inside the message: the top-level member
// kRequestHeadersMember, an object of lowercase header name → value as
// received. The session takes it out before anything is forwarded
// (TakeRequestHeaders, tool_gate.h).
inline constexpr std::string_view kRequestHeadersMember = "dev.idemgate/requestHeaders";
// `message` with that member set to `headers`, every other byte unchanged.
// kInvalidArgument if `message` is not a JSON object.
Result<std::string> WithRequestHeaders(
    std::string_view message, const std::vector<std::pair<std::string, std::string>>& headers);

// The Mcp-Param-* headers (name, encoded value) of a tools/call message for
// its tool's mirrored parameters. A value that is absent, null, or not a
// string, integer or boolean gets no header.
std::vector<std::pair<std::string, std::string>> MirroredParamHeaders(
    const std::vector<MirroredParam>& params, std::string_view tools_call_message,
    size_t max_depth);

// MCP 2026-07-28 answers some errors with an HTTP status: 404 for an
// unknown method (-32601), 400 for a header mismatch, a missing client
// capability or an unsupported protocol version. The status for an answer
// sent as a plain JSON body: that one, else 200.
int StatelessHttpStatus(std::string_view response);

// A JSON-RPC error response, e.g. {"jsonrpc":"2.0","id":null,"error":{...}}.
// `id_json` is a JSON value ("null", "7", "\"a\""); `data_json` an optional
// JSON value for error.data (empty: none).
std::string JsonRpcError(std::string_view id_json, int code, std::string_view message,
                         std::string_view data_json = {});

// JSON-RPC 2.0 error codes used by the transports.
inline constexpr int kJsonRpcParseError = -32700;
inline constexpr int kJsonRpcInvalidRequest = -32600;
inline constexpr int kJsonRpcInternalError = -32603;
// MCP 2026-07-28: the HTTP headers do not match the body.
inline constexpr int kMcpHeaderMismatch = -32020;
// MCP 2026-07-28: the protocol version is not supported.
inline constexpr int kMcpUnsupportedProtocolVersion = -32022;

}  // namespace idem::mcp
