#!/usr/bin/env python3
"""Integration tests of `idemgate http` (docs/DESIGN.md §6.2): the real binary in
front of the real example vendor (examples/http-vendor/server.mjs), both on
port 0, answers checked against the vendor's ledger of side effects.

    python3 tests/integration/http/http_proxy_test.py --binary build/idemgate \
        --vendor examples/http-vendor/server.mjs [--redis-url-file FILE] [unittest args...]

With --redis-url-file (the `redis` CTest fixture writes one), a test runs two
proxies on one Redis. Standard library only; needs node and openssl.
"""
import argparse
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

BINARY = None
VENDOR = None
REDIS_URL_FILE = None
DEADLINE = 20.0  # seconds: generous bound for anything we poll for


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child process whose first matching output line is awaited, the rest drained."""

    def __init__(self, args, marker, stream="stdout", env=None):
        self.args = args
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self.lines = queue.Queue()
        self.log = []
        for name in ("stdout", "stderr"):
            threading.Thread(target=self._drain, args=(getattr(self.proc, name), name == stream),
                             daemon=True).start()
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError("%s did not print %r; output:\n%s" %
                                     (args[0], marker, "".join(self.log)))
            if line is None:
                self.stop()
                raise AssertionError("%s exited before printing %r; output:\n%s" %
                                     (args, marker, "".join(self.log)))
            if marker in line:
                self.url = line.strip().split(marker, 1)[1].strip()
                return

    def _drain(self, pipe, watched):
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.log.append(line)
            if watched:
                self.lines.put(line)
        pipe.close()
        if watched:
            self.lines.put(None)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def request(base_url, method, path, body=None, headers=None, timeout=DEADLINE, context=None):
    """One request on a new connection; returns (status, [(name, value)], body bytes)."""
    host_port = base_url.split("://", 1)[1]
    if base_url.startswith("https://"):
        conn = http.client.HTTPSConnection(host_port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(host_port, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    try:
        conn.request(method, path, body=data, headers=hdrs)
        res = conn.getresponse()
        return res.status, res.getheaders(), res.read()
    finally:
        conn.close()


def header(headers, name):
    for n, v in headers:
        if n.lower() == name.lower():
            return v
    return None


def end_to_end(headers):
    """Headers a replay must reproduce (the listener sets Date, Connection, Content-Length)."""
    skip = {"date", "connection", "content-length", "keep-alive", "idempotent-replayed"}
    return [(n.lower(), v) for n, v in headers if n.lower() not in skip]


class ProxyTest(unittest.TestCase):
    """Each test gets a temp dir, a vendor and an idemgate http in front of it."""

    CONFIG = ""
    VENDOR_ARGS = []

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-http-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ledger = os.path.join(self.dir, "vendor.jsonl")
        self.store = "sqlite:" + os.path.join(self.dir, "idemgate.db")
        self.vendor = None
        self.proxy = None
        if self.VENDOR_ARGS is not None:
            self.vendor = self.start_vendor(*self.VENDOR_ARGS)
            self.proxy = self.start_proxy(self.vendor.url, self.CONFIG)

    def start_vendor(self, *args):
        p = Process(["node", VENDOR, "--port", "0", "--ledger", self.ledger, *args],
                    "listening on ")
        p.url = p.url if "://" in p.url else "http://" + p.url
        self.addCleanup(p.stop)
        return p

    def start_proxy(self, upstream, config="", store=None, extra=()):
        path = os.path.join(self.dir, "idemgate-%s.toml" % uuid.uuid4().hex[:8])
        with open(path, "w") as f:
            f.write(config)
        p = Process([BINARY, "http", "--listen", "127.0.0.1:0", "--upstream", upstream,
                     "--store", store or self.store, "--config", path, *extra],
                    "idemgate http: listening on ", stream="stderr")
        self.addCleanup(p.stop)
        return p

    def post(self, path, body, key=None, headers=None, proxy=None):
        hdrs = dict(headers or {})
        if key is not None:
            hdrs["Idempotency-Key"] = key
        return request((proxy or self.proxy).url, "POST", path, body, hdrs)

    def ledger_lines(self):
        try:
            with open(self.ledger) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def inspect(self, key, tenant=None, store=None):
        args = [BINARY, "inspect", key, "--json", "--store", store or self.store]
        if tenant:
            args += ["--tenant", tenant]
        p = subprocess.run(args, capture_output=True, timeout=DEADLINE)
        if p.returncode != 0:
            return None
        return json.loads(p.stdout)

    def assertProblem(self, answer, status, type_suffix=None):
        code, headers, body = answer
        self.assertEqual(code, status, body)
        self.assertEqual(header(headers, "Content-Type"), "application/problem+json")
        problem = json.loads(body)
        self.assertEqual(problem["status"], status)
        self.assertTrue(problem["detail"])
        if type_suffix:
            self.assertTrue(problem["type"].endswith("/" + type_suffix), problem)
        return problem


CHARGE = {"amount": 1200, "currency": "eur", "customer": "cus_1"}


class BasicTest(ProxyTest):
    def test_replay_is_byte_identical_and_marked(self):
        first = self.post("/v1/charges", CHARGE, key="k-replay")
        self.assertEqual(first[0], 201, first[2])
        self.assertIsNone(header(first[1], "Idempotent-Replayed"))
        for _ in range(2):
            again = self.post("/v1/charges", CHARGE, key="k-replay")
            self.assertEqual(again[0], 201)
            self.assertEqual(again[2], first[2], "body byte-identical")
            self.assertEqual(end_to_end(again[1]), end_to_end(first[1]))
            self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
            # Answered by idemgate, not by the vendor's own key handling.
            self.assertIsNone(header(again[1], "x-vendor-replayed"))
        lines = self.ledger_lines()
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["idempotency_key"], "k-replay")
        self.assertEqual(lines[0]["headers"]["idempotency-key"], "k-replay")
        self.assertIn("127.0.0.1", lines[0]["headers"]["x-forwarded-for"])
        record = self.inspect("k-replay")
        self.assertEqual(record["state"], "completed")
        self.assertEqual(record["tool"], "POST /v1/charges")

    def test_tickets_run_once_per_key(self):
        # The vendor does not dedupe tickets: only idemgate stands between.
        for key in ("t-1", "t-1", "t-2", "t-1", "t-2"):
            self.assertEqual(self.post("/v1/tickets", {"title": "x"}, key=key)[0], 201)
        self.assertEqual(len(self.ledger_lines()), 2)

    def test_quoted_key_is_the_same_key(self):
        a = self.post("/v1/tickets", {"title": "q"}, key='"q-1"')
        b = self.post("/v1/tickets", {"title": "q"}, key='"q-1"')
        self.assertEqual(a[2], b[2])
        self.assertEqual(header(b[1], "Idempotent-Replayed"), "true")
        self.assertEqual(self.inspect("q-1")["state"], "completed")

    def test_turn_header_derives_a_key(self):
        turn = {"Idemgate-Turn-Id": "turn-1"}
        a = self.post("/v1/tickets", {"title": "a"}, headers=turn)
        b = self.post("/v1/tickets", {"title": "a"}, headers=turn)
        self.assertEqual(a[2], b[2])
        self.assertEqual(header(b[1], "Idempotent-Replayed"), "true")
        c = self.post("/v1/tickets", {"title": "a"}, headers={"Idemgate-Turn-Id": "turn-2"})
        self.assertEqual(c[0], 201)
        self.assertIsNone(header(c[1], "Idempotent-Replayed"))
        lines = self.ledger_lines()
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0]["idempotency_key"].startswith("v1t.turn-1."), lines[0])
        self.assertNotIn("idemgate-turn-id", lines[0]["headers"])

    def test_no_key_no_turn_passes_through(self):
        for _ in range(2):
            self.assertEqual(self.post("/v1/tickets", {"title": "free"})[0], 201)
        self.assertEqual(len(self.ledger_lines()), 2)
        status, _, body = request(self.proxy.url, "GET", "/v1/ledger")
        self.assertEqual(status, 200)
        self.assertEqual(len(json.loads(body)["lines"]), 2)

    def test_malformed_key_is_400(self):
        for bad in ('"unterminated', '"a", "b"', 'k;p=1', "caf\u00e9"):
            hdrs = {"Idempotency-Key": bad.encode("utf-8")}
            self.assertProblem(request(self.proxy.url, "POST", "/v1/tickets", {"title": "x"}, hdrs),
                               400, "invalid-idempotency-key")
        self.assertProblem(self.post("/v1/tickets", {"title": "x"}, key="x" * 256), 400)
        self.assertEqual(self.ledger_lines(), [])

    def test_drift_is_422(self):
        self.assertEqual(self.post("/v1/tickets", {"title": "one"}, key="d-1")[0], 201)
        problem = self.assertProblem(self.post("/v1/tickets", {"title": "two"}, key="d-1"), 422,
                                     "drift")
        self.assertEqual(problem["key"], "d-1")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_vendor_4xx_is_stored_and_replayed(self):
        bad = {"amount": -1, "currency": "eur", "customer": "c"}
        first = self.post("/v1/charges", bad, key="e-1")
        self.assertEqual(first[0], 400)
        again = self.post("/v1/charges", bad, key="e-1")
        self.assertEqual((again[0], again[2]), (first[0], first[2]))
        self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
        self.assertEqual(self.inspect("e-1")["outcome_class"], "tool_error")

    def test_429_is_passed_through_released_and_the_retry_runs(self):
        # The vendor rate-limits the first POST of the key. Stored as a tool error, that 429 was
        # replayed with Idempotent-Replayed: true to every retry for a day, and the charge never
        # ran.
        fault = {"X-Vendor-Fault": "refuse-once:429"}
        first = self.post("/v1/charges", CHARGE, key="rl-1", headers=fault)
        self.assertEqual(first[0], 429, first[2])
        self.assertEqual(header(first[1], "Retry-After"), "1")
        self.assertIsNone(header(first[1], "Idempotent-Replayed"))
        self.assertIsNone(self.inspect("rl-1"), "released: no record")
        self.assertEqual(self.ledger_lines(), [])
        again = self.post("/v1/charges", CHARGE, key="rl-1", headers=fault)
        self.assertEqual(again[0], 201, again[2])
        self.assertIsNone(header(again[1], "Idempotent-Replayed"), "it ran, not replayed")
        self.assertEqual(len(self.ledger_lines()), 1)
        self.assertEqual(header(self.post("/v1/charges", CHARGE, key="rl-1", headers=fault)[1],
                                "Idempotent-Replayed"), "true")

    def test_answers_that_say_the_vendor_did_not_act_are_released(self):
        for status in (408, 409, 423, 425, 307):
            key = "na-%d" % status
            answer = self.post("/v1/tickets", {"title": "x"}, key=key,
                               headers={"X-Vendor-Fault": "refuse:%d" % status})
            self.assertEqual(answer[0], status, answer[2])
            self.assertIsNone(self.inspect(key), "HTTP %d released" % status)
        self.assertEqual(self.ledger_lines(), [])

    def test_5xx_after_the_side_effect_leaves_the_outcome_unknown(self):
        answer = self.post("/v1/tickets", {"title": "x"}, key="u-500",
                           headers={"X-Vendor-Fault": "500"})
        self.assertProblem(answer, 502, "outcome-unknown")
        self.assertEqual(self.inspect("u-500")["state"], "unknown")
        # A retry does not run it again and says why.
        self.assertProblem(self.post("/v1/tickets", {"title": "x"}, key="u-500"), 409,
                           "outcome-unknown")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_dropped_connection_after_sending_leaves_the_outcome_unknown(self):
        answer = self.post("/v1/tickets", {"title": "x"}, key="u-drop",
                           headers={"X-Vendor-Fault": "drop"})
        self.assertProblem(answer, 502, "outcome-unknown")
        self.assertEqual(self.inspect("u-drop")["state"], "unknown")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_concurrent_duplicates_execute_once(self):
        answers = [None] * 20
        barrier = threading.Barrier(20)

        def one(i):
            barrier.wait()
            answers[i] = self.post("/v1/tickets", {"title": "storm"}, key="storm-1")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(self.ledger_lines()), 1, "one upstream side effect")
        self.assertEqual({a[0] for a in answers}, {201})
        self.assertEqual(len({a[2] for a in answers}), 1, "twenty identical answers")

    def test_sigterm_stops_gracefully(self):
        self.assertEqual(self.post("/v1/tickets", {"title": "x"}, key="bye")[0], 201)
        self.assertEqual(self.proxy.stop(), 0)
        self.assertIn("stopping on SIGTERM", "".join(self.proxy.log))

    def test_each_stop_signal_right_after_a_replay_exits_0_with_the_replay_logged(self):
        # The audit log is written in batches; a stop must write what is
        # buffered (a host or a terminal stops with any of these).
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with self.subTest(signal=sig.name):
                store = "sqlite:" + os.path.join(self.dir, "stop-%s.db" % sig.name)
                proxy = self.start_proxy(self.vendor.url, store=store)
                key = "stop-" + sig.name
                self.assertEqual(self.post("/v1/tickets", {"title": key}, key=key,
                                           proxy=proxy)[0], 201)
                again = self.post("/v1/tickets", {"title": key}, key=key, proxy=proxy)
                self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
                self.assertEqual(proxy.stop(sig), 0, "".join(proxy.log))
                self.assertIn("stopping on " + sig.name, "".join(proxy.log))
                audit = subprocess.run([BINARY, "audit", "--json", "--store", store],
                                       capture_output=True, timeout=DEADLINE)
                self.assertEqual(audit.returncode, 0, audit.stderr)
                outcomes = sorted(json.loads(line)["outcome"]
                                  for line in audit.stdout.decode().splitlines())
                self.assertEqual([o for o in outcomes if o != "claimed"], ["executed", "replayed"])

    def test_admin_endpoints(self):
        self.assertEqual(request(self.proxy.url, "GET", "/healthz")[0], 200)
        self.assertEqual(request(self.proxy.url, "GET", "/readyz")[0], 200)


class LimitsTest(ProxyTest):
    CONFIG = """
