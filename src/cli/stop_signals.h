// How the long-running commands (`mcp`, `serve`, `http`) learn that they
// must stop: SIGINT (Ctrl-C; Claude Code stops its MCP servers with it),
// SIGTERM (Codex, Gemini CLI, the MCP SDKs, systemd, Kubernetes) and SIGHUP
// (the terminal closed), taken by sigwait or a signalfd rather than by a
// handler, so the stop runs as ordinary code on an ordinary thread.
#pragma once

#include <signal.h>

#include <functional>
#include <thread>

namespace idem::cli {

// Blocks the stop signals in the calling thread and returns their set. Call
// it before any thread starts (threads inherit the mask), or the kernel may
// hand a signal to a thread whose default action kills the process without
// a clean stop. Children reset their mask (mcp::ChildChannel).
sigset_t BlockStopSignals();
// Waits for one of `signals` (blocked) and returns its name ("SIGTERM").
const char* WaitForStopSignal(const sigset_t& signals);
// "SIGINT", "SIGTERM", "SIGHUP", or "signal N".
const char* StopSignalName(int sig);

// Calls `on_signal(name, first)` on its own thread for each stop signal that
// arrives (`first` true for the first one) until destroyed; for a command
// that waits for something else too (the MCP proxy on stdio waits for its
// session to end). The signals must be blocked in every thread
// (BlockStopSignals). Not copyable; the destructor joins the thread, so
// `on_signal` must not wait for the watcher's owner.
class StopSignalWatcher {
 public:
  StopSignalWatcher(const sigset_t& signals,
                    std::function<void(const char* name, bool first)> on_signal);
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  void Watch(std::function<void(const char* name, bool first)> on_signal);

  int signal_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd the destructor writes
  std::thread thread_;
};

}  // namespace idem::cli
