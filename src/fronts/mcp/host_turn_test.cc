// host_turn.h: the host process found through real shells, the hook
// directory's rules on real directories, and the turn file as the proxy
// reads it (missing, malformed, of the wrong types → absent).
#include "fronts/mcp/host_turn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

extern char** environ;

namespace idem::mcp {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "idem-host-turn-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, std::string_view text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Sets an environment variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// `sh -c SCRIPT` as a child of this test, with its stdin and stdout piped:
// the script prints a pid on its first line and keeps its processes up
// until stdin closes.
class ShellChain {
 public:
  explicit ShellChain(const std::string& script) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    if (::posix_spawn(&pid_, "/bin/sh", &actions, nullptr, const_cast<char**>(argv), environ) != 0) {
      std::abort();
    }
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~ShellChain() {
    ::close(stdin_);  // the leaf (cat) ends, and every shell after it
    int status;
    ::waitpid(pid_, &status, 0);
    ::close(stdout_);
  }
  pid_t pid() const { return pid_; }
  // The number on the script's first line, once the process it names runs
  // cat: a line sent to stdin comes back (no sleep; the exec is done).
  pid_t ReadPid() {
    const pid_t pid = static_cast<pid_t>(std::stol(ReadLine()));
    if (::write(stdin_, "ready\n", 6) != 6 || ReadLine() != "ready") std::abort();
    return pid;
  }

