#!/usr/bin/env python3
"""Hostile clients, end to end (issue #37, the security review's findings): the real binaries on
loopback — `idemgate serve`, `idemgate http` and `idemgate mcp --listen` — are sent what an
attacker sends, and each case asserts a bound read from /proc (CPU time, open descriptors, peak
memory) or from the server's own answers, and that a well-behaved client is still served.

Every loop here is bounded in count; every wait is bounded by DEADLINE (a bound, never a timing
assumption). The chunk-extension and trailer floods of F1 live in
tests/integration/bad_input_test.py (`chunk_cases`); the process and HTTP helpers are shared with
it and with tests/integration/http/http_proxy_test.py by import.

    python3 tests/adversarial/adversarial_test.py --binary build/idemgate \\
        [--mcp-server examples/mcp-server/server.js] \\
        [--vendor examples/http-vendor/server.mjs] [unittest args...]

Needs node and the example MCP server's npm packages for the `mcp --listen` cases. Standard
library only. The figures measured are printed at the end (RELIABILITY.md, "Security").
"""
import http.server
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "http"))
import bad_input_test  # noqa: E402
import http_proxy_test  # noqa: E402
from bad_input_test import host_port, read_response  # noqa: E402
from http_proxy_test import Process, header, request  # noqa: E402

BINARY = None
MCP_SERVER = None
VENDOR = None
DEADLINE = 30.0  # seconds: a bound for anything awaited, never a timing assumption

MEASURED = []  # (case, figure), printed at the end


