#include "fronts/mcp/http_jsonrpc.h"

#include <boost/json.hpp>

#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/json_rpc.h"  // DescribeJsonError, JsonRpcEnvelopeProblem
#include "json/json_text.h"

namespace idem::mcp {
namespace {

namespace json = boost::json;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsSpace(s[pos])) ++pos;
  return pos;
}

// The offset just past the JSON string starting at `pos` (s[pos] == '"'),
// or npos if it is not terminated.
size_t SkipString(std::string_view s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// The offset just past the JSON value starting at `pos` (no leading
// whitespace), or npos if it is malformed. Iterative, so deep nesting cannot
// exhaust the stack; it checks bracket balance, not full JSON grammar (the
// caller has already parsed the text).
size_t SkipValue(std::string_view s, size_t pos) {
  if (pos >= s.size()) return std::string_view::npos;
  char c = s[pos];
  if (c == '"') return SkipString(s, pos);
  if (c != '{' && c != '[') {
    size_t i = pos;
    while (i < s.size() && !IsSpace(s[i]) && s[i] != ',' && s[i] != ']' && s[i] != '}' &&
           s[i] != ':') {
      ++i;
    }
    return i == pos ? std::string_view::npos : i;
  }
  std::string closers;
  for (size_t i = pos; i < s.size(); ++i) {
    char ch = s[i];
    if (ch == '"') {
      i = SkipString(s, i);
      if (i == std::string_view::npos) return i;
      --i;
    } else if (ch == '{') {
      closers.push_back('}');
    } else if (ch == '[') {
      closers.push_back(']');
    } else if (ch == '}' || ch == ']') {
      if (closers.empty() || closers.back() != ch) return std::string_view::npos;
      closers.pop_back();
      if (closers.empty()) return i + 1;
    }
  }
  return std::string_view::npos;
}

std::string Serialize(const json::value& v) { return json::serialize(v); }

const json::value* Member(const json::object& o, std::string_view name) {
  auto it = o.find(name);
  return it == o.end() ? nullptr : &it->value();
}

MessageInfo Classify(const json::value& v, std::string_view raw) {
  MessageInfo info;
  info.raw = std::string(raw);
  if (std::optional<std::string> problem = JsonRpcEnvelopeProblem(v)) info.problem = *problem;
  const json::object* o = v.if_object();
  if (o == nullptr) return info;
  const json::value* method = Member(*o, "method");
  const json::value* id = Member(*o, "id");
  if (id != nullptr) info.id_key = Serialize(*id);
  if (method != nullptr && method->is_string()) {
    info.method = std::string(method->as_string());
    info.kind = id != nullptr ? MessageKind::kRequest : MessageKind::kNotification;
    if (const json::value* params = Member(*o, "params"); params && params->is_object()) {
      const json::object& p = params->as_object();
      if (const json::value* meta = Member(p, "_meta"); meta && meta->is_object()) {
        const json::object& m = meta->as_object();
        if (const json::value* t = Member(m, "progressToken")) info.progress_token = Serialize(*t);
        if (const json::value* pv = Member(m, "io.modelcontextprotocol/protocolVersion");
            pv && pv->is_string()) {
          info.meta_protocol_version = std::string(pv->as_string());
        }
      }
      if (info.method == "notifications/progress") {
        if (const json::value* t = Member(p, "progressToken")) info.progress_token = Serialize(*t);
      }
      const char* name_field = nullptr;
      if (info.method == "tools/call" || info.method == "prompts/get") name_field = "name";
      if (info.method == "resources/read") name_field = "uri";
      if (name_field != nullptr) {
        if (const json::value* n = Member(p, name_field); n && n->is_string()) {
          info.name = std::string(n->as_string());
        }
      }
    }
    return info;
  }
  if (method == nullptr && (Member(*o, "result") != nullptr || Member(*o, "error") != nullptr)) {
    info.kind = MessageKind::kResponse;
    if (const json::value* r = Member(*o, "result"); r && r->is_object()) {
      if (const json::value* pv = Member(r->as_object(), "protocolVersion");
          pv && pv->is_string()) {
        info.result_protocol_version = std::string(pv->as_string());
      }
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
  Result<json::value> parsed = Parse(body, max_depth);
  if (!parsed) return std::unexpected(parsed.error());
  MessageBatch batch;
  if (const json::array* a = parsed->if_array()) {
    batch.is_batch = true;
    if (a->empty()) return MakeError(ErrorCode::kInvalidArgument, "an empty JSON-RPC batch");
    std::optional<std::vector<std::string_view>> parts = SplitTopLevelArray(body);
    if (!parts || parts->size() != a->size()) {
      return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC batch that cannot be split");
    }
    for (size_t i = 0; i < a->size(); ++i) {
      if (!(*a)[i].is_object()) {
        return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC batch element is not an object");
      }
      batch.messages.push_back(Classify((*a)[i], (*parts)[i]));
    }
    return batch;
  }
  if (!parsed->is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "the body is neither a JSON-RPC message (an object) nor a batch (an array)");
  }
  size_t begin = SkipSpace(body, 0);
  size_t end = body.size();
  while (end > begin && IsSpace(body[end - 1])) --end;
  batch.messages.push_back(Classify(*parsed, body.substr(begin, end - begin)));
  return batch;
}

Result<MessageInfo> InspectMessage(std::string_view text, size_t max_depth) {
  Result<json::value> parsed = Parse(text, max_depth);
  if (!parsed) return std::unexpected(parsed.error());
  if (!parsed->is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, "a JSON-RPC message must be a JSON object");
  }
  return Classify(*parsed, text);
}

std::optional<std::string_view> FindTopLevelMember(std::string_view s, std::string_view name) {
  size_t pos = SkipSpace(s, 0);
  if (pos >= s.size() || s[pos] != '{') return std::nullopt;
  pos = SkipSpace(s, pos + 1);
  if (pos < s.size() && s[pos] == '}') return std::nullopt;
  while (pos < s.size()) {
    if (s[pos] != '"') return std::nullopt;
    size_t key_end = SkipString(s, pos);
    if (key_end == std::string_view::npos) return std::nullopt;
    std::string_view key = s.substr(pos + 1, key_end - pos - 2);
    pos = SkipSpace(s, key_end);
    if (pos >= s.size() || s[pos] != ':') return std::nullopt;
    pos = SkipSpace(s, pos + 1);
    size_t value_end = SkipValue(s, pos);
    if (value_end == std::string_view::npos) return std::nullopt;
    if (key == name) return s.substr(pos, value_end - pos);
    pos = SkipSpace(s, value_end);
    if (pos >= s.size()) return std::nullopt;
    if (s[pos] == '}') return std::nullopt;
    if (s[pos] != ',') return std::nullopt;
    pos = SkipSpace(s, pos + 1);
  }
  return std::nullopt;
}

std::optional<std::vector<std::string_view>> SplitTopLevelArray(std::string_view s) {
  size_t pos = SkipSpace(s, 0);
  if (pos >= s.size() || s[pos] != '[') return std::nullopt;
  std::vector<std::string_view> parts;
  pos = SkipSpace(s, pos + 1);
  if (pos < s.size() && s[pos] == ']') return parts;
  while (pos < s.size()) {
    size_t end = SkipValue(s, pos);
    if (end == std::string_view::npos) return std::nullopt;
    parts.push_back(s.substr(pos, end - pos));
    pos = SkipSpace(s, end);
    if (pos >= s.size()) return std::nullopt;
    if (s[pos] == ']') return parts;
    if (s[pos] != ',') return std::nullopt;
    pos = SkipSpace(s, pos + 1);
  }
  return std::nullopt;
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

std::optional<std::string> MirroredText(const json::value* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return std::string(v->as_string());
  if (v->is_int64()) return std::to_string(v->as_int64());
  if (v->is_uint64()) return std::to_string(v->as_uint64());
  if (v->is_bool()) return std::string(v->as_bool() ? "true" : "false");
  return std::nullopt;
}

Result<std::string> WithRequestHeaders(
    std::string_view message, const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string object = "{";
  for (const auto& [name, value] : headers) {
    if (object.size() > 1) object += ',';
    object += JsonQuote(name) + ":" + JsonQuote(value);
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
  Result<json::value> parsed = Parse(tools_call_message, max_depth);
  if (!parsed || !parsed->is_object()) return out;
  const json::value* p = Member(parsed->as_object(), "params");
  if (p == nullptr || !p->is_object()) return out;
  const json::value* arguments = Member(p->as_object(), "arguments");
  for (const MirroredParam& param : params) {
    const json::value* v = arguments;
    for (const std::string& key : param.path) {
      v = v != nullptr && v->is_object() ? Member(v->as_object(), key) : nullptr;
    }
    std::optional<std::string> text = MirroredText(v);
    if (!text) continue;
    out.emplace_back("Mcp-Param-" + param.header, EncodeMirroredHeaderValue(*text));
  }
  return out;
}

int StatelessHttpStatus(std::string_view response) {
  if (response.find("\"error\"") == std::string_view::npos) return 200;
  Result<json::value> parsed = Parse(response, 64);
  if (!parsed || !parsed->is_object()) return 200;
  const json::value* error = Member(parsed->as_object(), "error");
  if (error == nullptr || !error->is_object()) return 200;
  const json::value* code = Member(error->as_object(), "code");
  if (code == nullptr || !code->is_int64()) return 200;
  switch (code->as_int64()) {
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

std::string JsonQuote(std::string_view text) { return Serialize(json::string(text)); }

std::string JsonRpcError(std::string_view id_json, int code, std::string_view message,
                         std::string_view data_json) {
  std::string out = R"({"jsonrpc":"2.0","id":)";
  out.append(id_json.empty() ? "null" : id_json);
  out.append(R"(,"error":{"code":)");
  out.append(std::to_string(code));
  out.append(R"(,"message":)");
  out.append(JsonQuote(message));
  if (!data_json.empty()) {
    out.append(R"(,"data":)");
    out.append(data_json);
  }
  out.append("}}");
  return out;
}

}  // namespace idem::mcp
