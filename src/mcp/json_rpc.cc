#include "mcp/json_rpc.h"

#include <boost/json.hpp>
#include <cmath>

#include "mcp/json_text.h"

namespace idem::mcp {
namespace {

bool IsBlank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

}  // namespace

void LineFramer::Complete(std::vector<Frame>& out) {
  if (discarding_) {
    discarding_ = false;
    partial_.clear();
    return;
  }
  if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
  if (partial_.size() > max_) {
    out.push_back(Frame{{}, true});
  } else if (!IsBlank(partial_)) {
    out.push_back(Frame{std::move(partial_), false});
  }
  partial_.clear();
}

std::vector<LineFramer::Frame> LineFramer::Feed(std::string_view bytes) {
  std::vector<Frame> out;
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = bytes.substr(0, nl);
    if (!discarding_) {
      // "+ 1" leaves room for a CR that the newline will strip.
      if (partial_.size() + piece.size() > max_ + 1) {
        discarding_ = true;
        partial_.clear();
        partial_.shrink_to_fit();
        out.push_back(Frame{{}, true});
      } else {
        partial_.append(piece);
      }
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
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
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
      if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.2e18) {
        return "n:" + std::to_string(static_cast<int64_t>(d));
      }
      return "j:" + boost::json::serialize(id);
    }
    default:
      return "j:" + boost::json::serialize(id);
  }
}

Result<Message> ParseMessage(std::string_view text, size_t max_depth) {
  boost::json::parse_options options;
  options.max_depth = max_depth;
  boost::system::error_code ec;
  Message m;
  m.json = boost::json::parse(text, ec, {}, options);
  if (ec) {
    return MakeError(ErrorCode::kInvalidArgument, "not valid JSON: " + ec.message());
  }
  if (m.json.is_array()) {
    m.kind = Message::Kind::kBatch;
    return m;
  }
  if (!m.json.is_object()) return m;  // kOther
  auto members = json_text::ObjectMembers(text);
  if (!members) return std::unexpected(members.error());
  auto id = json_text::FindMember(*members, "id");
  if (!id) return std::unexpected(id.error());
  auto method = json_text::FindMember(*members, "method");
  if (!method) return std::unexpected(method.error());

  const boost::json::object& obj = m.json.get_object();
  m.id_text = *id ? std::string((*id)->value.In(text)) : "null";
  if (*id) m.id_key = IdKey(obj.at("id"));
  if (const auto* meth = obj.if_contains("method"); meth && meth->is_string()) {
    m.method = std::string(meth->get_string());
    m.kind = *id ? Message::Kind::kRequest : Message::Kind::kNotification;
  } else if (*id && obj.contains("error")) {
    m.kind = Message::Kind::kError;
  } else if (*id && obj.contains("result")) {
    m.kind = Message::Kind::kResult;
  }
  return m;
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

std::string ParseErrorResponse(std::string_view detail) {
  return ErrorResponse("null", kRpcParseError,
                       "Parse error: the message is " + std::string(detail) +
                           "; send one JSON-RPC message per line");
}

}  // namespace idem::mcp
