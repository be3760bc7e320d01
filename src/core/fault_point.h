// Deterministic crash points for the crash campaign (issue #6): the harness
// starts idemgate with IDEMGATE_FAULT_POINT=NAME[@N] and the process SIGKILLs
// itself the N-th time (default the first) it passes point NAME, so a crash
// lands exactly between two steps of a call instead of wherever a timer hits.
//
//   after_claim    the ledger was granted a claim (fresh or taken over)
//   after_send     the front forwarded a gated call to the upstream
//   after_answer   the upstream's answer to a gated call arrived, not yet stored
//   after_persist  the outcome is durable in the store, not yet answered
//   before_reply   the front is about to write the answer to its client
//
// Where each front passes them:
//   every front    after_claim in Ledger::Begin, after_persist in
//                  Ledger::Complete (src/core/ledger.cc).
//   idemgate mcp   after_send once the tools/call is handed to the upstream
//                  transport, after_answer when its response arrived,
//                  before_reply before any answer to a gated call
//                  (src/fronts/mcp/gated_call.cc).
//   idemgate http  after_send once a gated request is completely written to
//                  the upstream (UpstreamRequest::on_written), after_answer
//                  when the upstream's answer (or its too-large head) arrived,
//                  before_reply before any answer to a gated request, fresh or
//                  replayed (src/fronts/http_proxy/reverse_proxy.cc).
//   idemgate serve before_reply before the answer of /v1/calls/begin and
//                  /v1/calls/complete (src/fronts/ledger_api/ledger_api.cc). No after_send
//                  or after_answer: the runtime, not idemgate, calls the tool.
//
// Armed only in the test build's binary: with the CMake option
// IDEM_FAULT_POINTS, main() calls ArmFaultPoints() (src/cli/main.cc, the one
// file the option compiles differently), so that binary and the one the
// package installs link the same objects. Unarmed, FaultPoint returns at
// once and CheckFaultPointSetting refuses to start with the variable set, so
// a packaged binary never silently ignores it.
// Thread-safe.
#pragma once

#include <string_view>

#include "idem/error.h"

namespace idem {

// Lets IDEMGATE_FAULT_POINT act in this process. Call before any other
// thread starts (main()).
void ArmFaultPoints();
// Whether ArmFaultPoints ran: for a hook that exists only to pass a point.
bool FaultPointsArmed();
// SIGKILLs the process if the points are armed and IDEMGATE_FAULT_POINT
// selects this passage of `name`; otherwise returns at once.
void FaultPoint(std::string_view name);

// For main(): kInvalidArgument if IDEMGATE_FAULT_POINT is set but this build
// has no fault points, or it names no known point or a bad count.
Result<void> CheckFaultPointSetting();

}  // namespace idem
