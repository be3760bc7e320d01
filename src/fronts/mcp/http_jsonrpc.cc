#include "fronts/mcp/http_jsonrpc.h"

#include <boost/json.hpp>
#include <charconv>

#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/json_rpc.h"  // DescribeJsonError, JsonRpcEnvelopeProblem
#include "json/json_text.h"

namespace idem::mcp {
namespace {

namespace json = boost::json;

const json::value* Member(const json::object& o, std::string_view name) {
  auto it = o.find(name);
  return it == o.end() ? nullptr : &it->value();
}

// The JSON text of a small value (an id, a progress token) serialised
// canonically: equal values give equal text whatever their spelling.
std::string Serialize(json_text::View v) {
  boost::system::error_code ec;
  const json::value parsed = json::parse(v.text(), ec);
  return ec ? std::string(v.text()) : json::serialize(parsed);
}

// Read through json_text::View: nothing of the message is copied into a
// tree, so a tool's arguments are only skipped over.
MessageInfo Classify(std::string_view raw) {
  MessageInfo info;
  info.raw = std::string(raw);
  const json_text::View v(raw);
  if (std::optional<std::string> problem = JsonRpcEnvelopeProblem(v)) info.problem = *problem;
  if (!v.is_object()) return info;
  const json_text::View method = v["method"];
  const json_text::View id = v["id"];
  if (id.present()) info.id_key = Serialize(id);
  if (std::optional<std::string> name = method.string()) {
    info.method = std::move(*name);
    info.kind = id.present() ? MessageKind::kRequest : MessageKind::kNotification;
    const json_text::View p = v["params"];
    if (!p.is_object()) return info;
    const json_text::View meta = p["_meta"];
    if (const json_text::View t = meta["progressToken"]; t.present()) {
      info.progress_token = Serialize(t);
    }
    if (auto pv = meta["io.modelcontextprotocol/protocolVersion"].string()) {
      info.meta_protocol_version = std::move(*pv);
    }
    if (info.method == "notifications/progress") {
      if (const json_text::View t = p["progressToken"]; t.present()) {
        info.progress_token = Serialize(t);
      }
    }
    const char* name_field = nullptr;
    if (info.method == "tools/call" || info.method == "prompts/get") name_field = "name";
    if (info.method == "resources/read") name_field = "uri";
    if (name_field != nullptr) {
      if (auto n = p[name_field].string()) info.name = std::move(*n);
    }
    return info;
  }
  const json_text::View result = v["result"];
  if (!method.present() && (result.present() || v["error"].present())) {
    info.kind = MessageKind::kResponse;
    if (auto pv = result["protocolVersion"].string()) {
      info.result_protocol_version = std::move(*pv);
    }
  }
  return info;
}

Result<json::value> Parse(std::string_view text, size_t max_depth) {
  json::parse_options options;
  options.max_depth = max_depth;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec, json::storage_ptr(), options);
  if (ec) {
    return MakeError(
        ec == json::error::too_deep ? ErrorCode::kResourceExhausted : ErrorCode::kInvalidArgument,
        "the body is " + DescribeJsonError(text, ec, max_depth));
  }
  return v;
}

}  // namespace

Result<MessageBatch> InspectBody(std::string_view body, size_t max_depth) {
  if (auto valid = json_text::Validate(body, max_depth); !valid) {
    return MakeError(valid.error().code, "the body is " + valid.error().message);
  }
  MessageBatch batch;
  const json_text::View whole(body);
  if (whole.is_array()) {
    batch.is_batch = true;
    std::optional<std::vector<std::string_view>> parts = SplitTopLevelArray(body);
    if (!parts)
      return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC batch that cannot be split");
    if (parts->empty()) return MakeError(ErrorCode::kInvalidArgument, "an empty JSON-RPC batch");
    for (std::string_view part : *parts) {
      if (!json_text::IsObject(part)) {
        return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC batch element is not an object");
      }
      batch.messages.push_back(Classify(part));
    }
    return batch;
  }
  if (!whole.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "the body is neither a JSON-RPC message (an object) nor a batch (an array)");
  }
  batch.messages.push_back(Classify(whole.text()));
  return batch;
}

Result<MessageInfo> InspectMessage(std::string_view text, size_t max_depth) {
  if (auto valid = json_text::Validate(text, max_depth); !valid) {
    return MakeError(valid.error().code, "the body is " + valid.error().message);
  }
  if (!json_text::IsObject(text)) {
    return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC message must be a JSON object");
  }
  return Classify(text);
}

std::optional<std::string_view> FindTopLevelMember(std::string_view s, std::string_view name) {
  const json_text::View member = json_text::View(s)[name];
  if (!member.present()) return std::nullopt;
  return member.text();
}

std::optional<std::vector<std::string_view>> SplitTopLevelArray(std::string_view s) {
  auto spans = json_text::ArrayElements(s);
  if (!spans) return std::nullopt;
  std::vector<std::string_view> parts;
  parts.reserve(spans->size());
  for (const json_text::Span& e : *spans) parts.push_back(e.In(s));
  return parts;
}

