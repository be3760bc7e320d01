#!/usr/bin/env python3
"""Integration tests of the `idemgate` command line: they run the real binary.

    python3 tests/integration/cli_test.py --binary build/idemgate \
        [--fixture build/src/cli/idemgate_cli_fixture] [unittest args...]

Without --binary, ./build/idemgate is used. --fixture names the test helper
that fills a SQLite store with known records and attempts (completed, unknown,
in progress with a live and with an expired lease, expired, another tenant);
the record-command tests are skipped without it. Tests of `idemgate demo` run
only once that command exists.

Standard library only (unittest, subprocess, tempfile).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

BINARY = None
FIXTURE = None


def run(*args, stdin=b"", env=None, timeout=60):
    """Runs idemgate with `args`; returns CompletedProcess with bytes output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run([BINARY, *args], input=stdin, capture_output=True, env=full_env,
                          timeout=timeout)


def text(p):
    return p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def key_of(args_json, *flags):
    """The key idemgate derives for `args_json` (str or bytes) with `flags`."""
    data = args_json if isinstance(args_json, bytes) else args_json.encode("utf-8")
    p = run("key", *flags, stdin=data)
    if p.returncode != 0:
        raise AssertionError("idemgate key %s failed: %s" % (flags, p.stderr.decode()))
    return p.stdout.decode().strip()


def has_command(name):
    """True if `idemgate --help` lists the subcommand `name`."""
    listing = run("--help").stdout.decode()
    return re.search(r"(?m)^\s+" + re.escape(name) + r"\s", listing) is not None


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-cli-")
        # Never touch the user's real default store.
        self.env = {"XDG_STATE_HOME": os.path.join(self.dir, "state"), "HOME": self.dir}

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, content):
        with open(self.path(name), "w", encoding="utf-8") as f:
            f.write(content)
        return self.path(name)


class VersionAndHelpTest(unittest.TestCase):
    def test_version(self):
        p = run("--version")
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout.decode(), r"^idemgate \d+\.\d+\.\d+")

    def test_help_everywhere(self):
        for cmd in ([], ["canon"], ["key"], ["inspect"], ["evict"], ["resolve"], ["audit"],
                    ["stats"], ["purge"]):
            with self.subTest(cmd=cmd):
                p = run(*cmd, "--help")
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("Usage", p.stdout.decode())

    def test_global_options_listed(self):
        out = run("--help").stdout.decode()
        for flag in ("--store", "--config", "--version"):
            self.assertIn(flag, out)

    def test_usage_errors_exit_2(self):
        for args in (["--no-such-flag"], ["canon", "--bogus"], ["no-such-command"], [],
                     ["key"], ["inspect"], ["resolve", "k"], ["audit", "--outcome", "nope"],
                     ["audit", "--since", "yesterday"]):
            with self.subTest(args=args):
                p = run(*args, env={"XDG_STATE_HOME": tempfile.gettempdir()})
                self.assertEqual(p.returncode, 2, (p.stdout, p.stderr))
                self.assertTrue(p.stderr.strip(), "a usage error says what was wrong")


