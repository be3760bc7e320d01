#include "gate/begin_failure.h"

#include <utility>

namespace idem::gate {

BeginFailure BeginFailureOf(Error e) {
  // kAborted at begin is Begin giving up on a record that kept changing under
  // it, not a lost lease: nothing was claimed, so it is as retryable as a
  // store that did not answer.
  const bool retry = e.code == ErrorCode::kUnavailable || e.code == ErrorCode::kAborted;
  return {retry ? BeginFailure::Kind::kStoreUnavailable : BeginFailure::Kind::kClaimFailed,
          std::move(e)};
}

}  // namespace idem::gate
