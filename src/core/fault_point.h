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
// Compiled in only with the CMake option IDEM_FAULT_POINTS (the test build);
// elsewhere FaultPoint is empty and CheckFaultPointSetting refuses to start
// with the variable set, so a release binary never silently ignores it.
// Thread-safe.
#pragma once

#include <string_view>

#include "idem/error.h"

namespace idem {

#ifdef IDEM_FAULT_POINTS
// SIGKILLs the process if IDEMGATE_FAULT_POINT selects this passage of `name`.
void FaultPoint(std::string_view name);
#else
inline void FaultPoint(std::string_view) {}
#endif

// For main(): kInvalidArgument if IDEMGATE_FAULT_POINT is set but this build
// has no fault points, or it names no known point or a bad count.
Result<void> CheckFaultPointSetting();

}  // namespace idem
