// What the MCP proxy does to tools (docs/DESIGN.md §3, §4.7, §6.1), as pure
// functions over message text: which tools are gated, how tools/list is
// rewritten so the model knows, how a tools/call becomes a ledger Call and
// the request forwarded upstream, how the upstream's answer is classified,
// and the tool results idemgate answers with itself (replays, conditions).
//
// No I/O and no shared state: safe from any thread. The session
// (mcp_session.h) does the routing, threading and ledger calls.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/json_rpc.h"
#include "gate/answer.h"
#include "gate/upstream_class.h"
#include "idem/clock.h"
#include "idem/config.h"
#include "idem/key.h"
#include "idem/ledger.h"

namespace idem::mcp {

// _meta members idemgate reads and writes. Never under the reserved
// io.modelcontextprotocol/ or …mcp/ prefixes.
inline constexpr std::string_view kMetaIdempotencyKey = "dev.idemgate/idempotencyKey";
inline constexpr std::string_view kMetaReplayed = "dev.idemgate/replayed";
inline constexpr std::string_view kMetaKey = "dev.idemgate/key";
inline constexpr std::string_view kMetaFirstAt = "dev.idemgate/firstAt";
inline constexpr std::string_view kMetaDrift = "dev.idemgate/drift";
inline constexpr std::string_view kMetaReconciled = "dev.idemgate/reconciled";
inline constexpr std::string_view kMetaCondition = "dev.idemgate/condition";
inline constexpr std::string_view kMetaRetryAfter = "dev.idemgate/retryAfterSeconds";

// What the session learned about one tool from tools/list.
struct ToolInfo {
  bool read_only = false;       // annotations.readOnlyHint == true
  bool declares_nonce = false;  // the tool has its own argument named like repeat_nonce
  // Its x-mcp-header arguments, which a Streamable HTTP client mirrors into
  // Mcp-Param-* headers (MCP 2026-07-28, SEP-2243).
  std::vector<MirroredParam> mirrored;
};

// The request headers a Streamable HTTP client sent with a tools/call that
// idemgate reads (its Mcp-Param-* headers and those header: id sources
// name), by lowercase name, values as received.
using RequestHeaders = std::map<std::string, std::string, std::less<>>;

// The headers the HTTP server put into `request` (kRequestHeadersMember,
// http_jsonrpc.h), taken out of `request` so that nothing of them is
// forwarded; nullopt when it carries none (stdio, or an HTTP client that
// sent none in a dialect before 2026-07-28). `parsed` is its parse; its
// members are updated to the new text.
std::optional<RequestHeaders> TakeRequestHeaders(std::string& request, Message& parsed);

// How calls to one tool are handled.
struct Gate {
  bool gated = false;    // claimed in the ledger before it is forwarded
  bool mutating = true;  // not annotated readOnlyHint: true (or never listed)
  KeyMode mode = KeyMode::kOff;
  bool nonce = false;  // the repeat_nonce argument is offered, keyed and stripped
};

// Gating for `tool`: a config rule's `gated = false` passes it through; else
// the config's mode (Config::ModeFor: the rule's mode, its `gated = true`, or
// turn for mutating tools and off for read-only ones). `info` is null for a
// tool never listed: MCP's defaults make an unannotated tool destructive, so
// it is mutating.
Gate GateFor(const Config& config, std::string_view tool, const ToolInfo* info);

// Rewrites the result object of a tools/list response: gated tools get
// annotations.idempotentHint = true, a description saying they are safe to
// retry and for how long results are kept, and the optional repeat_nonce
// property; mutating tools left ungated are described as not safe to retry.
// Records what it learned of each tool in `tools`. Returns the new result
// text; a result without a "tools" array is returned unchanged.
// kInvalidArgument if the text is malformed.
Result<std::string> RewriteToolsListResult(std::string_view result, const Config& config,
                                           std::map<std::string, ToolInfo>& tools);

// What idemgate does with each tool of a tools/list, for the operator (the
// CLI prints it once the upstream's list is known): one line naming where
// turn, session and call ids are read, one line per gated tool with its key
// mode, what scopes its key and how long results are kept, one per
// mutating tool left ungated (its retries run again), and one line for the
// read-only tools passed through. `tools` as RewriteToolsListResult learned
// them. Lines without a newline.
std::vector<std::string> DescribeGating(const Config& config,
                                        const std::map<std::string, ToolInfo>& tools);

// A gated tools/call, ready for the ledger.
struct PreparedCall {
  Call call;
  Gate gate;
  std::string forward;            // the request to send upstream (key in _meta, nonce removed)
  std::string forward_arguments;  // its arguments object, for a reconcile lookup
  std::string forward_key;        // the key sent upstream: the record's, or the caller's own as sent
  std::string derived_key;        // the key before its scope, for PlanContext::key_of_call
  std::string call_id;            // the host's per-call id, if it sent one
  // Keyed in turn mode by the turn (or session) the host sent, with no
  // explicit key, call id seen or repeat_nonce: another key for the same
  // turn and tool soon after means the agent re-planned the call
  // (McpConfig::replan_window).
  bool replan_candidate = false;
  std::optional<std::string> reconcile_tool;  // rule.reconcile
  // The request speaks the stateless dialect (2026-07-28: _meta carries
  // io.modelcontextprotocol/protocolVersion), whose results all carry
  // "resultType"; results idemgate makes itself get "complete".
  bool stateless = false;
};

// What to do with one tools/call request.
struct CallPlan {
  enum class Kind {
    kPassThrough,  // not gated (or not a well-formed call): forward the original bytes
    kGated,        // claim `prepared.call`, then forward `prepared.forward`
    kAnswer,       // answer the client with `answer` (a refusal), forward nothing
  };
  Kind kind = Kind::kPassThrough;
  PreparedCall prepared;
  std::string answer;  // a complete JSON-RPC response
  std::string tool;    // params.name, when there is one
};

// The session's side of planning a call.
struct PlanContext {
  std::string_view tenant;  // the record's tenant
  std::string_view scope;   // records are keyed ScopedKey(scope, key)
  const SourceEnvironment* env = nullptr;  // for env: id sources; null: none
  // The agent host the session's initialize named (ClientNameOf); a call's
  // own _meta["io.modelcontextprotocol/clientInfo"] (2026-07-28) wins.
  std::string_view host;
  // The key (before its scope) of a call id the session has seen with
  // `tool`, or nullopt. Null function: no call ids are remembered.
  std::function<std::optional<std::string>(std::string_view call_id, std::string_view tool)>
      key_of_call;
  // The request headers of a call over Streamable HTTP (TakeRequestHeaders),
  // for header: id sources and SEP-2243's checks. Null: none (stdio).
  const RequestHeaders* headers = nullptr;
  // The turn file of the host that started this proxy (host_turn.h), which
  // a hook:turn source reads when the call is planned. Null: hook:turn is
  // never present.
  const std::string* hook_turn_file = nullptr;
};

// The agent host's name in an initialize request's params.clientInfo.name,
// or in a request's _meta["io.modelcontextprotocol/clientInfo"].name (the
// 2026-07-28 dialect sends it with every request), at most kMaxHostBytes;
// empty if there is none. For the host label of the metrics.
inline constexpr size_t kMaxHostBytes = 64;
std::string ClientNameOf(std::string_view request);

// Plans `request` (the text of a tools/call request and its parse, whose
// members must be those of this text). The key
// is scoped by the first turn id of config.mcp.turn_id the call carries,
// else by the first session id (a turn fallback), and a call id seen before
// (context.key_of_call) gives the earlier call's key. The record is keyed
// ScopedKey(context.scope, key) in context.tenant, and the upstream is sent
// that key (a caller's explicit key as it was sent). `info` as for GateFor.
// Refusals (arguments not an I-JSON object, a bad explicit key, explicit
// mode without a key) come back as kAnswer, and so, for any tool, does a
// call over Streamable HTTP whose Mcp-Param-* headers disagree with the
// arguments the tool marks x-mcp-header (SEP-2243: a header that does not
// match or cannot be decoded, one for an argument that is absent, and in
// the 2026-07-28 dialect a missing one): JSON-RPC error -32020
// (kMcpHeaderMismatch), which the HTTP front answers with 400.
CallPlan PlanToolCall(std::string_view request, const Message& parsed, const Config& config,
                      const PlanContext& context, const ToolInfo* info);

// What the upstream's answer to a forwarded tools/call says of the action
// (§4.7, gate/upstream_class.h): a result is kSuccess, or kToolError when
// isError; input_required is kInterim; a JSON-RPC error is what
// gate::ClassOfJsonRpcError says of its code. Ledger::Settle acts on it.
struct ToolAnswer {
  Execution::Kind kind = Execution::Kind::kSuccess;
  std::string body;  // the result object's text exactly as received (a result)
  std::string why;   // for logs: "success", "json-rpc error -32603", ...
};
ToolAnswer ClassifyToolAnswer(std::string_view response, const Message& parsed);

// What a reconcile lookup tool's answer says (§4 step 4). The contract: the
// lookup answers a result whose structuredContent has a boolean "found":
// true (the action happened; the result becomes the stored outcome) or
// false (it did not). Anything else — isError, a JSON-RPC error, a result
// without that boolean — is kCannotTell: the record stays unknown.
struct LookupAnswer {
  gate::LookupVerdict verdict = gate::LookupVerdict::kCannotTell;
  std::string body;  // kFound: the result object's text
  std::string why;   // kCannotTell: what was wrong with the answer
};
LookupAnswer ClassifyLookupAnswer(std::string_view response, const Message& parsed);

// The result object answering a replay of `record` (completed, with an
// outcome of class success or tool error): the stored result plus replay
// _meta and, if config.mcp.replay_text, a text block saying the action was
// not performed again. kDataLoss if the stored body is not a JSON object.
Result<std::string> ReplayResult(const Decision& decision, const gate::Answer& answer,
                                 const Config& config);

// Idempotency conditions, answered as tool results with isError: true, one
// plain-English text block and _meta["dev.idemgate/condition"]; `answer` is
// gate::AnswerFor of the ledger's decision.
std::string InProgressResult(const Call& call, const gate::Answer& answer);
std::string OutcomeUnknownResult(const Call& call, const gate::Answer& answer);
// The call this attempt forwarded got no answer (`why`: "the tool server went
// away before answering (...)"): its outcome is unknown as well.
std::string UnansweredResult(const Call& call, std::string_view why);
std::string DriftResult(const Call& call, const Decision& decision, const gate::Answer& answer,
                        KeyMode mode);
std::string TooLargeResult(const Call& call, const gate::Answer& answer);
std::string MissingKeyResult(std::string_view tool);

// `result` (a result object) with "resultType": "complete" added when
// `stateless`, unchanged otherwise.
std::string CompleteResult(std::string result, bool stateless);


}  // namespace idem::mcp
