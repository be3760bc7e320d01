// A child process as a Channel: the upstream of `idemgate mcp -- CMD ARGS…`
// (MCP stdio transport, server side).
//
// The child gets pipes for stdin and stdout; its stderr is ours, so its logs
// pass through. Close() closes the child's stdin (EOF: MCP servers exit on
// it); a child that has not exited `kill_grace` later gets SIGTERM, and
// SIGKILL after another `kill_grace`. The same happens when the child closes
// its stdout. CloseNow() (idemgate is stopping) sends SIGTERM at once, the
// signal its host would have stopped it with, and SIGKILL `kill_grace` later. The child is reaped and on_closed reports how it ended
// ("upstream `node` exited with status 1"). Signals go to the child's own
// PID only, and never after it has been reaped.
//
// Thread-safe. Reading (and reaping) runs on the channel's own thread.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "fronts/mcp/channel.h"
#include "fronts/mcp/fd_io.h"
#include "fronts/mcp/json_rpc.h"

namespace idem::mcp {

struct ChildOptions {
  // Largest message accepted from the child; a larger one is dropped and
  // logged. Default 64 MiB.
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // How long the child may take to exit after Close() before SIGTERM, and
  // after SIGTERM before SIGKILL (real time). Default 5 s.
  Duration kill_grace{5'000};
  // Log sink for what the child did wrong (dropped messages, signals sent).
  // Called from the channel's threads. Null: silent.
  std::function<void(std::string_view line)> log;
};

class ChildChannel final : public Channel {
 public:
  // Starts `argv` (argv[0] looked up in PATH) with the environment and
  // working directory of this process. kInvalidArgument for an empty argv,
  // kUnavailable (naming the command and the reason) if it cannot be started.
  static Result<std::unique_ptr<ChildChannel>> Spawn(const std::vector<std::string>& argv,
                                                     ChildOptions options = {});
  // Kills the child (SIGKILL) if it is still running, reaps it, joins.
  ~ChildChannel() override;

  pid_t pid() const { return pid_; }

  // Channel:
  void Start(std::function<void(std::string message)> on_message,
             std::function<void(std::string reason)> on_closed) override;
  bool Send(std::string message) override;
  void Close() override;
  void CloseNow() override;

 private:
  ChildChannel(pid_t pid, int stdin_fd, int stdout_fd, std::string name, ChildOptions options);
  void Read(const std::function<void(std::string)>& on_message,
            const std::function<void(std::string)>& on_closed);
  std::string Reap();  // waits for the child to exit, reaps it, says how it ended
  void StartKillTimer();
  void KillAfterGrace();
  void Log(std::string line) const;

  const pid_t pid_;
  const int stdout_fd_;
  const std::string name_;
  const ChildOptions options_;
  std::unique_ptr<FdWriter> writer_;
  WakePipe wake_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool exited_ = false;  // waited for (not yet reaped): the PID is still ours
  bool reaped_ = false;
  bool stopping_ = false;  // destructor
  bool kill_timer_ = false;
  bool sigterm_sent_ = false;  // by CloseNow or the kill timer
  std::thread reader_;
  std::thread killer_;
};

}  // namespace idem::mcp
