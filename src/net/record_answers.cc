#include "net/record_answers.h"

#include <algorithm>
#include <boost/json.hpp>
#include <charconv>

#include "idem/config.h"
#include "json/json_text.h"
#include "net/http_rules.h"

namespace idem::http {

namespace json = boost::json;

// Percent-decodes one path segment. kInvalidArgument for a bad escape.
Result<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    unsigned v = 0;
    if (i + 3 > s.size()) {
      return MakeError(ErrorCode::kInvalidArgument, "bad percent escape: '%' needs two hex digits");
    }
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || p != s.data() + i + 3) {
      return MakeError(ErrorCode::kInvalidArgument, "bad percent escape: '%' needs two hex digits");
    }
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// The query string as name → decoded value ('+' is a space).
Result<std::map<std::string, std::string>> ParseQuery(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string name(pair.substr(0, eq));
    std::string value(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1));
    std::replace(value.begin(), value.end(), '+', ' ');
    auto decoded = PercentDecode(value);
    if (!decoded) return std::unexpected(decoded.error());
    out[name] = std::move(*decoded);
  }
  return out;
}

std::expected<AttemptFilter, Response> ParseAttemptFilter(
    const std::map<std::string, std::string>& query, const Principal& who, TimePoint now,
    size_t max_limit) {
  auto bad = [](std::string detail) {
    return std::unexpected(Problem(400, "bad-request", "Bad request", "idemgate: " + detail));
  };
  AttemptFilter filter;
  filter.tenant = who.tenant;
  filter.limit = std::min<size_t>(100, max_limit);
  for (const auto& [name, value] : query) {
    if (name == "tenant") {
      if (!who.admin && value != who.tenant) {
        return std::unexpected(Problem(403, "forbidden", "Forbidden",
                                       "idemgate: another tenant's attempts need an admin token "
                                       "(a [[tenant]] with admin = true)"));
      }
      filter.tenant = value;
      if (value == "*" && who.admin) filter.tenant.reset();
    } else if (name == "key") {
      filter.key = value;
    } else if (name == "tool") {
      filter.tool = value;
    } else if (name == "outcome") {
      auto o = ParseAttemptOutcome(value);
      if (!o) {
        return bad(
            "\"outcome\" must be one of executed, replayed, attached, in_progress, drift, "
            "unknown, released, error, would_replay, would_drift, would_wait, would_unknown, "
            "executed_again, claimed, resolved, evicted");
      }
      filter.outcome = *o;
    } else if (name == "since") {
      // A duration back from now ("1h") or Unix milliseconds.
      if (auto d = ParseDuration(value)) {
        filter.since = now - *d;
      } else {
        int64_t ms = 0;
        auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
        if (ec != std::errc() || p != value.data() + value.size()) {
          return bad(
              "\"since\" must be a duration back from now (\"1h\", \"30m\") or Unix "
              "milliseconds");
        }
        filter.since = FromUnixMillis(ms);
      }
    } else if (name == "limit") {
      size_t n = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || n == 0 || n > max_limit) {
        return bad("\"limit\" must be a number from 1 to " + std::to_string(max_limit) +
                   " (default " + std::to_string(filter.limit) + ")");
      }
      filter.limit = n;
    } else {
      return bad("unknown query parameter \"" + idem::net::PrintableExcerpt(name, 40) +
                 "\"; the attempt log takes key, tool, outcome, since, limit, tenant");
    }
  }
  return filter;
}

json::array AttemptsJson(const std::vector<Attempt>& attempts) {
  json::array list;
  for (const Attempt& a : attempts) {
    json::object o;
    o["at"] = FormatIsoTime(a.at);
    o["tenant"] = a.tenant;
    o["key"] = a.key;
    o["tool"] = a.tool;
    o["turn"] = a.turn;
    o["outcome"] = AttemptOutcomeName(a.outcome);
    o["latency_ms"] = a.latency.count();
    o["instance"] = a.instance;
    o["detail"] = a.detail;
    list.push_back(std::move(o));
  }
  return list;
}

json::object RecordJson(const Record& r) {
  json::object o;
  o["key"] = r.id.key;
  o["tenant"] = r.id.tenant;
  o["state"] = RecordStateName(r.state);
  o["tool"] = r.tool;
  o["turn"] = r.turn;
  o["fingerprint"] = r.fingerprint;
  o["fence"] = r.fence;
  o["created_at"] = FormatIsoTime(r.created_at);
  if (r.state == RecordState::kInProgress) {
    o["lease_expires_at"] = FormatIsoTime(r.lease_expires_at);
  } else {
    o["completed_at"] = FormatIsoTime(r.completed_at);
  }
  o["expires_at"] = FormatIsoTime(r.expires_at);
  if (r.outcome) o["outcome_class"] = OutcomeClassName(r.outcome->cls);
  return o;
}

Response ResolutionAnswer(const Resolution& res, std::string_view key,
                          std::string_view evict_hint) {
  const std::string key_member = "\"key\":" + json_text::Quote(key);
  const Record& r = res.record;
  json::object o;
  o["key"] = key;
  switch (res.kind) {
    case Resolution::Kind::kReleased:
      o["released"] = true;
      break;
    case Resolution::Kind::kStored:
      o["state"] = "completed";
      o["expires_at"] = FormatIsoTime(r.expires_at);
      break;
    case Resolution::Kind::kNoRecord:
      return Problem(404, "no-record", "No such record",
                     "idemgate: no record for this key in this tenant: never begun, released, "
                     "evicted, or past retention",
                     key_member);
    case Resolution::Kind::kCompleted:
      return Problem(409, "not-unknown", "Nothing to resolve",
                     "idemgate: the record is completed: retries replay its outcome. To forget "
                     "it, " +
                         std::string(evict_hint),
                     key_member);
    case Resolution::Kind::kRunning:
      return Problem(409, "in-progress", "In progress",
                     "idemgate: the record is in progress and its owner's lease runs until " +
                         FormatIsoTime(r.lease_expires_at) + "; wait for it",
                     key_member);
    case Resolution::Kind::kLeaseExpired:
      return Problem(409, "lease-expired", "Owner presumed dead",
                     "idemgate: the record is in progress but its owner's lease expired at " +
                         FormatIsoTime(r.lease_expires_at) +
                         "; if you know what happened, send again with \"force\": true",
                     key_member);
    case Resolution::Kind::kTooLarge:
      return Problem(413, "too-large", "Outcome too large",
                     "idemgate: the outcome is larger than max_result_bytes (" +
                         std::to_string(res.policy.max_result_bytes) + " bytes)",
                     key_member);
    case Resolution::Kind::kChanged:
      return Problem(409, "changed", "The record changed",
                     "idemgate: the record's fence is now " + std::to_string(r.fence) + " (" +
                         std::string(RecordStateName(r.state)) +
                         "): someone else acted on it; nothing was written. Look again",
                     key_member);
  }
  if (res.audit_error) o["audit_error"] = res.audit_error->message;
  Response out;
  out.status = 200;
  out.headers.push_back({"Content-Type", "application/json"});
  out.body = json::serialize(o);
  return out;
}

}  // namespace idem::http