class CanonTest(unittest.TestCase):
    def canon(self, data, *flags):
        return run("canon", *flags, stdin=data)

    def test_writes_exact_bytes(self):
        p = self.canon(b'{"b": [1.0, 2e3, "\\u00e9"], "a": {"d": true, "c": null}}')
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, '{"a":{"c":null,"d":true},"b":[1,2000,"é"]}'.encode())

    def test_utf16_key_order(self):
        p = self.canon('{"\u20ac":1,"\U0001F600":2,"\\r":3,"1":4,"\u00f6":5}'.encode())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.decode(), '{"\\r":3,"1":4,"\u00f6":5,"\u20ac":1,"\U0001F600":2}')

    def assert_rejected(self, data, *words, flags=()):
        p = self.canon(data, *flags)
        out, err = text(p)
        self.assertNotEqual(p.returncode, 0, "accepted %r" % data[:60])
        self.assertEqual(p.stdout, b"", "nothing on stdout when rejected")
        self.assertTrue(err.startswith("idemgate canon: "), err)
        for w in words:
            self.assertIn(w.lower(), err.lower())

    def test_invalid_utf8(self):
        self.assert_rejected(b'"\xff"', "UTF-8")
        self.assert_rejected(b'{"a":"\xc3"}', "UTF-8")

    def test_duplicate_names(self):
        self.assert_rejected(b'{"a":1,"a":2}', "duplicate", '"a"')

    def test_lone_surrogate(self):
        self.assert_rejected(b'"\\ud800"', "surrogate")
        self.assert_rejected(b'"\\udc00x"', "surrogate")

    def test_deep_nesting(self):
        self.assert_rejected(b"[" * 200 + b"]" * 200, "nesting", "128")
        ok = self.canon(b"[" * 128 + b"]" * 128)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assert_rejected(b"[[[1]]]", "nesting", flags=("--max-depth", "2"))

    def test_too_large(self):
        big = b'"' + b"a" * (1 << 20) + b'"'
        self.assert_rejected(big, "limit", "1048576")
        self.assert_rejected(b"[" + b"1," * 100 + b"1]", "limit", "100",
                             flags=("--max-bytes", "100"))
        ok = self.canon(b"[" + b"1," * 100 + b"1]", "--max-bytes", "1KiB")
        self.assertEqual(ok.returncode, 0, ok.stderr)

    def test_not_json(self):
        for data in (b"", b"NaN", b"[1,]", b"{'a':1}", b"1 2"):
            with self.subTest(data=data):
                self.assert_rejected(data)

    def test_bad_max_bytes_is_usage_error(self):
        self.assertEqual(self.canon(b"1", "--max-bytes", "lots").returncode, 2)


class KeyTest(unittest.TestCase):
    T = ("--turn", "turn-1", "--tool", "create_ticket")

    def test_same_call_same_key(self):
        base = key_of('{"title":"Printer on fire","priority":1,"who":"\u00e9"}', *self.T)
        for variant in (
                '{"who":"\u00e9","priority":1,"title":"Printer on fire"}',            # order
                ' {\n "title" : "Printer on fire" ,\t"priority":1 , "who":"\u00e9"}\n',  # space
                '{"title":"Printer on fire","priority":1.0,"who":"\u00e9"}',          # 1.0 vs 1
                '{"title":"Printer on fire","priority":1e0,"who":"\\u00e9"}',          # escapes
                '{"title":"Printer \\u006fn fire","priority":10e-1,"who":"\\u00E9"}'):
            with self.subTest(variant=variant):
                self.assertEqual(key_of(variant, *self.T), base)

    def test_different_calls_different_keys(self):
        args = '{"amount":100}'
        base = key_of(args, *self.T)
        self.assertNotEqual(key_of(args, "--turn", "turn-2", "--tool", "create_ticket"), base)
        self.assertNotEqual(key_of(args, "--turn", "turn-1", "--tool", "create_charge"), base)
        self.assertNotEqual(key_of('{"amount":101}', *self.T), base)
        self.assertNotEqual(key_of('{"amount":"100"}', *self.T), base)

    def test_big_integers_never_collide(self):
        # Pure RFC 8785 rounds both to the same double; the fingerprint must not.
        a = key_of('{"customer":12345678901234567891}', *self.T)
        b = key_of('{"customer":12345678901234567892}', *self.T)
        self.assertNotEqual(a, b)
        c = key_of('{"customer":9007199254740993}', *self.T)
        d = key_of('{"customer":9007199254740992}', *self.T)
        self.assertNotEqual(c, d)

    def test_separator_in_parts_is_unambiguous(self):
        for (t1, n1), (t2, n2) in ((("a:b", "c"), ("a", "b:c")), (("a.b", "c"), ("a", "b.c")),
                                   (("a%2Eb", "c"), ("a.b", "c"))):
            with self.subTest(first=(t1, n1), second=(t2, n2)):
                k1 = key_of("{}", "--turn", t1, "--tool", n1)
                k2 = key_of("{}", "--turn", t2, "--tool", n2)
                self.assertNotEqual(k1, k2)

    def test_key_is_header_safe_and_bounded(self):
        k = key_of("{}", "--turn", "t" * 1000, "--tool", "\u00fc" * 300 + " spaced")
        self.assertLessEqual(len(k), 255)
        self.assertRegex(k, r"^[\x21-\x7e]+$")

    def test_turn_fallback(self):
        p = run("key", "--tool", "create_ticket", "--json", stdin=b"{}")
        self.assertEqual(p.returncode, 0, p.stderr)
        info = json.loads(p.stdout)
        self.assertTrue(info["turn_fallback"])
        self.assertEqual(info["mode"], "args")
        self.assertEqual(len(info["fingerprint"]), 64)

    def test_verbose(self):
        out = run("key", *self.T, "--verbose", stdin=b'{"a":1}').stdout.decode()
        self.assertRegex(out, r"(?m)^key\s+v1t\.")
        self.assertRegex(out, r"(?m)^mode\s+turn$")
        self.assertRegex(out, r"(?m)^fingerprint\s+[0-9a-f]{64}$")
        self.assertRegex(out, r"(?m)^turn_fallback\s+false$")

    def test_modes(self):
        args_key = key_of('{"a":1}', "--tool", "t", "--mode", "args", "--turn", "x")
        self.assertEqual(args_key, key_of('{"a":1}', "--tool", "t", "--mode", "args", "--turn", "y"))
        f1 = key_of('{"email":"a@x","name":"A"}', "--tool", "cu", "--mode", "fields",
                    "--fields", "/email")
        f2 = key_of('{"name":"B","email":"a@x"}', "--tool", "cu", "--mode", "fields",
                    "--fields", "/email")
        f3 = key_of('{"email":"b@x","name":"A"}', "--tool", "cu", "--mode", "fields",
                    "--fields", "/email")
        self.assertEqual(f1, f2)
        self.assertNotEqual(f1, f3)
        self.assertEqual(key_of("{}", "--tool", "t", "--key", "my-key-1"), "my-key-1")

    def test_key_errors(self):
        cases = [
            (["--tool", "t", "--key", "has space"], b"{}", 1),
            (["--tool", "t", "--mode", "explicit"], b"{}", 2),
            (["--tool", "t", "--mode", "off"], b"{}", 1),
            (["--tool", "t", "--mode", "sometimes"], b"{}", 2),
            (["--tool", "t", "--mode", "fields"], b"{}", 2),
            (["--tool", "t", "--fields", "/a"], b"{}", 2),
            (["--tool", "t"], b'{"a":1,"a":2}', 1),
        ]
        for flags, data, code in cases:
            with self.subTest(flags=flags):
                p = run("key", *flags, stdin=data)
                self.assertEqual(p.returncode, code, p.stderr)
                self.assertTrue(p.stderr.decode().startswith("idemgate key: "), p.stderr)