 private:
  std::string ReadLine() {
    std::string line;
    char c;
    while (::read(stdout_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  pid_t pid_ = 0;
  int stdin_ = -1;
  int stdout_ = -1;
};

TEST(HostTurnTest, ProcStatReadsThisProcess) {
  std::optional<ProcStat> self = ReadProcStat(::getpid());
  ASSERT_TRUE(self);
  EXPECT_EQ(self->ppid, ::getppid());
  EXPECT_GT(self->start_time, 0u);
  EXPECT_FALSE(ReadProcStat(0));
}

TEST(HostTurnTest, ShellsAreKnownByProgramName) {
  for (const char* shell : {"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish", "busybox"}) {
    EXPECT_TRUE(IsShellName(shell)) << shell;
  }
  for (const char* other : {"node", "claude", "gemini", "idemgate", "bash5", "/bin/sh", ""}) {
    EXPECT_FALSE(IsShellName(other)) << other;
  }
}

TEST(HostTurnTest, TheWalkSkipsShellsUpToTheHost) {
  // This test → sh → sh → (sh inner.sh, which prints its pid and becomes
  // cat). The `; :` keeps each shell from exec'ing its last command.
  TempDir dir;
  WriteFile(dir / "inner.sh", "echo $$\nexec cat\n");
  ShellChain chain("sh -c 'sh " + (dir / "inner.sh") + "; :'; :");
  const pid_t leaf = chain.ReadPid();
  std::optional<ProcStat> leaf_stat = ReadProcStat(leaf);
  ASSERT_TRUE(leaf_stat);
  const pid_t middle = leaf_stat->ppid;
  ASSERT_NE(middle, chain.pid());

  // From the middle shell (what the hook's getppid() is under `sh -c`), the
  // two shells are skipped: the host is this test process.
  Result<HostProcess> host = FindHostProcess(middle);
  ASSERT_TRUE(host) << host.error().message;
  EXPECT_EQ(host->pid, ::getpid());
  EXPECT_EQ(host->start_time, ReadProcStat(::getpid())->start_time);
  EXPECT_EQ(host->Identity(),
            std::to_string(::getpid()) + "-" + std::to_string(host->start_time));
  // What the proxy computes with its host as parent: the same identity.
  Result<HostProcess> direct = FindHostProcess(::getpid());
  ASSERT_TRUE(direct);
  EXPECT_EQ(direct->Identity(), host->Identity());

  // A process that is not a shell is the host itself (cat here).
  Result<HostProcess> cat = FindHostProcess(leaf);
  ASSERT_TRUE(cat);
  EXPECT_EQ(cat->pid, leaf);
}

TEST(HostTurnTest, BashInTheChainIsAShellToo) {
  if (::access("/bin/bash", X_OK) != 0) GTEST_SKIP() << "no /bin/bash";
  TempDir dir;
  WriteFile(dir / "inner.sh", "echo $$\nexec cat\n");
  ShellChain chain("/bin/bash -c 'sh " + (dir / "inner.sh") + "; :'; :");
  const pid_t leaf = chain.ReadPid();
  Result<HostProcess> host = FindHostProcess(ReadProcStat(leaf)->ppid);
  ASSERT_TRUE(host) << host.error().message;
  EXPECT_EQ(host->pid, ::getpid());
}

TEST(HostTurnTest, AProcessThatIsGoneHasNoHost) {
  ShellChain chain("exit 0");
  const pid_t gone = chain.pid();
  int status;
  ASSERT_EQ(::waitpid(gone, &status, 0), gone);
  Result<HostProcess> host = FindHostProcess(gone);
  ASSERT_FALSE(host);
  EXPECT_EQ(host.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(host.error().message.find("/proc/" + std::to_string(gone)), std::string::npos);
}

TEST(HostTurnTest, HookDirIsTheConfigsElseTheRuntimeDirElseTmp) {
  TempDir runtime;
  EXPECT_EQ(HookDir("/srv/hooks"), "/srv/hooks");
  {
    ScopedEnv env("XDG_RUNTIME_DIR", runtime.path().c_str());
    EXPECT_EQ(HookDir(""), runtime / "idemgate");
  }
  const std::string tmp = "/tmp/idemgate-" + std::to_string(::geteuid());
  {
    ScopedEnv env("XDG_RUNTIME_DIR", (runtime / "missing").c_str());
    EXPECT_EQ(HookDir(""), tmp);
  }
  {
    ScopedEnv env("XDG_RUNTIME_DIR", nullptr);
    EXPECT_EQ(HookDir(""), tmp);
  }
}

TEST(HostTurnTest, TheDirIsCreatedPrivate) {
  TempDir parent;
  const std::string dir = parent / "idemgate";
  ASSERT_TRUE(PrepareHookDir(dir));
  struct stat st{};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(PrepareHookDir(dir)) << "an existing good directory is fine";

  Result<void> no_parent = PrepareHookDir(parent / "no/such");
  ASSERT_FALSE(no_parent);
  EXPECT_NE(no_parent.error().message.find("its parent must exist"), std::string::npos)
      << no_parent.error().message;
}

TEST(HostTurnTest, ADirOthersCanWriteIsRefused) {
  TempDir parent;
  const std::string dir = parent / "open";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  Result<void> open = PrepareHookDir(dir);
  ASSERT_FALSE(open);
  EXPECT_EQ(open.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(open.error().message.find("mode 0777"), std::string::npos) << open.error().message;
  EXPECT_NE(open.error().message.find("chmod 700"), std::string::npos) << open.error().message;
  ASSERT_EQ(::chmod(dir.c_str(), 0720), 0);
  EXPECT_FALSE(PrepareHookDir(dir)) << "group-writable";
}

TEST(HostTurnTest, ASymlinkOrAFileIsRefused) {
  TempDir parent;
  ASSERT_EQ(::mkdir((parent / "real").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((parent / "real").c_str(), (parent / "link").c_str()), 0);
  Result<void> link = PrepareHookDir(parent / "link");
  ASSERT_FALSE(link);
  EXPECT_NE(link.error().message.find("symbolic link"), std::string::npos) << link.error().message;
  WriteFile(parent / "file", "x");
  Result<void> file = PrepareHookDir(parent / "file");
  ASSERT_FALSE(file);
  EXPECT_NE(file.error().message.find("not a directory"), std::string::npos);
}

TEST(HostTurnTest, ADirOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root can give a directory to another user";
  TempDir parent;
  const std::string dir = parent / "theirs";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  Result<void> theirs = PrepareHookDir(dir);
  ASSERT_FALSE(theirs);
  EXPECT_EQ(theirs.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(theirs.error().message.find("owned by uid 65534"), std::string::npos)
      << theirs.error().message;
}

TEST(HostTurnTest, ATurnFileIsWrittenWholeAndPrivateAndReadBack) {
  TempDir dir;
  const HookTurn turn{"claude-code", "sess \"1\"", "sess \"1\"/prompt-7", 1781120000123};
  ASSERT_TRUE(WriteTurnFile(dir.path(), "42-777", turn));
  const std::string path = TurnFilePath(dir.path(), "42-777");
  EXPECT_EQ(path, dir / "turn-42-777.json");
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u) << "no temporary file is left";

  std::optional<HookTurn> read = ReadTurnFile(path);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->host, "claude-code");
  EXPECT_EQ(read->session_id, "sess \"1\"");
  EXPECT_EQ(read->turn_id, "sess \"1\"/prompt-7");
  EXPECT_EQ(read->at_ms, 1781120000123);

  // The next prompt replaces it.
  ASSERT_TRUE(WriteTurnFile(dir.path(), "42-777", HookTurn{"claude-code", "s", "s/p8", 1}));
  EXPECT_EQ(ReadTurnFile(path)->turn_id, "s/p8");
}

TEST(HostTurnTest, AMissingMalformedOrMistypedFileIsAbsent) {
  TempDir dir;
  EXPECT_FALSE(ReadTurnFile(dir / "turn-1-1.json")) << "missing";
  const std::string path = dir / "turn-2-2.json";
  for (const char* bad : {
           "",                                            // empty
           "{\"turn_id\":\"t\"",                          // cut
           "not json",                                    //
           "[\"turn_id\"]",                               // not an object
           "{\"turn_id\":7}",                             // a number
           "{\"turn_id\":null}",                          //
           "{\"turn_id\":\"\"}",                          // empty
           "{\"host\":\"claude-code\"}",                  // no turn
           "{\"turn_id\":\"a\",\"turn_id\":\"b\"}",       // two: nobody knows which
           "{\"turn_id\":\"a\"} {}",                      // trailing data
       }) {
    WriteFile(path, bad);
    EXPECT_FALSE(ReadTurnFile(path)) << bad;
  }
  // Members other than turn_id of the wrong type are read as absent.
  WriteFile(path, R"({"host":3,"session_id":[],"turn_id":"t","at_ms":"x"})");
  std::optional<HookTurn> odd = ReadTurnFile(path);
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->turn_id, "t");
  EXPECT_EQ(odd->host, "unknown");
  EXPECT_EQ(odd->session_id, "");
  EXPECT_EQ(odd->at_ms, 0);
  // Longer than kMaxTurnFileBytes: absent.
  WriteFile(path, "{\"turn_id\":\"" + std::string(kMaxTurnFileBytes, 'x') + "\"}");
  EXPECT_FALSE(ReadTurnFile(path));
  // A symbolic link is not followed.
  WriteFile(dir / "elsewhere.json", R"({"turn_id":"planted"})");
  ASSERT_EQ(::symlink((dir / "elsewhere.json").c_str(), (dir / "turn-3-3.json").c_str()), 0);
  EXPECT_FALSE(ReadTurnFile(dir / "turn-3-3.json"));
}

TEST(HostTurnTest, StaleTurnFilesAreRemoved) {
  TempDir dir;
  const HostProcess self{::getpid(), ReadProcStat(::getpid())->start_time};
  ShellChain gone_chain("exit 0");
  const pid_t gone = gone_chain.pid();
  int status;
  ASSERT_EQ(::waitpid(gone, &status, 0), gone);
  const HookTurn turn{"gemini-cli", "s", "s/x", 1};
  ASSERT_TRUE(WriteTurnFile(dir.path(), self.Identity(), turn));
  // This pid with another start time: the pid was reused since.
  const std::string reused = std::to_string(self.pid) + "-" + std::to_string(self.start_time + 1);
  ASSERT_TRUE(WriteTurnFile(dir.path(), reused, turn));
  ASSERT_TRUE(WriteTurnFile(dir.path(), std::to_string(gone) + "-5", turn));
  WriteFile(dir / ("turn-" + std::to_string(gone) + "-5.json.tmpAbCdEf"), "{");  // a crashed hook's
  WriteFile(dir / "notes.txt", "mine");
  WriteFile(dir / "turn-x-y.json", "{}");

  EXPECT_EQ(RemoveStaleTurnFiles(dir.path()), 3u);
  EXPECT_TRUE(fs::exists(TurnFilePath(dir.path(), self.Identity())));
  EXPECT_FALSE(fs::exists(TurnFilePath(dir.path(), reused)));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "turn-x-y.json"));
  EXPECT_EQ(RemoveStaleTurnFiles(dir / "missing"), 0u);
}

TEST(HostTurnTest, ClaudeCodeInputGivesSessionSlashPromptId) {
  // What Claude Code 2.1 sends on UserPromptSubmit (issue #35).
  Result<HookTurn> turn = TurnFromHookInput(
      R"({"session_id":"3f1c","transcript_path":"/home/u/.claude/projects/x.jsonl","cwd":"/w",)"
      R"("permission_mode":"default","hook_event_name":"UserPromptSubmit","prompt":"charge )"
      R"(cus_7 9.90 EUR\n\"twice\"","prompt_id":"p-0002"})",
      1000, "ab");
  ASSERT_TRUE(turn) << turn.error().message;
  EXPECT_EQ(turn->host, "claude-code");
  EXPECT_EQ(turn->session_id, "3f1c");
  EXPECT_EQ(turn->turn_id, "3f1c/p-0002");
  EXPECT_EQ(turn->at_ms, 1000);
}

