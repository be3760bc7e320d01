// The ledger's reconcile hook for the MCP proxy (on_unknown = "reconcile",
// docs/DESIGN.md §4 step 4).
//
// LedgerOptions::reconcile is one function per Ledger, but a lookup needs the
// call's own session (to reach its upstream) and forwarded arguments. The
// ledger runs the hook synchronously inside Ledger::Begin, on the thread that
// called Begin, so the session publishes the call's lookup in a thread-local
// ReconcileScope around Begin and the hook finds it there. One Ledger is thus
// shared by every session of the process (one lease keeper, one audit log),
// and a Begin made by another front without a scope gets a clear error (the
// record then stays unknown, which is the safe answer).
#pragma once

#include <optional>

#include "idem/error.h"
#include "idem/ledger.h"
#include "idem/record.h"

namespace idem::mcp {

// Looks up whether the action of one call happened.
class ReconcileLookup {
 public:
  virtual ~ReconcileLookup() = default;
  // The outcome if the action happened, nullopt if it did not, an error if
  // it cannot tell.
  virtual Result<std::optional<Outcome>> Reconcile(const Call& call) = 0;
};

// Publishes `lookup` to MakeReconcileHook() on this thread until destroyed.
// Scopes nest. Not copyable; use on one thread.
class ReconcileScope {
 public:
  explicit ReconcileScope(ReconcileLookup* lookup);
  ~ReconcileScope();
  ReconcileScope(const ReconcileScope&) = delete;
  ReconcileScope& operator=(const ReconcileScope&) = delete;

 private:
  ReconcileLookup* previous_;
};

// The hook to put in LedgerOptions::reconcile for a Ledger that MCP sessions
// use: asks the lookup of the innermost ReconcileScope on the calling thread.
ReconcileHook MakeReconcileHook();

}  // namespace idem::mcp
