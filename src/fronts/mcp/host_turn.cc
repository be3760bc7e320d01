#include "fronts/mcp/host_turn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/hex.h"
#include "json/json_text.h"

namespace idem::mcp {
namespace {

// Host ids longer than this are not used (a turn file stays small).
constexpr size_t kMaxHookIdBytes = 256;
// Ancestors walked at most (a loop of shells this deep is not a host's).
constexpr int kMaxWalk = 64;

std::string ErrnoText(int err) { return std::strerror(err); }

// The whole of a small file, or nullopt.
std::optional<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  while (text.size() <= limit) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// The program a process runs: the basename of /proc/PID/exe (without the
// " (deleted)" of a replaced binary), else its comm (readable for processes
// of other users, whose exe link is not).
std::string ProgramName(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::array<char, 4096> link{};
  ssize_t n = ::readlink((base + "/exe").c_str(), link.data(), link.size() - 1);
  if (n > 0) {
    std::string_view path(link.data(), static_cast<size_t>(n));
    if (path.ends_with(" (deleted)")) path.remove_suffix(10);
    if (size_t slash = path.rfind('/'); slash != std::string_view::npos) path.remove_prefix(slash + 1);
    return std::string(path);
  }
  std::optional<std::string> comm = ReadSmallFile(base + "/comm", 64);
  if (!comm) return "";
  while (!comm->empty() && comm->back() == '\n') comm->pop_back();
  return *comm;
}

template <typename T>
bool ParseNumber(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

// "turn-PID-START.json…" → the host it names; nullopt for other names.
std::optional<HostProcess> HostOfFileName(std::string_view name) {
  if (!name.starts_with("turn-")) return std::nullopt;
  name.remove_prefix(5);
  const size_t dash = name.find('-');
  const size_t dot = name.find(".json");
  if (dash == std::string_view::npos || dot == std::string_view::npos || dot < dash) return std::nullopt;
  HostProcess host;
  if (!ParseNumber(name.substr(0, dash), host.pid) ||
      !ParseNumber(name.substr(dash + 1, dot - dash - 1), host.start_time)) {
    return std::nullopt;
  }
  return host;
}

Error DirError(ErrorCode code, const std::string& dir, std::string_view why) {
  return Error{code, "the hook directory " + dir + " " + std::string(why)};
}

}  // namespace

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  std::optional<std::string> text = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!text) return std::nullopt;
  // "PID (COMM) STATE PPID … STARTTIME …": COMM may hold spaces and ')', so
  // fields are counted after the last ')'. STATE is field 3, STARTTIME 22.
  const size_t paren = text->rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(*text).substr(paren + 1);
  std::array<std::string_view, 20> fields;  // fields 3..22
  size_t count = 0;
  while (count < fields.size()) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    if (rest.empty()) break;
    const size_t end = std::min(rest.find(' '), rest.size());
    fields[count++] = rest.substr(0, end);
    rest.remove_prefix(end);
  }
  ProcStat stat;
  if (count < fields.size() || !ParseNumber(fields[1], stat.ppid) ||
      !ParseNumber(fields[19], stat.start_time)) {
    return std::nullopt;
  }
  return stat;
}

bool IsShellName(std::string_view name) {
  for (std::string_view shell : {"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish", "busybox"}) {
    if (name == shell) return true;
  }
  return false;
}

std::string HostProcess::Identity() const {
  return std::to_string(pid) + "-" + std::to_string(start_time);
}

Result<HostProcess> FindHostProcess(pid_t start) {
  pid_t pid = start;
  for (int step = 0; step < kMaxWalk; ++step) {
    std::optional<ProcStat> stat = ReadProcStat(pid);
    if (!stat) {
      return MakeError(ErrorCode::kUnavailable,
                       "cannot read /proc/" + std::to_string(pid) +
                           "/stat to find the agent host (the process is gone, or /proc is "
                           "not mounted)");
    }
    if (!IsShellName(ProgramName(pid)) || stat->ppid <= 0) return HostProcess{pid, stat->start_time};
    pid = stat->ppid;
  }
  return MakeError(ErrorCode::kUnavailable, "more than " + std::to_string(kMaxWalk) +
                                                " shells above process " + std::to_string(start) +
                                                ": no agent host found");
}

std::string HookDir(std::string_view configured) {
  if (!configured.empty()) return std::string(configured);
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && *runtime != '\0') {
    struct stat st{};
    if (::stat(runtime, &st) == 0 && S_ISDIR(st.st_mode)) return std::string(runtime) + "/idemgate";
  }
  return "/tmp/idemgate-" + std::to_string(::geteuid());
}

