#include "fronts/ledger_api/ledger_api.h"

#include <boost/json.hpp>
#include <charconv>

#include "core/fault_point.h"
#include "gate/answer.h"
#include "gate/problem_types.h"
#include "idem/canonical_json.h"
#include "idem/key.h"
#include "idem/resolve.h"
#include "json/json_errors.h"
#include "json/json_text.h"
#include "net/http_rules.h"
#include "net/http_server_io.h"
#include "net/record_answers.h"

namespace idem::http {
namespace {

namespace json = boost::json;

template <typename T>
using Answer = std::expected<T, Response>;

Response BadRequest(std::string detail) {
  return Problem(400, "bad-request", "Bad request", "idemgate: " + detail);
}

// The most attempts GET /v1/attempts answers at once (its limit).
constexpr size_t kMaxAttempts = 1000;

Response Json(int status, const json::object& o, std::string_view raw_outcome = {}) {
  Response r;
  r.status = status;
  r.headers.push_back({"Content-Type", "application/json"});
  r.body = json::serialize(o);
  if (!raw_outcome.empty()) {
    // Splice the stored outcome in byte for byte: a round trip through
    // Boost.JSON would round numbers beyond a double.
    r.body.pop_back();
    r.body += o.empty() ? "\"outcome\":" : ",\"outcome\":";
    r.body.append(raw_outcome);
    r.body += '}';
  }
  return r;
}


// The answer while the worker pool is stopping: nothing was done.
Response Stopping() {
  return Problem(503, gate::problem::kStopping, "Stopping", "idemgate is stopping; retry shortly");
}

// Maps a store or ledger error to its answer (STYLE.md: one table per front).
Response FromError(const Error& e, std::string_view key) {
  std::string extra = key.empty() ? std::string() : "\"key\":" + json_text::Quote(key);
  switch (e.code) {
    case ErrorCode::kUnavailable: {
      Response r = Problem(503, gate::problem::kStoreUnavailable, "Store unavailable",
                           // The store's message names hosts and paths (F15).
                           "idemgate: the store cannot be reached; nothing was executed or "
                           "changed. Retry later. (Why is for the operator: /readyz with an "
                           "admin token, and idemgate's log.)",
                           extra);
      r.headers.push_back({"Retry-After", "1"});
      return r;
    }
    case ErrorCode::kAborted:
      return Problem(409, "lost-lease", "Lost the lease",
                     "idemgate: this owner lost the lease: the fence moved on (the lease expired "
                     "and another attempt took the call over, or it was resolved). Do not report "
                     "this outcome as stored. (" +
                         e.message + ")",
                     extra);
    case ErrorCode::kFailedPrecondition:
      return Problem(409, "not-in-progress", "Not in progress",
                     "idemgate: the record is not in progress any more (" + e.message + ")", extra);
    case ErrorCode::kNotFound:
      return Problem(404, "no-record", "No such record",
                     "idemgate: no record for this key in your tenant: never begun, released, "
                     "evicted, or past retention (" +
                         e.message + ")",
                     extra);
    case ErrorCode::kInvalidArgument:
      return BadRequest(e.message);
    case ErrorCode::kResourceExhausted:
      return Problem(413, "too-large", "Too large", "idemgate: " + e.message, extra);
    case ErrorCode::kDeadlineExceeded:
      return Problem(504, "deadline-exceeded", "Deadline exceeded",
                     "idemgate: gave up waiting; the outcome is unknown (" + e.message + ")",
                     extra);
    case ErrorCode::kDataLoss:
    case ErrorCode::kInternal:
      break;
  }
  return Problem(500, "internal", "Internal error", "idemgate: " + e.ToString(), extra);
}

// The answer to a begin that failed (gate::BeginFailureOf, the table every
// front shares): nothing was claimed or run, so no step's answer (FromError's
// 409 lost-lease for kAborted, say) fits.
Response BeginFailed(Error e, std::string_view key) {
  const gate::BeginFailure f = gate::BeginFailureOf(std::move(e));
  const std::string extra = "\"key\":" + json_text::Quote(key);
  const std::string_view type = gate::problem::TypeOf(f.kind);
  if (!f.retryable()) {
    return Problem(500, type, "Claim failed",
                   "idemgate: could not claim the call (" + f.error.ToString() +
                       "), so it must not run. An operator should look at the store.",
                   extra);
  }
  Response r = Problem(503, type, "Store unavailable",
                       "idemgate: the store cannot be reached or the record kept changing; "
                       "nothing was claimed or run. Retry shortly. (" +
                           f.error.message + ")",
                       extra);
  r.headers.push_back({"Retry-After", "1"});
  return r;
}

// A step (release, mark_unknown, heartbeat) that names an unknown record:
// settling it is an admin's act, through resolve (docs/DESIGN.md §8). A
// tenant token could otherwise read the fence from GET /v1/records/{key} and
// release the record, and the next retry would run the action again. One
// step is let through: the owner's own `complete` at the record's fence
// (`stores_at_fence`), which stores what the action did. A retry marks a
// record unknown when the owner's lease lapsed, not when the owner died; the
// owner's late outcome is the truth the record lacks, and refusing it lost
// the action's result (guarantees review F6). It cannot cause a second run.
std::optional<Response> RefusedOnUnknown(const Record& r, bool stores_at_fence = false) {
  if (r.state != RecordState::kUnknown || stores_at_fence) return std::nullopt;
  return Problem(409, gate::problem::kOutcomeUnknown, "Outcome unknown",
                 "idemgate: the record's outcome is unknown (the action may have happened), so "
                 "only an admin settles it: POST /v1/records/{key}/resolve with an admin "
                 "token, or `idemgate resolve " +
                     r.id.key + "`",
                 "\"key\":" + json_text::Quote(r.id.key));
}

// Who began a call through the ledger API: "api." and 16 hex digits of a
// digest of the tenant and the bearer token of `request` (Call::owner_tag).
// Steps are bound to it (security review F9): the fence alone, which
// GET /v1/records shows to every client of the tenant, no longer settles
// another client's call, nor a call of another front (`http`, `mcp`), whose
// owner tokens carry no tag.
std::string OwnerTagOf(const Request& request) {
  std::string_view token;
  if (auto auth = request.FindHeader("Authorization")) token = idem::net::BearerToken(*auth);
  std::string material = request.principal.tenant;
  material.push_back('\n');
  material.append(token);
  return "api." + Sha256Hex(material).substr(0, 16) + ".";
}

// A step on a record whose claim another client made: refused, whatever
// the step's fence. Records with no owner token (taken over after a lapsed
// lease, or written before owner tokens) keep the fence as their only check.
std::optional<Response> RefusedForAnotherOwner(const Record& r, std::string_view owner_tag) {
  if (r.owner.empty() || r.owner.starts_with(owner_tag)) return std::nullopt;
  return Problem(403, "not-your-call", "Not your call",
                 "idemgate: this call was begun by another client (another token, or another "
                 "front such as idemgate http or mcp): only the client that began it can "
                 "complete, release, heartbeat or mark it; an admin settles it through "
                 "POST /v1/records/{key}/resolve or `idemgate resolve " + r.id.key + "`",
                 "\"key\":" + json_text::Quote(r.id.key));
}

// ── Request bodies ──────────────────────────────────────────────────────────

// A JSON object body: parsed for reading, with its members' byte spans for
// the values kept byte for byte (args, outcome).
struct Body {
  std::string text;
  json::object object;
  std::vector<json_text::Member> members;

