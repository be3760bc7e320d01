// The process's own stdin/stdout as a Channel: the client side of
// `idemgate mcp` when an agent host starts it (MCP stdio transport).
//
// Messages are newline-delimited JSON (json_rpc.h). A message over the size
// limit is dropped unread (never held in memory whole) and answered with a
// JSON-RPC error that names the limit and its setting (with the message's id
// when it comes before the limit, else null). stdout
// carries only MCP messages: the channel writes through its own copy of
// fd 1 and, by default, points fd 1 at stderr, so a stray write to stdout
// by any library lands in the log instead of corrupting the stream.
//
// Thread-safe. Reading runs on the channel's own thread, writing on another.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "fronts/mcp/channel.h"
#include "fronts/mcp/fd_io.h"
#include "fronts/mcp/json_rpc.h"

namespace idem::mcp {

struct StdioOptions {
  // Largest message accepted from the client: [limits] max_body_bytes,
  // which the error for a larger message names. Default 1 MiB, that
  // setting's default.
  size_t max_message_bytes = size_t{1} << 20;
  // Point fd 1 at stderr once the channel holds its own copy of stdout.
  // Default true.
  bool protect_stdout = true;
  // File descriptors to use instead of 0 and 1 (tests). The channel reads
  // in_fd (not closing it) and takes a copy of out_fd.
  int in_fd = 0;
  int out_fd = 1;
};

class StdioChannel final : public Channel {
 public:
  explicit StdioChannel(StdioOptions options = {});
  // Gives a Close() in progress up to 2 s to finish writing, then stops.
  ~StdioChannel() override;

  // Channel:
  // on_closed reasons: "client closed stdin", "cannot read stdin: ...".
  void Start(std::function<void(std::string message)> on_message,
             std::function<void(std::string reason)> on_closed) override;
  bool Send(std::string message) override;
  // Flushes what is queued, then closes our stdout (EOF to the client).
  void Close() override;

 private:
  const StdioOptions options_;
  std::unique_ptr<FdWriter> writer_;
  WakePipe wake_;
  std::thread reader_;
};

}  // namespace idem::mcp
