#include "fronts/http_proxy/request_plan.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "core/hex.h"
#include "idem/canonical_json.h"
#include "json/json_text.h"
#include "fronts/http_proxy/idempotency_key.h"
#include "fronts/http_proxy/stored_response.h"

namespace idem::proxy {
namespace {

constexpr std::string_view kKeyHeader = "Idempotency-Key";

// The rule for requests no [[route]] matches.
const RouteRule& BuiltInRule() {
  static const RouteRule rule = [] {
    RouteRule r;
    r.match = "/";
    return r;
  }();
  return rule;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) { return HeaderNameEquals(a, b); }

// True for application/json and any */*+json media type.
bool IsJsonContentType(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  if (EqualsIgnoreCase(type, "application/json")) return true;
  return type.size() > 5 && EqualsIgnoreCase(type.substr(type.size() - 5), "+json") &&
         type.find('/') != std::string_view::npos;
}

// Hex of HMAC-SHA-256(secret, credential); of plain SHA-256 without a
// secret (then a weak credential can be checked offline against a key seen
// in a log: the README's `idemgate http` section says to set the secret).
std::string ScopeDigest(std::string_view credential, const std::string& secret) {
  if (secret.empty()) return Sha256Hex(credential);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), mac, &length);
  return LowerHex(mac, length);
}

// Whether `key` has the shape of a credential-scoped key: 'c', then anything,
// then a '/'.
bool LooksScoped(std::string_view key) {
  return key.starts_with('c') && key.find('/') != std::string_view::npos;
}

RequestPlan Refuse(int status, std::string type, std::string title, std::string detail) {
  RequestPlan plan;
  plan.kind = RequestPlan::Kind::kRefuse;
  plan.refusal = Refusal{status, std::move(type), std::move(title), std::move(detail)};
  return plan;
}

CanonOptions CanonFor(const PlanOptions& options) {
  CanonOptions canon;
  canon.max_bytes = options.max_body_bytes;
  canon.max_depth = options.max_json_depth;
  return canon;
}

}  // namespace

std::string RouteCallName(std::string_view method, std::string_view path) {
  std::string name(method);
  name.push_back(' ');
  name.append(path);
  return name;
}

Result<std::string> RequestFingerprint(const http::Request& request, const PlanOptions& options) {
  // Hash of a small, unambiguous frame around the body's own hash, so the
  // body is never copied: its length-free parts are separated by newlines,
  // which a method, a path and a query cannot hold.
  std::string body_hash;
  std::optional<std::string_view> type = request.FindHeader("Content-Type");
  if (type && IsJsonContentType(*type) && !request.body.empty()) {
    Result<std::string> fp = Fingerprint(request.body, CanonFor(options));
    if (!fp) return std::unexpected(fp.error());
    body_hash = "json:" + *fp;
  } else {
    body_hash = "raw:" + Sha256Hex(request.body);
  }
  std::string frame = "idemgate-http-fp/1\n";
  frame.append(request.method).push_back('\n');
  frame.append(request.path).push_back('\n');
  frame.append(request.query).push_back('\n');
  frame.append(body_hash);
  return Sha256Hex(frame);
}

std::string CredentialScope(const http::Request& request, const Config& config) {
  if (!config.tenants.empty()) return {};
  for (const std::string& name : config.http.credential_headers) {
    if (auto credential = request.FindHeader(name); credential && !credential->empty()) {
      return "c" + ScopeDigest(*credential, config.http.credential_scope_secret).substr(0, 32);
    }
  }
  return {};
}

std::vector<http::Header> CredentialHeaders(const http::Request& request, const Config& config) {
  std::vector<http::Header> out;
  for (const http::Header& h : request.headers) {
    for (const std::string& name : config.http.credential_headers) {
      if (HeaderNameEquals(h.name, name)) out.push_back(h);
    }
  }
  return out;
}

