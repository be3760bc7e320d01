// The pure edits of `idemgate install` on the hosts' own settings text.
#include "host_settings.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <string>

namespace idem::cli {
namespace {

namespace json = boost::json;

constexpr const char* kIdemgate = "/opt/idem/bin/idemgate";

ServerEdit Install(std::vector<std::string> servers = {}, std::vector<std::string> options = {}) {
  return {InstallAction::kInstall, std::move(servers), kIdemgate, std::move(options)};
}
ServerEdit Uninstall(std::vector<std::string> servers = {}) {
  return {InstallAction::kUninstall, std::move(servers), kIdemgate, {}};
}
HookEdit Hook(HookHost host, InstallAction action = InstallAction::kInstall) {
  return {action, host, HookCommand(kIdemgate, {})};
}

// As `claude mcp add` writes ~/.claude.json (2-space JSON, no final newline).
constexpr const char* kClaudeJson = R"({
  "numStartups": 3,
  "mcpServers": {
    "pay": {
      "type": "stdio",
      "command": "node",
      "args": [
        "server.js",
        "--port=0"
      ],
      "env": {
        "TOKEN": "x"
      }
    },
    "files": {
      "command": "npx",
      "args": []
    },
    "remote": {
      "type": "http",
      "url": "https://example.com/mcp"
    }
  },
  "ratio": 0.25,
  "userID": "abc"
})";

json::value Parse(const std::string& text) { return json::parse(text); }

TEST(HostSettingsJson, WrapsEveryStdioServerAndKeepsTheRest) {
  Result<EditOutcome> out = EditJsonServers(kClaudeJson, Install(), "~/.claude.json");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_TRUE(out->changed);
  json::value v = Parse(out->text);
  const json::object& pay = v.at("mcpServers").at("pay").as_object();
  EXPECT_EQ(pay.at("command"), kIdemgate);
  EXPECT_EQ(pay.at("args"), (json::array{"mcp", "--", "node", "server.js", "--port=0"}));
  EXPECT_EQ(pay.at("type"), "stdio");
  EXPECT_EQ(pay.at("env").at("TOKEN"), "x");
  EXPECT_EQ(v.at("mcpServers").at("files").at("args"), (json::array{"mcp", "--", "npx"}));
  // The HTTP server is left, with a note that says how to front it.
  EXPECT_EQ(v.at("mcpServers").at("remote"), Parse(kClaudeJson).at("mcpServers").at("remote"));
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_NE(out->notes[0].find("\"remote\" is reached over HTTP"), std::string::npos);
  EXPECT_NE(out->notes[0].find("idemgate mcp --listen"), std::string::npos);
  // Other keys, their order and the layout (2 spaces, no final newline) as they were.
  EXPECT_EQ(v.at("numStartups"), 3);
  EXPECT_EQ(v.at("ratio"), 0.25);
  std::vector<std::string> keys;
  for (const auto& m : v.as_object()) keys.emplace_back(m.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"numStartups", "mcpServers", "ratio", "userID"}));
  EXPECT_TRUE(out->text.starts_with("{\n  \"numStartups\": 3,\n  \"mcpServers\": {\n    \"pay\""));
  EXPECT_TRUE(out->text.ends_with("\n  \"ratio\": 0.25,\n  \"userID\": \"abc\"\n}"));
}

TEST(HostSettingsJson, WrapsOnlyTheNamedServerWithTheOptions) {
  Result<EditOutcome> out =
      EditJsonServers(kClaudeJson, Install({"files"}, {"--store", "sqlite:/s.db"}), "f");
  ASSERT_TRUE(out) << out.error().message;
  json::value v = Parse(out->text);
  EXPECT_EQ(v.at("mcpServers").at("pay").at("command"), "node");
  EXPECT_EQ(v.at("mcpServers").at("files").at("args"),
            (json::array{"mcp", "--store", "sqlite:/s.db", "--", "npx"}));
  EXPECT_TRUE(out->notes.empty());
}

TEST(HostSettingsJson, SecondInstallChangesNothing) {
  Result<EditOutcome> first = EditJsonServers(kClaudeJson, Install(), "f");
  ASSERT_TRUE(first);
  Result<EditOutcome> second = EditJsonServers(first->text, Install(), "f");
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->changed);
  EXPECT_EQ(second->text, first->text);
}