  const json::value* Find(std::string_view name) const { return object.if_contains(name); }
  // The raw text of member `name` (nullopt if absent).
  std::optional<std::string_view> Raw(std::string_view name) const {
    for (const auto& m : members) {
      if (m.name == name) return m.value.In(text);
    }
    return std::nullopt;
  }
};

bool IsJsonMediaType(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  if (type.size() != 16) return false;
  for (size_t i = 0; i < type.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(type[i])) != "application/json"[i]) return false;
  }
  return true;
}

Answer<Body> ParseBody(Request& request, const Config& config) {
  auto ct = request.FindHeader("Content-Type");
  if (!ct || !IsJsonMediaType(*ct)) {
    return std::unexpected(Problem(415, "unsupported-media-type", "Unsupported media type",
                                   "idemgate: send the body as JSON with Content-Type: "
                                   "application/json"));
  }
  Body body;
  body.text = std::move(request.body);
  json::parse_options opts;
  opts.max_depth = config.limits.max_depth + 2;
  boost::system::error_code ec;
  json::value v = json::parse(body.text, ec, {}, opts);
  if (ec) {
    std::string why = "the body is " + json_text::DescribeJsonError(body.text, ec, opts.max_depth);
    if (ec == json::error::too_deep) {
      why += " (\"args\" may nest limits.max_depth levels; the request adds 2)";
    }
    return std::unexpected(BadRequest(why));
  }
  if (!v.is_object()) return std::unexpected(BadRequest("the body must be a JSON object"));
  auto members = json_text::ObjectMembers(body.text);
  if (!members) return std::unexpected(BadRequest("the body: " + members.error().message));
  for (size_t i = 0; i < members->size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if ((*members)[i].name == (*members)[j].name) {
        return std::unexpected(BadRequest("member \"" + (*members)[i].name +
                                          "\" appears twice in the body; send it once"));
      }
    }
  }
  body.object = std::move(v.get_object());
  body.members = std::move(*members);
  return body;
}

