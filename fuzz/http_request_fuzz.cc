// How the HTTP reverse proxy plans one request (src/fronts/http_proxy/request_plan.h):
// route, gating, key, fingerprint and refusals, as a pure function of the
// request and the config. Input: an HTTP/1-like request,
//   "METHOD TARGET\n" ("Name: value\n")* "\n" body
// (CRLF accepted), planned against a fixed config with a route of each key
// mode. Properties:
//  - a refusal is 400 or 413 with a type, a title and a detail;
//  - a gated call has a valid key, a 64-hex fingerprint and the tool
//    "METHOD /path"; a client key is forwarded exactly as sent and keyed as
//    ParseIdempotencyKey reads it;
//  - a JSON body's fingerprint does not depend on its spelling: the body
//    replaced by its canonical form gives the same fingerprint.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "idem/canonical_json.h"
#include "idem/config.h"
#include "idem/key.h"
#include "fronts/http_proxy/idempotency_key.h"
#include "fronts/http_proxy/request_plan.h"

namespace {

using idem::proxy::RequestPlan;

const idem::Config& TestConfig() {
  static const idem::Config config = [] {
    auto c = idem::ParseConfig(R"(
[[route]]
match = "/v1/charges"
methods = ["POST", "PUT"]
mode = "explicit"
[[route]]
match = "/v1/users"
mode = "fields"
fields = ["/email", "/org/id"]
[[route]]
match = "/v1/search*"
mode = "off"
[[route]]
match = "/v1/jobs"
mode = "args"
[[route]]
match = "/v1/turns"
key_header = "X-Request-Key"
)",
                               "fuzz.toml");
    FUZZ_CHECK(c.has_value());
    return std::move(*c);
  }();
  return config;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits the input into a request; false if it has no request line or a
// header line with a CR or NUL.
bool ReadRequest(std::string_view in, idem::http::Request& req) {
  auto line = [&in]() -> std::optional<std::string_view> {
    const size_t nl = in.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;
    std::string_view l = in.substr(0, nl);
    in.remove_prefix(nl + 1);
    if (l.ends_with('\r')) l.remove_suffix(1);
    return l;
  };
  const auto first = line();
  if (!first) return false;
  const size_t sp = first->find(' ');
  if (sp == std::string_view::npos) return false;
  req.method = std::string(first->substr(0, sp));
  req.target = std::string(first->substr(sp + 1));
  const size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  req.query = q == std::string::npos ? std::string() : req.target.substr(q + 1);
  while (auto l = line()) {
    if (l->empty()) break;
    // What an HTTP parser refuses in a field line never reaches the plan.
    if (l->find_first_of(std::string_view("\r\0", 2)) != std::string_view::npos) return false;
    const size_t colon = l->find(':');
    if (colon == std::string_view::npos) continue;
    req.headers.push_back(
        {std::string(l->substr(0, colon)), std::string(TrimOws(l->substr(colon + 1)))});
  }
  req.body = std::string(in);
  return true;
}

// application/json or any type/subtype+json, parameters and case ignored
// (as request_plan.h documents).
bool IsJsonMediaType(std::string_view content_type) {
  std::string type(TrimOws(content_type.substr(0, content_type.find(';'))));
  for (char& c : type) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return type == "application/json" ||
         (type.ends_with("+json") && type.size() > 5 && type.find('/') != std::string::npos);
}

bool IsHex64(std::string_view s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  idem::http::Request req;
  if (!ReadRequest(std::string_view(reinterpret_cast<const char*>(data), size), req)) return 0;
  const idem::Config& config = TestConfig();
  idem::proxy::PlanOptions options;
  options.max_body_bytes = 4096;
  options.max_json_depth = 16;

  const RequestPlan plan = idem::proxy::PlanRequest(req, config, options);
  switch (plan.kind) {
    case RequestPlan::Kind::kPassThrough:
      break;
    case RequestPlan::Kind::kRefuse:
      FUZZ_CHECK(plan.refusal.status == 400 || plan.refusal.status == 413);
      FUZZ_CHECK(!plan.refusal.type.empty() && !plan.refusal.title.empty());
      FUZZ_CHECK(!plan.refusal.detail.empty());
      break;
    case RequestPlan::Kind::kGated: {
      FUZZ_CHECK(idem::ValidateKey(plan.call.id.key).has_value());
      FUZZ_CHECK(IsHex64(plan.call.fingerprint));
      FUZZ_CHECK_EQ(plan.call.tool, idem::proxy::RouteCallName(req.method, req.path));
      FUZZ_CHECK(!plan.key_header.empty() && !plan.forward_key.empty());
      if (plan.client_key) {
        const auto sent = req.FindHeader("Idempotency-Key");
        FUZZ_CHECK(sent.has_value());
        FUZZ_CHECK_EQ(plan.forward_key, *sent);
        const auto parsed = idem::proxy::ParseIdempotencyKey(*sent);
        FUZZ_CHECK(parsed.has_value());
        FUZZ_CHECK_EQ(plan.call.id.key, *parsed);
      } else {
        FUZZ_CHECK_EQ(plan.forward_key, plan.call.id.key);
      }
      break;
    }
  }

  // Spelling-insensitive fingerprints of JSON bodies.
  const auto fp = idem::proxy::RequestFingerprint(req, options);
  if (fp) {
    FUZZ_CHECK(IsHex64(*fp));
    idem::CanonOptions exact;
    exact.exact_numbers = true;
    exact.max_bytes = options.max_body_bytes;
    exact.max_depth = options.max_json_depth;
    const auto type = req.FindHeader("Content-Type");
    if (type && IsJsonMediaType(*type)) {
      if (const auto canonical = idem::Canonicalize(req.body, exact);
          canonical && canonical->size() <= options.max_body_bytes) {
        idem::http::Request respelled = req;
        respelled.body = *canonical;
        const auto again = idem::proxy::RequestFingerprint(respelled, options);
        FUZZ_CHECK(again.has_value());
        FUZZ_CHECK_EQ(*again, *fp);
      }
    }
  } else {
    FUZZ_CHECK(fp.error().code == idem::ErrorCode::kInvalidArgument ||
               fp.error().code == idem::ErrorCode::kResourceExhausted);
  }
  return 0;
}