def cpu_seconds(pid):
    """User plus system CPU time of `pid` so far, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_descriptors(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def with_nofile(limit, args):
    """`args` run with RLIMIT_NOFILE lowered to `limit` (soft and hard), same pid (exec)."""
    return [sys.executable, "-c",
            "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
            "os.execv(sys.argv[1], sys.argv[1:])" % (limit, limit), *args]


def connect(base):
    return socket.create_connection(host_port(base), timeout=DEADLINE)


def served(base, path="/healthz", attempts=100):
    """Whether a well-behaved GET of `path` on a fresh connection is answered 200 within
    `attempts` tries (the server notices closed connections asynchronously)."""
    for _ in range(attempts):
        try:
            if request(base, "GET", path, timeout=2)[0] == 200:
                return True
        except OSError:
            pass
    return False


class Front:
    """How to start each front on loopback: (args, marker, env)."""

    @staticmethod
    def serve(extra, store="memory:"):
        return [BINARY, "serve", "--listen", "127.0.0.1:0", "--store", store, *extra], None

    @staticmethod
    def http(extra, upstream="http://127.0.0.1:9", store="memory:"):
        return [BINARY, "http", "--listen", "127.0.0.1:0", "--upstream", upstream,
                "--store", store, *extra], None

    @staticmethod
    def mcp(extra, store="memory:", ledger=os.devnull):
        return ([BINARY, "mcp", "--listen", "127.0.0.1:0", "--store", store, *extra, "--",
                 "node", MCP_SERVER], dict(os.environ, EXAMPLE_LEDGER=ledger))


def start(test, args, env=None):
    proc = Process(args, "listening on ", stream="stderr", env=env)
    test.addCleanup(proc.stop)
    base = proc.url.rsplit("/mcp", 1)[0]
    return proc, base


# ── F2: connections and descriptors ──────────────────────────────────────────────────────────


class ConnectionFloodTest(unittest.TestCase):
    """F2: a flood of idle connections past max_connections, and past the process's open-file
    limit, on every front."""

    FRONTS = ("serve", "http", "mcp")
    NOFILE = 64      # RLIMIT_NOFILE of the server in the EMFILE case
    FLOOD = 100      # connections opened past it
    PROBES = 10      # new connections tried (and left unanswered) while it is out of descriptors
    MAX_CPU_SHARE = 0.2  # of the wall time the probes took (a busy accept loop takes ~1.0)

    def test_out_of_descriptors_pauses_accepting(self):
        """With RLIMIT_NOFILE at 64 and max_connections 1024: the start warns that the limit is
        too low; a flood of 100 idle connections runs the server out of descriptors; while it is
        out, the server uses under a fifth of a core (a busy accept loop used all of one) and logs
        the accept failure once; once the flood closes, it serves again."""
        for front in self.FRONTS:
            with self.subTest(front=front):
                args, env = getattr(Front, front)(["--read-timeout", "20s"])
                proc, base = start(self, with_nofile(self.NOFILE, args), env)
                pid = proc.proc.pid
                self.assertTrue(served(base), "not serving before the flood")
                flood = [connect(base) for _ in range(self.FLOOD)]
                try:
                    failed = lambda: [l for l in proc.log if "accept failed" in l]
                    for _ in range(1000):
                        if failed():
                            break
                        select.select([], [], [], 0.01)
                    self.assertTrue(failed(), "the flood did not exhaust descriptors")
                    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
                    for _ in range(self.PROBES):
                        probe = connect(base)
                        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        select.select([probe], [], [], 0.2)
                        flood.append(probe)
                    cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - wall0
                    MEASURED.append(("%s: CPU share while out of descriptors" % front,
                                     "%.3f (%.2f s CPU over %.2f s)" % (cpu / wall, cpu, wall)))
                    self.assertLess(cpu / wall, self.MAX_CPU_SHARE,
                                    "%.2f s of CPU in %.2f s while out of descriptors" %
                                    (cpu, wall))
                    self.assertLessEqual(len(failed()), 2, "the accept failure is logged "
                                         "%d times" % len(failed()))
                finally:
                    for s in flood:
                        s.close()
                self.assertTrue(served(base), "not serving after the flood closed")
                self.assertTrue(any("accepting connections again" in l for l in proc.log))
                self.assertIsNone(proc.proc.poll())
                self.assertTrue(any("RLIMIT_NOFILE" in line and "below" in line
                                    for line in proc.log), "no start-time warning: %s" % proc.log)

    def test_over_limit_connections_are_closed_promptly(self):
        """With max_connections 4 and read_timeout 20 s, four idle connections held: a fifth gets
        503 and the server closes it within 5 s (it was held for read_timeout, 20 s); a flood of
        200 more never holds more than max_connections + 64 (the over-limit reserve) descriptors
        for connections; once the flood closes, a well-behaved client is served."""
        for front in ("serve", "http"):
            with self.subTest(front=front):
                args, env = getattr(Front, front)(["--read-timeout", "20s",
                                                   "--max-connections", "4"])
                proc, base = start(self, args, env)
                pid = proc.proc.pid
                baseline = open_descriptors(pid)
                held = [connect(base) for _ in range(4)]
                try:
                    for _ in range(1000):  # the server registers them asynchronously
                        if open_descriptors(pid) >= baseline + 4:
                            break
                        select.select([], [], [], 0.01)
                    over = connect(base)
                    held.append(over)
                    status, _, body = read_response(over)
                    self.assertEqual(status, 503, body)
                    self.assertIn(b"max_connections", body)
                    # The server's descriptor for it is gone within 5 s (bounded polls).
                    t0 = time.monotonic()
                    for _ in range(500):
                        if open_descriptors(pid) <= baseline + 4:
                            break
                        select.select([], [], [], 0.01)
                    closed_after = time.monotonic() - t0
                    self.assertLessEqual(open_descriptors(pid), baseline + 4,
                                         "the over-limit connection was held open")
                    MEASURED.append(("%s: over-limit connection closed after its 503" % front,
                                     "%.2f s" % closed_after))
                    peak = 0
                    for _ in range(200):
                        held.append(connect(base))
                        peak = max(peak, open_descriptors(pid) - baseline)
                    MEASURED.append(("%s: connection descriptors, 200 over the limit of 4" %
                                     front, "peak %d" % peak))
                    self.assertLessEqual(peak, 4 + 64 + 2, "descriptors held past the hard cap")
                finally:
                    for s in held:
                        s.close()
                self.assertTrue(served(base), "not serving after the flood closed")


# ── F3: client-chosen tool names ─────────────────────────────────────────────────────────────


class HostileToolNameTest(unittest.TestCase):
    """F3: gated calls with many distinct, long tool names grow no label past
    [metrics] max_label_bytes and no more tool labels than [metrics] max_tools (the rest count as
    "other"): /metrics stays small, and a well-behaved call is still served."""

    TOOLS = 40            # distinct tool names sent
    NAME_BYTES = 50_000   # each this long
    MAX_TOOLS = 10
    MAX_METRICS_BYTES = 1 << 20

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-adversarial-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.config = os.path.join(self.dir, "idemgate.toml")
        with open(self.config, "w") as f:
            f.write("[metrics]\nmax_tools = %d\nmax_label_bytes = 128\n" % self.MAX_TOOLS)
        self.store = "sqlite:" + os.path.join(self.dir, "idemgate.db")

    def check_metrics(self, front, base):
        status, _, text = request(base, "GET", "/metrics")
        self.assertEqual(status, 200, text[:300])
        MEASURED.append(("%s: /metrics after %d tool names of %d bytes" %
                         (front, self.TOOLS, self.NAME_BYTES), "%d bytes" % len(text)))
        self.assertLess(len(text), self.MAX_METRICS_BYTES, "the exposition holds the names")
        tools = set()
        for line in text.decode().splitlines():
            if line.startswith("idemgate_attempts_total{"):
                tools.add(line.split('tool="', 1)[1].split('"', 1)[0])
        self.assertLessEqual(max(len(t) for t in tools), 128, sorted(tools))
        self.assertLessEqual(len(tools), self.MAX_TOOLS + 1, sorted(tools))
        self.assertIn("other", tools)

    def test_serve_begin_with_long_tool_names(self):
        proc, base = start(self, Front.serve(["--config", self.config], self.store)[0])
        for i in range(self.TOOLS):
            tool = "t%d-" % i + "x" * self.NAME_BYTES
            status, _, body = request(base, "POST", "/v1/calls/begin",
                                      {"turn_id": "turn", "tool": tool, "args": {"i": i}})
            self.assertEqual(status, 200, body[:300])
            decision = json.loads(body)
            status, _, body = request(base, "POST", "/v1/calls/complete", {
                "key": decision["key"], "fence": decision["fence"],
                "outcome": {"status": "success", "result": {}}})
            self.assertEqual(status, 200, body[:300])
        self.check_metrics("serve", base)
        status, _, body = request(base, "POST", "/v1/calls/begin",
                                  {"turn_id": "turn", "tool": "create_ticket", "args": {}})
        self.assertEqual((status, json.loads(body)["decision"]), (200, "execute"), body)

    def test_http_paths_as_tool_names(self):
        proc, base = start(self, Front.http(["--config", self.config], store=self.store)[0])
        for i in range(self.TOOLS):
            path = "/t%d/" % i + "x" * (self.NAME_BYTES // 5)  # 10 kB: within max_header_bytes
            status, _, body = request(base, "POST", path, {"i": i}, {"Idempotency-Key": "k%d" % i})
            self.assertEqual(status, 502, body[:300])  # the upstream is not there
        self.check_metrics("http", base)

    # An MCP session over Streamable HTTP, as bad_input_test.py drives one.
    headers = bad_input_test.HttpMcpTest.headers
    post = bad_input_test.HttpMcpTest.post
    messages = staticmethod(bad_input_test.HttpMcpTest.messages)
    initialize = bad_input_test.HttpMcpTest.initialize
    post_and_answer = bad_input_test.HttpMcpTest.post_and_answer
    call = bad_input_test.HttpMcpTest.call

    def test_mcp_tools_call_with_long_tool_names(self):
        args, env = Front.mcp(["--config", self.config], self.store,
                              os.path.join(self.dir, "ledger.jsonl"))
        proc, self.base = start(self, args, env)
        self.session, self.next_id = None, 10
        self.session = self.initialize("2025-06-18")[0]
        self.assertEqual(self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')[0],
                         202)
        for i in range(self.TOOLS):
            answer = self.call("tools/call", {
                "name": "t%d-" % i + "x" * self.NAME_BYTES, "arguments": {},
                "_meta": {"dev.idemgate/turnId": "turn-1"}})
            self.assertIn("result" if "result" in answer else "error", answer)
        self.check_metrics("mcp --listen", self.base)
        answer = self.call("tools/call", {"name": "create_ticket", "arguments": {"title": "ok"},
                                          "_meta": {"dev.idemgate/turnId": "turn-2"}})
        self.assertIn("result", answer, answer)


# ── F10: request targets ──────────────────────────────────────────────────────────────────────


class RecordingUpstream:
    """A real HTTP upstream on loopback that answers 200 and records each request target it
    received, to see what idemgate forwarded."""

    def __init__(self, test, hold=None):
        """`hold`: a threading.Event each request waits for (bounded by DEADLINE) before its
        answer, to keep calls in flight."""
        targets = self.targets = []
        headers = self.headers = []  # [(name, value)] of each request, in order

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                targets.append(self.path)
                headers.append(self.headers.items())
                if hold is not None:
                    hold.wait(DEADLINE)
                body = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        test.addCleanup(self.server.server_close)
        test.addCleanup(self.server.shutdown)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]


class RequestTargetTest(unittest.TestCase):
    """F10: on `idemgate http`, a route with mode = "explicit" cannot be skipped by spelling its
    path differently (repeated slashes, percent-encoded letters, dot-segments): each spelling is
    refused 400 for want of a key, and nothing reaches the upstream; dot-segments cannot climb
    out of the upstream's base path; an absolute-form target naming another host is refused."""

    SPELLINGS = ("/v1//charges", "/v1/%63harges", "/v1/./charges", "/v1/x/../charges",
                 "//v1/charges", "/v1/%2e/charges")

    def test_route_modes_hold_for_every_spelling(self):
        dir = tempfile.mkdtemp(prefix="idemgate-adversarial-")
        self.addCleanup(shutil.rmtree, dir, True)
        config = os.path.join(dir, "idemgate.toml")
        with open(config, "w") as f:
            f.write('[[route]]\nmatch = "/v1/charges"\nmode = "explicit"\n')
        upstream = RecordingUpstream(self)
        proc, base = start(self, Front.http(["--config", config], upstream=upstream.url + "/api")[0])
        status, _, body = request(base, "POST", "/v1/charges", {"amount": 1})
        self.assertEqual(status, 400, body)  # the route's mode, as spelt in the config
        for spelling in self.SPELLINGS:
            with self.subTest(target=spelling):
                status, _, body = request(base, "POST", spelling, {"amount": 1})
                self.assertEqual(status, 400, "%s skipped the route: %s %s" %
                                 (spelling, status, body[:200]))
                self.assertIn(b"Idempotency-Key", body)
        self.assertEqual(upstream.targets, [], "a charge without a key reached the upstream")
        status, _, _ = request(base, "GET", "/v1/../../admin")
        self.assertEqual(status, 200)
        self.assertEqual(upstream.targets, ["/api/admin"], "dot-segments left the base path")
        host, port = host_port(base)
        with connect(base) as sock:
            sock.sendall(b"GET http://internal.example/x HTTP/1.1\r\nHost: %s:%d\r\n\r\n" %
                         (host.encode(), port))
            status, _, body = read_response(sock)
        self.assertEqual(status, 400, body)
        self.assertIn(b"another host", body)
        self.assertEqual(upstream.targets, ["/api/admin"])
        self.assertTrue(served(base))


