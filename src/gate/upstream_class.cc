#include "gate/upstream_class.h"

namespace idem::gate {

Execution::Kind ClassOfJsonRpcError(int64_t code) {
  switch (code) {
    case -32700:  // parse error
    case -32600:  // invalid request
    case -32601:  // method not found
    case -32602:  // invalid params (MCP: unknown tool, arguments refused)
      return Execution::Kind::kNotSent;
    default:
      return Execution::Kind::kMaybeSent;
  }
}

Execution::Kind ClassOfHttpStatus(int status) {
  if ((status >= 200 && status < 300) || status == 303) return Execution::Kind::kSuccess;
  if (status >= 500) return Execution::Kind::kMaybeSent;
  switch (status) {
    case 408:  // Request Timeout: the vendor gave up waiting for the request
    case 409:  // Conflict: the key's first request still in progress (IETF Idempotency-Key)
    case 423:  // Locked
    case 425:  // Too Early
    case 429:  // Too Many Requests
      return Execution::Kind::kNotSent;
    default:
      break;
  }
  if (status < 400) return Execution::Kind::kNotSent;  // 1xx, a redirect
  return Execution::Kind::kToolError;
}

std::string_view LookupVerdictName(LookupVerdict v) {
  switch (v) {
    case LookupVerdict::kFound:
      return "found";
    case LookupVerdict::kNotFound:
      return "not found";
    case LookupVerdict::kCannotTell:
      return "cannot tell";
  }
  return "cannot tell";
}

LookupVerdict LookupVerdictOfHttpStatus(int status) {
  if (status >= 200 && status < 300) return LookupVerdict::kFound;
  if (status == 404 || status == 410) return LookupVerdict::kNotFound;
  return LookupVerdict::kCannotTell;
}

}  // namespace idem::gate
