#include "stop_signals.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace idem::cli {

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

const char* StopSignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a stop signal";
  }
}

const char* WaitForStopSignal(const sigset_t& signals) {
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  return StopSignalName(sig);
}

StopSignalWatcher::StopSignalWatcher(const sigset_t& signals,
                                     std::function<void(const char*, bool)> on_signal)
    : signal_fd_(::signalfd(-1, &signals, SFD_CLOEXEC)),
      wake_fd_(::eventfd(0, EFD_CLOEXEC)) {
  if (signal_fd_ < 0 || wake_fd_ < 0) {
    // Without a watcher the signals stay blocked: the process then stops
    // only on its other conditions (for the MCP proxy, the client's end of
    // input), never half-way. Said, since a host's stop would be ignored.
    std::fprintf(stderr, "idemgate: cannot watch for stop signals (%s); they are ignored\n",
                 std::strerror(errno));
    return;
  }
  thread_ = std::thread([this, on_signal = std::move(on_signal)] { Watch(on_signal); });
}

StopSignalWatcher::~StopSignalWatcher() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void StopSignalWatcher::Watch(std::function<void(const char*, bool)> on_signal) {
  bool first = true;
  while (true) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    signalfd_siginfo info{};
    if (::read(signal_fd_, &info, sizeof info) != static_cast<ssize_t>(sizeof info)) continue;
    on_signal(StopSignalName(static_cast<int>(info.ssi_signo)), first);
    first = false;
  }
}

}  // namespace idem::cli
