#include "idem/error.h"

namespace idem {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kFailedPrecondition: return "failed_precondition";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kDeadlineExceeded: return "deadline_exceeded";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kDataLoss: return "data_loss";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

std::string Error::ToString() const {
  std::string s(ErrorCodeName(code));
  s += ": ";
  s += message;
  return s;
}

}  // namespace idem
