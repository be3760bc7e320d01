#include "fronts/mcp/tool_gate.h"

#include <boost/json.hpp>
#include <cctype>
#include <ctime>

#include "idem/canonical_json.h"
#include "fronts/mcp/host_turn.h"
#include "fronts/mcp/http_protocol.h"
#include "json/json_text.h"

namespace idem::mcp {
namespace {

namespace json = boost::json;
using json_text::Quote;

const json::object* ObjectAt(const json::value* v) {
  return v != nullptr && v->is_object() ? &v->get_object() : nullptr;
}

const json::value* Member(const json::object* o, std::string_view name) {
  return o == nullptr ? nullptr : o->if_contains(name);
}

// RFC 6901: "~" → "~0", "/" → "~1".
std::string PointerTo(std::string_view name) {
  std::string out = "/";
  for (char c : name) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// The value `source` reads from a call's _meta (or the environment), or
// nullopt when it is absent or not usable: a host's members are read as
// they come, so a shape idemgate does not expect is skipped, never refused.
std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A header's value as the argument it mirrors: an Mcp-Param-* value is
// decoded (=?base64?...?=); nullopt if it cannot be.
std::optional<std::string> HeaderValue(const RequestHeaders& headers, std::string_view name) {
  const std::string lower = Lower(name);
  auto it = headers.find(lower);
  if (it == headers.end()) return std::nullopt;
  if (!lower.starts_with("mcp-param-")) return it->second;
  Result<std::string> decoded = DecodeMirroredHeaderValue(it->second);
  if (!decoded) return std::nullopt;
  return std::move(*decoded);
}

std::optional<std::string> ReadIdSource(const IdSource& source, const json::object* meta,
                                        const PlanContext& context) {
  const SourceEnvironment* env = context.env;
  const RequestHeaders* headers = context.headers;
  if (source.kind == IdSource::Kind::kHook) {
    if (context.hook_turn_file == nullptr) return std::nullopt;
    std::optional<HookTurn> turn = ReadTurnFile(*context.hook_turn_file);
    if (!turn) return std::nullopt;
    return std::move(turn->turn_id);
  }
  if (source.kind == IdSource::Kind::kHeader) {
    if (headers == nullptr) return std::nullopt;
    std::optional<std::string> value = HeaderValue(*headers, source.name);
    if (!value || value->empty()) return std::nullopt;
    return value;
  }
  if (source.kind == IdSource::Kind::kEnv) {
    if (env == nullptr) return std::nullopt;
    auto it = env->find(source.name);
    if (it == env->end() || it->second.empty()) return std::nullopt;
    return it->second;
  }
  const json::value* member = Member(meta, source.name);
  if (member == nullptr) return std::nullopt;
  const json::value* found = member;
  json::value parsed;  // a member holding JSON text (Codex sent its turn metadata as text once)
  if (!source.pointer.empty()) {
    if (member->is_string()) {
      boost::system::error_code ec;
      parsed = json::parse(member->get_string(), ec);
      if (ec) return std::nullopt;
      member = &parsed;
    }
    boost::system::error_code ec;
    found = member->find_pointer(source.pointer, ec);
    if (found == nullptr) return std::nullopt;
  }
  if (found->is_string() && !found->get_string().empty()) return std::string(found->get_string());
  if (found->is_int64() || found->is_uint64()) return json::serialize(*found);
  return std::nullopt;
}

// The first of `sources` present in the call: its value and its source.
struct FoundId {
  std::string value;
  const IdSource* source = nullptr;
  std::string note;  // for the attempt's detail: "claude-code prompt hook"; empty: none
};
std::optional<FoundId> FirstId(const std::vector<IdSource>& sources, const json::object* meta,
                               const PlanContext& context) {
  for (const IdSource& source : sources) {
    if (source.kind == IdSource::Kind::kHook) {
      // Read only here, once earlier sources gave nothing: one small file.
      if (context.hook_turn_file == nullptr) continue;
      if (std::optional<HookTurn> turn = ReadTurnFile(*context.hook_turn_file)) {
        return FoundId{std::move(turn->turn_id), &source, turn->host + " prompt hook"};
      }
      continue;
    }
    if (auto value = ReadIdSource(source, meta, context)) {
      return FoundId{std::move(*value), &source, ""};
    }
  }
  return std::nullopt;
}

// "hook:turn (claude-code prompt hook)", "meta:vscode.requestId".
std::string SourceText(const FoundId& found) {
  return found.note.empty() ? found.source->text : found.source->text + " (" + found.note + ")";
}

// "arguments.a.b" for a mirrored parameter's path, for messages.
std::string ArgumentPath(const MirroredParam& param) {
  std::string out = "arguments";
  for (const std::string& p : param.path) out += "." + p;
  return out;
}

// SEP-2243's checks of the Mcp-Param-* headers of one tools/call against
// the arguments they mirror: what is wrong, or nullopt. `required`: the
// 2026-07-28 dialect, in which a client must send a header for every
// marked argument it passes.
std::optional<std::string> HeaderMismatch(const std::vector<MirroredParam>& params,
                                          json_text::View arguments, const RequestHeaders& headers,
                                          bool required) {
  for (const MirroredParam& param : params) {
    json_text::View v = arguments;
    for (const std::string& key : param.path) v = v[key];
    const std::optional<std::string> body = MirroredText(v);
    const std::string name = "Mcp-Param-" + param.header;
    auto sent = headers.find(Lower(name));
    if (sent == headers.end()) {
      if (body && required) {
        return "Header mismatch: " + name + " is missing, but " + ArgumentPath(param) +
               " is in the body; a client mirrors every x-mcp-header argument it sends";
      }
      continue;
    }
    Result<std::string> decoded = DecodeMirroredHeaderValue(sent->second);
    if (!decoded) {
      return "Header mismatch: " + name + " cannot be decoded: " + decoded.error().message;
    }
    if (!body) {
      return "Header mismatch: " + name + " was sent, but " + ArgumentPath(param) +
             " is not in the body; send the header only with the argument";
    }
    if (*decoded != *body) {
      return "Header mismatch: " + name + " header value " + Quote(*decoded) +
             " does not match body value " + Quote(*body) + " of " + ArgumentPath(param);
    }
  }
  return std::nullopt;
}

// How long results are kept, for the model: "24h", "7d", "1h30m".
std::string RetentionText(Duration d) {
  constexpr int64_t kHour = 3'600'000, kDay = 24 * kHour;
  const int64_t ms = d.count();
  if (ms > 0 && ms % kDay == 0 && ms >= 2 * kDay) return std::to_string(ms / kDay) + "d";
  if (ms > 0 && ms % kHour == 0) return std::to_string(ms / kHour) + "h";
  return FormatDuration(d);
}

std::string SafeToRetrySuffix(const Config& config, std::string_view tool, const Gate& gate) {
  std::string what;
  switch (gate.mode) {
    case KeyMode::kTurn:
      what = "a repeated call with the same arguments in the same turn";
      break;
    case KeyMode::kArgs:
      what = "a repeated call with the same arguments";
      break;
    case KeyMode::kFields: {
      what = "a repeated call with the same";
      const ToolRule* rule = config.RuleFor(tool);
      if (rule != nullptr) {
        for (size_t i = 0; i < rule->fields.size(); ++i) {
          what += i == 0 ? " " : ", ";
          what += rule->fields[i];
        }
      }
      break;
    }
    case KeyMode::kExplicit:
    case KeyMode::kOff:
      what = "a repeated call with the same idempotency key (_meta \"" +
             std::string(kMetaIdempotencyKey) + "\")";
      break;
  }
  std::string out = "\n\n[idemgate] Safe to retry: " + what +
                    " returns the first call's stored result instead of acting again (kept " +
                    RetentionText(config.PolicyFor(tool).ttl) + ").";
  if (gate.nonce) {
    out += " To deliberately repeat the action, pass a new `" + *config.mcp.repeat_nonce + "`.";
  }
  return out;
}

constexpr std::string_view kNotSafeSuffix =
    "\n\n[idemgate] Not safe to retry: this tool is not protected against duplicate calls.";

std::string NonceSchema() {
  return R"({"type":"string","description":"Optional. Leave it out normally: an identical call )"
         R"(is then answered with the first call's stored result instead of acting twice. Pass )"
         R"(a new unique value only to deliberately perform the action again."})";
}

