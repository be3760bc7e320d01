#!/usr/bin/env python3
"""`idemgate install` end to end: the real binary edits Claude Code's, Gemini CLI's and Codex's
settings files in a temporary HOME / CODEX_HOME (never the user's), shows the diff, changes
nothing the second time, restores the files with --uninstall, and leaves every file byte for
byte as it was when the input is bad (exit 2).

    python3 tests/integration/install_test.py --binary build/idemgate [unittest args...]

Standard library only.
"""
import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

BINARY = None

CODEX_TOML = """# my Codex settings
model = "gpt-5"  # default model

[mcp_servers.payments]
command = "node"   # the server
args = [
  "/srv/payments/server.js",  # entry point
  "--port=0",
]
env = { TOKEN = "t" }

[mcp_servers.docs]
url = "https://example.com/mcp"
"""

CLAUDE_JSON = {
    "numStartups": 2,
    "mcpServers": {
        "payments": {"type": "stdio", "command": "node", "args": ["server.js"],
                     "env": {"K": "v"}},
        "search": {"type": "http", "url": "https://example.com/mcp"},
    },
    "userID": "u",
}

CLAUDE_SETTINGS = {
    "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "echo hi"}]}]},
}


class InstallTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-install-")
        self.home = os.path.join(self.dir, "home")
        os.mkdir(self.home)
        self.env = dict(os.environ)
        for name in ("CLAUDE_CONFIG_DIR", "GEMINI_CLI_HOME", "CODEX_HOME"):
            self.env.pop(name, None)
        self.env["HOME"] = self.home
        self.binary = os.path.realpath(BINARY)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def install(self, *args, cwd=None):
        p = subprocess.run([BINARY, "install", *args], capture_output=True, env=self.env,
                           cwd=cwd or self.dir, timeout=60)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def write(self, path, data, mode=0o600):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(path, mode)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def snapshot(self):
        """Every file under the temporary directory with its bytes and mode."""
        files = {}
        for root, _, names in os.walk(self.dir):
            for name in names:
                path = os.path.join(root, name)
                files[path] = (self.read(path), stat.S_IMODE(os.stat(path).st_mode))
        return files

    def test_codex_install_again_uninstall(self):
        codex_home = os.path.join(self.dir, "codex")
        self.env["CODEX_HOME"] = codex_home
        config = os.path.join(codex_home, "config.toml")
        self.write(config, CODEX_TOML, 0o640)

        code, out, err = self.install("codex", "--store", "sqlite:ledger.db")
        self.assertEqual(code, 0, err)
        store = "sqlite:" + os.path.join(self.dir, "ledger.db")
        self.assertIn("--- %s\n+++ %s\n" % (config, config), out)
        self.assertIn('-command = "node"   # the server\n', out)
        self.assertIn('+command = "%s"   # the server\n' % self.binary, out)
        self.assertIn('server "docs" is reached over HTTP', out)
        wrapped = self.read(config).decode()
        self.assertEqual(
            wrapped,
            CODEX_TOML.replace('command = "node"', 'command = "%s"' % self.binary).replace(
                '  "/srv/payments/server.js",',
                '  "mcp", "--store", "%s", "--", "node", "/srv/payments/server.js",' % store))
        self.assertEqual(stat.S_IMODE(os.stat(config).st_mode), 0o640)

        code, out, err = self.install("codex", "--store", "sqlite:ledger.db")
        self.assertEqual(code, 0, err)
        self.assertIn("%s: already set up, nothing to change" % config, out)
        self.assertEqual(self.read(config).decode(), wrapped)

        code, out, err = self.install("codex", "--uninstall")
        self.assertEqual(code, 0, err)
        self.assertIn('+command = "node"   # the server\n', out)
        self.assertEqual(self.read(config).decode(), CODEX_TOML)
        code, out, err = self.install("codex", "--uninstall")
        self.assertEqual(code, 0, err)
        self.assertIn("already set up, nothing to change", out)

    def test_codex_project_scope(self):
        project = os.path.join(self.dir, "proj")
        os.mkdir(project)
        self.write(os.path.join(project, ".codex", "config.toml"),
                   '[mcp_servers.a]\ncommand = "x"\n')
        code, out, err = self.install("codex", "--scope", "project", "--project", project)
        self.assertEqual(code, 0, err)
        self.assertIn("only when %s is a trusted project" % project, out)
        self.assertEqual(self.read(os.path.join(project, ".codex", "config.toml")).decode(),
                         '[mcp_servers.a]\ncommand = "%s"\n'
                         'args = ["mcp", "--", "x"]  # added by idemgate install\n' % self.binary)

    def test_claude_code_servers_and_hook(self):
        servers = os.path.join(self.home, ".claude.json")
        settings = os.path.join(self.home, ".claude", "settings.json")
        self.write(servers, json.dumps(CLAUDE_JSON, indent=2))
        self.write(settings, json.dumps(CLAUDE_SETTINGS, indent=2) + "\n", 0o644)

        code, out, err = self.install("claude-code")
        self.assertEqual(code, 0, err)
        self.assertIn("+++ %s\n" % servers, out)
        self.assertIn("+++ %s\n" % settings, out)
        self.assertIn('server "search" is reached over HTTP', out)
        got = json.loads(self.read(servers))
        self.assertEqual(got["mcpServers"]["payments"],
                         {"type": "stdio", "command": self.binary,
                          "args": ["mcp", "--", "node", "server.js"], "env": {"K": "v"}})
        self.assertEqual(got["mcpServers"]["search"], CLAUDE_JSON["mcpServers"]["search"])
        self.assertEqual(list(got), list(CLAUDE_JSON))
        hooks = json.loads(self.read(settings))["hooks"]["UserPromptSubmit"]
        self.assertEqual(hooks[0], CLAUDE_SETTINGS["hooks"]["UserPromptSubmit"][0])
        self.assertEqual(hooks[1], {"hooks": [{"type": "command",
                                               "command": self.binary + " hook"}]})
        self.assertEqual(stat.S_IMODE(os.stat(settings).st_mode), 0o644)

        before = self.snapshot()
        code, out, err = self.install("claude-code")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("already set up, nothing to change"), 2, out)
        self.assertEqual(self.snapshot(), before)

        code, out, err = self.install("claude-code", "--uninstall")
        self.assertEqual(code, 0, err)
        # 2-space JSON as the hosts write it: the original bytes return.
        self.assertEqual(self.read(servers).decode(), json.dumps(CLAUDE_JSON, indent=2))
        self.assertEqual(self.read(settings).decode(),
                         json.dumps(CLAUDE_SETTINGS, indent=2) + "\n")

    def test_gemini_creates_missing_files_and_dry_run_writes_nothing(self):
        path = os.path.join(self.home, ".gemini", "settings.json")
        code, out, err = self.install("gemini-cli", "--dry-run")
        self.assertEqual(code, 0, err)
        self.assertIn("--- /dev/null\n+++ %s\n" % path, out)
        self.assertIn("(--dry-run: no file was written)", out)
        self.assertFalse(os.path.exists(os.path.dirname(path)))

        code, out, err = self.install("gemini-cli")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(self.read(path)), {"hooks": {"BeforeAgent": [
            {"matcher": "*", "hooks": [{"name": "idemgate", "type": "command",
                                        "command": self.binary + " hook"}]}]}})
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
        code, out, err = self.install("gemini-cli", "--uninstall")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(self.read(path)), {})

    def test_bad_input_changes_no_file(self):
        codex_home = os.path.join(self.dir, "codex")
        self.env["CODEX_HOME"] = codex_home
        self.write(os.path.join(codex_home, "config.toml"), CODEX_TOML)
        self.write(os.path.join(self.home, ".claude.json"), json.dumps(CLAUDE_JSON))
        self.write(os.path.join(self.home, ".gemini", "settings.json"),
                   '{\n  "mcpServers": {\n    "a": {"command": "x",}\n  }\n}\n')
        before = self.snapshot()
        cases = [
            (["claude-code", "--server", "payment"],
             'no MCP server named "payment" in %s; it has: payments, search'
             % os.path.join(self.home, ".claude.json")),
            (["codex", "--server", "pay"], "it has: payments, docs"),
            (["gemini-cli"], "has comments or trailing commas"),
            (["vscode"], 'unknown host "vscode"; the hosts are claude-code, gemini-cli and codex'),
            (["codex", "--mcp-config", "x.json"], "--mcp-config is for claude-code"),
        ]
        for args, message in cases:
            code, out, err = self.install(*args)
            self.assertEqual(code, 2, (args, out, err))
            self.assertIn(message, err, args)
            self.assertEqual(out, "", args)
        # Not JSON / not TOML: where, as line:column.
        self.write(os.path.join(self.home, ".claude.json"), '{"mcpServers": {"a": }}')
        self.write(os.path.join(codex_home, "config.toml"), '[mcp_servers.a]\ncommand = "x\n')
        before = self.snapshot()
        code, _, err = self.install("claude-code")
        self.assertEqual(code, 2, err)
        self.assertIn("%s:1:22: not valid JSON" % os.path.join(self.home, ".claude.json"), err)
        self.assertIn("no file was changed", err)
        code, _, err = self.install("codex")
        self.assertEqual(code, 2, err)
        self.assertIn(os.path.join(codex_home, "config.toml") + ":2:", err)
        self.assertIn("not valid TOML", err)
        self.assertEqual(self.snapshot(), before)  # ~/.claude/settings.json not created either

    def test_help_explains_it(self):
        p = subprocess.run([BINARY, "install", "--help"], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0)
        self.assertIn("--uninstall", p.stdout.decode())
        self.assertIn("UserPromptSubmit", p.stdout.decode())


def main():
    global BINARY
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="build/idemgate")
    args, rest = parser.parse_known_args()
    BINARY = os.path.abspath(args.binary)
    unittest.main(argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    main()