TEST(HostSettingsJson, AServerWrappedByAnotherIdemgateIsLeft) {
  std::string text =
      R"({"mcpServers":{"a":{"command":"/usr/bin/idemgate","args":["mcp","--","x"]}}})";
  Result<EditOutcome> out = EditJsonServers(text, Install(), "f");
  ASSERT_TRUE(out);
  EXPECT_FALSE(out->changed);
  EXPECT_EQ(out->text, text);
}

TEST(HostSettingsJson, UninstallRestoresTheOriginalText) {
  Result<EditOutcome> wrapped =
      EditJsonServers(kClaudeJson, Install({}, {"--config", "/c.toml"}), "f");
  ASSERT_TRUE(wrapped);
  Result<EditOutcome> restored = EditJsonServers(wrapped->text, Uninstall(), "f");
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_TRUE(restored->changed);
  EXPECT_EQ(restored->text, kClaudeJson);  // already 2-space: byte for byte
  Result<EditOutcome> again = EditJsonServers(restored->text, Uninstall(), "f");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->changed);
}

TEST(HostSettingsJson, UninstallOfOneServerLeavesTheOthersWrapped) {
  Result<EditOutcome> wrapped = EditJsonServers(kClaudeJson, Install(), "f");
  ASSERT_TRUE(wrapped);
  Result<EditOutcome> out = EditJsonServers(wrapped->text, Uninstall({"pay"}), "f");
  ASSERT_TRUE(out);
  json::value v = Parse(out->text);
  EXPECT_EQ(v.at("mcpServers").at("pay"), Parse(kClaudeJson).at("mcpServers").at("pay"));
  EXPECT_EQ(v.at("mcpServers").at("files").at("command"), kIdemgate);
}

TEST(HostSettingsJson, ValuesRoundTripThroughAnyLayout) {
  // Compact JSON with escapes and numbers: the values return, the layout
  // becomes the hosts' 2-space one.
  std::string text =
      "{\"a\":[1,-2,1.5e300,true,null,\"\\u00e9\\n\"],\"mcpServers\":{\"s\":"
      "{\"command\":\"c\",\"args\":[\"x y\"],\"timeout\":600000}}}\n";
  Result<EditOutcome> wrapped = EditJsonServers(text, Install(), "f");
  ASSERT_TRUE(wrapped);
  Result<EditOutcome> restored = EditJsonServers(wrapped->text, Uninstall(), "f");
  ASSERT_TRUE(restored);
  EXPECT_EQ(Parse(restored->text), Parse(text));
  EXPECT_TRUE(restored->text.ends_with("}\n"));
}

TEST(HostSettingsJson, UnknownServerNameListsTheNames) {
  Result<EditOutcome> out = EditJsonServers(kClaudeJson, Install({"pay", "paymnets"}), "f.json");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(out.error().message,
            "no MCP server named \"paymnets\" in f.json; it has: pay, files, remote");
  Result<EditOutcome> none = EditJsonServers("{}", Install({"x"}), "f.json");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().message, "no MCP server named \"x\" in f.json; it has none");
}

TEST(HostSettingsJson, InvalidJsonSaysLineAndColumn) {
  Result<EditOutcome> out =
      EditJsonServers("{\n  \"mcpServers\": {\n    \"a\": {]\n  }\n}", Install(), "s.json");
  ASSERT_FALSE(out);
  EXPECT_TRUE(out.error().message.starts_with("s.json:3:11: not valid JSON"))
      << out.error().message;
  Result<EditOutcome> truncated = EditJsonServers("{\"a\": 1", Install(), "s.json");
  ASSERT_FALSE(truncated);
  EXPECT_TRUE(truncated.error().message.starts_with("s.json:1:8: not valid JSON"))
      << truncated.error().message;
  Result<EditOutcome> array = EditJsonServers("[]", Install(), "s.json");
  ASSERT_FALSE(array);
  EXPECT_EQ(array.error().message, "s.json is not a JSON object; fix the file and run again");
}

TEST(HostSettingsJson, CommentsAreRefusedNotLost) {
  Result<EditOutcome> out = EditJsonServers(
      "{\n  // my servers\n  \"mcpServers\": {\"a\": {\"command\": \"x\"}}\n}", Install(), "g");
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message.find("g has comments"), std::string::npos);
  EXPECT_NE(out.error().message.find("docs/hosts.md"), std::string::npos);
}