// "meta:a, env:B", or "nothing" for an empty list.
std::string SourceList(const std::vector<IdSource>& sources) {
  std::string out;
  for (const IdSource& s : sources) out += (out.empty() ? "" : ", ") + s.text;
  return out.empty() ? "nothing" : out;
}

// What scopes the key of a gated tool in `mode`, for DescribeGating.
std::string ScopeText(const Config& config, std::string_view tool, KeyMode mode) {
  const Policy policy = config.PolicyFor(tool);
  switch (mode) {
    case KeyMode::kTurn:
      return "scoped by the turn id (else the session id, kept " + RetentionText(policy.window) +
             "; else none)";
    case KeyMode::kArgs:
      return "no scope: identical arguments within " + RetentionText(policy.window) +
             " are one call";
    case KeyMode::kFields: {
      std::string fields;
      if (const ToolRule* rule = config.RuleFor(tool)) {
        for (const std::string& f : rule->fields) fields += (fields.empty() ? "" : ", ") + f;
      }
      return "keyed by " + fields + " alone";
    }
    case KeyMode::kExplicit:
      return "keyed by the caller's key alone (" + SourceList(config.mcp.key) + ")";
    case KeyMode::kOff:
      break;
  }
  return {};
}

// One tool object of a tools/list result, rewritten.
Result<std::string> RewriteTool(std::string_view tool_text, const Config& config,
                                std::map<std::string, ToolInfo>& tools) {
  boost::system::error_code ec;
  json::value tool = json::parse(tool_text, ec);
  if (ec || !tool.is_object()) return std::string(tool_text);
  const json::object& obj = tool.get_object();
  const json::value* name = obj.if_contains("name");
  if (name == nullptr || !name->is_string()) return std::string(tool_text);
  const std::string tool_name(name->get_string());

  ToolInfo info;
  const json::object* annotations = ObjectAt(obj.if_contains("annotations"));
  if (const json::value* ro = Member(annotations, "readOnlyHint"); ro && ro->is_bool()) {
    info.read_only = ro->get_bool();
  }
  const json::object* schema = ObjectAt(obj.if_contains("inputSchema"));
  if (schema != nullptr) info.mirrored = MirroredParamsOfSchema(*schema);
  const json::object* properties = ObjectAt(Member(schema, "properties"));
  if (config.mcp.repeat_nonce && properties != nullptr &&
      properties->contains(*config.mcp.repeat_nonce)) {
    info.declares_nonce = true;
  }
  tools[tool_name] = info;

  const Gate gate = GateFor(config, tool_name, &info);
  if (!gate.gated && !gate.mutating) return std::string(tool_text);

  auto members = json_text::ObjectMembers(tool_text);
  if (!members) return std::unexpected(members.error());
  std::string out(tool_text);

  std::string description;
  if (const json::value* d = obj.if_contains("description"); d && d->is_string()) {
    description = std::string(d->get_string());
  }
  std::string suffix =
      gate.gated ? SafeToRetrySuffix(config, tool_name, gate) : std::string(kNotSafeSuffix);
  if (description.empty()) suffix.erase(0, 2);  // no blank lines before the note
  auto set = json_text::SetMember(out, "description", Quote(description + suffix));
  if (!set) return std::unexpected(set.error());
  out = std::move(*set);
  if (!gate.gated) return out;

  // annotations.idempotentHint = true
  std::string annotations_text = "{}";
  if (auto m = json_text::FindMember(*members, "annotations"); m && *m && annotations != nullptr) {
    annotations_text = std::string((*m)->value.In(tool_text));
  }
  auto hinted = json_text::SetMember(annotations_text, "idempotentHint", "true");
  if (!hinted) return std::unexpected(hinted.error());
  set = json_text::SetMember(out, "annotations", *hinted);
  if (!set) return std::unexpected(set.error());
  out = std::move(*set);

  // inputSchema.properties.repeat_nonce
  if (gate.nonce && schema != nullptr) {
    auto m = json_text::FindMember(*members, "inputSchema");
    if (!m || !*m) return out;
    std::string schema_text((*m)->value.In(tool_text));
    auto schema_members = json_text::ObjectMembers(schema_text);
    if (!schema_members) return std::unexpected(schema_members.error());
    std::string properties_text = "{}";
    if (auto p = json_text::FindMember(*schema_members, "properties");
        p && *p && properties != nullptr) {
      properties_text = std::string((*p)->value.In(schema_text));
    }
    auto with_nonce =
        json_text::SetMember(properties_text, *config.mcp.repeat_nonce, NonceSchema());
    if (!with_nonce) return std::unexpected(with_nonce.error());
    auto new_schema = json_text::SetMember(schema_text, "properties", *with_nonce);
    if (!new_schema) return std::unexpected(new_schema.error());
    set = json_text::SetMember(out, "inputSchema", *new_schema);
    if (!set) return std::unexpected(set.error());
    out = std::move(*set);
  }
  return out;
}