[limits]
max_body_bytes = "1KiB"

[http]
upstream_timeout = "700ms"

[[route]]
match = "/v1/tickets"
wait = "200ms"
"""

    def test_body_over_the_limit_is_413(self):
        answer = self.post("/v1/tickets", {"title": "x" * 2000}, key="big-1")
        self.assertEqual(answer[0], 413)
        self.assertEqual(self.ledger_lines(), [])

    def test_in_progress_after_wait_is_409_with_retry_after(self):
        # The slow first request sits in the vendor for 600 ms; the tickets route's
        # wait (200 ms) runs out before it answers.
        first = []
        t = threading.Thread(target=lambda: first.append(
            self.post("/v1/tickets", {"title": "slow"}, key="slow-1",
                      headers={"X-Vendor-Fault": "delay:600"})))
        t.start()
        deadline = time.monotonic() + DEADLINE
        while not self.ledger_lines() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the side effect, not timing
        self.assertEqual(len(self.ledger_lines()), 1)
        answer = self.post("/v1/tickets", {"title": "slow"}, key="slow-1")
        problem = self.assertProblem(answer, 409, "in-progress")
        self.assertGreaterEqual(int(header(answer[1], "Retry-After")), 1)
        self.assertEqual(problem["key"], "slow-1")
        t.join()
        self.assertEqual(first[0][0], 201)
        again = self.post("/v1/tickets", {"title": "slow"}, key="slow-1")
        self.assertEqual(again[2], first[0][2])
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_timeout_after_sending_is_504_and_unknown(self):
        answer = self.post("/v1/tickets", {"title": "x"}, key="u-timeout",
                           headers={"X-Vendor-Fault": "delay:3000"})
        self.assertProblem(answer, 504, "outcome-unknown")
        self.assertEqual(self.inspect("u-timeout")["state"], "unknown")


class TooLargeTest(ProxyTest):
    CONFIG = """
