// What a caller is told when a gated call could not begin: the one table
// every front renders (docs/DESIGN.md §4.7). Nothing ran in any case; what
// differs is whether retrying as is can help.
//
// Pure functions, no state: safe from any thread.
#pragma once

#include "idem/error.h"

namespace idem::gate {

struct BeginFailure {
  enum class Kind {
    kStoreUnavailable,  // the store is down, or the record kept changing (kUnavailable,
                        // kAborted): retry shortly
    kClaimFailed,       // any other error (a corrupt store, a bad record): retrying as is
                        // will fail the same way; an operator looks
    kStopping,          // the front is stopping and took no new work: retry (elsewhere)
  };
  Kind kind = Kind::kStoreUnavailable;
  Error error;
  // Nothing ran and a retry may succeed: kStoreUnavailable and kStopping.
  bool retryable() const { return kind != Kind::kClaimFailed; }
};

// The failure a begin error means.
BeginFailure BeginFailureOf(Error e);

}  // namespace idem::gate