CallPlan Refuse(CallPlan plan, const Message& parsed, int code, std::string message) {
  plan.kind = CallPlan::Kind::kAnswer;
  plan.answer = ErrorResponse(parsed.id_text, code, message);
  return plan;
}

CallPlan Refuse(CallPlan plan, const Message& parsed, std::string message) {
  return Refuse(std::move(plan), parsed, kRpcInvalidParams, std::move(message));
}

// {"content":[{"type":"text","text":...}],"isError":true,"_meta":{...}}
std::string Condition(std::string_view condition, std::string_view text,
                      std::string_view extra_meta = {}) {
  std::string out = R"({"content":[{"type":"text","text":)";
  out += Quote(text);
  out += R"(}],"isError":true,"_meta":{)";
  out += Quote(kMetaCondition);
  out += ':';
  out += Quote(condition);
  out.append(extra_meta);
  out += "}}";
  return out;
}

std::string KeyMeta(const Call& call) { return "," + Quote(kMetaKey) + ":" + Quote(call.id.key); }

}  // namespace

std::string CompleteResult(std::string result, bool stateless) {
  if (!stateless) return result;
  auto members = json_text::ObjectMembers(result);
  if (!members) return result;
  auto existing = json_text::FindMember(*members, "resultType");
  if (!existing || *existing != nullptr) return result;
  auto out = json_text::SetMember(result, "resultType", "\"complete\"");
  return out ? std::move(*out) : result;
}