Answer<std::optional<std::string>> OptionalString(const Body& b, std::string_view name) {
  const json::value* v = b.Find(name);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) {
    return std::unexpected(BadRequest("\"" + std::string(name) + "\" must be a string"));
  }
  return std::optional<std::string>(std::string(v->get_string()));
}

Answer<std::string> RequiredString(const Body& b, std::string_view name, std::string_view what) {
  auto s = OptionalString(b, name);
  if (!s) return std::unexpected(s.error());
  if (!*s || (*s)->empty()) {
    return std::unexpected(
        BadRequest("missing \"" + std::string(name) + "\": " + std::string(what)));
  }
  return std::move(**s);
}

Answer<uint64_t> RequiredFence(const Body& b) {
  const json::value* v = b.Find("fence");
  if (v == nullptr) {
    return std::unexpected(BadRequest("missing \"fence\": send the fence begin returned"));
  }
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<uint64_t>(v->get_int64());
  return std::unexpected(
      BadRequest("\"fence\" must be a non-negative integer (the fence begin returned)"));
}

// The key of a step request: checked like a caller-sent key.
Answer<std::string> RequiredKey(const Body& b) {
  auto key = RequiredString(b, "key", "send the key begin returned");
  if (!key) return key;
  if (auto ok = ValidateKey(*key); !ok) {
    return std::unexpected(BadRequest("\"key\": " + ok.error().message));
  }
  return key;
}

// An outcome: {"status": "success" | "error", "result": <any JSON>}.
struct ParsedOutcome {
  OutcomeClass cls = OutcomeClass::kSuccess;
  std::string text;  // the outcome object as sent
};

Answer<ParsedOutcome> RequiredOutcome(const Body& b) {
  const json::value* v = b.Find("outcome");
  constexpr std::string_view kShape =
      "send {\"status\": \"success\" | \"error\", \"result\": <any JSON>}";
  if (v == nullptr)
    return std::unexpected(BadRequest("missing \"outcome\": " + std::string(kShape)));
  if (!v->is_object()) {
    return std::unexpected(BadRequest("\"outcome\" must be an object: " + std::string(kShape)));
  }
  const json::value* status = v->get_object().if_contains("status");
  if (status == nullptr || !status->is_string() ||
      (status->get_string() != "success" && status->get_string() != "error")) {
    return std::unexpected(
        BadRequest("\"outcome.status\" must be \"success\" or \"error\": " + std::string(kShape)));
  }
  for (const auto& [name, value] : v->get_object()) {
    if (name != "status" && name != "result") {
      return std::unexpected(BadRequest("\"outcome\" has an unknown member \"" + std::string(name) +
                                        "\": " + std::string(kShape)));
    }
  }
  ParsedOutcome o;
  o.cls = status->get_string() == "success" ? OutcomeClass::kSuccess : OutcomeClass::kToolError;
  o.text = std::string(*b.Raw("outcome"));
  return o;
}

// Refuses members the endpoint does not know: a typo must not pass silently.
Answer<void> OnlyMembers(const Body& b, std::initializer_list<std::string_view> known) {
  for (const auto& m : b.members) {
    if (std::find(known.begin(), known.end(), m.name) == known.end()) {
      std::string list;
      for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      return std::unexpected(
          BadRequest("unknown member \"" + m.name + "\"; this endpoint takes " + list));
    }
  }
  return {};
}

// ── Records ─────────────────────────────────────────────────────────────────

// Whether `r` was begun in turn mode without a turn id (args mode, kept for
// policy.window): a derived args-mode key for a tool whose mode is turn.
bool TurnFallbackOf(const Record& r, const Config& config) {
  return r.turn.empty() && r.id.key.starts_with("v1a.") &&
         config.ModeFor(r.tool, /*mutating=*/true) == KeyMode::kTurn;
}

// The Call a step (complete, release, ...) acts on, rebuilt from the record
// so that policy, retention and the audit log match what begin used.
Call CallOf(const Record& r, const Config& config) {
  Call c;
  c.id = r.id;
  c.fingerprint = r.fingerprint;
  c.tool = r.tool;
  c.turn = r.turn;
  c.policy = config.PolicyFor(r.tool);
  c.turn_fallback = TurnFallbackOf(r, config);
  c.detail = "ledger api";
  return c;
}

// The decision a step continues: the execution that `fence` owns.
Decision ExecutionOf(const Record& r, uint64_t fence) {
  Decision d;
  d.kind = Decision::Kind::kExecute;
  d.fence = fence;
  d.started_at = r.created_at;
  d.record = r;  // its retention, decided by begin, is the one complete keeps
  return d;
}

// A tool error under `errors = release` is not stored: the record goes.
bool ReleasesOn(const Call& call, OutcomeClass cls) {
  return cls == OutcomeClass::kToolError && call.policy.errors == ErrorPolicy::kRelease;
}

