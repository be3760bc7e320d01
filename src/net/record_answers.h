// What the ledger API (`serve`) and the operator console share about records
// and attempts: the query string, a record's fields, what a resolve did or
// why it was refused (idem/resolve.h) as RFC 9457 problems, and the attempt
// log's filter and entries.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <expected>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "idem/record.h"
#include "idem/resolve.h"
#include "net/http_listener.h"

namespace idem::http {

// Percent-decodes one path segment or query value. kInvalidArgument for a
// bad escape.
Result<std::string> PercentDecode(std::string_view s);
// The query string as name → decoded value ('+' is a space).
Result<std::map<std::string, std::string>> ParseQuery(std::string_view q);

// key, tenant, state, tool, turn, fingerprint, fence, created_at,
// lease_expires_at (in progress) or completed_at, expires_at, outcome_class.
boost::json::object RecordJson(const Record& r);

// 200 {"key", "released": true} or {"key", "state": "completed", "expires_at"};
// a refusal: 404 no-record, 409 not-unknown / in-progress / lease-expired /
// changed, 413 too-large. `evict_hint` says how to forget a completed record
// ("DELETE /v1/records/{key}").
Response ResolutionAnswer(const Resolution& res, std::string_view key, std::string_view evict_hint);

// The attempt log's filter from a query: key, tool, outcome, since (a
// duration back from `now`, "1h", or Unix milliseconds), limit (1..max_limit,
// default 100), tenant (the caller's own unless admin; an admin's "*" is
// every tenant). A 400 (or 403 for another tenant) naming the parameter.
std::expected<AttemptFilter, Response> ParseAttemptFilter(
    const std::map<std::string, std::string>& query, const Principal& who, TimePoint now,
    size_t max_limit);

// [{"at", "tenant", "key", "tool", "turn", "outcome", "latency_ms",
//   "instance", "detail"}, ...]
boost::json::array AttemptsJson(const std::vector<Attempt>& attempts);

}  // namespace idem::http