class ConfigTest(TempDirTest):
    def test_typo_names_line_and_suggestion(self):
        cfg = self.write("idemgate.toml",
                         '[defaults]\nttl = "24h"\ntll = "1h"\n\n[[tool]]\nmatch = "x"\nmdoe = "off"\n')
        p = run("--config", cfg, "inspect", "k", "--store", "memory:", env=self.env)
        self.assertEqual(p.returncode, 1)
        err = p.stderr.decode()
        self.assertIn(cfg + ":3:1:", err)
        self.assertIn("did you mean 'ttl'?", err)
        self.assertIn(cfg + ":7:1:", err)
        self.assertIn("did you mean 'mode'?", err)

    def test_wrong_type_and_bad_duration(self):
        cfg = self.write("a.toml", '[defaults]\nlease = 30\nwait = "10 seconds"\n')
        p = run("stats", "--config", cfg, env=self.env)
        self.assertEqual(p.returncode, 1)
        err = p.stderr.decode()
        self.assertIn(":2:9:", err)
        self.assertIn("got an integer", err)
        self.assertIn(":3:8:", err)
        self.assertIn('"1h30m"', err)

    def test_missing_config_file(self):
        p = run("stats", "--config", self.path("nope.toml"), env=self.env)
        self.assertEqual(p.returncode, 1)
        self.assertIn("does not exist", p.stderr.decode())

    def test_key_uses_the_first_matching_rule(self):
        cfg = self.write("c.toml", '[[tool]]\nmatch = "create_user"\nmode = "fields"\n'
                                   'fields = ["/email"]\n[[tool]]\nmatch = "create_*"\n'
                                   'mode = "args"\n[[tool]]\nmatch = "search_*"\nmode = "off"\n')
        k1 = key_of('{"email":"a@x","n":1}', "--config", cfg, "--tool", "create_user")
        k2 = key_of('{"email":"a@x","n":2}', "--config", cfg, "--tool", "create_user")
        self.assertEqual(k1, k2)
        self.assertTrue(k1.startswith("v1f."), k1)
        self.assertTrue(key_of("{}", "--config", cfg, "--tool", "create_x",
                               "--turn", "t").startswith("v1a."))
        p = run("key", "--config", cfg, "--tool", "search_x", stdin=b"{}")
        self.assertEqual(p.returncode, 1)
        self.assertIn("not gated", p.stderr.decode())


