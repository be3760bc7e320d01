#include "fronts/mcp/child_channel.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace idem::mcp {
namespace {

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

}  // namespace

Result<std::unique_ptr<ChildChannel>> ChildChannel::Spawn(const std::vector<std::string>& argv,
                                                          ChildOptions options) {
  if (argv.empty() || argv[0].empty()) {
    return MakeError(
        ErrorCode::kInvalidArgument,
        "no upstream command: give it after --, e.g. `idemgate mcp -- node server.js`");
  }
  const std::string& command = argv[0];
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) {
    return MakeError(ErrorCode::kUnavailable,
                     "cannot start `" + command + "`: pipe: " + std::strerror(errno));
  }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(in[0]);
    ::close(in[1]);
    return MakeError(ErrorCode::kUnavailable,
                     "cannot start `" + command + "`: pipe: " + std::strerror(err));
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  // Nothing else of ours reaches the child: not other sessions' pipes, and
  // above all not the HTTP listener's sockets. A child holding a client's
  // connection or the listening port would keep both open after idemgate
  // died, so clients would wait for an answer instead of seeing the crash.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  // The child starts with default signal handling and nothing blocked, not
  // with what this process set up for itself (SIGPIPE ignored, say).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGCHLD);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGHUP);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, command.c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  // Our end of the child's stdin is a file description no one else holds:
  // non-blocking, the writer sends without a poll() per message.
  if (rc == 0) ::fcntl(in[1], F_SETFL, ::fcntl(in[1], F_GETFL) | O_NONBLOCK);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return MakeError(ErrorCode::kUnavailable,
                     "cannot start the upstream command `" + command + "`: " + std::strerror(rc));
  }
  return std::unique_ptr<ChildChannel>(
      new ChildChannel(pid, in[1], out[0], command, std::move(options)));
}

ChildChannel::ChildChannel(pid_t pid, int stdin_fd, int stdout_fd, std::string name,
                           ChildOptions options)
    : pid_(pid),
      stdout_fd_(stdout_fd),
      name_(std::move(name)),
      options_(std::move(options)),
      writer_(std::make_unique<FdWriter>(stdin_fd)) {}

ChildChannel::~ChildChannel() {
  {
    std::lock_guard g(mu_);
    stopping_ = true;
    if (!exited_) ::kill(pid_, SIGKILL);  // not reaped yet, so the PID is still the child's
  }
  cv_.notify_all();
  wake_.Wake();
  if (reader_.joinable()) reader_.join();
  if (killer_.joinable()) killer_.join();
  writer_.reset();
  bool reaped;
  {
    std::lock_guard g(mu_);
    reaped = reaped_;
  }
  if (!reaped) Reap();
  ::close(stdout_fd_);
}

void ChildChannel::Log(std::string line) const {
  if (options_.log) options_.log(line);
}

void ChildChannel::Start(std::function<void(std::string message)> on_message,
                         std::function<void(std::string reason)> on_closed) {
  reader_ = std::thread([this, on_message = std::move(on_message),
                         on_closed = std::move(on_closed)] { Read(on_message, on_closed); });
}

void ChildChannel::Read(const std::function<void(std::string)>& on_message,
                        const std::function<void(std::string)>& on_closed) {
  LineFramer framer(options_.max_message_bytes);
  auto on_frame = [&](LineFramer::Frame frame) {
    if (frame.oversize) {
      const std::string limit = std::to_string(framer.max_message_bytes());
      if (frame.has_method || frame.id_text == "null") {
        Log("the upstream `" + name_ + "` sent a message larger than " + limit +
            " bytes; it was dropped");
        return;
      }
      // An answer: the request it answers gets an error in its place, so
      // that its caller is not left waiting (a gated call becomes unknown:
      // ClassOfJsonRpcError takes -32007 as "may have acted").
      Log("the upstream `" + name_ + "` answered request " + frame.id_text +
          " with a message larger than " + limit + " bytes; it was dropped and answered with an "
          "error");
      on_message(ErrorResponse(
          frame.id_text, kRpcAnswerTooLarge,
          "the tool server's answer was larger than " + limit +
              " bytes (max_message_bytes) and was dropped. The tool may have acted: do not "
              "repeat the call blindly; check its effect first."));
      return;
    }
    on_message(std::move(frame.message));
  };
  std::string error;
  ReadEnd end = ReadFrames(stdout_fd_, wake_.read_fd(), framer, on_frame, &error);
  if (end == ReadEnd::kWoken) return;  // being destroyed
  if (end == ReadEnd::kError) Log("cannot read from the upstream `" + name_ + "`: " + error);
  // The child closed its stdout: it can no longer answer. Let it go.
  Close();
  on_closed(Reap());
}

std::string ChildChannel::Reap() {
  siginfo_t info{};
  // WNOWAIT: the child stays a zombie, so its PID cannot be reused while the
  // kill timer might still signal it; exited_ is set before reaping.
  while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) != 0) {
    if (errno != EINTR) {
      std::lock_guard g(mu_);
      exited_ = reaped_ = true;
      cv_.notify_all();
      return "upstream `" + name_ + "` ended (cannot wait for it: " + std::strerror(errno) + ")";
    }
  }
  {
    std::lock_guard g(mu_);
    exited_ = true;
  }
  cv_.notify_all();
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  {
    std::lock_guard g(mu_);
    reaped_ = true;
  }
  if (info.si_code == CLD_EXITED) {
    return "upstream `" + name_ + "` exited with status " + std::to_string(info.si_status);
  }
  return "upstream `" + name_ + "` was killed by " + SignalName(info.si_status);
}

bool ChildChannel::Send(std::string message) {
  return writer_->Send(FrameLine(std::move(message)));
}

void ChildChannel::Close() {
  writer_->Close();
  StartKillTimer();
}

void ChildChannel::StartKillTimer() {
  std::lock_guard g(mu_);
  if (kill_timer_ || stopping_ || exited_) return;
  kill_timer_ = true;
  killer_ = std::thread([this] { KillAfterGrace(); });
}

void ChildChannel::CloseNow() {
  writer_->Close();
  {
    std::lock_guard g(mu_);
    if (stopping_ || exited_ || sigterm_sent_) return;
    ::kill(pid_, SIGTERM);  // exited_ is false under mu_: the PID is still the child's
    sigterm_sent_ = true;
  }
  cv_.notify_all();  // a kill timer started by Close() goes on to SIGKILL
  StartKillTimer();
}

void ChildChannel::KillAfterGrace() {
  std::unique_lock g(mu_);
  auto gone = [&] { return exited_ || stopping_; };
  auto say = [&](int sig) {
    Log("the upstream `" + name_ + "` (pid " + std::to_string(pid_) + ") did not exit within " +
        std::to_string(options_.kill_grace.count()) + " ms; sending " + SignalName(sig));
  };
  // EOF first (Close), SIGTERM after kill_grace unless CloseNow sent it.
  if (!sigterm_sent_) {
    cv_.wait_for(g, options_.kill_grace, [&] { return gone() || sigterm_sent_; });
    if (gone()) return;
    if (!sigterm_sent_) {
      say(SIGTERM);
      ::kill(pid_, SIGTERM);  // exited_ is false under mu_: the PID is still the child's
      sigterm_sent_ = true;
    }
  }
  cv_.wait_for(g, options_.kill_grace, gone);
  if (gone()) return;
  say(SIGKILL);
  ::kill(pid_, SIGKILL);
}

}  // namespace idem::mcp