// The answer to a release (or a complete that released).
Response ReleaseAnswer(const RecordId& id, const Result<void>& released) {
  if (!released) return FromError(released.error(), id.key);
  json::object o;
  o["key"] = id.key;
  o["released"] = true;
  return Json(200, o);
}

// The answer to a complete that stored the outcome (or could not).
Response CompleteAnswer(const RecordId& id, const Result<Record>& stored) {
  if (!stored) return FromError(stored.error(), id.key);
  json::object o;
  o["key"] = id.key;
  o["stored"] = true;
  o["state"] = RecordStateName(stored->state);
  if (stored->outcome && stored->outcome->cls == OutcomeClass::kTooLarge) {
    o["too_large"] = true;
  }
  o["expires_at"] = FormatIsoTime(stored->expires_at);
  return Json(200, o);
}

bool HasReplayableOutcome(const Record& r) {
  return r.outcome && r.outcome->cls != OutcomeClass::kTooLarge && !r.outcome->body.empty();
}

Response Forbidden(std::string_view what) {
  return Problem(
      403, "forbidden", "Forbidden",
      "idemgate: " + std::string(what) + " needs an admin token (a [[tenant]] with admin = true)");
}

// The answer to begin that hands the caller the call to run: claimed
// (fenced), or unguarded (the store is down with on_store_down = pass, or
// observe mode).
Response RunAnswer(const Call& call, const Decision& d) {
  json::object o;
  o["decision"] = "execute";
  o["key"] = call.id.key;
  if (d.kind == Decision::Kind::kPassThrough) {
    o["fence"] = 0;
    o["unguarded"] = true;
    if (d.observed) o["observed"] = true;
    return Json(200, o);
  }
  o["fence"] = d.fence;
  o["lease_ms"] = call.policy.lease.count();
  o["lease_expires_at"] = FormatIsoTime(d.record.lease_expires_at);
  if (d.took_over) o["took_over"] = true;
  if (call.turn_fallback) o["turn_fallback"] = true;
  return Json(200, o);
}

// The answer to begin for what the ledger decided (gate::AnswerFor).
Response BeginAnswer(const Call& call, const Decision& d) {
  const gate::Answer a = gate::AnswerFor(d);
  json::object o;
  const std::string key_member = "\"key\":" + json_text::Quote(call.id.key);
  switch (a.kind) {
    case gate::Answer::Kind::kRun:
      return RunAnswer(call, d);
    case gate::Answer::Kind::kReplay:
      // An outcome the ledger API stored is a JSON value, never empty; an
      // empty one (from another front's record) cannot be spliced into JSON.
      if (d.record.outcome->body.empty()) break;
      o["decision"] = "replay";
      o["replayed"] = true;
      o["key"] = call.id.key;
      o["first_at"] = a.first_at;
      o["completed_at"] = FormatIsoTime(d.record.completed_at);
      o["attached"] = d.attached;
      o["drift"] = d.drift;
      if (d.reconciled) o["reconciled"] = true;
      return Json(200, o, d.record.outcome->body);
    case gate::Answer::Kind::kTooLarge:
    case gate::Answer::Kind::kNoOutcome:
      break;
    case gate::Answer::Kind::kInProgress: {
      const std::string secs = std::to_string(a.retry_after_seconds);
      Response p =
          Problem(a.http_status, gate::problem::TypeOf(a.kind), "In progress",
                  "idemgate: an identical call is still running (since " + a.first_at +
                      "). Retry after " + secs + " s to get its outcome; do not run it again",
                  key_member + ",\"retry_after\":" + secs);
      p.headers.push_back({"Retry-After", secs});
      return p;
    }
    case gate::Answer::Kind::kUnknown:
      return Problem(a.http_status, gate::problem::TypeOf(a.kind), "Outcome unknown",
                     "idemgate: an identical call began at " + a.first_at +
                         " and its owner died before reporting an outcome: the action may "
                         "already have happened. Do not repeat it blindly; check, then "
                         "resolve the record (POST /v1/records/{key}/resolve or `idemgate "
                         "resolve`)",
                     key_member);
    case gate::Answer::Kind::kDrift:
      return Problem(a.http_status, gate::problem::TypeOf(a.kind), "Arguments differ",
                     "idemgate: key " + call.id.key + " was first used at " + a.first_at +
                         " with different arguments. Send the original arguments to get "
                         "its outcome, or use a new key for a new action",
                     key_member + ",\"first_at\":" + json_text::Quote(a.first_at));
  }
  // Completed, but nothing this API can replay: a too-large marker, or no
  // outcome at all. The call is not run again either way.
  return Problem(409, gate::problem::kOutcomeTooLarge, "Outcome too large to replay",
                 "idemgate: this call already ran (first at " + a.first_at +
                     ") but its outcome was larger than max_result_bytes, so only a "
                     "marker was stored. Do not run it again; look the result up in "
                     "the tool itself",
                 key_member);
}

