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

#include "idem/clock.h"
#include "idem/config.h"
#include "idem/key.h"
#include "gate/upstream_class.h"
#include "idem/ledger.h"
#include "fronts/mcp/json_rpc.h"

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
};

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

// A gated tools/call, ready for the ledger.
struct PreparedCall {
  Call call;
  Gate gate;
  std::string forward;            // the request to send upstream (key in _meta, nonce removed)
  std::string forward_arguments;  // its arguments object, for a reconcile lookup
  std::string forward_key;        // the key sent upstream: the record's, or the caller's own as sent
  std::string derived_key;        // the key before its scope, for PlanContext::key_of_call
  std::string call_id;            // the host's per-call id, if it sent one
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
  // The key (before its scope) of a call id the session has seen with
  // `tool`, or nullopt. Null function: no call ids are remembered.
  std::function<std::optional<std::string>(std::string_view call_id, std::string_view tool)>
      key_of_call;
};

// Plans `request` (the text of a tools/call request and its parse). The key
// is scoped by the first turn id of config.mcp.turn_id the call carries,
// else by the first session id (a turn fallback), and a call id seen before
// (context.key_of_call) gives the earlier call's key. The record is keyed
// ScopedKey(context.scope, key) in context.tenant, and the upstream is sent
// that key (a caller's explicit key as it was sent). `info` as for GateFor.
// Refusals (arguments not an I-JSON object, a bad explicit key, explicit
// mode without a key) come back as kAnswer.
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
Result<std::string> ReplayResult(const Decision& decision, const Config& config);

// Idempotency conditions, answered as tool results with isError: true, one
// plain-English text block and _meta["dev.idemgate/condition"].
std::string InProgressResult(const Call& call, const Decision& decision);
std::string OutcomeUnknownResult(const Call& call, const Decision& decision);
// The call this attempt forwarded got no answer (`why`: "the tool server went
// away before answering (...)"): its outcome is unknown as well.
std::string UnansweredResult(const Call& call, std::string_view why);
std::string DriftResult(const Call& call, const Decision& decision, KeyMode mode);
std::string TooLargeResult(const Call& call, const Decision& decision);
std::string MissingKeyResult(std::string_view tool);

// `result` (a result object) with "resultType": "complete" added when
// `stateless`, unchanged otherwise.
std::string CompleteResult(std::string result, bool stateless);


}  // namespace idem::mcp