std::vector<std::string> DescribeGating(const Config& config,
                                        const std::map<std::string, ToolInfo>& tools) {
  std::vector<std::string> lines = {
      "ids: turn from " + SourceList(config.mcp.turn_id) + "; session from " +
      SourceList(config.mcp.session_id) + "; call id from " + SourceList(config.mcp.call_id) +
      "; a caller's key from " + SourceList(config.mcp.key)};
  std::string read_only;
  size_t read_only_count = 0;
  for (const auto& [name, info] : tools) {
    const Gate gate = GateFor(config, name, &info);
    if (gate.gated) {
      const Policy policy = config.PolicyFor(name);
      lines.push_back("gates " + name + ": mode " + std::string(KeyModeName(gate.mode)) + ", " +
                      ScopeText(config, name, gate.mode) + ", results kept " +
                      RetentionText(policy.ttl) + (policy.observe ? ", observe mode" : ""));
    } else if (gate.mutating) {
      lines.push_back("NOT gated: " + name +
                      " is not read-only, but the config leaves it ungated ([[tool]] gated = "
                      "false or mode = \"off\"): its retries run again");
    } else {
      read_only += (read_only.empty() ? "" : ", ") + name;
      ++read_only_count;
    }
  }
  if (read_only_count > 0) {
    lines.push_back("passes " + std::to_string(read_only_count) +
                    " read-only tool(s) through: " + read_only);
  }
  return lines;
}

Gate GateFor(const Config& config, std::string_view tool, const ToolInfo* info) {
  Gate gate;
  gate.mutating = info == nullptr || !info->read_only;
  const ToolRule* rule = config.RuleFor(tool);
  if (rule != nullptr && rule->gated && !*rule->gated) return gate;
  gate.mode = config.ModeFor(tool, gate.mutating);
  gate.gated = gate.mode != KeyMode::kOff;
  gate.nonce = gate.gated && gate.mode != KeyMode::kExplicit && config.mcp.repeat_nonce &&
               !config.mcp.repeat_nonce->empty() && !(info != nullptr && info->declares_nonce);
  return gate;
}

Result<std::string> RewriteToolsListResult(std::string_view result, const Config& config,
                                           std::map<std::string, ToolInfo>& tools) {
  auto members = json_text::ObjectMembers(result);
  if (!members) return std::unexpected(members.error());
  auto list = json_text::FindMember(*members, "tools");
  if (!list) return std::unexpected(list.error());
  if (*list == nullptr || !json_text::IsArray((*list)->value.In(result))) {
    return std::string(result);
  }
  const json_text::Span list_span = (*list)->value;
  std::string_view list_text = list_span.In(result);
  auto elements = json_text::ArrayElements(list_text);
  if (!elements) return std::unexpected(elements.error());

  std::string new_list;
  size_t copied = 0;
  for (const json_text::Span& e : *elements) {
    new_list.append(list_text.substr(copied, e.begin - copied));
    auto tool = RewriteTool(e.In(list_text), config, tools);
    if (!tool) return std::unexpected(tool.error());
    new_list.append(*tool);
    copied = e.end;
  }
  new_list.append(list_text.substr(copied));

  std::string out(result.substr(0, list_span.begin));
  out.append(new_list);
  out.append(result.substr(list_span.end));
  return out;
}

namespace {

// What scoped a call's key, for the attempt log and the verbose log:
// "turn: meta:vscode.requestId", "session: env:CLAUDE_CODE_SESSION_ID (no turn
// id)", "call id seen: meta:claudecode/toolUseId", "explicit key", ...
std::string ScopeDetail(bool explicit_key, bool call_seen, const std::optional<FoundId>& turn,
                        const std::optional<FoundId>& session, const std::optional<FoundId>& call,
                        bool turn_fallback) {
  if (explicit_key) return "explicit key";
  if (call_seen) return "call id seen: " + call->source->text;
  std::string detail;
  if (turn) {
    detail = "turn: " + SourceText(*turn);
  } else if (session) {
    detail = "session: " + SourceText(*session) + " (no turn id)";
  } else if (turn_fallback) {
    detail = "turn fallback: no turn id";
  }
  if (call) detail += (detail.empty() ? "" : "; ") + ("call id: " + call->source->text);
  return detail;
}

}  // namespace

std::optional<RequestHeaders> TakeRequestHeaders(std::string& request, Message& parsed) {
  auto member = json_text::FindMember(parsed.members, kRequestHeadersMember);
  if (!member || *member == nullptr) return std::nullopt;
  auto carried = json_text::ObjectMembers((*member)->value.In(request));
  if (!carried) return std::nullopt;  // not an object: idemgate's own server never sends that
  RequestHeaders headers;
  for (const json_text::Member& h : *carried) {
    if (auto value = json_text::View(h.value.In((*member)->value.In(request))).string()) {
      headers[Lower(h.name)] = std::move(*value);
    }
  }
  if (auto without = json_text::RemoveMember(request, kRequestHeadersMember)) {
    request = std::move(*without);
    if (auto members = json_text::ObjectMembers(request)) parsed.members = std::move(*members);
  }
  return headers;
}

namespace {

// ClientNameOf, from a request's params.clientInfo and params._meta.
std::string ClientNameIn(json_text::View client_info, json_text::View meta) {
  json_text::View info = client_info;
  if (!info.present()) info = meta["io.modelcontextprotocol/clientInfo"];
  std::optional<std::string> name = info["name"].string();
  if (!name) return {};
  return name->substr(0, kMaxHostBytes);
}

}  // namespace

std::string ClientNameOf(std::string_view request) {
  const json_text::View params = json_text::View(request)["params"];
  return ClientNameIn(params["clientInfo"], params["_meta"]);
}