# ── F9: ledger steps bound to who began the call ─────────────────────────────────────────────


class LedgerStepOwnerTest(unittest.TestCase):
    """F9: the fence that GET /v1/records shows every client of a tenant no longer settles a call
    that another client began: not an `idemgate http` call in flight on the same store (the
    Debian units share one), and not a ledger API call begun with another token of the tenant.
    The client that began a call still completes it."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-adversarial-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.store = "sqlite:" + os.path.join(self.dir, "idemgate.db")

    def test_serve_cannot_release_an_http_call_in_flight(self):
        hold = threading.Event()
        self.addCleanup(hold.set)
        upstream = RecordingUpstream(self, hold)
        _, proxy = start(self, Front.http([], upstream=upstream.url, store=self.store)[0])
        _, serve = start(self, Front.serve([], self.store)[0])
        answer = {}
        charge = threading.Thread(target=lambda: answer.update(r=request(
            proxy, "POST", "/v1/charges", {"amount": 1}, {"Idempotency-Key": "order-1"})))
        charge.start()
        record = None
        for _ in range(1000):  # until the proxy's claim is visible through the ledger API
            status, _, body = request(serve, "GET", "/v1/records/order-1")
            if status == 200:
                record = json.loads(body)
                break
            select.select([], [], [], 0.01)
        self.assertIsNotNone(record, "the http call's record never appeared")
        self.assertEqual(record["state"], "in_progress", record)
        status, _, body = request(serve, "POST", "/v1/calls/release",
                                  {"key": "order-1", "fence": record["fence"]})
        self.assertEqual(status, 403, "another front's call was released: %s %s" % (status, body))
        self.assertIn(b"begun by another client", body)
        status, _, body = request(serve, "POST", "/v1/calls/complete", {
            "key": "order-1", "fence": record["fence"],
            "outcome": {"status": "success", "result": {"forged": True}}})
        self.assertEqual(status, 403, body)
        hold.set()
        charge.join(DEADLINE)
        self.assertEqual(answer["r"][0], 200, answer)
        self.assertEqual(json.loads(answer["r"][2]), {"ok": True})
        again = request(proxy, "POST", "/v1/charges", {"amount": 1}, {"Idempotency-Key": "order-1"})
        self.assertEqual(header(again[1], "Idempotent-Replayed"), "true", again)
        self.assertEqual(len(upstream.targets), 1, "the charge ran twice")

    def test_another_token_of_the_tenant_cannot_settle_a_call(self):
        config = os.path.join(self.dir, "idemgate.toml")
        with open(config, "w") as f:
            f.write('[[tenant]]\nname = "acme"\ntokens = ["token-of-front-a", '
                    '"token-of-front-b"]\n')
        _, serve = start(self, Front.serve(["--config", config], self.store)[0])
        a = {"Authorization": "Bearer token-of-front-a"}
        b = {"Authorization": "Bearer token-of-front-b"}
        status, _, body = request(serve, "POST", "/v1/calls/begin",
                                  {"turn_id": "t1", "tool": "charge", "args": {"n": 1}}, a)
        self.assertEqual(status, 200, body)
        begun = json.loads(body)
        status, _, body = request(serve, "GET", "/v1/records/" + begun["key"], headers=b)
        self.assertEqual(status, 200, body)  # B may read it, and sees the fence
        fence = json.loads(body)["fence"]
        self.assertEqual(fence, begun["fence"])
        for step in ("release", "heartbeat", "mark_unknown"):
            status, _, body = request(serve, "POST", "/v1/calls/" + step,
                                      {"key": begun["key"], "fence": fence}, b)
            self.assertEqual(status, 403, "%s by another token: %s %s" % (step, status, body))
        status, _, body = request(serve, "POST", "/v1/calls/complete", {
            "key": begun["key"], "fence": fence, "outcome": {"status": "success", "result": 1}}, a)
        self.assertEqual(status, 200, body)


# ── F11–F18: operator surfaces ───────────────────────────────────────────────────────────────


class OperatorSurfaceTest(unittest.TestCase):
    """The smaller findings that reach an operator: secrets in error messages (F14)."""

    def test_terminal_escapes_in_tool_names_are_not_printed_raw(self):
        """A ledger API client names its tool and turn with terminal escape sequences (a title
        change, a clipboard write, erase-line): `idemgate audit` and `idemgate inspect` print
        them escaped as \\xNN, never the raw ESC, BEL or C1 bytes (F12)."""
        dir = tempfile.mkdtemp(prefix="idemgate-adversarial-")
        self.addCleanup(shutil.rmtree, dir, True)
        store = "sqlite:" + os.path.join(dir, "idemgate.db")
        proc, base = start(self, Front.serve([], store)[0])
        hostile = "charge\u001b]0;pwned\u0007\u001b]52;c;ZWNobyBwd25lZA==\u0007\u001b[2K\u009b1A"
        status, _, body = request(base, "POST", "/v1/calls/begin",
                                  {"turn_id": "turn\u001b[1A", "tool": hostile, "args": {}})
        self.assertEqual(status, 200, body)
        begun = json.loads(body)
        status, _, body = request(base, "POST", "/v1/calls/complete", {
            "key": begun["key"], "fence": begun["fence"],
            "outcome": {"status": "success", "result": 1}})
        self.assertEqual(status, 200, body)
        self.assertEqual(proc.stop(), 0)
        for args in (["audit"], ["inspect", begun["key"]]):
            with self.subTest(command=args[0]):
                p = subprocess.run([BINARY, *args, "--store", store], capture_output=True,
                                   timeout=DEADLINE)
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                for raw in (b"\x1b", b"\x07", b"\xc2\x9b"):
                    self.assertNotIn(raw, p.stdout, "%s printed a raw control" % args[0])
                self.assertIn(b"charge\\x1b]0;pwned\\x07", p.stdout)

    def test_a_password_in_the_store_query_is_not_printed(self):
        """libpq takes `password=` in the URL's query: `cannot open store …` must not repeat it
        (on main it printed the URL with only the user info masked)."""
        p = subprocess.run([BINARY, "inspect", "k", "--store",
                            "postgres://idem@127.0.0.1:1/db?password=hunter2&sslmode=disable"],
                           capture_output=True, timeout=DEADLINE)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("cannot open store", err)
        self.assertIn("password=***", err)
        self.assertNotIn("hunter2", err)

    def test_a_store_off_the_host_without_verified_tls_is_warned_about(self):
        """F17: a front says at start, in one line, that its store is reached over the network
        without verified TLS (the warning comes before the store is reached; db.invalid never
        resolves, so the start then fails), and says nothing for a loopback one."""
        for store, warned in (("redis://:hunter2@db.invalid:6379", "plain text"),
                              ("postgres://idem@db.invalid/db?connect_timeout=1", "sslmode=prefer"),
                              ("redis://127.0.0.1:1", None)):
            with self.subTest(store=store):
                p = subprocess.run([BINARY, "serve", "--listen", "127.0.0.1:0", "--store", store],
                                   capture_output=True, timeout=DEADLINE)
                err = p.stderr.decode()
                self.assertEqual(p.returncode, 1, err)
                lines = [l for l in err.splitlines() if "warning: the store" in l]
                if warned is None:
                    self.assertEqual(lines, [], err)
                else:
                    self.assertEqual(len(lines), 1, err)
                    self.assertIn(warned, lines[0])
                    self.assertNotIn("hunter2", err)


# ── F18: what the proxy tells the upstream ───────────────────────────────────────────────────


class ForwardedHeadersTest(unittest.TestCase):
    """F18: on `idemgate http`, a client's Forwarded, X-Forwarded-Host/-Proto/-Port and X-Real-IP
    do not reach the upstream (which would believe them coming from its proxy), X-Forwarded-For
    ends with the client's real address, and a header named by a second Connection field is
    dropped like one named by the first."""

    def test_client_forwarding_claims_are_not_passed_on(self):
        upstream = RecordingUpstream(self)
        _, base = start(self, Front.http([], upstream=upstream.url)[0])
        host, port = host_port(base)
        with connect(base) as sock:
            sock.sendall(b"GET /whoami HTTP/1.1\r\nHost: %s:%d\r\n"
                         b"Forwarded: for=203.0.113.9;host=admin.internal;proto=https\r\n"
                         b"X-Forwarded-Host: admin.internal\r\nX-Forwarded-Proto: https\r\n"
                         b"X-Forwarded-Port: 443\r\nX-Real-IP: 203.0.113.9\r\n"
                         b"X-Forwarded-For: 203.0.113.9\r\n"
                         b"Connection: keep-alive\r\nConnection: X-Internal\r\n"
                         b"X-Internal: hop-only\r\nX-Kept: end-to-end\r\n\r\n" %
                         (host.encode(), port))
            status, _, body = read_response(sock)
        self.assertEqual(status, 200, body)
        self.assertEqual(len(upstream.headers), 1)
        seen = {n.lower(): v for n, v in upstream.headers[0]}
        for name in ("forwarded", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
                     "x-real-ip", "x-internal"):
            self.assertNotIn(name, seen, "%s reached the upstream: %s" % (name, seen))
        self.assertEqual(seen.get("x-kept"), "end-to-end")
        self.assertEqual(seen.get("x-forwarded-for"), "203.0.113.9, 127.0.0.1", seen)


# ── F7: cross-site requests in no-token mode ─────────────────────────────────────────────────


class CrossSiteTest(unittest.TestCase):
    """F7: without tokens every loopback caller is admin, so a web page the operator opens must
    not reach the ledger API, the console's API or /metrics: a request a browser marks as sent
    from another site (Sec-Fetch-Site: cross-site or same-site, another port of 127.0.0.1 being
    the same site) or from a foreign Origin is refused 403, GET included, before any work is
    done. The console's own page (same-origin) and CLI clients (no Origin, no Sec-Fetch-Site)
    are served."""

    FOREIGN = ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
               {"Origin": "http://evil.example"}, {"Origin": "null"},
               {"Origin": "http://127.0.0.1:1"})

    def check(self, base, paths):
        host = base.split("://", 1)[1]
        for path in paths:
            for headers in self.FOREIGN:
                with self.subTest(path=path, headers=headers):
                    status, _, body = request(base, "GET", path, headers=headers)
                    self.assertEqual(status, 403, "%s %s: %s" % (path, headers, body[:200]))
                    self.assertIn(b"cross-site", body)
            for headers in ({}, {"Sec-Fetch-Site": "same-origin", "Origin": "http://" + host},
                            {"Sec-Fetch-Site": "none"}):
                with self.subTest(path=path, headers=headers):
                    status, _, body = request(base, "GET", path, headers=headers)
                    self.assertNotEqual(status, 403, "%s %s: %s" % (path, headers, body[:200]))
        # The console's page itself may be opened from a link.
        status, _, _ = request(base, "GET", "/console", headers={"Sec-Fetch-Site": "cross-site"})
        self.assertEqual(status, 200)

    def test_serve_refuses_cross_site_requests(self):
        _, base = start(self, Front.serve([])[0])
        self.check(base, ("/v1/records/k", "/v1/attempts?key=x", "/console/api/replay",
                          "/console/api/whoami", "/metrics"))

    def test_http_refuses_cross_site_requests_to_its_console(self):
        _, base = start(self, Front.http([])[0])
        self.check(base, ("/console/api/replay", "/console/api/unknown", "/metrics"))


# ── F8: the console's origin on `idemgate http` ──────────────────────────────────────────────


class RelayedPageSandboxTest(unittest.TestCase):
    """F8: `idemgate http` serves its console on the origin it relays the upstream's answers on,
    so an upstream page (a reflected error page, a stored attachment) opened through the proxy
    would run as the console's origin. Every relayed or replayed answer carries
    `Content-Security-Policy: sandbox`: a browser gives it an opaque origin (no script, no
    access to the console, its requests marked cross-site and refused), while an API client
    ignores the header. The upstream's own headers are kept."""

    def test_relayed_and_replayed_answers_are_sandboxed(self):
        upstream = RecordingUpstream(self)
        _, base = start(self, Front.http([], upstream=upstream.url)[0])
        answers = [request(base, "GET", "/attachment"),
                   request(base, "POST", "/v1/charges", {"amount": 1}, {"Idempotency-Key": "o-1"}),
                   request(base, "POST", "/v1/charges", {"amount": 1}, {"Idempotency-Key": "o-1"})]
        self.assertEqual(header(answers[2][1], "Idempotent-Replayed"), "true")
        for status, headers, body in answers:
            self.assertEqual(status, 200, body)
            self.assertEqual(body, b'{"ok":true}')
            policies = [v for n, v in headers if n.lower() == "content-security-policy"]
            self.assertIn("sandbox", policies, headers)
        # The console's own answers keep their policy (the page must run its script).
        status, headers, _ = request(base, "GET", "/console")
        self.assertEqual(status, 200)
        self.assertNotIn("sandbox", header(headers, "Content-Security-Policy"))


def tearDownModule():
    for case, figure in MEASURED:
        print("measured: %s: %s" % (case, figure), file=sys.stderr)


def main():
    global BINARY, MCP_SERVER, VENDOR
    rest = bad_input_test.set_peers()
    BINARY, MCP_SERVER, VENDOR = (bad_input_test.BINARY, bad_input_test.MCP_SERVER,
                                  bad_input_test.VENDOR)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