// 405 naming what `path` answers.
Response NotAllowed(std::string_view path, std::string_view allow) {
  Response r = Problem(405, "method-not-allowed", "Method not allowed",
                       "idemgate: " + std::string(path) + " answers " + std::string(allow));
  r.headers.push_back({"Allow", std::string(allow)});
  return r;
}

// A begin's "args", byte for byte: "{}" when absent or null.
Answer<std::string_view> ArgsOf(const Body& body) {
  auto raw = body.Raw("args");
  if (!raw || body.Find("args")->is_null()) return std::string_view("{}");
  if (!body.Find("args")->is_object()) {
    return std::unexpected(BadRequest("\"args\" must be a JSON object (the tool's arguments)"));
  }
  return *raw;
}

// A begin's key mode: "mode" when sent, else the tool's configured one; a
// sent key always wins over a tool configured off.
Answer<KeyMode> ModeOf(const Body& body, const std::string& tool, bool has_key,
                       const Config& config) {
  auto name = OptionalString(body, "mode");
  if (!name) return std::unexpected(std::move(name.error()));
  KeyMode mode = config.ModeFor(tool, /*mutating=*/true);
  if (*name) {
    auto parsed = ParseKeyMode(**name);
    if (!parsed || *parsed == KeyMode::kOff) {
      return std::unexpected(BadRequest("\"mode\" must be one of turn, args, fields, explicit; got \"" +
                                        net::PrintableExcerpt(**name, 40) + "\""));
    }
    mode = *parsed;
  }
  if (mode == KeyMode::kOff && has_key) mode = KeyMode::kExplicit;
  return mode;
}

// A begin's "fields" (JSON Pointers), else the tool's [[tool]] rule's.
Answer<std::vector<std::string>> FieldsOf(const Body& body, const std::string& tool,
                                          const Config& config) {
  std::vector<std::string> fields;
  const json::value* f = body.Find("fields");
  if (!f || f->is_null()) {
    if (const ToolRule* rule = config.RuleFor(tool)) fields = rule->fields;
    return fields;
  }
  auto refused = [] {
    return std::unexpected(BadRequest("\"fields\" must be an array of JSON Pointers (\"/email\")"));
  };
  if (!f->is_array()) return refused();
  for (const json::value& p : f->get_array()) {
    if (!p.is_string()) return refused();
    fields.emplace_back(p.get_string());
  }
  return fields;
}

// The call a begin body asks for, or nullopt when its tool is configured off
// (not guarded), or the refusal naming what was wrong.
Answer<std::optional<Call>> PlanBegin(const Body& body, const Principal& who, const Config& config) {
  if (auto ok = OnlyMembers(body, {"turn_id", "tool", "args", "key", "mode", "fields"}); !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  auto tool = RequiredString(body, "tool", "the name of the tool about to run");
  if (!tool) return std::unexpected(std::move(tool.error()));
  auto turn = OptionalString(body, "turn_id");
  if (!turn) return std::unexpected(std::move(turn.error()));
  auto key = OptionalString(body, "key");
  if (!key) return std::unexpected(std::move(key.error()));
  auto args = ArgsOf(body);
  if (!args) return std::unexpected(std::move(args.error()));
  auto mode = ModeOf(body, *tool, key->has_value(), config);
  if (!mode) return std::unexpected(std::move(mode.error()));
  auto fields = FieldsOf(body, *tool, config);
  if (!fields) return std::unexpected(std::move(fields.error()));
  if (*mode == KeyMode::kOff) return std::nullopt;  // configured off: not guarded
  if (*mode == KeyMode::kFields && fields->empty() && !*key) {
    return std::unexpected(
        BadRequest("mode fields needs \"fields\": JSON Pointers into args that "
                   "identify the call, e.g. [\"/email\"] (or a [[tool]] rule)"));
  }
  if (*mode == KeyMode::kExplicit && !*key) {
    return std::unexpected(BadRequest("missing \"key\": tool \"" +
                                      net::PrintableExcerpt(*tool, 80) +
                                      "\" is keyed explicitly (mode explicit); send a key"));
  }
  CanonOptions canon;
  canon.max_bytes = config.limits.max_body_bytes;
  canon.max_depth = config.limits.max_depth;
  auto fingerprint = Fingerprint(*args, canon);
  if (!fingerprint) {
    return std::unexpected(
        BadRequest("\"args\" cannot be fingerprinted: " + fingerprint.error().message));
  }
  std::string key_fingerprint = *fingerprint;
  if (*mode == KeyMode::kFields && !*key) {
    auto selected = FingerprintFields(*args, *fields, canon);
    if (!selected) return std::unexpected(BadRequest("\"fields\": " + selected.error().message));
    key_fingerprint = std::move(*selected);
  }
  auto derived = DeriveKey(KeyInput{*mode, turn->value_or(""), *tool, key_fingerprint, *key});
  if (!derived) {
    return std::unexpected(BadRequest((*key ? "\"key\": " : "") + derived.error().message));
  }
  Call call;
  call.id = RecordId{who.tenant, derived->key};
  call.fingerprint = std::move(*fingerprint);
  call.tool = *tool;
  call.turn = turn->value_or("");
  call.policy = config.PolicyFor(*tool);
  call.turn_fallback = derived->turn_fallback;
  call.detail = *key                     ? "ledger api, explicit key"
                : derived->turn_fallback ? "ledger api, turn fallback: no turn id"
                                         : "ledger api";
  return call;
}

}  // namespace

