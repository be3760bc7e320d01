// Errors as values. Every fallible call on the request path returns
// idem::Result<T>; the code tells the caller what to do next.
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace idem {

enum class ErrorCode {
  kInvalidArgument,    // the input is wrong; fix it and send again (never retry as is)
  kNotFound,           // no such record / key
  kFailedPrecondition, // the record is not in a state that allows this (e.g. resolve a completed record)
  kAborted,            // the fence moved on: this owner lost its claim and must not write
  kUnavailable,        // the store could not be reached; safe to retry later
  kDeadlineExceeded,   // gave up waiting; the outcome is UNKNOWN, never "did not happen"
  kResourceExhausted,  // a configured limit was hit (size, depth, connections)
  kDataLoss,           // the store's data is corrupt or unreadable
  kInternal,           // a bug or an impossible state
};

// Returns the lower-case name of a code ("unavailable"), stable for logs and APIs.
std::string_view ErrorCodeName(ErrorCode code);

struct Error {
  ErrorCode code;
  std::string message;  // says what was wrong and what to do; never contains stored outcomes
  // kUnavailable only: the request never reached the store (no connection
  // could be made), so nothing was written. Contention, a lost reply or a
  // replica short of a write leave it false: something may have been.
  // on_store_down = "pass" runs a call unguarded only when this is true.
  bool unreached = false;

  // True if the caller may retry the same request later and expect it to work.
  bool retryable() const { return code == ErrorCode::kUnavailable; }
  std::string ToString() const;
};

template <typename T>
using Result = std::expected<T, Error>;

inline std::unexpected<Error> MakeError(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

}  // namespace idem