[defaults]
max_result_bytes = "4KiB"

[http]
max_response_bytes = "64KiB"
"""

    def test_answer_over_max_result_bytes_is_relayed_once_then_a_marker(self):
        fault = {"X-Vendor-Fault": "big:10000"}
        first = self.post("/v1/tickets", {"title": "big"}, key="big-res", headers=fault)
        self.assertEqual(first[0], 201)
        self.assertEqual(len(first[2]), 10000, "the first caller gets the whole answer")
        problem = self.assertProblem(self.post("/v1/tickets", {"title": "big"}, key="big-res"),
                                     409, "outcome-too-large")
        self.assertEqual(problem["upstream_status"], 201)
        self.assertEqual(self.inspect("big-res")["outcome_class"], "too_large")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_5xx_over_max_response_bytes_is_unknown_not_executed(self):
        # Judged by its status first: an over-limit 5xx was stored as "executed".
        answer = self.post("/v1/tickets", {"title": "x"}, key="big-500",
                           headers={"X-Vendor-Fault": "big500:%d" % (2 << 20)})
        self.assertProblem(answer, 502, "outcome-unknown")
        self.assertEqual(self.inspect("big-500")["state"], "unknown")

    def test_answer_over_max_response_bytes_is_502_and_not_run_again(self):
        fault = {"X-Vendor-Fault": "big:100000"}
        self.assertProblem(self.post("/v1/tickets", {"title": "huge"}, key="huge", headers=fault),
                           502, "upstream-answer-too-large")
        self.assertProblem(self.post("/v1/tickets", {"title": "huge"}, key="huge"), 409,
                           "outcome-too-large")
        self.assertEqual(len(self.ledger_lines()), 1)


class PassThroughStreamTest(ProxyTest):
    """Answers that are not gated are relayed as the vendor sends them: any size (beyond
    max_response_bytes, which bounds stored answers), and an event stream's first event
    before the vendor has finished."""

    CONFIG = """