Result<void> PrepareHookDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return std::unexpected(DirError(ErrorCode::kUnavailable, dir,
                                    "cannot be created: " + ErrnoText(errno) +
                                        " (its parent must exist; set [mcp] hook_dir)"));
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) {
    return std::unexpected(
        DirError(ErrorCode::kUnavailable, dir, "cannot be read: " + ErrnoText(errno)));
  }
  if (S_ISLNK(st.st_mode)) {
    return std::unexpected(DirError(ErrorCode::kFailedPrecondition, dir,
                                    "is a symbolic link; remove it, or set [mcp] hook_dir to a "
                                    "directory of your own"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return std::unexpected(DirError(ErrorCode::kFailedPrecondition, dir,
                                    "is not a directory; remove it, or set [mcp] hook_dir"));
  }
  if (st.st_uid != ::geteuid()) {
    return std::unexpected(DirError(
        ErrorCode::kFailedPrecondition, dir,
        "is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
            std::to_string(::geteuid()) +
            "), so another user could plant turns in it; set [mcp] hook_dir to a directory of "
            "your own"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::unexpected(DirError(ErrorCode::kFailedPrecondition, dir,
                                    std::string("is writable by group or others (mode ") + mode +
                                        "); run chmod 700 on it"));
  }
  return {};
}

std::string TurnFilePath(std::string_view dir, std::string_view identity) {
  std::string path(dir);
  path += "/turn-";
  path += identity;
  path += ".json";
  return path;
}

std::string TurnFileText(const HookTurn& turn) {
  return "{\"host\":" + json_text::Quote(turn.host) +
         ",\"session_id\":" + json_text::Quote(turn.session_id) +
         ",\"turn_id\":" + json_text::Quote(turn.turn_id) +
         ",\"at_ms\":" + std::to_string(turn.at_ms) + "}\n";
}

std::optional<HookTurn> ParseTurnFile(std::string_view text) {
  // Read per gated call: the members are found in one pass (a lookup by
  // name per member scanned the object four times: 7 600 instructions per
  // read against 5 600, bench/mcp/instructions.py --cases hook). A member
  // sent twice makes the file malformed.
  if (!json_text::Validate(text, 2) || !json_text::IsObject(text)) return std::nullopt;
  Result<std::vector<json_text::Member>> members = json_text::ObjectMembers(text);
  if (!members) return std::nullopt;
  HookTurn turn;
  turn.host = "unknown";
  unsigned seen = 0;
  for (const json_text::Member& m : *members) {
    static constexpr std::array<std::string_view, 4> kNames = {"turn_id", "host", "session_id",
                                                               "at_ms"};
    const auto at = std::find(kNames.begin(), kNames.end(), m.name);
    if (at == kNames.end()) continue;
    const unsigned bit = 1u << (at - kNames.begin());
    if ((seen & bit) != 0) return std::nullopt;
    seen |= bit;
    const json_text::View value(m.value.In(text));
    if (at == kNames.begin()) {
      turn.turn_id = value.string().value_or("");
    } else if (m.name == "host") {
      turn.host = value.string().value_or("unknown");
    } else if (m.name == "session_id") {
      turn.session_id = value.string().value_or("");
    } else {
      turn.at_ms = value.int64().value_or(0);
    }
  }
  if (turn.turn_id.empty()) return std::nullopt;
  return turn;
}

Result<void> WriteTurnFile(const std::string& dir, std::string_view identity,
                           const HookTurn& turn) {
  const std::string path = TurnFilePath(dir, identity);
  std::string temp = path + ".tmpXXXXXX";
  const int fd = ::mkstemp(temp.data());  // mode 0600
  if (fd < 0) {
    return MakeError(ErrorCode::kUnavailable,
                     "cannot create a file in " + dir + ": " + ErrnoText(errno));
  }
  const std::string text = TurnFileText(turn);
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    return MakeError(ErrorCode::kUnavailable, "cannot write " + path + ": " + ErrnoText(err));
  }
  return {};
}

std::optional<HookTurn> ReadTurnFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  // One read: the hook writes the file whole and renames it in place, and a
  // regular file that fits the buffer comes back in one read.
  char buf[kMaxTurnFileBytes + 1];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0 || static_cast<size_t>(n) > kMaxTurnFileBytes) return std::nullopt;
  return ParseTurnFile(std::string_view(buf, static_cast<size_t>(n)));
}

size_t RemoveStaleTurnFiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  while (const dirent* entry = ::readdir(d)) {
    std::optional<HostProcess> host = HostOfFileName(entry->d_name);
    if (!host) continue;
    std::optional<ProcStat> stat = ReadProcStat(host->pid);
    if (stat && stat->start_time == host->start_time) continue;  // its host is still there
    if (::unlinkat(::dirfd(d), entry->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

Result<HostTurnFile> LocateHostTurnFile(std::string_view configured_dir) {
  Result<HostProcess> host = FindHostProcess(::getppid());
  if (!host) return std::unexpected(host.error());
  HostTurnFile file;
  file.dir = HookDir(configured_dir);
  if (auto ok = PrepareHookDir(file.dir); !ok) return std::unexpected(ok.error());
  file.identity = host->Identity();
  file.path = TurnFilePath(file.dir, file.identity);
  return file;
}

Result<HookTurn> TurnFromHookInput(std::string_view input, int64_t now_ms,
                                   std::string_view random_hex) {
  if (auto ok = json_text::Validate(input, 64); !ok) {
    return MakeError(ErrorCode::kInvalidArgument, "stdin is " + ok.error().message);
  }
  const json_text::View hook(input);
  if (!hook.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string("stdin is ") + hook.KindName() + ", not the host's JSON object");
  }
  auto id = [&hook](std::string_view name) {
    std::optional<std::string> v = hook[name].string();
    return v && v->size() <= kMaxHookIdBytes ? std::move(*v) : std::string();
  };
  HookTurn turn;
  const std::string event = hook["hook_event_name"].string().value_or("");
  turn.host = event == "UserPromptSubmit" ? "claude-code"
              : event == "BeforeAgent"    ? "gemini-cli"
                                          : "unknown";
  turn.session_id = id("session_id");
  const std::string prompt = id("prompt_id");
  turn.turn_id = turn.session_id + "/" + (prompt.empty() ? std::string(random_hex) : prompt);
  turn.at_ms = now_ms;
  return turn;
}

std::string RandomTurnHex() {
  // std::random_device reads getrandom(2) on Linux; a turn id must be new,
  // not secret.
  std::random_device random;
  unsigned char bytes[16];
  for (size_t i = 0; i < sizeof bytes; i += 4) {
    const uint32_t word = random();
    std::memcpy(bytes + i, &word, 4);
  }
  return LowerHex(bytes, sizeof bytes);
}

}  // namespace idem::mcp