class FreshStoreTest(TempDirTest):
    def test_inspect_missing_key(self):
        store = "sqlite:" + self.path("fresh.db")
        p = run("inspect", "v1t.t.tool.abc", "--store", store, env=self.env)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no record for key v1t.t.tool.abc", p.stderr.decode())

    def test_empty_audit_stats_purge(self):
        store = "sqlite:" + self.path("fresh.db")
        self.assertEqual(run("audit", "--store", store, "--json", env=self.env).stdout, b"")
        self.assertEqual(run("stats", "--store", store, env=self.env).returncode, 0)
        p = run("purge", "--store", store, env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("purged 0", p.stdout.decode())

    def test_default_store_is_in_the_state_directory(self):
        p = run("stats", env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "state", "idemgate", "idemgate.db")))

    def test_bad_store_url(self):
        p = run("inspect", "k", "--store", "carrier-pigeon://x", env=self.env)
        self.assertEqual(p.returncode, 1)
        self.assertIn("carrier-pigeon://x", p.stderr.decode())

    def test_a_store_password_is_never_repeated(self):
        for url in ("redis://alice:s3cret@127.0.0.1:1/0?connect_timeout=100ms",
                    "redis://alice:s3cret@127.0.0.1:1/0?no_such_option=1",
                    "rediss+cluster://:s3cret@127.0.0.1:1,127.0.0.1:2?tls_ca=/nonexistent"):
            p = run("stats", "--store", url, env=self.env)
            self.assertEqual(p.returncode, 1, url)
            err = p.stderr.decode()
            self.assertNotIn("s3cret", err)
            self.assertIn(":***@127.0.0.1:1", err)