Result<std::string> ReplaceId(std::string_view message, std::string_view new_id_json) {
  std::optional<std::string_view> id = FindTopLevelMember(message, "id");
  if (!id) return MakeError(ErrorCode::kInvalidArgument, "the message has no top-level \"id\"");
  size_t offset = static_cast<size_t>(id->data() - message.data());
  std::string out;
  out.reserve(message.size() + new_id_json.size());
  out.append(message.substr(0, offset));
  out.append(new_id_json);
  out.append(message.substr(offset + id->size()));
  return out;
}

namespace {

// RFC 9110 token characters.
bool IsHeaderToken(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

void CollectMirrored(const json::object& schema, std::vector<std::string>& path,
                     std::vector<MirroredParam>& out) {
  const json::value* properties = Member(schema, "properties");
  if (properties == nullptr || !properties->is_object() || path.size() > 16) return;
  for (const auto& [name, sub] : properties->as_object()) {
    if (!sub.is_object()) continue;
    path.emplace_back(name);
    if (const json::value* h = Member(sub.as_object(), "x-mcp-header"); h && h->is_string()) {
      std::string header(h->as_string());
      if (IsHeaderToken(header)) out.push_back(MirroredParam{header, path});
    }
    CollectMirrored(sub.as_object(), path, out);
    path.pop_back();
  }
}

}  // namespace

std::vector<MirroredParam> MirroredParamsOfSchema(const json::object& input_schema) {
  std::vector<MirroredParam> params;
  std::vector<std::string> path;
  CollectMirrored(input_schema, path, params);
  return params;
}

std::optional<std::string> MirroredText(json_text::View v) {
  if (std::optional<std::string> s = v.string()) return s;
  if (std::optional<int64_t> i = v.int64()) return std::to_string(*i);
  if (std::optional<bool> b = v.boolean()) return std::string(*b ? "true" : "false");
  uint64_t u = 0;  // an integer beyond int64 (Boost.JSON's uint64)
  const std::string_view t = v.text();
  if (v.is_number() &&
      std::from_chars(t.data(), t.data() + t.size(), u).ptr == t.data() + t.size()) {
    return std::to_string(u);
  }
  return std::nullopt;
}

Result<std::string> WithRequestHeaders(
    std::string_view message, const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string object = "{";
  for (const auto& [name, value] : headers) {
    if (object.size() > 1) object += ',';
    object += json_text::Quote(name) + ":" + json_text::Quote(value);
  }
  object += '}';
  return json_text::SetMember(message, kRequestHeadersMember, object);
}

std::map<std::string, std::vector<MirroredParam>> ParseMirroredParams(
    std::string_view tools_list_response, size_t max_depth) {
  std::map<std::string, std::vector<MirroredParam>> out;
  Result<json::value> parsed = Parse(tools_list_response, max_depth);
  if (!parsed || !parsed->is_object()) return out;
  const json::value* result = Member(parsed->as_object(), "result");
  if (result == nullptr || !result->is_object()) return out;
  const json::value* tools = Member(result->as_object(), "tools");
  if (tools == nullptr || !tools->is_array()) return out;
  for (const json::value& tool : tools->as_array()) {
    if (!tool.is_object()) continue;
    const json::value* name = Member(tool.as_object(), "name");
    const json::value* schema = Member(tool.as_object(), "inputSchema");
    if (name == nullptr || !name->is_string() || schema == nullptr || !schema->is_object()) {
      continue;
    }
    std::vector<MirroredParam> params = MirroredParamsOfSchema(schema->as_object());
    if (!params.empty()) out[std::string(name->as_string())] = std::move(params);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> MirroredParamHeaders(
    const std::vector<MirroredParam>& params, std::string_view tools_call_message,
    size_t max_depth) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!json_text::Validate(tools_call_message, max_depth)) return out;
  const json_text::View arguments = json_text::View(tools_call_message)["params"]["arguments"];
  for (const MirroredParam& param : params) {
    json_text::View v = arguments;
    for (const std::string& key : param.path) v = v[key];
    std::optional<std::string> text = MirroredText(v);
    if (!text) continue;
    out.emplace_back("Mcp-Param-" + param.header, EncodeMirroredHeaderValue(*text));
  }
  return out;
}

int StatelessHttpStatus(std::string_view response) {
  if (response.find("\"error\"") == std::string_view::npos) return 200;
  if (!json_text::Validate(response, 64)) return 200;
  const std::optional<int64_t> code = json_text::View(response)["error"]["code"].int64();
  if (!code) return 200;
  switch (*code) {
    case -32601:
      return 404;
    case kMcpHeaderMismatch:
    case -32021:  // MissingRequiredClientCapability
    case kMcpUnsupportedProtocolVersion:
      return 400;
    default:
      return 200;
  }
}

std::string JsonRpcError(std::string_view id_json, int code, std::string_view message,
                         std::string_view data_json) {
  std::string out = R"({"jsonrpc":"2.0","id":)";
  out.append(id_json.empty() ? "null" : id_json);
  out.append(R"(,"error":{"code":)");
  out.append(std::to_string(code));
  out.append(R"(,"message":)");
  out.append(json_text::Quote(message));
  if (!data_json.empty()) {
    out.append(R"(,"data":)");
    out.append(data_json);
  }
  out.append("}}");
  return out;
}

}  // namespace idem::mcp