TEST(HostSettingsJson, AnEmptyOrMissingFileIsAnEmptyObject) {
  Result<EditOutcome> out = EditJsonServers("", Install(), "f");
  ASSERT_TRUE(out);
  EXPECT_FALSE(out->changed);
  Result<EditOutcome> hook = EditJsonHook("", Hook(HookHost::kClaudeCode), "f");
  ASSERT_TRUE(hook);
  EXPECT_EQ(hook->text, std::string(R"({
  "hooks": {
    "UserPromptSubmit": [
      {
        "hooks": [
          {
            "type": "command",
            "command": "/opt/idem/bin/idemgate hook"
          }
        ]
      }
    ]
  }
}
)"));
}

constexpr const char* kClaudeSettings = R"js({
  "permissions": {
    "allow": [
      "Bash(ls:*)"
    ]
  },
  "hooks": {
    "UserPromptSubmit": [
      {
        "hooks": [
          {
            "type": "command",
            "command": "echo hi >> /tmp/log"
          }
        ]
      }
    ],
    "Stop": [
      {
        "hooks": [
          {
            "type": "command",
            "command": "true"
          }
        ]
      }
    ]
  }
}
)js";

TEST(HostSettingsJsonHook, ClaudeHookKeepsOtherHooksAndRoundTrips) {
  Result<EditOutcome> out = EditJsonHook(kClaudeSettings, Hook(HookHost::kClaudeCode), "s");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_TRUE(out->changed);
  json::value v = Parse(out->text);
  const json::array& groups = v.at("hooks").at("UserPromptSubmit").as_array();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], Parse(kClaudeSettings).at("hooks").at("UserPromptSubmit").at(0));
  EXPECT_EQ(groups[1], Parse(R"({"hooks":[{"type":"command",
                                "command":"/opt/idem/bin/idemgate hook"}]})"));
  EXPECT_EQ(v.at("hooks").at("Stop"), Parse(kClaudeSettings).at("hooks").at("Stop"));

  Result<EditOutcome> again = EditJsonHook(out->text, Hook(HookHost::kClaudeCode), "s");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->changed);

  Result<EditOutcome> removed =
      EditJsonHook(out->text, Hook(HookHost::kClaudeCode, InstallAction::kUninstall), "s");
  ASSERT_TRUE(removed);
  EXPECT_EQ(removed->text, kClaudeSettings);
}

TEST(HostSettingsJsonHook, UninstallOfAFileThatHadNoHooksRemovesTheKey) {
  std::string text = "{\n  \"model\": \"x\"\n}\n";
  Result<EditOutcome> added = EditJsonHook(text, Hook(HookHost::kGeminiCli), "g");
  ASSERT_TRUE(added);
  json::value v = Parse(added->text);
  EXPECT_EQ(v.at("hooks").at("BeforeAgent").at(0),
            Parse(R"({"matcher":"*","hooks":[{"name":"idemgate","type":"command",
                      "command":"/opt/idem/bin/idemgate hook"}]})"));
  Result<EditOutcome> removed =
      EditJsonHook(added->text, Hook(HookHost::kGeminiCli, InstallAction::kUninstall), "g");
  ASSERT_TRUE(removed);
  EXPECT_EQ(removed->text, text);
}

TEST(HostSettingsJsonHook, AnIdemgateHookWithOtherOptionsIsUpdatedNotAdded) {
  HookEdit edit{InstallAction::kInstall, HookHost::kClaudeCode,
                HookCommand(kIdemgate, {"--store", "sqlite:/a b.db"})};
  EXPECT_EQ(edit.command, "/opt/idem/bin/idemgate hook --store 'sqlite:/a b.db'");
  Result<EditOutcome> first = EditJsonHook("{}", Hook(HookHost::kClaudeCode), "s");
  ASSERT_TRUE(first);
  Result<EditOutcome> out = EditJsonHook(first->text, edit, "s");
  ASSERT_TRUE(out);
  EXPECT_TRUE(out->changed);
  json::value v = Parse(out->text);
  ASSERT_EQ(v.at("hooks").at("UserPromptSubmit").as_array().size(), 1u);
  EXPECT_EQ(v.at("hooks").at("UserPromptSubmit").at(0).at("hooks").at(0).at("command").as_string(),
            edit.command);
}