class RecordCommandsTest(TempDirTest):
    """inspect / evict / resolve / audit / stats / purge on the fixture's records."""

    def setUp(self):
        if not FIXTURE:
            self.skipTest("needs --fixture (the idemgate_cli_fixture helper)")
        super().setUp()
        self.db = self.path("records.db")
        self.store = "sqlite:" + self.db
        p = subprocess.run([FIXTURE, self.store], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)

    def idem(self, *args, stdin=b""):
        return run(*args, "--store", self.store, stdin=stdin, env=self.env)

    def inspect_json(self, key, *flags):
        p = self.idem("inspect", key, "--json", *flags)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_inspect_text(self):
        p = self.idem("inspect", "fx-completed")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout.decode()
        self.assertRegex(out, r"(?m)^state\s+completed$")
        self.assertRegex(out, r"(?m)^tool\s+create_ticket$")
        self.assertRegex(out, r"(?m)^created\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertRegex(out, r"(?m)^outcome\s+success, 31 bytes$")
        self.assertNotIn("s3cr3t", out, "outcomes can hold secrets: only with --show-outcome")
        shown = self.idem("inspect", "fx-completed", "--show-outcome").stdout.decode()
        self.assertIn('{"ticket":42,"secret":"s3cr3t"}', shown)

    def test_inspect_json_and_tenants(self):
        r = self.inspect_json("fx-completed")
        self.assertEqual(r["state"], "completed")
        self.assertEqual(r["tenant"], "default")
        self.assertEqual(r["outcome_class"], "success")
        self.assertNotIn("outcome_body", r)
        acme = self.inspect_json("fx-completed", "--tenant", "acme", "--show-outcome")
        self.assertEqual(acme["outcome_class"], "tool_error")
        self.assertEqual(acme["outcome_body"], "acme-body")
        self.assertEqual(self.idem("inspect", "fx-completed", "--tenant", "nobody").returncode, 1)
        stale = self.inspect_json("fx-stale")
        self.assertEqual(stale["state"], "in_progress")
        self.assertTrue(stale["lease_expired"])
        self.assertFalse(self.inspect_json("fx-live")["lease_expired"])
        unknown = self.idem("inspect", "fx-unknown").stdout.decode()
        self.assertIn("idemgate resolve fx-unknown --release", unknown)

    def test_evict(self):
        p = self.idem("evict", "fx-completed")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("evicted fx-completed", p.stdout.decode())
        self.assertEqual(self.idem("inspect", "fx-completed").returncode, 1)
        # The other tenant's record with the same key is untouched.
        self.assertEqual(self.inspect_json("fx-completed", "--tenant", "acme")["state"], "completed")
        again = self.idem("evict", "fx-completed")
        self.assertEqual(again.returncode, 1)
        self.assertIn("no record for key fx-completed", again.stderr.decode())

    def test_resolve_release_unknown(self):
        p = self.idem("resolve", "fx-unknown", "--release")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("released fx-unknown", p.stdout.decode())
        self.assertEqual(self.idem("inspect", "fx-unknown").returncode, 1)

    def test_resolve_with_outcome(self):
        outcome = self.write("outcome.json", '{"charged":true}')
        p = self.idem("resolve", "fx-unknown", "--outcome-file", outcome, "--class", "success",
                      "--ttl", "2h")
        self.assertEqual(p.returncode, 0, p.stderr)
        r = self.inspect_json("fx-unknown", "--show-outcome")
        self.assertEqual(r["state"], "completed")
        self.assertEqual(r["outcome_body"], '{"charged":true}')
        self.assertEqual(r["outcome_class"], "success")
        # From stdin too.
        p = self.idem("resolve", "fx-unknown-2", "--outcome-file", "-", "--class", "tool_error",
                      stdin=b"declined")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.inspect_json("fx-unknown-2")["outcome_class"], "tool_error")

    def test_resolve_refusals(self):
        p = self.idem("resolve", "fx-completed", "--release")
        self.assertEqual(p.returncode, 1)
        self.assertIn("is completed", p.stderr.decode())
        self.assertIn("idemgate evict fx-completed", p.stderr.decode())
        p = self.idem("resolve", "fx-live", "--release", "--force")
        self.assertEqual(p.returncode, 1)
        self.assertIn("lease runs until", p.stderr.decode())
        p = self.idem("resolve", "fx-stale", "--release")
        self.assertEqual(p.returncode, 1)
        self.assertIn("--force", p.stderr.decode())
        self.assertEqual(self.inspect_json("fx-stale")["state"], "in_progress")
        p = self.idem("resolve", "fx-stale", "--release", "--force")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.idem("inspect", "fx-stale").returncode, 1)
        p = self.idem("resolve", "no-such-key", "--release")
        self.assertEqual(p.returncode, 1)
        self.assertIn("no record for key no-such-key", p.stderr.decode())
        self.assertEqual(self.idem("resolve", "fx-unknown", "--release", "--outcome-file",
                                   "x").returncode, 2)
        self.assertEqual(self.idem("resolve", "fx-unknown", "--outcome-file", "-", "--class",
                                   "too_large").returncode, 2)
        p = self.idem("resolve", "fx-unknown", "--outcome-file", self.path("missing"))
        self.assertEqual(p.returncode, 1)
        self.assertEqual(self.inspect_json("fx-unknown")["state"], "unknown")

    def test_resolve_respects_max_result_bytes(self):
        cfg = self.write("c.toml", '[[tool]]\nmatch = "charge_*"\nmax_result_bytes = 4\n')
        p = self.idem("resolve", "fx-unknown", "--config", cfg, "--outcome-file", "-",
                      stdin=b"12345")
        self.assertEqual(p.returncode, 1)
        self.assertIn("max_result_bytes", p.stderr.decode())
        self.assertEqual(self.inspect_json("fx-unknown")["state"], "unknown")

    def audit(self, *flags):
        p = self.idem("audit", "--json", *flags)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [json.loads(line) for line in p.stdout.decode().splitlines()]

    def test_audit(self):
        rows = self.audit()
        self.assertEqual(len(rows), 7)
        self.assertEqual([r["at"] for r in rows], sorted((r["at"] for r in rows), reverse=True))
        self.assertEqual(len(self.audit("--outcome", "replayed")), 2)
        self.assertEqual(len(self.audit("--tool", "charge_card")), 2)
        self.assertEqual(len(self.audit("--key", "fx-completed")), 4)
        self.assertEqual(len(self.audit("--since", "1h")), 6)
        self.assertEqual(len(self.audit("--limit", "3")), 3)
        self.assertEqual(self.audit("--tenant", "acme"), [])
        table = self.idem("audit").stdout.decode()
        self.assertRegex(table.splitlines()[0], r"^TIME\s+TENANT\s+TOOL\s+OUTCOME")
        self.assertIn("fx-completed", table)

    def tamper(self, sql):
        """Changes the audit log behind idemgate's back, as someone with write access could."""
        import sqlite3
        db = sqlite3.connect(self.db)
        try:
            db.execute(sql)
            db.commit()
        finally:
            db.close()

    def verify(self, *flags):
        p = self.idem("audit", "--verify", *flags)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def test_audit_verify_holds_and_head(self):
        code, out, err = self.verify()
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "checked 7 entries in 1 tenant: every chain holds\n")
        self.assertEqual(self.verify("--tenant", "acme")[1],
                         "checked 0 entries in 0 tenants: every chain holds\n")
        heads = [json.loads(line) for line in
                 self.idem("audit", "--head", "--json").stdout.decode().splitlines()]
        self.assertEqual([(h["tenant"], h["seq"], h["start_seq"]) for h in heads],
                         [("default", 7, 1)])
        self.assertRegex(heads[0]["hash"], r"^[0-9a-f]{64}$")
        table = self.idem("audit", "--head").stdout.decode()
        self.assertRegex(table, r"(?m)^default\s+7\s+[0-9a-f]{64}\s+1$")
        self.assertEqual(self.idem("audit", "--verify", "--head").returncode, 2)
        self.assertEqual(self.idem("audit", "--verify", "--key", "k").returncode, 2)

    def test_audit_verify_names_an_edited_entry(self):
        self.tamper("UPDATE attempts SET outcome = 'executed' WHERE id = "
                    "(SELECT id FROM attempts ORDER BY seq LIMIT 1 OFFSET 2)")
        code, out, _ = self.verify()
        self.assertEqual(code, 1)
        self.assertRegex(out, r'^audit log tampered with: tenant "default" seq 3 \(key "[^"]+", '
                              r'\d{4}-\d\d-\d\dT[\d:.]+Z, executed\): edited: ')
        j = json.loads(self.idem("audit", "--verify", "--json").stdout)
        self.assertEqual((j["ok"], j["fault"], j["seq"], j["checked"]), (False, "edited", 3, 2))

    def test_audit_verify_names_deleted_and_inserted_entries(self):
        self.tamper("DELETE FROM attempts WHERE seq = 4")
        code, out, _ = self.verify()
        self.assertEqual(code, 1)
        self.assertIn('seq 5 ', out)
        self.assertIn("deleted: entry 4 before it are missing", out)
        self.tamper("DELETE FROM attempts WHERE seq >= 5")
        code, out, _ = self.verify()
        self.assertEqual(code, 1)
        self.assertIn("deleted: entries 4..7 after it are missing", out)
        self.tamper("INSERT INTO attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms, "
                    "instance, detail, seq, prev_hash, hash) SELECT at_ms, tenant, key, tool, "
                    "turn, outcome, latency_ms, instance, detail, seq, prev_hash, hash "
                    "FROM attempts WHERE seq = 2")
        code, out, _ = self.verify()
        self.assertEqual(code, 1)
        self.assertIn("seq 2 ", out)
        self.assertIn("inserted out of order: a second entry with this seq", out)

    def test_purged_attempts_keep_the_chain_verifiable(self):
        # The fixture's entries are 50, 40, 30, 20, 10, 5 s and (appended last) 30 h old:
        # the chain's first two go; the one after newer entries stays.
        p = self.idem("purge", "--attempts-before", "35s")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("purged 2 audit entries", p.stdout.decode())
        code, out, err = self.verify()
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "checked 5 entries in 1 tenant: every chain holds; "
                              "1 restarts where a purge cut it\n")
        self.assertEqual(len(self.audit()), 5)
        self.tamper("DELETE FROM attempts WHERE seq = 3")  # the first entry kept
        code, out, _ = self.verify()
        self.assertEqual(code, 1)
        self.assertIn("(the chain restarts at 3)", out)

    def test_stats(self):
        p = self.idem("stats", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        stats = {s["tool"]: s for s in map(json.loads, p.stdout.decode().splitlines())}
        self.assertEqual(stats["create_ticket"]["attempts"], 4)
        self.assertEqual(stats["create_ticket"]["replayed"], 2)
        self.assertEqual(stats["create_ticket"]["attached"], 1)
        self.assertAlmostEqual(stats["create_ticket"]["replay_ratio"], 0.75)
        self.assertEqual(stats["charge_card"]["unknown"], 1)
        recent = {s["tool"] for s in map(json.loads,
                                         self.idem("stats", "--json", "--since", "1h")
                                         .stdout.decode().splitlines())}
        self.assertEqual(recent, {"create_ticket", "charge_card"})
        table = self.idem("stats").stdout.decode()
        self.assertRegex(table, r"(?m)^create_ticket\s+4\s+1\s+2\s+1\s.*0\.750$")

    def test_purge(self):
        p = self.idem("purge", "--batch", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("purged 5 expired records", p.stdout.decode())
        self.assertIn("purged 2 of", p.stderr.decode(), "progress per batch")
        again = self.idem("purge")
        self.assertIn("purged 0 expired records", again.stdout.decode())
        self.assertEqual(self.inspect_json("fx-completed")["state"], "completed")

    def test_store_precedence(self):
        cfg = self.write("c.toml", 'store = "%s"\n' % self.store)
        p = run("inspect", "fx-completed", "--config", cfg, env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = run("inspect", "fx-completed", "--config", cfg, "--store", "memory:", env=self.env)
        self.assertEqual(p.returncode, 1, "--store wins over the config's store")


class DemoTest(TempDirTest):
    """End to end through the lead's `idemgate demo`, which runs real Ledger calls."""

    @classmethod
    def setUpClass(cls):
        if not has_command("demo"):
            raise unittest.SkipTest("needs idemgate demo")

    def test_demo_records_are_visible(self):
        store = "sqlite:" + self.path("demo.db")
        p = run("demo", "--store", store, env=self.env, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(l) for l in
                run("audit", "--json", "--store", store, env=self.env).stdout.decode().splitlines()]
        self.assertTrue(rows, "the demo's attempts are in the audit log")
        outcomes = {r["outcome"] for r in rows}
        self.assertIn("executed", outcomes)
        self.assertIn("replayed", outcomes)
        keys = {r["key"] for r in rows}
        states = {}
        for key in keys:
            q = run("inspect", key, "--json", "--store", store, env=self.env)
            if q.returncode == 0:
                states[key] = json.loads(q.stdout)["state"]
        self.assertIn("completed", states.values())
        unknown = [k for k, s in states.items() if s == "unknown"]
        if unknown:
            p = run("resolve", unknown[0], "--release", "--store", store, env=self.env)
            self.assertEqual(p.returncode, 0, p.stderr)
        stats = run("stats", "--json", "--store", store, env=self.env)
        self.assertEqual(stats.returncode, 0, stats.stderr)


def main():
    global BINARY, FIXTURE
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--binary", default=os.path.join("build", "idemgate"))
    ap.add_argument("--fixture", default=os.environ.get("IDEMGATE_CLI_FIXTURE"))
    opts, rest = ap.parse_known_args()
    BINARY = os.path.abspath(opts.binary)
    FIXTURE = os.path.abspath(opts.fixture) if opts.fixture else None
    if not os.access(BINARY, os.X_OK):
        sys.exit("cli_test.py: no idemgate binary at %s; build it or pass --binary" % BINARY)
    unittest.main(argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    main()