CallPlan PlanToolCall(std::string_view request, const Message& parsed, const Config& config,
                      const PlanContext& context, const ToolInfo* info) {
  CallPlan plan;
  // params' members, found once in the original bytes from the top-level
  // members the parse found; every reader below looks them up.
  auto params_member = json_text::FindMember(parsed.members, "params");
  std::string_view params_text;
  Result<std::vector<json_text::Member>> pm = std::vector<json_text::Member>{};
  if (params_member && *params_member) {
    params_text = (*params_member)->value.In(request);
    pm = json_text::ObjectMembers(params_text);
  }
  const std::vector<json_text::Member> no_members;
  const std::vector<json_text::Member>& members = pm ? *pm : no_members;
  const auto member = [&](std::string_view name) {
    auto m = json_text::FindMember(members, name);
    return m && *m ? json_text::View((*m)->value.In(params_text)) : json_text::View();
  };
  auto name_member = json_text::FindMember(members, "name");
  if (!name_member) {
    // Which tool would run depends on which copy the upstream reads.
    return Refuse(std::move(plan), parsed, kRpcInvalidRequest,
                  "tools/call refused: params " + name_member.error().message);
  }
  std::optional<std::string> name = member("name").string();
  if (!name) return plan;  // the upstream will refuse it
  plan.tool = std::move(*name);
  // SEP-2243: every server that reads the body checks the headers that
  // mirror it, whether or not it gates the tool (the headers are what an
  // intermediary routed on).
  if (context.headers != nullptr && info != nullptr && !info->mirrored.empty()) {
    const std::optional<std::string> version =
        member("_meta")["io.modelcontextprotocol/protocolVersion"].string();
    const bool required = version && *version >= "2026-07-28";
    if (auto wrong =
            HeaderMismatch(info->mirrored, member("arguments"), *context.headers, required)) {
      return Refuse(std::move(plan), parsed, kMcpHeaderMismatch, *wrong);
    }
  }
  const Gate gate = GateFor(config, plan.tool, info);
  if (!gate.gated) return plan;

  // A duplicated member is refused: the upstream might read the copy we
  // did not.
  if (!params_member || !*params_member) {
    return Refuse(std::move(plan), parsed, kRpcInvalidRequest,
                  "tools/call refused: " +
                      (params_member ? std::string("no params") : params_member.error().message));
  }
  if (!pm) return Refuse(std::move(plan), parsed, kRpcInvalidRequest, pm.error().message);
  auto args_member = json_text::FindMember(members, "arguments");
  auto meta_member = json_text::FindMember(members, "_meta");
  for (const auto* r : {&args_member, &meta_member}) {
    if (!*r) {
      return Refuse(std::move(plan), parsed, kRpcInvalidRequest,
                    "tools/call refused: params " + r->error().message);
    }
  }
  std::string_view args_text = "{}";
  if (*args_member != nullptr) {
    args_text = (*args_member)->value.In(params_text);
    if (!json_text::IsObject(args_text)) {
      return Refuse(
          std::move(plan), parsed,
          "tools/call refused: params.arguments of \"" + plan.tool + "\" must be a JSON object");
    }
  }
  // _meta, small and idemgate's to read, is the one part of a call read
  // into a tree (its sources name members by JSON Pointer).
  json::value meta_value;
  if (*meta_member != nullptr) {
    const std::string_view meta_text = (*meta_member)->value.In(params_text);
    if (!json_text::IsObject(meta_text)) {
      return Refuse(std::move(plan), parsed, "tools/call refused: params._meta must be an object");
    }
    boost::system::error_code ec;
    meta_value = json::parse(meta_text, ec);  // validated with the message
  }
  const json::object* meta = ObjectAt(&meta_value);

  // idemgate's own members are a caller's promise: one of the wrong type is
  // refused (a host's members are read as they come, and skipped).
  for (const auto* sources :
       {&config.mcp.turn_id, &config.mcp.session_id, &config.mcp.call_id, &config.mcp.key}) {
    for (const IdSource& source : *sources) {
      const json::value* own = source.kind == IdSource::Kind::kMeta && source.pointer.empty() &&
                                       source.name.starts_with("dev.idemgate/")
                                   ? Member(meta, source.name)
                                   : nullptr;
      if (own != nullptr && !own->is_string()) {
        return Refuse(std::move(plan), parsed,
                      "tools/call refused: _meta[\"" + source.name + "\"] (" +
                          (sources == &config.mcp.key ? "the idempotency key" : "the turn id") +
                          ") must be a string");
      }
    }
  }
  // The turn, else the session (a turn fallback kept for `window`), and the
  // call id, from the first source of each that the host sent (docs/hosts.md).
  const std::optional<FoundId> turn_id = FirstId(config.mcp.turn_id, meta, context);
  const std::optional<FoundId> session_id =
      turn_id ? std::nullopt : FirstId(config.mcp.session_id, meta, context);
  const std::optional<FoundId> call_id = FirstId(config.mcp.call_id, meta, context);
  const std::string turn = turn_id ? turn_id->value : session_id ? session_id->value : "";
  // A caller's own key: the first of [mcp] key present (an empty one is
  // refused by DeriveKey as it always was).
  std::optional<std::string> explicit_key;
  for (const IdSource& source : config.mcp.key) {
    if (source.kind == IdSource::Kind::kMeta && source.pointer.empty()) {
      if (const json::value* k = Member(meta, source.name); k && k->is_string()) {
        explicit_key = std::string(k->get_string());
        break;
      }
    } else if (auto value = ReadIdSource(source, meta, context)) {
      explicit_key = std::move(*value);
      break;
    }
  }

  // The fingerprint is taken over the arguments' original bytes, so numbers
  // keep their exact value and duplicate members are refused (§3).
  CanonOptions canon;
  canon.max_bytes = config.limits.max_body_bytes;
  canon.max_depth = config.limits.max_depth;
  auto fingerprint = Fingerprint(args_text, canon);
  if (!fingerprint) {
    return Refuse(std::move(plan), parsed,
                  "tools/call refused: the arguments of \"" + plan.tool +
                      "\" cannot be fingerprinted: " + fingerprint.error().message);
  }

  std::string forward_args(args_text);
  bool nonce_present = false;
  if (gate.nonce) {
    auto am = json_text::ObjectMembers(args_text);
    if (!am) return Refuse(std::move(plan), parsed, am.error().message);
    auto nm = json_text::FindMember(*am, *config.mcp.repeat_nonce);
    if (!nm) return Refuse(std::move(plan), parsed, nm.error().message);
    if (*nm != nullptr) {
      nonce_present = true;
      auto stripped = json_text::RemoveMember(forward_args, *config.mcp.repeat_nonce);
      if (!stripped) return Refuse(std::move(plan), parsed, stripped.error().message);
      forward_args = std::move(*stripped);
    }
  }

  const ToolRule* rule = config.RuleFor(plan.tool);
  std::string key_fingerprint = *fingerprint;
  if (gate.mode == KeyMode::kFields) {
    std::vector<std::string> pointers;
    if (rule != nullptr) pointers = rule->fields;
    if (nonce_present) pointers.push_back(PointerTo(*config.mcp.repeat_nonce));
    auto selected = FingerprintFields(args_text, pointers, canon);
    if (!selected) {
      return Refuse(std::move(plan), parsed,
                    "tools/call refused: the key fields of \"" + plan.tool +
                        "\" cannot be fingerprinted: " + selected.error().message);
    }
    key_fingerprint = std::move(*selected);
  }
  bool stateless = false;
  if (const json::value* v = Member(meta, "io.modelcontextprotocol/protocolVersion");
      v && v->is_string() && v->get_string() >= "2026-07-28") {
    stateless = true;
  }
  if (gate.mode == KeyMode::kExplicit && !explicit_key) {
    plan.kind = CallPlan::Kind::kAnswer;
    plan.answer =
        ResultResponse(parsed.id_text, CompleteResult(MissingKeyResult(plan.tool), stateless));
    return plan;
  }
  // A call id the session has seen with this tool is that call again (a
  // transport re-send): its key, whatever else changed.
  const std::optional<std::string> seen_key =
      call_id && !explicit_key && context.key_of_call ? context.key_of_call(call_id->value, plan.tool)
                                                      : std::nullopt;
  auto derived = seen_key
                     ? DeriveKey(KeyInput{KeyMode::kExplicit, "", plan.tool, "", *seen_key})
                     : DeriveKey(KeyInput{gate.mode, turn, plan.tool, key_fingerprint, explicit_key});
  if (!derived) {
    return Refuse(std::move(plan), parsed, "tools/call refused: " + derived.error().message);
  }

  PreparedCall& p = plan.prepared;
  p.gate = gate;
  p.call.id = RecordId{std::string(context.tenant), ScopedKey(context.scope, derived->key)};
  // The upstream gets the record's key, which replays and `inspect` name;
  // a caller's own key goes as it was sent.
  p.forward_key = explicit_key ? derived->key : p.call.id.key;
  p.derived_key = derived->key;
  if (call_id) p.call_id = call_id->value;
  p.replan_candidate = gate.mode == KeyMode::kTurn && !turn.empty() && !explicit_key &&
                       !seen_key && !nonce_present;
  p.call.fingerprint = std::move(*fingerprint);
  p.call.tool = plan.tool;
  p.call.turn = turn;
  p.call.policy = config.PolicyFor(plan.tool);
  p.call.host = ClientNameIn(member("clientInfo"), member("_meta"));
  if (p.call.host.empty()) p.call.host = std::string(context.host);
  p.call.turn_fallback = derived->turn_fallback || (!turn_id && session_id);
  p.call.detail = ScopeDetail(explicit_key.has_value(), seen_key.has_value(), turn_id, session_id,
                              call_id, derived->turn_fallback);
  if (seen_key) p.call.policy.on_drift = OnDrift::kReplay;  // the same call, whatever changed
  if (rule != nullptr) p.reconcile_tool = rule->reconcile;
  p.stateless = stateless;

  // The forwarded request: key in _meta (and in the tool's own key argument
  // if configured), repeat_nonce removed; every other byte as received.
  if (rule != nullptr && rule->key_argument) {
    auto with_key = json_text::SetMember(forward_args, *rule->key_argument, Quote(p.forward_key));
    if (!with_key) return Refuse(std::move(plan), parsed, with_key.error().message);
    forward_args = std::move(*with_key);
  }
  const std::string_view meta_text =
      *meta_member != nullptr ? (*meta_member)->value.In(params_text) : "{}";
  auto new_meta = json_text::SetMember(meta_text, kMetaIdempotencyKey, Quote(p.forward_key));
  if (!new_meta) return Refuse(std::move(plan), parsed, new_meta.error().message);
  // Spliced with the members found above while params is as received.
  Result<std::string> set_meta;
  if (forward_args == args_text) {
    set_meta = json_text::SetMember(params_text, *pm, "_meta", *new_meta);
  } else {
    auto set = json_text::SetMember(params_text, *pm, "arguments", forward_args);
    if (!set) return Refuse(std::move(plan), parsed, set.error().message);
    set_meta = json_text::SetMember(*set, "_meta", *new_meta);
  }
  if (!set_meta) return Refuse(std::move(plan), parsed, set_meta.error().message);
  auto forward = json_text::SetMember(request, parsed.members, "params", *set_meta);
  if (!forward) return Refuse(std::move(plan), parsed, forward.error().message);
  p.forward = std::move(*forward);
  p.forward_arguments = std::move(forward_args);
  plan.kind = CallPlan::Kind::kGated;
  return plan;
}