[http]
max_response_bytes = "64KiB"
"""

    def test_download_larger_than_max_response_bytes_is_relayed_whole(self):
        size = 20_000_000
        status, headers, body = request(self.proxy.url, "GET", "/v1/export?bytes=%d" % size)
        self.assertEqual(status, 200, body[:200])
        self.assertEqual(header(headers, "Content-Length"), str(size))
        self.assertEqual(len(body), size)
        block = bytes(i % 251 for i in range(251 * 256))
        expected = block * (size // len(block)) + block[:size % len(block)]
        self.assertTrue(body == expected, "the bytes the vendor sent, in order")
        # The connection to the vendor went back to the pool and works.
        self.assertEqual(request(self.proxy.url, "GET", "/healthz")[0], 200)

    def test_event_stream_is_relayed_as_it_comes(self):
        host_port = self.proxy.url.split("://", 1)[1]
        conn = http.client.HTTPConnection(host_port, timeout=DEADLINE)
        self.addCleanup(conn.close)
        conn.request("GET", "/v1/events")
        res = conn.getresponse()
        self.assertEqual(res.status, 200)
        self.assertEqual(res.getheader("Content-Type"), "text/event-stream")
        self.assertEqual(res.getheader("Transfer-Encoding"), "chunked")
        # The vendor holds the rest back until the release below: buffered, this read would
        # wait until DEADLINE and fail.
        self.assertEqual(res.read(len(b"data: first\n\n")), b"data: first\n\n")
        status, _, body = request(self.vendor.url, "POST", "/v1/events/release", {})
        self.assertEqual((status, json.loads(body)), (200, {"released": 1}))
        self.assertEqual(res.read(), b"data: second\n\n")
        # Keep-alive: the same client connection serves the next request.
        conn.request("GET", "/healthz")
        self.assertEqual(conn.getresponse().status, 200)

    def test_client_leaving_mid_stream_frees_the_vendor_connection(self):
        host_port = self.proxy.url.split("://", 1)[1]
        conn = http.client.HTTPConnection(host_port, timeout=DEADLINE)
        conn.request("GET", "/v1/export?bytes=%d" % (1 << 30))
        res = conn.getresponse()
        self.assertEqual(len(res.read(1 << 16)), 1 << 16)
        conn.close()  # a GiB not read: idemgate must close its vendor connection, not buffer it
        deadline = time.monotonic() + DEADLINE
        while True:  # until the vendor sees its answer abandoned
            status, _, body = request(self.vendor.url, "GET", "/healthz")
            if json.loads(body)["open_streams"] == 0 or time.monotonic() > deadline:
                break
        self.assertEqual(json.loads(body)["open_streams"], 0, "the vendor still streams")
        self.assertEqual(request(self.proxy.url, "GET", "/healthz")[0], 200)
        self.assertEqual(self.proxy.stop(), 0, "".join(self.proxy.log))


class ReconcileTest(ProxyTest):
    CONFIG = """
