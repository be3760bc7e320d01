#include "fronts/console/console.h"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>
#include <map>
#include <set>
#include <utility>

#include "core/utf8.h"
#include "fronts/console/console_assets.h"
#include "idem/resolve.h"
#include "net/cross_site.h"
#include "net/http_rules.h"
#include "net/record_answers.h"

namespace idem::console {
namespace {

namespace json = boost::json;

// The most of an outcome the record page shows; the rest is cut (the CLI's
// `inspect --show-outcome` prints it whole).
constexpr size_t kShownOutcomeBytes = 64 * 1024;

// What every console answer carries: the page runs only its own script and
// style, talks only to this origin, and is never framed or cached.
void Harden(http::Response& r) {
  r.headers.push_back({"Content-Security-Policy",
                       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                       "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                       "frame-ancestors 'none'"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  r.headers.push_back({"X-Frame-Options", "DENY"});
  r.headers.push_back({"Referrer-Policy", "no-referrer"});
  r.headers.push_back({"Cache-Control", "no-store"});
}

http::Response Asset(std::string_view body, std::string_view type) {
  http::Response r;
  r.headers.push_back({"Content-Type", std::string(type)});
  r.body = std::string(body);
  return r;
}

http::Response Json(const json::object& o) {
  http::Response r;
  r.headers.push_back({"Content-Type", "application/json"});
  r.body = json::serialize(o);
  return r;
}

http::Response BadRequest(std::string detail) {
  return http::Problem(400, "bad-request", "Bad request", "idemgate: " + detail);
}

// A store error, for the page to show.
http::Response StoreError(const Error& e) {
  if (e.code == ErrorCode::kUnavailable) {
    http::Response r = http::Problem(503, "store-unavailable", "Store unavailable",
                                     "idemgate: the store cannot be reached; nothing was changed. "
                                     "Retry later. (" + e.message + ")");
    r.headers.push_back({"Retry-After", "1"});
    return r;
  }
  if (e.code == ErrorCode::kAborted || e.code == ErrorCode::kFailedPrecondition) {
    return http::Problem(409, "changed", "The record changed",
                         "idemgate: someone else acted on the record meanwhile; nothing was "
                         "written. Look again (" + e.message + ")");
  }
  return http::Problem(500, "internal", "Internal error", "idemgate: " + e.ToString());
}

// The first whole UTF-8 characters of `s`, at most `max` bytes; nullopt when
// they are not UTF-8 (a binary outcome).
std::optional<std::string_view> Utf8Prefix(std::string_view s, size_t max) {
  const auto* begin = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = begin + s.size();
  const auto* p = begin;
  while (p < end && static_cast<size_t>(p - begin) < max) {
    uint32_t length = 1;
    if (*p >= 0x80) {
      utf8::Char c = utf8::DecodeMultiByte(p, end);
      if (c.problem != utf8::Problem::kNone) return std::nullopt;
      length = c.length;
    }
    if (static_cast<size_t>(p - begin) + length > max) break;
    p += length;
  }
  return s.substr(0, static_cast<size_t>(p - begin));
}

bool IEquals(std::string_view a, std::string_view b) { return boost::beast::iequals(a, b); }

bool IsJson(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  return IEquals(type, "application/json");
}

// A POST must come from this page: JSON (a form cannot send it without a
// CORS preflight, which is never granted); where it comes from is checked
// for every API request (http::CrossSiteRefusal).
std::optional<http::Response> NonJsonRefusal(const http::Request& request) {
  auto ct = request.FindHeader("Content-Type");
  if (!ct || !IsJson(*ct)) {
    return http::Problem(415, "unsupported-media-type", "Unsupported media type",
                         "idemgate: console actions take a JSON body (Content-Type: "
                         "application/json)");
  }
  return std::nullopt;
}

std::optional<std::string> StringMember(const json::object& o, std::string_view name) {
  const json::value* v = o.if_contains(name);
  if (v == nullptr || !v->is_string()) return std::nullopt;
  return std::string(v->get_string());
}

std::optional<uint64_t> FenceMember(const json::object& o) {
  const json::value* v = o.if_contains("fence");
  if (v == nullptr) return std::nullopt;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<uint64_t>(v->get_int64());
  return std::nullopt;
}

// The record an action names: {"tenant", "key", "fence"}.
struct Target {
  RecordId id;
  std::optional<uint64_t> fence;
};

std::expected<Target, http::Response> TargetOf(const json::object& o, bool fence_required) {
  auto tenant = StringMember(o, "tenant");
  auto key = StringMember(o, "key");
  if (!tenant || !key || key->empty()) {
    return std::unexpected(BadRequest("send \"tenant\" and \"key\" (strings) of the record"));
  }
  Target t{RecordId{*tenant, *key}, FenceMember(o)};
  if (fence_required && !t.fence) {
    return std::unexpected(
        BadRequest("send \"fence\": the fence of the record as the page showed it"));
  }
  return t;
}

// The points of the replay chart: per tool, per bucket, answers and replays.
struct Bucket {
  uint64_t answers = 0;  // attempts answered (audit-only entries left out)
  uint64_t replays = 0;  // replayed + attached
};

bool IsAnswer(AttemptOutcome o) {
  return o != AttemptOutcome::kClaimed && o != AttemptOutcome::kResolved &&
         o != AttemptOutcome::kEvicted;
}

Bucket CountOf(const ToolStats& s) {
  Bucket b;
  for (const auto& [o, n] : s.by_outcome) {
    if (!IsAnswer(o)) continue;
    b.answers += n;
    if (o == AttemptOutcome::kReplayed || o == AttemptOutcome::kAttached) b.replays += n;
  }
  return b;
}

// A query parameter, or nullopt.
std::optional<std::string> Param(const std::map<std::string, std::string>& query,
                                 const std::string& name) {
  auto it = query.find(name);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

}  // namespace

Console::Console(Ledger& ledger, const Config& config) : ledger_(ledger), config_(config) {}

Console::~Console() { pool_.Shutdown(); }

bool Console::Handles(std::string_view path) {
  return path == "/console" || path.starts_with("/console/");
}

const std::vector<std::string>& Console::PublicPaths() {
  static const std::vector<std::string> paths = {"/console", "/console/", "/console/console.js",
                                                 "/console/console.css"};
  return paths;
}

http::Handler Console::Wrap(http::Handler next) {
  return [this, next = std::move(next)](http::Request request, http::Responder respond) {
    if (!Handles(request.path)) return next(std::move(request), std::move(respond));
    Handle(std::move(request), std::move(respond));
  };
}

void Console::Handle(http::Request request, http::Responder respond) {
  auto answer = [&respond](http::Response r) {
    Harden(r);
    respond(std::move(r));
  };
  if (!config_.console.enabled) {
    return answer(http::Problem(404, "console-disabled", "Console disabled",
                                "idemgate: the operator console is off ([console] enabled = "
                                "false)"));
  }
  const std::string& path = request.path;
  if (!path.starts_with("/console/api/")) {
    if (request.method != "GET" && request.method != "HEAD") {
      http::Response r = http::Problem(405, "method-not-allowed", "Method not allowed",
                                       "idemgate: the console's page answers GET");
      r.headers.push_back({"Allow", "GET, HEAD"});
      return answer(std::move(r));
    }
    if (path == "/console" || path == "/console/") {
      return answer(Asset(kIndexHtml, "text/html; charset=utf-8"));
    }
    if (path == "/console/console.js") {
      return answer(Asset(kConsoleJs, "text/javascript; charset=utf-8"));
    }
    if (path == "/console/console.css") return answer(Asset(kConsoleCss, "text/css; charset=utf-8"));
    return answer(http::Problem(404, "not-found", "Not found", "idemgate: no such console page"));
  }
  // A public path never reaches here without a token on `serve` and `http`
  // (their listener refuses it first); `mcp --listen` hands the console every
  // request, its principal tenant "" when the token was missing or unknown.
  if (request.principal.tenant.empty() && !request.principal.admin) {
    return answer(http::Problem(401, "unauthorized", "Unauthorized",
                                "idemgate: the console needs an admin token (Authorization: "
                                "Bearer TOKEN)"));
  }
  if (!request.principal.admin) {
    return answer(http::Problem(403, "forbidden", "Forbidden",
                                "idemgate: the console needs an admin token (a [[tenant]] with "
                                "admin = true); tenant \"" +
                                    net::PrintableExcerpt(request.principal.tenant, 64) +
                                    "\" is not an admin"));
  }
  // GETs too: without tokens every caller is admin, and a page of another
  // site must not make the browser run a query (security review F7).
  if (auto refused = http::CrossSiteRefusal(request)) return answer(std::move(*refused));
  std::string what = path.substr(13);
  const bool post = what == "release" || what == "set-outcome" || what == "evict";
  if (post) {
    if (request.method != "POST") {
      http::Response r = http::Problem(405, "method-not-allowed", "Method not allowed",
                                       "idemgate: /console/api/" + what + " answers POST");
      r.headers.push_back({"Allow", "POST"});
      return answer(std::move(r));
    }
    if (auto refused = NonJsonRefusal(request)) return answer(std::move(*refused));
  } else if (request.method != "GET" && request.method != "HEAD") {
    http::Response r = http::Problem(405, "method-not-allowed", "Method not allowed",
                                     "idemgate: /console/api/" + what + " answers GET");
    r.headers.push_back({"Allow", "GET, HEAD"});
    return answer(std::move(r));
  }
  auto shared = std::make_shared<http::Request>(std::move(request));
  bool submitted = pool_.Submit([this, shared, what, answer_to = respond]() mutable {
    http::Response r = Api(*shared, what);
    Harden(r);
    answer_to(std::move(r));
  });
  if (!submitted) {
    answer(http::Problem(503, "stopping", "Stopping", "idemgate is stopping"));
  }
}

http::Response Console::Api(const http::Request& request, std::string_view what) {
  auto query = http::ParseQuery(request.query);
  if (!query) return BadRequest(query.error().message);
  if (what == "whoami") return Whoami(request.principal);
  if (what == "unknown") return UnknownRecords(*query);
  if (what == "record") return OneRecord(*query);
  if (what == "attempts") return Attempts(request.principal, *query);
  if (what == "replay") return ReplayChart(*query);
  if (what == "release" || what == "set-outcome" || what == "evict") {
    return Act(request, what);
  }
  return http::Problem(404, "not-found", "Not found",
                       "idemgate: no such console endpoint; see /console/api/ in docs/DESIGN.md");
}

http::Response Console::Whoami(const http::Principal& who) {
  json::object o;
  o["tenant"] = who.tenant;
  o["admin"] = who.admin;
  o["instance"] = ledger_.instance();
  json::object limits;
  limits["max_records"] = config_.console.max_records;
  limits["scan_attempts"] = config_.console.scan_attempts;
  limits["max_attempts"] = config_.console.max_attempts;
  limits["chart_buckets"] = config_.console.chart_buckets;
  limits["chart_tools"] = config_.console.chart_tools;
  o["limits"] = std::move(limits);
  return Json(o);
}

http::Response Console::UnknownRecords(const std::map<std::string, std::string>& query) {
  ledger_.Flush();  // entries still buffered are part of the answer
  AttemptFilter filter;
  filter.tenant.reset();
  if (auto t = Param(query, "tenant"); t && *t != "*") filter.tenant = *t;
  filter.outcome = AttemptOutcome::kUnknown;
  filter.limit = config_.console.scan_attempts;
  auto entries = ledger_.QueryAttempts(filter);
  if (!entries) return StoreError(entries.error());
  std::set<std::pair<std::string, std::string>> seen;
  json::array records;
  bool truncated = false;
  for (const Attempt& a : *entries) {
    if (!seen.emplace(a.tenant, a.key).second) continue;
    if (records.size() >= config_.console.max_records) {
      truncated = true;
      break;
    }
    auto got = ledger_.Read(RecordId{a.tenant, a.key});
    if (!got) return StoreError(got.error());
    if (!*got || (*got)->state != RecordState::kUnknown) continue;
    json::object r = http::RecordJson(**got);
    r["since"] = r["completed_at"];
    records.push_back(std::move(r));
  }
  json::object o;
  o["records"] = std::move(records);
  o["truncated"] = truncated || entries->size() >= filter.limit;
  o["scanned"] = entries->size();
  o["max_records"] = config_.console.max_records;
  return Json(o);
}

http::Response Console::OneRecord(const std::map<std::string, std::string>& query) {
  auto key = Param(query, "key");
  if (!key || key->empty()) return BadRequest("send key= (and tenant=) of the record");
  RecordId id{Param(query, "tenant").value_or("default"), *key};
  auto got = ledger_.Read(id);
  if (!got) return StoreError(got.error());
  if (!*got) {
    return http::Problem(404, "no-record", "No such record",
                         "idemgate: no live record for this key in this tenant: never begun, "
                         "released, evicted, or past retention");
  }
  const Record& r = **got;
  json::object o = http::RecordJson(r);
  o["lease_expired"] =
      r.state == RecordState::kInProgress && r.lease_expires_at <= ledger_.clock().Now();
  if (r.outcome) {
    const std::string& body = r.outcome->body;
    o["outcome_bytes"] = body.size();
    if (auto shown = Utf8Prefix(body, kShownOutcomeBytes)) {
      o["outcome_body"] = *shown;
      o["outcome_cut"] = shown->size() < body.size();
    } else {
      o["outcome_binary"] = true;  // not text: `idemgate inspect --json --show-outcome`
    }
  }
  json::object answer;
  answer["record"] = std::move(o);
  return Json(answer);
}

http::Response Console::Attempts(const http::Principal& who, const std::map<std::string, std::string>& query) {
  auto filter = http::ParseAttemptFilter(query, who, ledger_.clock().Now(),
                                         config_.console.max_attempts);
  if (!filter) return std::move(filter.error());
  if (!query.contains("tenant")) filter->tenant.reset();  // an admin sees every tenant
  ledger_.Flush();
  bool cut = false;  // the store stopped before the oldest entry (Redis attempts_scan)
  filter->cut = &cut;
  auto attempts = ledger_.QueryAttempts(*filter);
  if (!attempts) return StoreError(attempts.error());
  json::object o;
  o["attempts"] = http::AttemptsJson(*attempts);
  o["limit"] = filter->limit;
  o["truncated"] = cut;
  return Json(o);
}

http::Response Console::ReplayChart(const std::map<std::string, std::string>& query) {
  Duration period{3600 * 1000};
  if (auto s = Param(query, "since")) {
    auto d = ParseDuration(*s);
    if (!d || d->count() <= 0) {
      return BadRequest("\"since\" must be a duration back from now (\"1h\", \"30m\", \"7d\")");
    }
    period = *d;
  }
  const size_t n = config_.console.chart_buckets;
  const Duration step = std::max(Duration(1), period / static_cast<int64_t>(n));
  ledger_.Flush();
  const TimePoint now = ledger_.clock().Now();
  const TimePoint from = now - step * static_cast<int64_t>(n);
  AttemptFilter filter;
  filter.tenant.reset();
  if (auto t = Param(query, "tenant"); t && *t != "*") filter.tenant = *t;
  // The audit log summarizes everything since a time: bucket i is the
  // summary since its start less the one since the next bucket's start.
  // Oldest first, so an attempt logged meanwhile only adds to later sums.
  std::vector<std::map<std::string, Bucket>> since(n + 1);
  for (size_t i = 0; i < n; ++i) {
    filter.since = from + step * static_cast<int64_t>(i);
    auto summary = ledger_.SummarizeAttempts(filter);
    if (!summary) return StoreError(summary.error());
    for (const auto& [tool, stats] : *summary) since[i][tool] = CountOf(stats);
  }
  std::map<std::string, uint64_t> totals;
  for (const auto& [tool, b] : since[0]) totals[tool] = b.answers;
  std::vector<std::pair<uint64_t, std::string>> ranked;
  for (const auto& [tool, total] : totals) ranked.emplace_back(total, tool);
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (ranked.size() > config_.console.chart_tools) ranked.resize(config_.console.chart_tools);
  json::array tools;
  for (const auto& [total, tool] : ranked) {
    json::array points;
    for (size_t i = 0; i < n; ++i) {
      auto at = [&](size_t j) {
        auto it = since[j].find(tool);
        return it == since[j].end() ? Bucket{} : it->second;
      };
      Bucket a = at(i), b = at(i + 1);
      Bucket d{a.answers > b.answers ? a.answers - b.answers : 0,
               a.replays > b.replays ? a.replays - b.replays : 0};
      json::object p;
      p["t"] = ToUnixMillis(from + step * static_cast<int64_t>(i));
      p["answers"] = d.answers;
      p["replays"] = d.replays;
      if (d.answers > 0) {
        p["ratio"] = static_cast<double>(d.replays) / static_cast<double>(d.answers);
      } else {
        p["ratio"] = nullptr;
      }
      points.push_back(std::move(p));
    }
    json::object t;
    t["tool"] = tool;
    t["answers"] = total;
    t["points"] = std::move(points);
    tools.push_back(std::move(t));
  }
  json::object o;
  o["from"] = ToUnixMillis(from);
  o["to"] = ToUnixMillis(now);
  o["bucket_ms"] = step.count();
  o["tools"] = std::move(tools);
  o["more_tools"] = totals.size() > ranked.size();
  return Json(o);
}

http::Response Console::Act(const http::Request& request, std::string_view what) {
  const Operator op{request.principal.tenant, "console", ledger_.instance()};
  boost::system::error_code ec;
  json::value body = json::parse(request.body, ec);
  if (ec || !body.is_object()) return BadRequest("the body must be a JSON object");
  const json::object& o = body.get_object();
  auto target = TargetOf(o, what != "evict");
  if (!target) return std::move(target.error());
  if (what == "evict") {
    if (target->fence) {
      auto got = ledger_.Read(target->id);
      if (!got) return StoreError(got.error());
      if (*got && (*got)->fence != *target->fence) {
        return http::Problem(409, "changed", "The record changed",
                             "idemgate: the record's fence is now " +
                                 std::to_string((*got)->fence) +
                                 ": someone else acted on it; nothing was evicted. Look again");
      }
    }
    std::optional<Error> audit_error;
    auto evicted = ledger_.Evict(target->id, op, &audit_error);
    if (!evicted) return StoreError(evicted.error());
    if (!*evicted) {
      return http::Problem(404, "no-record", "No such record",
                           "idemgate: no record for this key in this tenant; nothing was evicted");
    }
    json::object a;
    a["key"] = target->id.key;
    a["evicted"] = true;
    if (audit_error) a["audit_error"] = audit_error->message;
    return Json(a);
  }
  ResolveRequest req;
  req.id = target->id;
  req.expect_fence = target->fence;
  if (what == "set-outcome") {
    auto cls_name = StringMember(o, "class");
    auto cls = ParseOutcomeClass(cls_name.value_or(""));
    auto text = StringMember(o, "body");
    if (!cls || *cls == OutcomeClass::kTooLarge || !text) {
      return BadRequest(
          "send \"class\" (\"success\" or \"tool_error\") and \"body\" (the outcome as the "
          "front stores it, text)");
    }
    req.outcome = Outcome{*cls, std::move(*text)};
  }
  auto res = ledger_.Resolve(
      req, [this](const std::string& tool) { return config_.PolicyFor(tool); }, op);
  if (!res) return StoreError(res.error());
  return http::ResolutionAnswer(*res, target->id.key, "evict it");
}

}  // namespace idem::console