namespace {

// The text of the "result" member of `response` exactly as received
// (`parsed` is its parse, whose members locate it). Of a "result" sent
// twice, the last copy, as a JSON parser that keeps the last duplicate
// reads it.
std::string ResultText(std::string_view response, const Message& parsed) {
  std::string_view text = "null";
  for (const json_text::Member& m : parsed.members) {
    if (m.name == "result") text = m.value.In(response);
  }
  return std::string(text);
}

}  // namespace

ToolAnswer ClassifyToolAnswer(std::string_view response, const Message& parsed) {
  ToolAnswer a;
  if (parsed.kind != Message::Kind::kResult) {
    const std::optional<int64_t> code = json_text::View(response)["error"]["code"].int64();
    if (!code) {
      a.kind = Execution::Kind::kMaybeSent;
      a.why = "json-rpc error without a code";
      return a;
    }
    a.kind = gate::ClassOfJsonRpcError(*code);
    a.why = "json-rpc error " + std::to_string(*code);
    return a;
  }
  a.body = ResultText(response, parsed);
  const json_text::View result(a.body);
  if (result["resultType"].string() == "input_required") {
    a.kind = Execution::Kind::kInterim;
    a.why = "input_required: not an outcome";
    return a;
  }
  if (result["isError"].boolean() == true) {
    a.kind = Execution::Kind::kToolError;
    a.why = "tool error";
    return a;
  }
  a.why = "success";
  return a;
}