[[route]]
match = "/v1/charges"
on_unknown = "reconcile"
reconcile = "/v1/charges?idempotency_key={key}"
"""

    def test_unknown_outcome_found_by_the_lookup_is_replayed(self):
        self.assertProblem(self.post("/v1/charges", CHARGE, key="rc-1",
                                     headers={"X-Vendor-Fault": "500"}), 502, "outcome-unknown")
        self.assertEqual(self.inspect("rc-1")["state"], "unknown")
        again = self.post("/v1/charges", CHARGE, key="rc-1")
        self.assertEqual(again[0], 200, again[2])
        self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
        self.assertEqual(json.loads(again[2])["idempotency_key"], "rc-1")
        self.assertEqual(self.inspect("rc-1")["state"], "completed")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_unknown_outcome_not_found_executes(self):
        self.assertProblem(self.post("/v1/charges", CHARGE, key="rc-2",
                                     headers={"X-Vendor-Fault": "500-before"}), 502,
                           "outcome-unknown")
        self.assertEqual(self.ledger_lines(), [])
        again = self.post("/v1/charges", CHARGE, key="rc-2")
        self.assertEqual(again[0], 201, again[2])
        self.assertEqual(len(self.ledger_lines()), 1)


class ReconcileWithCredentialsTest(ProxyTest):
    """A vendor that wants its API key on every request, lookups included. The lookup asked for
    idemgate's record key (c<hash>/<key> once a credential scopes it; unquoted where the vendor
    got the quoted sf-string) without credentials: a 404 ran the call again, a 401 could never
    tell (guarantees review F1)."""
    CONFIG = ReconcileTest.CONFIG
    VENDOR_ARGS = ["--api-key", "sk_test"]
    AUTH = {"Authorization": "Bearer sk_test"}

    def unknown_then_retry(self, key):
        self.assertProblem(self.post("/v1/charges", CHARGE, key=key,
                                     headers=dict(self.AUTH, **{"X-Vendor-Fault": "500"})),
                           502, "outcome-unknown")
        return self.post("/v1/charges", CHARGE, key=key, headers=self.AUTH)

    def test_the_lookup_asks_for_the_forwarded_key_with_the_callers_credentials(self):
        again = self.unknown_then_retry("rcc-1")
        self.assertEqual(again[0], 200, again[2])
        self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
        self.assertEqual(json.loads(again[2])["idempotency_key"], "rcc-1")
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_a_quoted_key_is_looked_up_as_the_vendor_received_it(self):
        again = self.unknown_then_retry('"rcc-2"')
        self.assertEqual(again[0], 200, again[2])
        self.assertEqual(header(again[1], "Idempotent-Replayed"), "true")
        self.assertEqual(json.loads(again[2])["idempotency_key"], '"rcc-2"')
        self.assertEqual(len(self.ledger_lines()), 1)


class LeaseOutlivesRequestTest(ProxyTest):
    """A lease must outlive the longest a request to the vendor can stay open (connect +
    upstream timeout), or an instance cut off from the store loses it while the vendor may still
    act, and a retry runs the call again (guarantees F3): refused at start, exit 2."""

    VENDOR_ARGS = None

    def test_a_lease_shorter_than_the_upstream_timeout_is_refused_at_start(self):
        path = os.path.join(self.dir, "short-lease.toml")
        with open(path, "w") as f:
            f.write('[defaults]\nlease = "2m"\n\n[http]\nupstream_timeout = "60s"\n\n'
                    '[[route]]\nmatch = "/v1/charges"\nlease = "30s"\n')
        proc = subprocess.run([BINARY, "http", "--listen", "127.0.0.1:0", "--upstream",
                               "http://127.0.0.1:9", "--store", self.store, "--config", path],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        err = proc.stderr.decode()
        self.assertEqual(proc.returncode, 2, err)
        self.assertIn("route /v1/charges has lease = \"30s\"", err)
        self.assertIn("set lease above 1m5s", err)


class ExplicitRouteTest(ProxyTest):
    CONFIG = """