TEST(HostSettingsJsonHook, GeminiWithHooksDisabledGetsANote) {
  Result<EditOutcome> out =
      EditJsonHook(R"({"hooksConfig":{"enabled":false}})", Hook(HookHost::kGeminiCli), "g");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_NE(out->notes[0].find("hooksConfig.enabled is false"), std::string::npos);
}

TEST(HostSettingsJsonHook, HooksOfTheWrongShapeAreRefused) {
  Result<EditOutcome> out = EditJsonHook(R"({"hooks":[]})", Hook(HookHost::kClaudeCode), "s");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().message, "s: `hooks` is not a JSON object; fix the file and run again");
}

TEST(HostSettings, RecognisesIdemgateHookCommands) {
  using host_settings::IsIdemgateHookCommand;
  EXPECT_TRUE(IsIdemgateHookCommand("/usr/bin/idemgate hook"));
  EXPECT_TRUE(IsIdemgateHookCommand("'/home/a b/idemgate' hook --store redis://x"));
  EXPECT_TRUE(IsIdemgateHookCommand("idemgate hook"));
  EXPECT_FALSE(IsIdemgateHookCommand("idemgate mcp"));
  EXPECT_FALSE(IsIdemgateHookCommand("echo idemgate hook"));
  EXPECT_EQ(HookCommand("/a b/idemgate", {}), "'/a b/idemgate' hook");
  EXPECT_EQ(HookCommand("/x/idemgate", {"--config", "/it's.toml"}),
            "/x/idemgate hook --config '/it'\\''s.toml'");
}

// Codex's config.toml as people write it: comments, a multi-line args, a
// server without args, dotted keys, an HTTP server.
constexpr const char* kCodexToml = R"(# Codex settings
model = "gpt-5"   # the default

[mcp_servers.pay]
# the payments server
command = "node"   # keep
args = [
  "server.js",  # entry
  '--port=0',
]
env = { TOKEN = "x" }

[mcp_servers.files]
command = 'npx'
startup_timeout_sec = 20

[mcp_servers]
dotted.command = "uvx"
dotted.args = ["tool"]

[mcp_servers.remote]
url = "https://example.com/mcp"

[projects."/w"]
trust_level = "trusted"
)";

TEST(HostSettingsToml, WrapsInPlaceAndKeepsEveryOtherByte) {
  Result<EditOutcome> out = EditTomlServers(kCodexToml, Install(), "config.toml");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_TRUE(out->changed);
  EXPECT_EQ(out->text, R"(# Codex settings
model = "gpt-5"   # the default

[mcp_servers.pay]
# the payments server
command = "/opt/idem/bin/idemgate"   # keep
args = [
  "mcp", "--", "node", "server.js",  # entry
  '--port=0',
]
env = { TOKEN = "x" }

[mcp_servers.files]
command = "/opt/idem/bin/idemgate"
args = ["mcp", "--", 'npx']  # added by idemgate install
startup_timeout_sec = 20

[mcp_servers]
dotted.command = "/opt/idem/bin/idemgate"
dotted.args = ["mcp", "--", "uvx", "tool"]

[mcp_servers.remote]
url = "https://example.com/mcp"

[projects."/w"]
trust_level = "trusted"
)");
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_NE(out->notes[0].find("\"remote\" is reached over HTTP"), std::string::npos);
}

TEST(HostSettingsToml, SecondInstallChangesNothingAndUninstallRestoresTheBytes) {
  Result<EditOutcome> wrapped =
      EditTomlServers(kCodexToml, Install({}, {"--store", "sqlite:/s \"q\".db"}), "c");
  ASSERT_TRUE(wrapped) << wrapped.error().message;
  EXPECT_NE(wrapped->text.find(R"("mcp", "--store", "sqlite:/s \"q\".db", "--", "node")"),
            std::string::npos);
  Result<EditOutcome> again = EditTomlServers(wrapped->text, Install(), "c");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->changed);
  EXPECT_EQ(again->text, wrapped->text);
  Result<EditOutcome> restored = EditTomlServers(wrapped->text, Uninstall(), "c");
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_EQ(restored->text, kCodexToml);
  Result<EditOutcome> twice = EditTomlServers(restored->text, Uninstall(), "c");
  ASSERT_TRUE(twice);
  EXPECT_FALSE(twice->changed);
}