LedgerApi::LedgerApi(Ledger& ledger, const Config& config, WorkerPool& pool)
    : ledger_(ledger), config_(config), pool_(pool) {}

bool LedgerApi::CompleteWithoutBlocking(const RecordId& id, uint64_t fence,
                                        const std::string& owner_tag,
                                        std::shared_ptr<const Outcome> outcome,
                                        const Responder& respond) {
  auto answer = [respond](Response r) {
    FaultPoint("before_reply");
    respond(std::move(r));
  };
  return ledger_.ReadAsync(
      id, [this, id, fence, owner_tag, outcome, answer,
           respond](Result<std::optional<Record>> got) {
        if (!got) return answer(FromError(got.error(), id.key));
        if (!*got) return answer(FromError(Error{ErrorCode::kNotFound, "no record"}, id.key));
        if (auto refused = RefusedForAnotherOwner(**got, owner_tag)) {
          return answer(std::move(*refused));
        }
        // Alive until CompleteAsync's callback has run.
        auto call = std::make_shared<const Call>(CallOf(**got, config_));
        const bool releases = ReleasesOn(*call, outcome->cls);
        if (auto refused = RefusedOnUnknown(**got, !releases && (*got)->fence == fence)) {
          return answer(std::move(*refused));
        }
        const Decision d = ExecutionOf(**got, fence);
        if (releases) {
          // Rare, and Release may block: a worker's.
          if (!pool_.Submit([this, call, d, id, answer] {
                answer(ReleaseAnswer(id, ledger_.Release(*call, d)));
              })) {
            respond(Stopping());
          }
          return;
        }
        if (ledger_.CompleteAsync(*call, d, *outcome, [call, id, answer](const Result<Record>& r) {
              answer(CompleteAnswer(id, r));
            })) {
          return;
        }
        if (!pool_.Submit([this, call, d, outcome, id, answer] {
              answer(CompleteAnswer(id, ledger_.Complete(*call, d, *outcome)));
            })) {
          respond(Stopping());
        }
      });
}

void LedgerApi::Offload(const Responder& respond, bool before_reply,
                        std::function<Response()> work) {
  if (!pool_.Submit([work = std::move(work), respond, before_reply] {
        Response answer = work();
        if (before_reply) FaultPoint("before_reply");
        respond(std::move(answer));
      })) {
    respond(Stopping());
  }
}

void LedgerApi::Handle(Request request, Responder respond) {
  const std::string_view path = request.path;
  if (path.starts_with("/v1/calls/")) return HandleStep(request, respond);
  if (path.starts_with("/v1/records/")) return HandleRecord(request, respond);
  if (path == "/v1/attempts") return HandleAttempts(request, respond);
  respond(Problem(404, "not-found", "Not found",
                  "idemgate: no such endpoint; the ledger API is under /v1/calls/, /v1/records/ "
                  "and /v1/attempts"));
}

// ── /v1/calls/{step} ────────────────────────────────────────────────────────

void LedgerApi::HandleStep(Request& request, const Responder& respond) {
  const std::string_view step = std::string_view(request.path).substr(10);
  if (step != "begin" && step != "complete" && step != "release" && step != "heartbeat" &&
      step != "mark_unknown") {
    return respond(Problem(404, "not-found", "Not found",
                           "idemgate: no such endpoint; the steps are /v1/calls/begin, "
                           "complete, release, heartbeat and mark_unknown"));
  }
  if (request.method != "POST") return respond(NotAllowed(request.path, "POST"));
  if (step == "begin") return Begin(request, respond);
  FenceStep(std::string(step), request, respond);
}