[[route]]
match = "/v1/charges"
mode = "explicit"
key_header = "X-Vendor-Key"
"""
    VENDOR_ARGS = ["--key-header", "X-Vendor-Key"]

    def test_missing_key_is_400(self):
        self.assertProblem(self.post("/v1/charges", CHARGE), 400, "idempotency-key-required")
        self.assertProblem(self.post("/v1/charges", CHARGE, headers={"Idemgate-Turn-Id": "t"}),
                           400, "idempotency-key-required")
        self.assertEqual(self.ledger_lines(), [])

    def test_key_is_forwarded_in_the_configured_header(self):
        self.assertEqual(self.post("/v1/charges", CHARGE, key="fwd-1")[0], 201)
        line = self.ledger_lines()[0]
        self.assertEqual(line["idempotency_key"], "fwd-1")
        self.assertEqual(line["headers"]["x-vendor-key"], "fwd-1")
        self.assertNotIn("idempotency-key", line["headers"])


class UpstreamDownTest(ProxyTest):
    VENDOR_ARGS = None  # the vendor starts later, on a port known in advance

    def test_not_sent_is_502_and_released_then_runs_once_the_vendor_is_up(self):
        port = free_port()
        self.proxy = self.start_proxy("http://127.0.0.1:%d" % port)
        self.assertProblem(self.post("/v1/tickets", {"title": "x"}, key="down-1"), 502,
                           "upstream-unreachable")
        self.assertIsNone(self.inspect("down-1"), "the record was released")
        self.start_vendor("--port", str(port))  # a later --port wins in parseArgs
        self.assertEqual(self.post("/v1/tickets", {"title": "x"}, key="down-1")[0], 201)
        self.assertEqual(len(self.ledger_lines()), 1)


class TenantTest(ProxyTest):
    CONFIG = """