TEST(HostSettingsToml, OneServerOnlyAndEmptyArgs) {
  std::string text = "[mcp_servers.a]\ncommand = \"x\"\nargs = []\n[mcp_servers.b]\n"
                     "command = \"y\"\nargs = [ \"1\" ]";
  Result<EditOutcome> out = EditTomlServers(text, Install({"a"}), "c");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->text, "[mcp_servers.a]\ncommand = \"/opt/idem/bin/idemgate\"\n"
                       "args = [\"mcp\", \"--\", \"x\"]\n[mcp_servers.b]\n"
                       "command = \"y\"\nargs = [ \"1\" ]");
  Result<EditOutcome> b = EditTomlServers(out->text, Install({"b"}), "c");
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->text.ends_with("args = [ \"mcp\", \"--\", \"y\", \"1\" ]"));
  Result<EditOutcome> back = EditTomlServers(b->text, Uninstall(), "c");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->text, text);
}

TEST(HostSettingsToml, ServerWithoutArgsAtTheEndOfAFileWithoutNewline) {
  std::string text = "[mcp_servers.a]\ncommand = \"x\"";
  Result<EditOutcome> out = EditTomlServers(text, Install(), "c");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->text, "[mcp_servers.a]\ncommand = \"/opt/idem/bin/idemgate\"\n"
                       "args = [\"mcp\", \"--\", \"x\"]  # added by idemgate install\n");
  Result<EditOutcome> back = EditTomlServers(out->text, Uninstall(), "c");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->text, "[mcp_servers.a]\ncommand = \"x\"\n");  // one newline more, no less
}

TEST(HostSettingsToml, InlineTables) {
  std::string text = "mcp_servers = { a = { command = \"x\", args = [\"1\"] } }\n";
  Result<EditOutcome> out = EditTomlServers(text, Install(), "c");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->text, "mcp_servers = { a = { command = \"/opt/idem/bin/idemgate\", "
                       "args = [\"mcp\", \"--\", \"x\", \"1\"] } }\n");
  Result<EditOutcome> back = EditTomlServers(out->text, Uninstall(), "c");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->text, text);

  std::string no_args = "[mcp_servers]\na = { command = \"x\" }\n";
  Result<EditOutcome> refused = EditTomlServers(no_args, Install(), "c.toml");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("c.toml:2:17: server \"a\" is an inline table without "
                                         "`args`"),
            std::string::npos)
      << refused.error().message;
}

TEST(HostSettingsToml, NonAsciiBeforeTheValues) {
  std::string text = "[mcp_servers.\"é\"]\ncommand = \"ü\"  # ö\nargs = [\"ä\"]\n";
  Result<EditOutcome> out = EditTomlServers(text, Install(), "c");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->text, "[mcp_servers.\"é\"]\ncommand = \"/opt/idem/bin/idemgate\"  # ö\n"
                       "args = [\"mcp\", \"--\", \"ü\", \"ä\"]\n");
  Result<EditOutcome> back = EditTomlServers(out->text, Uninstall(), "c");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->text, text);
}

TEST(HostSettingsToml, InvalidTomlSaysLineAndColumn) {
  Result<EditOutcome> out =
      EditTomlServers("[mcp_servers.a]\ncommand = \"x\n", Install(), "config.toml");
  ASSERT_FALSE(out);
  EXPECT_TRUE(out.error().message.starts_with("config.toml:2:")) << out.error().message;
  EXPECT_NE(out.error().message.find("not valid TOML"), std::string::npos);
}

TEST(HostSettingsToml, UnknownServerNameListsTheNamesInFileOrder) {
  Result<EditOutcome> out = EditTomlServers(kCodexToml, Install({"payments"}), "c");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().message,
            "no MCP server named \"payments\" in c; it has: pay, files, dotted, remote");
}

TEST(HostSettingsToml, ANonStringArgIsLeftWithANote) {
  std::string text = "[mcp_servers.a]\ncommand = \"x\"\nargs = [1]\n";
  Result<EditOutcome> out = EditTomlServers(text, Install(), "c");
  ASSERT_TRUE(out);
  EXPECT_FALSE(out->changed);
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_NE(out->notes[0].find("left as it is"), std::string::npos);
}

}  // namespace
}  // namespace idem::cli
