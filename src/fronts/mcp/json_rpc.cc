#include "fronts/mcp/json_rpc.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "idem/canonical_json.h"
#include "fronts/mcp/http_jsonrpc.h"   // FindTopLevelMember
#include "fronts/mcp/http_protocol.h"  // PrintableExcerpt
#include "json/json_text.h"

namespace idem::mcp {
namespace {

bool IsBlank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

// False for a number beyond a double ("1e400", "-1e400"), which Boost.JSON
// reads as infinity: it serializes as null, so an answer could not carry it
// back. A NaN is representable: it is Boost.JSON's reading of a zero with a
// huge exponent ("0e4001" is 0 times 10^4001 = 0 * inf), and IdKey keys it as
// the zero it is.
bool Representable(const boost::json::value& v) {
  return !v.is_double() || !std::isinf(v.get_double());
}

}  // namespace

void IdSkeleton::Keep(char c) {
  constexpr size_t kMaxSkeletonBytes = 64 * 1024;
  if (skeleton_.size() < kMaxSkeletonBytes) skeleton_.push_back(c);
}

void IdSkeleton::Feed(std::string_view bytes) {
  constexpr size_t kMaxStringBytes = 1024;
  for (char c : bytes) {
    const bool top = depth_ <= 1;
    if (in_string_) {
      if (escape_) {
        escape_ = false;
        if (top && !cut_) Keep(c);
      } else if (c == '"') {
        in_string_ = false;
        if (top) Keep(c);
      } else {
        escape_ = c == '\\';
        if (top && !cut_) {
          string_bytes_ += escape_ ? 2 : 1;  // an escape and what it escapes stay together
          if (string_bytes_ > kMaxStringBytes) {
            cut_ = true;
            Keep('\x01');  // raw control bytes are not JSON: no longer an id
          } else {
            Keep(c);
          }
        }
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        cut_ = false;
        string_bytes_ = 0;
        if (top) Keep(c);
        break;
      case '{':
      case '[':
        if (++depth_ <= 2) Keep(c);
        break;
      case '}':
      case ']':
        if (depth_-- <= 2) Keep(c);
        break;
      default:
        if (top) Keep(c);
    }
  }
}

std::string IdSkeleton::IdText() const { return RecoverIdText(skeleton_); }

bool IdSkeleton::HasMember(std::string_view name) const {
  return FindTopLevelMember(skeleton_, name).has_value();
}

void LineFramer::Complete(std::vector<Frame>& out) {
  if (discarding_) {
    discarding_ = false;
    out.push_back(Frame{{}, true, skeleton_.IdText(), skeleton_.HasMember("method")});
    skeleton_ = IdSkeleton();
    partial_.clear();
    return;
  }
  const bool cr = !partial_.empty() && partial_.back() == '\r';
  if (partial_.size() - cr > max_) {  // one byte over: read whole, but the same answer
    IdSkeleton skeleton;
    skeleton.Feed(partial_);
    out.push_back(Frame{{}, true, skeleton.IdText(), skeleton.HasMember("method")});
  } else {
    if (cr) partial_.pop_back();
    if (!IsBlank(partial_)) out.push_back(Frame{std::move(partial_), false});
  }
  partial_.clear();
}

std::vector<LineFramer::Frame> LineFramer::Feed(std::string_view bytes) {
  std::vector<Frame> out;
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = bytes.substr(0, nl);
    if (discarding_) {
      skeleton_.Feed(piece);
    } else if (partial_.size() + piece.size() > max_ + 1) {
      // "+ 1" above leaves room for a CR that the newline will strip. Over
      // the limit: the line is read on, kept only as its skeleton, which
      // finds the id to answer wherever it comes.
      skeleton_.Feed(partial_);
      skeleton_.Feed(piece);
      discarding_ = true;
      partial_.clear();
      partial_.shrink_to_fit();
    } else {
      // Room for the newline FrameLine adds when the message is forwarded.
      if (partial_.empty()) partial_.reserve(piece.size() + 1);
      partial_.append(piece);
    }
    if (nl == std::string_view::npos) break;
    Complete(out);
    bytes.remove_prefix(nl + 1);
  }
  return out;
}

std::vector<LineFramer::Frame> LineFramer::Finish() {
  std::vector<Frame> out;
  Complete(out);
  return out;
}

std::string FrameLine(std::string message) {
  char* const end = message.data() + message.size();
  for (char c : {'\n', '\r'}) {  // memchr: most messages have neither
    for (char* p = message.data(); (p = static_cast<char*>(std::memchr(p, c, end - p)));) *p++ = ' ';
  }
  message.push_back('\n');
  return message;
}

std::string IdKey(const boost::json::value& id) {
  switch (id.kind()) {
    case boost::json::kind::string:
      return "s:" + std::string(id.get_string());
    case boost::json::kind::int64:
      return "n:" + std::to_string(id.get_int64());
    case boost::json::kind::uint64:
      return "n:" + std::to_string(id.get_uint64());
    case boost::json::kind::double_: {
      double d = id.get_double();
      // JSON has no NaN: Boost.JSON reads a zero with an exponent past a
      // double's range ("0e400") as 0 * inf. Its value is 0.
      if (std::isnan(d)) d = 0;
      if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.2e18) {
        return "n:" + std::to_string(static_cast<int64_t>(d));
      }
      return "j:" + boost::json::serialize(id);
    }
    default:
      return "j:" + boost::json::serialize(id);
  }
}

