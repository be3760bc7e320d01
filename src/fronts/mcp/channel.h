// The transport seam of the MCP proxy (docs/DESIGN.md §6.1): the session logic
// (mcp_session.h) binds one client Channel to one upstream Channel and never
// knows whether bytes travel over stdio, a child's pipes or Streamable HTTP.
#pragma once

#include <functional>
#include <string>

namespace idem::mcp {

// A bidirectional stream of JSON-RPC messages, one JSON text each (no framing
// in the strings). Implementations: the process's own stdio, a child process,
// a Streamable HTTP client session, an upstream Streamable HTTP session.
class Channel {
 public:
  virtual ~Channel() = default;
  // Starts delivering. on_message runs on the channel's own thread, in order of
  // arrival; on_closed runs once, after the last on_message, with a reason
  // ("client closed stdin", "upstream exited with status 1").
  virtual void Start(std::function<void(std::string message)> on_message,
                     std::function<void(std::string reason)> on_closed) = 0;
  // Queues one message for the peer. Thread-safe. False if the channel is closed.
  virtual bool Send(std::string message) = 0;
  // Closes our sending side (EOF to a child's stdin, end of an HTTP session). Idempotent.
  virtual void Close() = 0;
  // Close(), and the peer is not given time to finish on its own: its host
  // is stopping everything (ChildChannel: SIGTERM at once). Default: Close().
  virtual void CloseNow() { Close(); }
};

}  // namespace idem::mcp
