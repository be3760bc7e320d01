// The current turn of an agent host, as its prompt hook records it for the
// MCP proxies the same host started (docs/hosts.md, "Prompt hook").
//
// Claude Code and Gemini CLI send no turn id to MCP servers, but both run a
// command on every user prompt (`idemgate hook`), and that command and the
// stdio MCP servers (`idemgate mcp`) are children, directly or through a
// shell, of the same host process. So the hook writes "the current turn of
// host process P" into a small local file and the proxy whose host is P
// reads it for every gated call (the `hook:turn` id source). The link is a
// pid, which means something on this machine only, so the state is a file,
// never the store (which may be remote and shared).
//
// Both sides use these functions, so they always agree on the host and the
// file. Functions with I/O say so; the rest are pure. Safe from any thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::mcp {

// One process as /proc/PID/stat tells it: its parent and its start time
// (field 22, clock ticks since boot), which tells a reused pid apart.
struct ProcStat {
  pid_t ppid = 0;
  uint64_t start_time = 0;
};
// Reads /proc/PID/stat; nullopt if the process is gone (or /proc is not
// there).
std::optional<ProcStat> ReadProcStat(pid_t pid);

// True for the shells a host may run its commands through: sh, dash, bash,
// zsh, ksh, mksh, fish, busybox (a program name, not a path).
bool IsShellName(std::string_view name);

// The host process: from `start` (the caller's getppid()) up, the first
// process whose executable (basename of /proc/PID/exe, else /proc/PID/comm)
// is not a shell; a shell with no parent (pid 1) is the host itself.
struct HostProcess {
  pid_t pid = 0;
  uint64_t start_time = 0;
  // "PID-STARTTIME": what names its turn file.
  std::string Identity() const;
};
// Reads /proc. kUnavailable naming the pid when a process of the walk is
// gone or /proc cannot be read.
Result<HostProcess> FindHostProcess(pid_t start);

// The directory of the turn files: `configured` ([mcp] hook_dir) if not
// empty, else $XDG_RUNTIME_DIR/idemgate when XDG_RUNTIME_DIR is a directory,
// else /tmp/idemgate-UID. Reads the environment and stats one path.
std::string HookDir(std::string_view configured);

// Makes `dir` ready to hold turn files: creates it (mode 0700; its parent
// must exist) if it is missing, then checks that it is a directory, not a
// symbolic link, owned by this process's user and not writable by group or
// others, so that nobody else can plant a turn. kFailedPrecondition saying
// what is wrong and what to do; kUnavailable if it cannot be made or read.
Result<void> PrepareHookDir(const std::string& dir);

// The turn a prompt hook recorded.
struct HookTurn {
  std::string host;        // "claude-code", "gemini-cli" or "unknown"
  std::string session_id;  // the host's session, "" if it gave none
  std::string turn_id;     // never empty
  int64_t at_ms = 0;       // when the hook ran, Unix ms
};

// DIR/turn-IDENTITY.json.
std::string TurnFilePath(std::string_view dir, std::string_view identity);

// The JSON object of a turn file:
// {"host":"…","session_id":"…","turn_id":"…","at_ms":N}.
std::string TurnFileText(const HookTurn& turn);
// Parses a turn file's text; nullopt when it is not that object with a
// non-empty string turn_id (the other members are read if they have the
// right type). Pure.
std::optional<HookTurn> ParseTurnFile(std::string_view text);

// Writes TurnFileText(turn) to TurnFilePath(dir, identity) atomically (a
// temporary file in `dir`, then rename), mode 0600. kUnavailable naming the
// file and errno's text.
Result<void> WriteTurnFile(const std::string& dir, std::string_view identity,
                           const HookTurn& turn);

// The largest turn file ReadTurnFile reads; a longer one is absent.
inline constexpr size_t kMaxTurnFileBytes = 4096;
// The turn in the file at `path`: one open and one read, no stat or
// directory scan, for every gated call. nullopt when it is missing,
// unreadable, a symbolic link, longer than kMaxTurnFileBytes or malformed.
std::optional<HookTurn> ReadTurnFile(const std::string& path);

// Deletes the turn files of `dir` (and left-over temporary files) whose
// host process is gone or whose pid now names another process; returns how
// many. Scans the directory and /proc.
size_t RemoveStaleTurnFiles(const std::string& dir);

// Where the turn of the host that started this process is kept.
struct HostTurnFile {
  std::string dir;       // HookDir, prepared
  std::string identity;  // the host's HostProcess::Identity()
  std::string path;      // TurnFilePath(dir, identity)
};
// FindHostProcess(getppid()), HookDir(configured_dir) and PrepareHookDir:
// the one way the hook and the proxy find the file they share. Their errors.
Result<HostTurnFile> LocateHostTurnFile(std::string_view configured_dir);

// What a prompt hook's stdin says. `input`: the host's JSON (Claude Code's
// UserPromptSubmit: session_id, prompt_id, hook_event_name, …; Gemini CLI's
// BeforeAgent: session_id, hook_event_name, …). The host is told by
// hook_event_name (UserPromptSubmit → claude-code, BeforeAgent →
// gemini-cli, else "unknown"); turn_id is SESSION/PROMPT_ID, or
// SESSION/`random_hex` without a prompt id. kInvalidArgument when `input` is
// not a JSON object. Pure.
Result<HookTurn> TurnFromHookInput(std::string_view input, int64_t now_ms,
                                   std::string_view random_hex);

// 32 random lowercase hex characters.
std::string RandomTurnHex();

}  // namespace idem::mcp