std::string IdKeyOfText(std::string_view id_text) {
  boost::system::error_code ec;
  const boost::json::value id = boost::json::parse(id_text, ec);
  if (ec) return "j:" + std::string(id_text);
  return IdKey(id);
}

Result<Message> ParseMessage(std::string_view text, size_t max_depth) {
  // Validated once, building nothing; read below only through spans.
  if (auto valid = json_text::Validate(text, max_depth); !valid) {
    return std::unexpected(valid.error());
  }
  Message m;
  const json_text::View whole(text);
  if (whole.is_array()) {
    m.kind = Message::Kind::kBatch;
    return m;
  }
  if (!whole.is_object()) return m;  // kOther
  auto members = json_text::ObjectMembers(text);
  if (!members) return std::unexpected(members.error());
  auto id = json_text::FindMember(*members, "id");
  if (!id) return std::unexpected(id.error());
  auto method = json_text::FindMember(*members, "method");
  if (!method) return std::unexpected(method.error());
  m.members = std::move(*members);  // `id` points into them: a vector's move keeps its nodes

  if (*id) {
    m.id_text = std::string((*id)->value.In(text));
    boost::system::error_code ec;
    const boost::json::value id_value = boost::json::parse(m.id_text, ec);  // a few bytes
    if (!Representable(id_value)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "not usable: its \"id\" " + PrintableExcerpt(m.id_text, 40) +
                           " is a number beyond what a double holds; use a string or a smaller "
                           "number");
    }
    m.id_key = IdKey(id_value);
  } else {
    m.id_text = "null";
  }
  const auto has = [&](std::string_view name) {
    return std::ranges::any_of(m.members,
                               [&](const json_text::Member& e) { return e.name == name; });
  };
  if (std::optional<std::string> name =
          *method ? json_text::View((*method)->value.In(text)).string() : std::nullopt) {
    m.method = std::move(*name);
    m.kind = *id ? Message::Kind::kRequest : Message::Kind::kNotification;
  } else if (*id && has("error")) {
    m.kind = Message::Kind::kError;
  } else if (*id && has("result")) {
    m.kind = Message::Kind::kResult;
  }
  return m;
}

std::optional<std::string> JsonRpcEnvelopeProblem(json_text::View message) {
  if (!message.is_object()) {
    return std::string(
               "a JSON-RPC message must be a JSON object (a batch: an array of them), "
               "not ") +
           message.KindName();
  }
  auto members = json_text::ObjectMembers(message.text());
  if (!members) return members.error().message;
  return JsonRpcEnvelopeProblem(message.text(), *members);
}

std::optional<std::string> JsonRpcEnvelopeProblem(std::string_view object,
                                                  const std::vector<json_text::Member>& members) {
  // Parsers disagree about which copy of a member wins: one sent twice is
  // refused rather than read one way here and another way by the peer.
  json_text::View method, id, version, params, result, error;
  for (const json_text::Member& m : members) {
    json_text::View* slot = m.name == "method"    ? &method
                            : m.name == "id"      ? &id
                            : m.name == "jsonrpc" ? &version
                            : m.name == "params"  ? &params
                            : m.name == "result"  ? &result
                            : m.name == "error"   ? &error
                                                  : nullptr;
    if (slot == nullptr) continue;
    if (slot->present()) return "\"" + m.name + "\" is sent more than once; send it once";
    *slot = json_text::View(m.value.In(object));
  }
  if (!method.present()) {
    if (id.present() && (result.present() || error.present())) return std::nullopt;
    return "the message is neither a request (\"method\" and \"id\"), a notification "
           "(\"method\") nor a response (\"id\" and \"result\" or \"error\")";
  }
  if (!method.is_string()) {
    return std::string("\"method\" must be a string, not ") + method.KindName();
  }
  if (version.string() != "2.0") return "\"jsonrpc\" must be \"2.0\" (JSON-RPC 2.0)";
  if (id.present() && !id.is_string() && !id.is_number()) {
    return std::string("a request's \"id\" must be a string or a number, not ") + id.KindName();
  }
  if (params.present() && !params.is_object()) {
    return std::string("\"params\" must be an object, not ") + params.KindName();
  }
  return std::nullopt;
}

std::string RecoverIdText(std::string_view text) {
  std::optional<std::string_view> id = FindTopLevelMember(text, "id");
  // A value that reaches the end of `text` may have been cut short.
  if (!id || id->data() + id->size() >= text.data() + text.size()) return "null";
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(*id, ec);
  if (ec || !(v.is_string() || v.is_number()) || !Representable(v)) return "null";
  return std::string(*id);
}

std::string ErrorResponse(std::string_view id_text, int code, std::string_view message,
                          std::string_view data_json) {
  std::string out = R"({"jsonrpc":"2.0","id":)";
  out.append(id_text.empty() ? "null" : id_text);
  out += R"(,"error":{"code":)";
  out += std::to_string(code);
  out += R"(,"message":)";
  out += json_text::Quote(message);
  if (!data_json.empty()) {
    out += R"(,"data":)";
    out.append(data_json);
  }
  out += "}}";
  return out;
}

std::string ResultResponse(std::string_view id_text, std::string_view result_json) {
  std::string out = R"({"jsonrpc":"2.0","id":)";
  out.append(id_text.empty() ? "null" : id_text);
  out += R"(,"result":)";
  out.append(result_json);
  out += "}";
  return out;
}

std::string ParseErrorResponse(std::string_view id_text, std::string_view detail) {
  return ErrorResponse(id_text, kRpcParseError,
                       "Parse error: the message is " + std::string(detail));
}

}  // namespace idem::mcp