[[tenant]]
name = "alpha"
tokens = ["token-alpha"]
[[tenant]]
name = "beta"
tokens = ["token-beta"]
"""

    def test_records_never_cross_tenants(self):
        alpha = {"Authorization": "Bearer token-alpha"}
        beta = {"Authorization": "Bearer token-beta"}
        a1 = self.post("/v1/tickets", {"title": "same"}, key="shared", headers=alpha)
        b1 = self.post("/v1/tickets", {"title": "same"}, key="shared", headers=beta)
        self.assertEqual((a1[0], b1[0]), (201, 201))
        self.assertNotEqual(a1[2], b1[2], "each tenant ran its own")
        a2 = self.post("/v1/tickets", {"title": "same"}, key="shared", headers=alpha)
        self.assertEqual(a2[2], a1[2])
        self.assertEqual(len(self.ledger_lines()), 2)
        self.assertEqual(self.inspect("shared", tenant="alpha")["tenant"], "alpha")
        for line in self.ledger_lines():
            self.assertNotIn("authorization", line["headers"], "the idemgate token stays here")
        self.assertEqual(self.post("/v1/tickets", {"title": "same"}, key="shared")[0], 401)


class HttpsUpstreamTest(ProxyTest):
    VENDOR_ARGS = None

    def make_certificate(self):
        cert = os.path.join(self.dir, "cert.pem")
        key = os.path.join(self.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True, timeout=DEADLINE)
        return cert, key

    def test_https_upstream_with_a_private_ca(self):
        cert, key = self.make_certificate()
        vendor = self.start_vendor("--https", "--cert", cert, "--key", key)
        self.assertTrue(vendor.url.startswith("https://"), vendor.url)
        config = '[http]\nupstream_ca_file = "%s"\n' % cert
        self.proxy = self.start_proxy(vendor.url, config)
        first = self.post("/v1/tickets", {"title": "tls"}, key="tls-1")
        self.assertEqual(first[0], 201, first[2])
        again = self.post("/v1/tickets", {"title": "tls"}, key="tls-1")
        self.assertEqual(again[2], first[2])
        self.assertEqual(len(self.ledger_lines()), 1)

    def test_an_unknown_ca_is_refused_and_not_sent(self):
        cert, key = self.make_certificate()
        vendor = self.start_vendor("--https", "--cert", cert, "--key", key)
        self.proxy = self.start_proxy(vendor.url)  # verification on, CA not trusted
        self.assertProblem(self.post("/v1/tickets", {"title": "tls"}, key="tls-2"), 502,
                           "upstream-unreachable")
        self.assertIsNone(self.inspect("tls-2"))
        self.assertEqual(self.ledger_lines(), [])


class VendorProfileTest(ProxyTest):
    """Each vendor profile forwards the key where that vendor dedupes on it."""

    # profile -> (header the vendor sees, body field the vendor sees); one of them.
    PROFILES = {
        "stripe": ("idempotency-key", None),
        "paypal": ("paypal-request-id", None),
        "adyen": ("idempotency-key", None),
        "checkout": ("cko-idempotency-key", None),
        "square": (None, "idempotency_key"),
    }

    def test_each_profile_forwards_the_key_where_its_vendor_reads_it(self):
        for profile, (want_header, want_field) in self.PROFILES.items():
            with self.subTest(profile=profile):
                config = '[[route]]\nmatch = "/v1/tickets"\nprofile = "%s"\n' % profile
                self.proxy = self.start_proxy(self.vendor.url, config)
                key = "%s-1" % profile
                first = self.post("/v1/tickets", {"title": profile}, key='"%s"' % key)
                self.assertEqual(first[0], 201, first[2])
                self.assertEqual(self.post("/v1/tickets", {"title": profile}, key=key)[0], 201)
                line = self.ledger_lines()[-1]
                self.assertEqual(line["body"]["title"], profile, "one execution per key")
                headers = line["headers"]
                if want_header:
                    self.assertEqual(headers.get(want_header), key, headers)  # bare, not "..."
                else:
                    self.assertEqual(line["body"].get(want_field), key, line["body"])
                    self.assertNotIn("idempotency-key", headers)
                for other in ("idempotency-key", "paypal-request-id", "cko-idempotency-key"):
                    if other != want_header:
                        self.assertNotIn(other, headers, profile)
        self.assertEqual(len(self.ledger_lines()), len(self.PROFILES))

    def test_a_ttl_longer_than_the_vendors_window_is_warned_about_at_start(self):
        proxy = self.start_proxy(self.vendor.url,
                                 '[[route]]\nmatch = "/v2/orders"\nprofile = "paypal"\n')
        log = "".join(proxy.log)
        self.assertIn("route POST,PATCH /v2/orders:", log)
        self.assertIn("warning: route /v2/orders keeps records for 1d, but PayPal keeps a key for "
                      "6h", log)
        quiet = self.start_proxy(self.vendor.url, '[[route]]\nmatch = "/v2/orders"\n'
                                 'profile = "paypal"\nttl = "6h"\n')
        self.assertNotIn("warning: route", "".join(quiet.log))


class SharedRedisTest(ProxyTest):
    VENDOR_ARGS = None

    def redis_store(self):
        """The `redis` fixture's server, database 0; skips the test without one."""
        if not REDIS_URL_FILE:
            self.skipTest("no --redis-url-file")
        with open(REDIS_URL_FILE) as f:
            base = f.read().strip()
        return base.rsplit("/", 1)[0] + "/0" if base.count("/") > 2 else base

    def test_two_instances_on_one_redis_execute_once(self):
        store = self.redis_store()
        vendor = self.start_vendor()
        proxies = [self.start_proxy(vendor.url, store=store) for _ in range(2)]
        key = "redis-" + uuid.uuid4().hex
        answers = [None] * 20
        barrier = threading.Barrier(20)

        def one(i):
            barrier.wait()
            answers[i] = self.post("/v1/tickets", {"title": "fleet"}, key=key,
                                   proxy=proxies[i % 2])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(self.ledger_lines()), 1)
        self.assertEqual({a[0] for a in answers}, {201})
        self.assertEqual(len({a[2] for a in answers}), 1)

    def test_sigterm_with_a_request_at_the_vendor_ends_it_and_settles_its_record(self):
        # On Redis the listener, the upstream client and the store share one
        # io_context: stopping must end the exchange still at the vendor past
        # --drain-timeout, and store its outcome as unknown, while those
        # threads still run.
        store = self.redis_store()
        vendor = self.start_vendor()
        proxy = self.start_proxy(vendor.url, store=store, extra=("--drain-timeout", "200ms"))
        key = "sigterm-" + uuid.uuid4().hex
        answer = []

        def slow():
            try:
                answer.append(self.post("/v1/tickets", {"title": "slow"}, key=key,
                                        headers={"X-Vendor-Fault": "delay:60000"}, proxy=proxy))
            except (OSError, http.client.HTTPException) as e:
                answer.append(e)

        t = threading.Thread(target=slow)
        t.start()
        deadline = time.monotonic() + DEADLINE
        while not self.ledger_lines():  # the side effect is done; the answer waits 60 s
            self.assertLess(time.monotonic(), deadline, "the request never reached the vendor")
            time.sleep(0.02)
        # Exits on its own (stop() kills it after DEADLINE, which is under the 60 s).
        self.assertEqual(proxy.stop(), 0, "".join(proxy.log))
        t.join()
        self.assertNotEqual(answer[0][0] if isinstance(answer[0], tuple) else None, 201)
        record = self.inspect(key, store=store)
        self.assertIsNotNone(record)
        self.assertEqual(record["state"], "unknown", record)


def main():
    global BINARY, VENDOR, REDIS_URL_FILE
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--binary", default="build/idemgate")
    parser.add_argument("--vendor", default="examples/http-vendor/server.mjs")
    parser.add_argument("--redis-url-file", default=None)
    args, rest = parser.parse_known_args()
    BINARY = os.path.abspath(args.binary)
    VENDOR = os.path.abspath(args.vendor)
    REDIS_URL_FILE = args.redis_url_file
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