LookupAnswer ClassifyLookupAnswer(std::string_view response, const Message& parsed) {
  LookupAnswer a;
  if (parsed.kind != Message::Kind::kResult) {
    a.why = "it answered with a JSON-RPC error";
    return a;
  }
  const std::string result_text = ResultText(response, parsed);
  const json_text::View result(result_text);
  if (result["isError"].boolean() == true) {
    a.why = "it answered isError (it could not look)";
    return a;
  }
  const std::optional<bool> found = result["structuredContent"]["found"].boolean();
  if (!found) {
    a.why = "its result has no boolean structuredContent.found";
    return a;
  }
  if (!*found) {
    a.verdict = gate::LookupVerdict::kNotFound;
    return a;
  }
  a.verdict = gate::LookupVerdict::kFound;
  a.body = result_text;
  return a;
}

Result<std::string> ReplayResult(const Decision& decision, const gate::Answer& answer,
                                 const Config& config) {
  const Record& record = decision.record;
  if (!record.outcome) {
    return MakeError(ErrorCode::kDataLoss, "record " + record.id.key + " has no stored outcome");
  }
  const std::string& body = record.outcome->body;
  auto members = json_text::ObjectMembers(body);
  if (!members) {
    return MakeError(ErrorCode::kDataLoss, "the stored outcome of " + record.id.key +
                                               " is not a JSON object: " + members.error().message);
  }
  auto meta = json_text::FindMember(*members, "_meta");
  auto content = json_text::FindMember(*members, "content");
  if (!meta || !content) {
    return MakeError(ErrorCode::kDataLoss,
                     "the stored outcome of " + record.id.key +
                         " is ambiguous: " + (!meta ? meta : content).error().message);
  }
  // When the first attempt claimed the call: "first run at", the same
  // instant the drift and in-progress answers name.
  const std::string& first_at = answer.first_at;

  std::vector<std::pair<std::string_view, std::string>> marks = {
      {kMetaReplayed, "true"}, {kMetaKey, Quote(record.id.key)}, {kMetaFirstAt, Quote(first_at)}};
  if (decision.drift) marks.emplace_back(kMetaDrift, "true");
  if (decision.reconciled) marks.emplace_back(kMetaReconciled, "true");
  std::string meta_text;
  if (*meta != nullptr && json_text::IsObject((*meta)->value.In(body))) {
    meta_text = std::string((*meta)->value.In(body));
    for (const auto& [name, value] : marks) {
      auto set = json_text::SetMember(meta_text, name, value);
      if (!set) return MakeError(ErrorCode::kDataLoss, set.error().message);
      meta_text = std::move(*set);
    }
  } else {
    // Nothing to merge with (most results have no _meta): the marks are the
    // whole object, as setting each into "{}" would make it, without
    // scanning it again for each.
    meta_text = "{";
    for (const auto& [name, value] : marks) {
      if (meta_text.size() > 1) meta_text += ',';
      json_text::AppendQuoted(meta_text, name);
      meta_text += ':';
      meta_text += value;
    }
    meta_text += '}';
  }
  auto out = json_text::SetMember(body, *members, "_meta", meta_text);  // found above
  if (!out) return MakeError(ErrorCode::kDataLoss, out.error().message);

  if (config.mcp.replay_text) {
    std::string note =
        "[idemgate] This is the stored result of an identical earlier call (first run at " +
        first_at + "); the action was not performed again.";
    if (decision.drift) {
      note += " The arguments differed from the earlier call's; its result is shown as it was.";
    }
    std::string block = R"({"type":"text","text":)" + Quote(note) + "}";
    std::string content_text = "[]";
    if (*content != nullptr && json_text::IsArray((*content)->value.In(body))) {
      content_text = std::string((*content)->value.In(body));
    }
    auto appended = json_text::AppendElement(content_text, block);
    if (!appended) return MakeError(ErrorCode::kDataLoss, appended.error().message);
    out = json_text::SetMember(*out, "content", *appended);
    if (!out) return MakeError(ErrorCode::kDataLoss, out.error().message);
  }
  return std::move(*out);
}

