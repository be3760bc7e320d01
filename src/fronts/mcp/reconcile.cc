#include "fronts/mcp/reconcile.h"

namespace idem::mcp {
namespace {

thread_local ReconcileLookup* current_lookup = nullptr;

}  // namespace

ReconcileScope::ReconcileScope(ReconcileLookup* lookup) : previous_(current_lookup) {
  current_lookup = lookup;
}

ReconcileScope::~ReconcileScope() { current_lookup = previous_; }

ReconcileHook MakeReconcileHook() {
  return [](const Call& call) -> Result<std::optional<Outcome>> {
    if (current_lookup == nullptr) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "cannot reconcile " + call.id.key +
                           ": the call was not made through an MCP session on this thread");
    }
    return current_lookup->Reconcile(call);
  };
}

}  // namespace idem::mcp
