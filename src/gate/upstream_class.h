// What an upstream's answer to a forwarded call says about its action: the
// one table every front uses (docs/DESIGN.md §4.7). A front reads its own
// protocol (a JSON-RPC error code, an HTTP status, a reconcile lookup's
// answer) and asks here what it means; Ledger::Settle then stores, releases
// or marks unknown. The README's "What an upstream answer means" table is
// this file.
//
// Pure functions, no state: safe from any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "idem/ledger.h"

namespace idem::gate {

// A JSON-RPC error answering a forwarded request. The four codes a server
// sends before it dispatches to a tool mean it did not run: -32700 (parse
// error), -32600 (invalid request), -32601 (method not found) and -32602
// (invalid params, MCP's "unknown tool"): kNotSent, released so a retry runs.
// Every other code — -32603 (internal error), the server-defined
// -32000..-32099, anything else — may come from inside the tool after its
// side effect: kMaybeSent, the record becomes unknown and on_unknown decides
// the retry. The first caller still gets the server's error as it was.
Execution::Kind ClassOfJsonRpcError(int64_t code);

// An HTTP status answering a forwarded request:
//   2xx, and 303 See Other (the action done, its result elsewhere): kSuccess;
//   408, 409, 423, 425, 429 — the vendor did not act on this request (timed
//   out waiting for it, a conflicting or in-progress request with the same
//   key, locked, too early, rate limited) — and every other 1xx/3xx (a
//   redirect: the action is elsewhere, not done here): kNotSent, released so
//   that the next retry runs, the vendor's answer (Retry-After included)
//   passed through; storing a 429 would replay it for the whole retention;
//   5xx: kMaybeSent (the vendor may have acted before failing);
//   any other 4xx: kToolError, a deterministic refusal, stored and replayed
//   (released under errors = "release").
Execution::Kind ClassOfHttpStatus(int status);

// What a reconcile lookup (on_unknown = "reconcile") answered about an
// action whose outcome is unknown.
enum class LookupVerdict {
  kFound,       // the action happened: its answer becomes the stored outcome
  kNotFound,    // it did not happen: the call executes under the new fence
  kCannotTell,  // an error, a timeout, an unreadable or ambiguous answer: the
                // record stays unknown; it is never read as "did not happen"
};
std::string_view LookupVerdictName(LookupVerdict v);

// An HTTP lookup's status: 2xx found, 404 and 410 not found, anything else
// cannot tell.
LookupVerdict LookupVerdictOfHttpStatus(int status);

}  // namespace idem::gate