void LedgerApi::Begin(Request& request, const Responder& respond) {
  auto body = ParseBody(request, config_);
  if (!body) return respond(std::move(body.error()));
  auto planned = PlanBegin(*body, request.principal, config_);
  if (!planned) return respond(std::move(planned.error()));
  if (!*planned) {
    // Configured off: the call is not guarded; the helper runs it as is.
    json::object o;
    o["decision"] = "execute";
    o["unguarded"] = true;
    o["fence"] = 0;
    o["key"] = nullptr;
    return respond(Json(200, o));
  }
  (*planned)->owner_tag = OwnerTagOf(request);
  auto shared = std::make_shared<const Call>(std::move(**planned));
  auto reply = [shared, respond](const Result<Decision>& d) {
    Response r = d ? BeginAnswer(*shared, *d) : BeginFailed(d.error(), shared->id.key);
    FaultPoint("before_reply");
    respond(std::move(r));
  };
  // Without a worker where the store allows (Ledger::BeginWithoutBlocking).
  auto to_pool = [this, respond](std::function<void()> begin) {
    if (!pool_.Submit(std::move(begin))) respond(Stopping());
  };
  ledger_.BeginWithoutBlocking(*shared, to_pool, reply);
}

void LedgerApi::FenceStep(std::string step, Request& request, const Responder& respond) {
  auto parsed = ParseBody(request, config_);
  if (!parsed) return respond(std::move(parsed.error()));
  const Body& body = *parsed;
  if (step == "complete") {
    if (auto ok = OnlyMembers(body, {"key", "fence", "outcome"}); !ok) {
      return respond(std::move(ok.error()));
    }
  } else if (auto ok = OnlyMembers(body, {"key", "fence"}); !ok) {
    return respond(std::move(ok.error()));
  }
  auto key = RequiredKey(body);
  if (!key) return respond(std::move(key.error()));
  auto fence = RequiredFence(body);
  if (!fence) return respond(std::move(fence.error()));
  // complete: the outcome, made once and shared by whichever path stores it.
  std::shared_ptr<Outcome> outcome;
  if (step == "complete") {
    auto o = RequiredOutcome(body);
    if (!o) return respond(std::move(o.error()));
    outcome = std::make_shared<Outcome>(Outcome{o->cls, std::move(o->text)});
  }
  const RecordId id{request.principal.tenant, *key};
  // A complete reads the record and stores the outcome without a worker
  // where the store allows (Ledger::ReadAsync, Ledger::CompleteAsync).
  std::string owner_tag = OwnerTagOf(request);
  if (outcome && CompleteWithoutBlocking(id, *fence, owner_tag, outcome, respond)) return;
  const bool before_reply = step == "complete";
  Offload(respond, before_reply,
          [this, step = std::move(step), id, fence = *fence, owner_tag, outcome] {
            return SettleStep(step, id, fence, owner_tag, outcome);
          });
}

Response LedgerApi::SettleStep(std::string_view step, const RecordId& id, uint64_t fence,
                               const std::string& owner_tag,
                               const std::shared_ptr<Outcome>& outcome) {
  auto got = ledger_.Read(id);
  if (!got) return FromError(got.error(), id.key);
  if (!*got) return FromError(Error{ErrorCode::kNotFound, "no record"}, id.key);
  if (auto refused = RefusedForAnotherOwner(**got, owner_tag)) return std::move(*refused);
  const Call call = CallOf(**got, config_);
  const bool stores = step == "complete" && !ReleasesOn(call, outcome->cls);
  if (auto refused = RefusedOnUnknown(**got, stores && (*got)->fence == fence)) {
    return std::move(*refused);
  }
  const Decision d = ExecutionOf(**got, fence);
  json::object o;
  o["key"] = id.key;
  if (step == "heartbeat") {
    auto until = ledger_.Heartbeat(call, fence);
    if (!until) return FromError(until.error(), id.key);
    o["lease_expires_at"] = FormatIsoTime(*until);
    o["lease_ms"] = call.policy.lease.count();
    return Json(200, o);
  }
  if (step == "release" || (step == "complete" && ReleasesOn(call, outcome->cls))) {
    return ReleaseAnswer(id, ledger_.Release(call, d));
  }
  if (step == "mark_unknown") {
    auto marked = ledger_.MarkUnknown(call, d);
    if (!marked) return FromError(marked.error(), id.key);
    o["state"] = "unknown";
    o["expires_at"] = FormatIsoTime(marked->expires_at);
    return Json(200, o);
  }
  // The asynchronous path declined and dropped its share: the outcome is
  // this step's alone.
  return CompleteAnswer(id, ledger_.Complete(call, d, std::move(*outcome)));
}

// ── /v1/records/{key}[/resolve] ─────────────────────────────────────────────

