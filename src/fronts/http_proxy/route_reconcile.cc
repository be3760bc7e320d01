#include "fronts/http_proxy/route_reconcile.h"

#include <future>

#include "fronts/http_proxy/stored_response.h"
#include "json/json_text.h"

namespace idem::proxy {
namespace {

// Percent-encodes everything outside RFC 3986's unreserved set.
std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// Whether a lookup's body is an empty list: a JSON array without elements,
// or an object without "id" whose arrays are all empty, as a vendor's list
// or search envelope is when nothing matched ({"object":"list","data":[]},
// {"items":[]}). It names no outcome, so it cannot be the action's (review
// H8); a found resource has its "id".
bool IsEmptyList(std::string_view body) {
  if (!json_text::Validate(body, 64)) return false;
  const json_text::View v(body);
  if (v.is_array()) return v.Elements().empty();
  if (!v.is_object()) return false;
  auto members = json_text::ObjectMembers(body);
  if (!members) return false;
  size_t arrays = 0;
  for (const json_text::Member& m : *members) {
    if (m.name == "id") return false;
    const json_text::View value(m.value.In(body));
    if (!value.is_array()) continue;
    if (!value.Elements().empty()) return false;
    ++arrays;
  }
  return arrays > 0;
}

const RouteRule* RuleOf(const Config& config, std::string_view tool) {
  const size_t space = tool.find(' ');
  if (space == std::string::npos) return nullptr;
  return config.RouteFor(tool.substr(0, space), tool.substr(space + 1));
}

}  // namespace

std::optional<std::string> ReconcileTarget(const Config& config, std::string_view tool,
                                           std::string_view forwarded_key) {
  const RouteRule* rule = RuleOf(config, tool);
  if (rule == nullptr || !rule->reconcile) return std::nullopt;
  std::string target = *rule->reconcile;
  const std::string key = PercentEncode(forwarded_key);
  for (size_t at = target.find("{key}"); at != std::string::npos;
       at = target.find("{key}", at + key.size())) {
    target.replace(at, 5, key);
  }
  return target;
}

ReconcileHook MakeRouteLookup(const Config& config, net::HttpClient& upstream,
                              std::string forwarded_key, std::vector<http::Header> credentials) {
  return [&config, &upstream, forwarded_key = std::move(forwarded_key),
          credentials = std::move(credentials)](const Call& call) -> Result<std::optional<Outcome>> {
    std::optional<std::string> target = ReconcileTarget(config, call.tool, forwarded_key);
    if (!target) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "no reconcile route is configured for " + call.tool);
    }
    net::HttpClientRequest request;
    request.method = "GET";
    request.target = std::move(*target);
    request.headers = credentials;
    if (const std::string& header = RuleOf(config, call.tool)->key_header; !header.empty()) {
      request.headers.push_back({header, forwarded_key});
    }
    auto promise = std::make_shared<std::promise<net::HttpClientResult>>();
    std::future<net::HttpClientResult> answer = promise->get_future();
    upstream.Send(std::move(request),
                  [promise](net::HttpClientResult r) { promise->set_value(std::move(r)); });
    net::HttpClientResult r = answer.get();
    if (r.kind != net::HttpClientResult::Kind::kResponse) {
      return MakeError(ErrorCode::kUnavailable, "the reconcile lookup failed: " + r.detail);
    }
    const int status = r.response.status;
    if (status == 404 || status == 410) return std::optional<Outcome>();
    if (status < 200 || status >= 300) {
      return MakeError(ErrorCode::kUnavailable,
                       "the reconcile lookup answered HTTP " + std::to_string(status));
    }
    if (IsEmptyList(r.response.body)) {
      return MakeError(ErrorCode::kUnavailable,
                       "the reconcile lookup answered HTTP " + std::to_string(status) +
                           " with an empty list, which names no outcome: point reconcile at a "
                           "lookup that answers 404 when the key is unknown");
    }
    const std::string_view connection = [&]() -> std::string_view {
      for (const http::Header& h : r.response.headers) {
        if (HeaderNameEquals(h.name, "Connection")) return h.value;
      }
      return {};
    }();
    StoredResponse found{status, EndToEndHeaders(r.response.headers, connection),
                         std::move(r.response.body)};
    return std::optional<Outcome>(Outcome{OutcomeClass::kSuccess, EncodeStoredResponse(found)});
  };
}

}  // namespace idem::proxy