RequestPlan PlanRequest(const http::Request& request, const Config& config,
                        const PlanOptions& options) {
  const RouteRule* rule = config.RouteFor(request.method, request.path);
  Policy policy;
  if (rule != nullptr) {
    policy = rule->overrides.ApplyTo(config.defaults);
  } else if (EqualsIgnoreCase(request.method, "POST") ||
             EqualsIgnoreCase(request.method, "PATCH")) {
    rule = &BuiltInRule();
    policy = config.defaults;
  } else {
    return RequestPlan{};
  }
  if (rule->mode == KeyMode::kOff) return RequestPlan{};

  const std::string tool = RouteCallName(request.method, request.path);
  std::optional<std::string> explicit_key;
  std::optional<std::string_view> key_value;
  // The client's key: Idempotency-Key, else the vendor's own header.
  std::string_view client_header = kKeyHeader;
  if (request.CountHeader(kKeyHeader) == 0 && !rule->key_header.empty() &&
      request.CountHeader(rule->key_header) > 0) {
    client_header = rule->key_header;
  }
  if (size_t n = request.CountHeader(client_header); n > 1) {
    return Refuse(400, "invalid-idempotency-key", "Invalid Idempotency-Key",
                  "the request has " + std::to_string(n) + " " + std::string(client_header) +
                      " headers; send exactly one key per request");
  } else if (n == 1) {
    key_value = request.FindHeader(client_header);
    Result<std::string> key = ParseIdempotencyKey(*key_value, {.max_bytes = options.max_key_bytes});
    if (!key) {
      return Refuse(400, "invalid-idempotency-key", "Invalid Idempotency-Key", key.error().message);
    }
    explicit_key = std::move(*key);
  }

  std::optional<std::string_view> turn = request.FindHeader(config.http.turn_header);
  if (turn && turn->empty()) turn.reset();
  const std::optional<KeyMode> mode = rule->mode;
  if (!explicit_key) {
    if (mode == KeyMode::kExplicit) {
      return Refuse(400, "idempotency-key-required", "Idempotency-Key required",
                    tool +
                        " requires an Idempotency-Key header and none was sent; send one "
                        "(Idempotency-Key: \"<a unique id for this operation>\") and reuse it "
                        "when you retry");
    }
    if ((!mode || mode == KeyMode::kTurn) && !turn) return RequestPlan{};
  }

  Result<std::string> fingerprint = RequestFingerprint(request, options);
  if (!fingerprint) {
    // 413 is for size only; nesting past max_depth (also kResourceExhausted)
    // is a body the client must change, like any other malformed one: 400.
    const bool too_large = fingerprint.error().code == ErrorCode::kResourceExhausted &&
                           request.body.size() > CanonFor(options).max_bytes;
    return Refuse(too_large ? 413 : 400, "invalid-json-body", "Invalid JSON body",
                  "the body is labelled JSON but " + fingerprint.error().message +
                      "; fix the body or send it with a non-JSON Content-Type");
  }

  KeyInput input;
  input.tool = tool;
  input.fingerprint = *fingerprint;
  input.explicit_key = explicit_key;
  input.mode = mode.value_or(KeyMode::kTurn);
  if (turn) input.turn = std::string(*turn);
  if (!explicit_key && input.mode == KeyMode::kFields) {
    std::optional<std::string_view> type = request.FindHeader("Content-Type");
    if (!type || !IsJsonContentType(*type)) {
      return Refuse(400, "invalid-json-body", "JSON body required",
                    tool +
                        " derives its key from fields of a JSON body; send the body with "
                        "Content-Type: application/json or an Idempotency-Key header");
    }
    Result<std::string> selected = FingerprintFields(request.body, rule->fields, CanonFor(options));
    if (!selected) {
      return Refuse(400, "invalid-json-body", "Invalid JSON body", selected.error().message);
    }
    input.fingerprint = *selected;
  }
  Result<DerivedKey> key = DeriveKey(input);
  if (!key) {
    return Refuse(400, "invalid-idempotency-key", "Invalid Idempotency-Key", key.error().message);
  }

  RequestPlan plan;
  plan.kind = RequestPlan::Kind::kGated;
  std::string scope = CredentialScope(request, config);
  // A client's key without a credential that looks like a scoped one
  // ("c" + anything + "/", such as "c1a2…/order-1") is put under "c-/" ('-' is
  // no hex digit, and "c-/…" looks scoped too, so it is escaped the same
  // way): it can never name a credential's record (security review F5),
  // while every other key stays as the client sent it. A derived key starts
  // with "v1".
  if (scope.empty() && config.tenants.empty() && LooksScoped(key->key)) scope = "c-";
  plan.call.id = RecordId{request.principal.tenant, ScopedKey(scope, key->key)};
  plan.call.fingerprint = std::move(*fingerprint);
  plan.call.tool = tool;
  if (turn) plan.call.turn = std::string(*turn);
  plan.call.policy = policy;
  plan.call.turn_fallback = key->turn_fallback;
  plan.call.detail = explicit_key ? "http: client key" : "http: derived key";
  plan.key_header = rule->key_header;
  plan.key_field = rule->key_field;
  plan.client_key = explicit_key.has_value();
  // A vendor profile's header or field gets the bare key its vendor documents.
  plan.forward_key = explicit_key && !rule->profile ? std::string(*key_value) : key->key;
  return plan;
}

std::string BodyWithKeyField(std::string body, std::string_view field, std::string_view key) {
  auto members = json_text::ObjectMembers(body);
  if (!members) return body;
  auto member = json_text::FindMember(*members, field);
  if (!member || *member != nullptr) return body;
  auto with_key = json_text::SetMember(body, field, json_text::Quote(key));
  return with_key ? std::move(*with_key) : body;
}

}  // namespace idem::proxy