std::string InProgressResult(const Call& call, const gate::Answer& answer) {
  const int64_t seconds = answer.retry_after_seconds;
  std::string text = "[idemgate] An identical call to " + call.tool + " (key " + call.id.key +
                     ") is still running, so this one was not executed again. Retry this same "
                     "call in about " +
                     std::to_string(seconds) +
                     " seconds to get its result; do not change the arguments to get around "
                     "this.";
  return Condition("in_progress", text,
                   KeyMeta(call) + "," + Quote(kMetaRetryAfter) + ":" + std::to_string(seconds));
}

std::string OutcomeUnknownResult(const Call& call, const gate::Answer& answer) {
  std::string text =
      "[idemgate] The outcome of an identical earlier call to " + call.tool + " (key " +
      call.id.key + ", started at " + answer.first_at +
      ") is unknown: it was sent to the tool, but no result came back. The action may already "
      "have happened. Do not repeat it blindly: first check whether it took effect, or tell the "
      "user. An operator can settle it with `idemgate resolve " +
      call.id.key + "`.";
  return Condition("outcome_unknown", text, KeyMeta(call));
}

std::string UnansweredResult(const Call& call, std::string_view why) {
  std::string text = "[idemgate] The outcome of this call to " + call.tool +
                     " is unknown: it was sent to the tool, but " + std::string(why) +
                     ". The action may already have happened. Do not repeat it blindly: first "
                     "check whether it took effect, or tell the user. An operator can settle it "
                     "with `idemgate resolve " +
                     call.id.key + "`.";
  return Condition("outcome_unknown", text, KeyMeta(call));
}

std::string DriftResult(const Call& call, const Decision& decision, const gate::Answer& answer,
                        KeyMode mode) {
  std::string how = mode == KeyMode::kExplicit || call.detail == "explicit key"
                        ? "to perform a new action, send a new idempotency key"
                        : "to perform a new action, start a new turn or pass a new repeat_nonce";
  const bool other_tool = decision.record.tool != call.tool;
  std::string text =
      "[idemgate] The idempotency key " + call.id.key + " was first used at " + answer.first_at +
      " for a call to " +
      (other_tool ? "another tool, " + decision.record.tool + ","
                  : call.tool + " with different arguments,") +
      " so this call was refused rather than treated as the same action. To get the earlier "
      "call's result, repeat it with its original " +
      (other_tool ? "tool and arguments; " : "arguments; ") + how + ".";
  return Condition("drift", text,
                   KeyMeta(call) + "," + Quote(kMetaFirstAt) + ":" + Quote(answer.first_at));
}

std::string TooLargeResult(const Call& call, const gate::Answer& answer) {
  std::string text = "[idemgate] An identical earlier call to " + call.tool + " (key " +
                     call.id.key + ", first run at " + answer.first_at +
                     ") already ran, but its result was too large to store, so it cannot be "
                     "shown again. The action was not performed again.";
  return Condition("too_large", text, KeyMeta(call));
}

std::string MissingKeyResult(std::string_view tool) {
  std::string text = "[idemgate] " + std::string(tool) +
                     " requires an idempotency key: send one in _meta[\"" +
                     std::string(kMetaIdempotencyKey) +
                     "\"] (1 to 255 visible ASCII characters). The call was not executed.";
  return Condition("missing_key", text);
}

}  // namespace idem::mcp