void LedgerApi::HandleRecord(Request& request, const Responder& respond) {
  const Principal& who = request.principal;
  std::string_view rest = std::string_view(request.path).substr(12);
  bool resolve = false;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (rest.substr(slash) != "/resolve") {
      return respond(Problem(404, "not-found", "Not found",
                             "idemgate: no such endpoint; percent-encode a '/' in the key "
                             "as %2F"));
    }
    resolve = true;
    rest = rest.substr(0, slash);
  }
  auto key = PercentDecode(rest);
  if (!key) return respond(BadRequest(key.error().message));
  if (auto ok = ValidateKey(*key); !ok) return respond(BadRequest("key: " + ok.error().message));
  auto query = ParseQuery(request.query);
  if (!query) return respond(BadRequest(query.error().message));
  std::string tenant = who.tenant;
  if (auto t = query->find("tenant"); t != query->end()) {
    if (!who.admin && t->second != who.tenant) return respond(Forbidden("another tenant's record"));
    tenant = t->second;
  }
  const RecordId id{tenant, *key};
  if (resolve) return Resolve(request, id, respond);
  const std::string& method = request.method;
  if (method == "GET" || method == "HEAD") {
    return Offload(respond, false, [this, id]() -> Response {
      auto got = ledger_.Read(id);
      if (!got) return FromError(got.error(), id.key);
      if (!*got) return FromError(Error{ErrorCode::kNotFound, "no record"}, id.key);
      const Record& r = **got;
      json::object o = RecordJson(r);
      return Json(200, o, HasReplayableOutcome(r) ? std::string_view(r.outcome->body) : "");
    });
  }
  if (method == "DELETE") {
    if (!who.admin) return respond(Forbidden("evicting a record"));
    Operator op{who.tenant, "ledger api", ledger_.instance()};
    return Offload(respond, false, [this, id, op]() -> Response {
      auto evicted = ledger_.Evict(id, op);
      if (!evicted) return FromError(evicted.error(), id.key);
      if (!*evicted) return FromError(Error{ErrorCode::kNotFound, "no record"}, id.key);
      json::object o;
      o["key"] = id.key;
      o["evicted"] = true;
      return Json(200, o);
    });
  }
  respond(NotAllowed(request.path, "GET, DELETE"));
}

void LedgerApi::Resolve(Request& request, const RecordId& id, const Responder& respond) {
  const Principal& who = request.principal;
  if (request.method != "POST") return respond(NotAllowed(request.path, "POST"));
  if (!who.admin) return respond(Forbidden("resolving a record"));
  auto body = ParseBody(request, config_);
  if (!body) return respond(std::move(body.error()));
  if (auto ok = OnlyMembers(*body, {"release", "outcome", "force"}); !ok) {
    return respond(std::move(ok.error()));
  }
  const json::value* release = body->Find("release");
  bool releasing = release && release->is_bool() && release->get_bool();
  if (release && !release->is_bool()) return respond(BadRequest("\"release\" must be true"));
  std::optional<ParsedOutcome> outcome;
  if (body->Find("outcome")) {
    auto o = RequiredOutcome(*body);
    if (!o) return respond(std::move(o.error()));
    outcome = std::move(*o);
  }
  if (releasing == outcome.has_value()) {
    return respond(
        BadRequest("send exactly one of \"release\": true (the action did not "
                   "happen) or \"outcome\" (it happened; its outcome)"));
  }
  const json::value* force_v = body->Find("force");
  if (force_v && !force_v->is_bool()) return respond(BadRequest("\"force\" must be a boolean"));
  ResolveRequest req;
  req.id = id;
  req.force = force_v && force_v->get_bool();
  if (outcome) req.outcome = Outcome{outcome->cls, std::move(outcome->text)};
  Operator op{who.tenant, "ledger api", ledger_.instance()};
  Offload(respond, false, [this, req = std::move(req), op]() -> Response {
    auto res =
        ledger_.Resolve(req, [this](const std::string& tool) { return config_.PolicyFor(tool); }, op);
    if (!res) return FromError(res.error(), req.id.key);
    return ResolutionAnswer(*res, req.id.key, "DELETE /v1/records/{key}");
  });
}

// ── /v1/attempts ────────────────────────────────────────────────────────────

void LedgerApi::HandleAttempts(const Request& request, const Responder& respond) {
  if (request.method != "GET" && request.method != "HEAD") {
    return respond(NotAllowed(request.path, "GET"));
  }
  auto query = ParseQuery(request.query);
  if (!query) return respond(BadRequest(query.error().message));
  auto filter =
      ParseAttemptFilter(*query, request.principal, ledger_.clock().Now(), kMaxAttempts);
  if (!filter) return respond(std::move(filter.error()));
  Offload(respond, false, [this, filter = *filter]() mutable -> Response {
    ledger_.Flush();  // attempts still buffered are part of the answer
    bool cut = false;  // the store stopped before the oldest entry (Redis attempts_scan)
    filter.cut = &cut;
    auto attempts = ledger_.QueryAttempts(filter);
    if (!attempts) return FromError(attempts.error(), "");
    json::object o;
    o["attempts"] = AttemptsJson(*attempts);
    o["truncated"] = cut;
    return Json(200, o);
  });
}

}  // namespace idem::http