TEST(HostTurnTest, GeminiCliInputGivesSessionSlashRandom) {
  // What Gemini CLI 0.61 sends on BeforeAgent: no prompt id.
  Result<HookTurn> turn = TurnFromHookInput(
      R"({"session_id":"g-9","transcript_path":"/t","cwd":"/w","hook_event_name":"BeforeAgent",)"
      R"("timestamp":"2026-06-01T10:00:00.000Z","prompt":"charge it"})",
      5, "0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(turn) << turn.error().message;
  EXPECT_EQ(turn->host, "gemini-cli");
  EXPECT_EQ(turn->turn_id, "g-9/0123456789abcdef0123456789abcdef");
}

TEST(HostTurnTest, OtherInputStillGivesATurn) {
  Result<HookTurn> other = TurnFromHookInput(R"({"hook_event_name":"Stop","session_id":"s"})", 1, "r");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->host, "unknown");
  EXPECT_EQ(other->turn_id, "s/r");
  Result<HookTurn> bare = TurnFromHookInput("{}", 1, "r");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->turn_id, "/r");
  // Ids that are not strings, or absurdly long, are not used.
  Result<HookTurn> odd = TurnFromHookInput(
      R"({"session_id":7,"prompt_id":")" + std::string(300, 'p') + R"("})", 1, "r");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->turn_id, "/r");
}

TEST(HostTurnTest, InputThatIsNotAnObjectIsRefusedWithWhy) {
  for (std::string_view bad : {"", "{\"session_id\":", "[1]", "\"x\"", "{} {}"}) {
    Result<HookTurn> turn = TurnFromHookInput(bad, 1, "r");
    ASSERT_FALSE(turn) << bad;
    EXPECT_EQ(turn.error().code, ErrorCode::kInvalidArgument);
    EXPECT_TRUE(turn.error().message.starts_with("stdin is ")) << turn.error().message;
  }
}

TEST(HostTurnTest, RandomTurnHexIsNewEachTime) {
  const std::string a = RandomTurnHex(), b = RandomTurnHex();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace idem::mcp
