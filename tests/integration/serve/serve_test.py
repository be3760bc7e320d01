#!/usr/bin/env python3
"""Integration tests of `idemgate serve` (the ledger API): real binaries on port 0, driven by the
runtime helpers in examples/ledger-helpers (Python, and Node for the .mjs one) and by raw HTTP.

    IDEMGATE=build/idemgate [IDEM_REDIS_URL_FILE=build/redis-single/url] \
        [IDEM_REDIS_TLS_URL_FILE=build/redis-tls/url] \
        python3 tests/integration/serve/serve_test.py [unittest args...]

The shared-store tests need real Redis servers: CTest starts them (the `redis` and `redis_tls`
fixtures) and passes their URL files; run by hand without them, those tests fail rather than
pass unseen. Standard library only.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
HELPERS = os.path.join(ROOT, "examples", "ledger-helpers")
sys.path.insert(0, HELPERS)
import idemgate_ledger  # noqa: E402

BINARY = os.environ.get("IDEMGATE", os.path.join(ROOT, "build", "idemgate"))
DEADLINE = 30  # seconds; a safety net for a broken build, never a timing assumption

CONFIG_TENANTS = """
[[tenant]]
name = "alice"
tokens = ["t-alice"]

[[tenant]]
name = "bob"
tokens = ["t-bob"]

[[tenant]]
name = "ops"
tokens = ["t-root"]
admin = true
"""


class Serve:
    """One `idemgate serve` process on 127.0.0.1:0."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([BINARY, "serve", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.url = None
        ready = threading.Event()

        def pump():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                m = re.search(r"listening on (http://\S+)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    ready.set()
            ready.set()
            self.proc.stderr.close()

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        ready.wait(DEADLINE)
        if not self.url:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("idemgate serve did not start: " + "\n".join(self.lines))

    def stop(self, sig=signal.SIGTERM):
        """Sends `sig`; returns the exit status (a graceful stop exits 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(DEADLINE)
        self.pump.join(DEADLINE)
        return code


def http(method, url, body=None, token=None, content_type="application/json", raw=None):
    """Returns (status, headers, parsed JSON or text)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {}
    if data is not None and content_type:
        headers["Content-Type"] = content_type
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as res:
            status, hdrs, text = res.status, dict(res.headers), res.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, hdrs, json.loads(text) if text else None
    except ValueError:
        return status, hdrs, text


class ServeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-serve-")
        self.store = "sqlite:" + os.path.join(self.dir, "idemgate.db")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def serve(self, *args, store=None):
        listen = () if "--listen" in args else ("--listen", "127.0.0.1:0")
        s = Serve(*listen, "--store", store or self.store, *args)
        self.servers.append(s)
        return s

    def tenant_config(self):
        path = os.path.join(self.dir, "idemgate.toml")
        with open(path, "w") as f:
            f.write(CONFIG_TENANTS)
        return path

    # ── the Python helper ──

    def test_python_helper_executes_once_and_replays_the_retry(self):
        s = self.serve()
        ledger = idemgate_ledger.Ledger(s.url)
        runs = []

        def create_ticket(title):
            with ledger.call("turn-1", "create_ticket", {"title": title, "n": 12345678901234567891}) as c:
                if c.replayed:
                    return c.outcome["result"], True
                runs.append(title)
                result = {"id": len(runs), "title": title}
                c.complete(result)
                return result, False

        first, replayed = create_ticket("printer on fire")
        self.assertFalse(replayed)
        again, replayed = create_ticket("printer on fire")
        self.assertTrue(replayed)
        self.assertEqual(again, first)
        self.assertEqual(runs, ["printer on fire"])
        other, replayed = create_ticket("another")  # different arguments: a new call
        self.assertFalse(replayed)
        self.assertEqual(len(runs), 2)

        # An exception marks the call unknown: a retry is told not to repeat it blindly.
        with self.assertRaises(RuntimeError):
            with ledger.call("turn-2", "charge", {"cents": 100}):
                raise RuntimeError("network cut after sending")
        with self.assertRaises(idemgate_ledger.LedgerError) as err:
            with ledger.call("turn-2", "charge", {"cents": 100}):
                self.fail("must not run")
        self.assertEqual(err.exception.status, 409)
        self.assertEqual(err.exception.type, "outcome-unknown")

        # NotSent releases: the retry executes.
        with self.assertRaises(idemgate_ledger.NotSent):
            with ledger.call("turn-3", "charge", {"cents": 5}):
                raise idemgate_ledger.NotSent()
        with ledger.call("turn-3", "charge", {"cents": 5}) as c:
            self.assertFalse(c.replayed)
            c.complete({"ok": True}, status="error")  # a tool error is stored and replayed
        with ledger.call("turn-3", "charge", {"cents": 5}) as c:
            self.assertTrue(c.replayed)
            self.assertEqual(c.outcome, {"status": "error", "result": {"ok": True}})
        self.assertEqual(s.stop(), 0)

        # The graceful stop flushed the audit log.
        audit = subprocess.run([BINARY, "audit", "--store", self.store, "--json"],
                               capture_output=True, timeout=DEADLINE)
        self.assertEqual(audit.returncode, 0, audit.stderr)
        outcomes = [json.loads(line)["outcome"] for line in audit.stdout.decode().splitlines()]
        self.assertIn("executed", outcomes)
        self.assertIn("replayed", outcomes)
        self.assertIn("unknown", outcomes)
        self.assertIn("released", outcomes)

    def test_sigint_and_sighup_stop_it_as_sigterm_does_with_the_audit_log_written(self):
        for sig in (signal.SIGINT, signal.SIGHUP):
            with self.subTest(signal=sig.name):
                store = "sqlite:" + os.path.join(self.dir, "stop-%s.db" % sig.name)
                s = self.serve(store=store)
                ledger = idemgate_ledger.Ledger(s.url)
                for _ in range(2):  # the second is a replay
                    with ledger.call("turn-stop", "charge", {"cents": 7}) as c:
                        if not c.replayed:
                            c.complete({"ok": True})
                self.assertEqual(s.stop(sig), 0, "\n".join(s.lines))
                self.assertTrue(any("stopping on " + sig.name in l for l in s.lines), s.lines)
                audit = subprocess.run([BINARY, "audit", "--store", store, "--json"],
                                       capture_output=True, timeout=DEADLINE)
                self.assertEqual(audit.returncode, 0, audit.stderr)
                outcomes = sorted(json.loads(line)["outcome"]
                                  for line in audit.stdout.decode().splitlines())
                self.assertEqual([o for o in outcomes if o != "claimed"], ["executed", "replayed"])

    def test_node_helper_executes_once_and_replays_the_retry(self):
        if shutil.which("node") is None:
            self.fail("node is not installed (scripts/setup installs it)")
        s = self.serve()
        script = os.path.join(self.dir, "drive.mjs")
        with open(script, "w") as f:
            f.write("""
import { withIdempotency, LedgerError } from %s;
let runs = 0;
const call = () => withIdempotency(
  { url: process.argv[2], turnId: "t-node", tool: "deploy", args: { service: "api", v: 7 } },
  async () => { runs += 1; return { deployed: "api@7", run: runs }; });
const first = await call();
const second = await call();
let failed = null;
try {
  await withIdempotency({ url: process.argv[2], turnId: "t-node", tool: "deploy", args: { v: 8 } },
    async () => { throw new Error("lost connection"); });
} catch (e) { failed = e.message; }
let condition = null;
try {
  await withIdempotency({ url: process.argv[2], turnId: "t-node", tool: "deploy", args: { v: 8 } },
    async () => "must not run");
} catch (e) { condition = e instanceof LedgerError ? e.type : String(e); }
console.log(JSON.stringify({ first, second, runs, failed, condition }));
""" % json.dumps(os.path.join(HELPERS, "idemgate-ledger.mjs")))
        p = subprocess.run(["node", script, s.url], capture_output=True, timeout=DEADLINE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = json.loads(p.stdout)
        self.assertFalse(out["first"]["replayed"])
        self.assertTrue(out["second"]["replayed"])
        self.assertEqual(out["second"]["result"], {"deployed": "api@7", "run": 1})
        self.assertEqual(out["runs"], 1)
        self.assertEqual(out["failed"], "lost connection")
        self.assertEqual(out["condition"], "outcome-unknown")

    # ── calls longer than the lease (guarantees review F6) ──

    def short_lease_config(self, on_unknown):
        path = os.path.join(self.dir, "short-lease-%s.toml" % on_unknown)
        with open(path, "w") as f:
            f.write('[defaults]\nlease = "300ms"\nwait = "100ms"\non_unknown = "%s"\n' % on_unknown)
        return path

    def test_the_python_helper_heartbeats_a_call_longer_than_the_lease(self):
        """The tool runs for three leases; a retry meanwhile finds it in progress (not taken over
        and run again under on_unknown = "retry"), and the first call's result is stored."""
        s = self.serve("--config", self.short_lease_config("retry"))
        ledger = idemgate_ledger.Ledger(s.url)
        runs, retried = [], {}
        with ledger.call(None, "deploy", {"app": "api"}, key="long-1") as c:
            self.assertFalse(c.replayed)
            runs.append(1)
            # The call outlasts its lease three times over: without heartbeats the retry below
            # would take it over.
            deadline = time.monotonic() + 0.9
            while time.monotonic() < deadline:
                threading.Event().wait(deadline - time.monotonic())
            try:
                with ledger.call(None, "deploy", {"app": "api"}, key="long-1") as r:
                    retried["replayed"] = r.replayed
                    runs.append(2)
                    r.complete({"run": 2})
            except idemgate_ledger.LedgerError as e:
                retried["type"] = e.type
            c.complete({"run": 1})
        self.assertEqual(retried, {"type": "in-progress"})
        self.assertEqual(runs, [1])
        with ledger.call(None, "deploy", {"app": "api"}, key="long-1") as again:
            self.assertTrue(again.replayed)
            self.assertEqual(again.outcome["result"], {"run": 1})

    def test_the_node_helper_heartbeats_a_call_longer_than_the_lease(self):
        """As the Python helper's test, through idemgate-ledger.mjs (issue 36 item 6): the tool
        runs for three leases, a concurrent retry meanwhile finds it in progress (not taken over
        and run again under on_unknown = "retry"), and the first call's result is stored."""
        if shutil.which("node") is None:
            self.fail("node is not installed (scripts/setup installs it)")
        s = self.serve("--config", self.short_lease_config("retry"))
        script = os.path.join(self.dir, "long.mjs")
        with open(script, "w") as f:
            f.write("""
import { withIdempotency, LedgerError } from %s;
const url = process.argv[2];
const call = (fn) => withIdempotency({ url, tool: "deploy", args: { app: "api" }, key: "long-node" }, fn);
let runs = 0;
let retried = null;
const first = await call(async () => {
  runs += 1;
  // The call outlasts its lease (300 ms) three times over: without heartbeats the retry
  // below would take it over and run it again.
  await new Promise((done) => setTimeout(done, 900));
  try {
    const r = await call(async () => { runs += 1; return { run: 2 }; });
    retried = { replayed: r.replayed };
  } catch (e) { retried = { type: e instanceof LedgerError ? e.type : String(e) }; }
  return { run: 1 };
});
const again = await call(async () => { runs += 1; return { run: 3 }; });
console.log(JSON.stringify({ first, retried, runs, again }));
""" % json.dumps(os.path.join(HELPERS, "idemgate-ledger.mjs")))
        p = subprocess.run(["node", script, s.url], capture_output=True, timeout=DEADLINE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = json.loads(p.stdout)
        self.assertEqual(out["retried"], {"type": "in-progress"}, out)
        self.assertEqual(out["runs"], 1, out)
        self.assertFalse(out["first"]["replayed"])
        self.assertTrue(out["again"]["replayed"])
        self.assertEqual(out["again"]["result"], {"run": 1})

    def test_the_owners_late_complete_is_stored_after_a_retry_marked_it_unknown(self):
        """The owner's lease lapsed (no heartbeat) and a retry marked the record unknown; the
        owner's own complete, at its fence, still stores what the action did."""
        s = self.serve("--config", self.short_lease_config("fail"))
        status, _, begun = http("POST", s.url + "/v1/calls/begin", {"tool": "deploy", "key": "late-1"})
        self.assertEqual((status, begun["decision"]), (200, "execute"), begun)
        deadline = time.monotonic() + DEADLINE
        while True:  # until the lease has run out and the retry says so
            status, _, retry = http("POST", s.url + "/v1/calls/begin", {"tool": "deploy", "key": "late-1"})
            if status == 409 and retry["type"].endswith("outcome-unknown"):
                break
            self.assertLess(time.monotonic(), deadline, retry)
        status, _, done = http("POST", s.url + "/v1/calls/complete",
                               {"key": "late-1", "fence": begun["fence"],
                                "outcome": {"status": "success", "result": {"deployed": True}}})
        self.assertEqual(status, 200, done)
        status, _, replay = http("POST", s.url + "/v1/calls/begin", {"tool": "deploy", "key": "late-1"})
        self.assertEqual((status, replay["decision"]), (200, "replay"), replay)
        self.assertEqual(replay["outcome"]["result"], {"deployed": True})

    # ── the store's clock (guarantees review F2) ──

    def test_a_store_whose_clock_cannot_be_read_refuses_to_start(self):
        """A Redis that answers everything but TIME (renamed away): records could be read, but
        leases would be judged by this machine's clock, which lets a host that runs ahead take
        over live calls. The front says which store and what to do, and exits 1."""
        redis_dir = os.path.join(self.dir, "redis-no-time")
        redis_sh = os.path.join(ROOT, "tests", "servers", "redis.sh")
        subprocess.run(["bash", redis_sh, "start", redis_dir, "auto", "--rename-command", "TIME",
                        ""], check=True, timeout=DEADLINE, stdout=subprocess.DEVNULL)
        self.addCleanup(subprocess.run, ["bash", redis_sh, "stop", redis_dir], timeout=DEADLINE)
        with open(os.path.join(redis_dir, "url")) as f:
            url = f.read().strip()
        try:
            proc = subprocess.run([BINARY, "serve", "--listen", "127.0.0.1:0", "--store", url],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=DEADLINE)
        except subprocess.TimeoutExpired as e:
            self.fail("idemgate serve started on a store whose clock it could not read: "
                      + (e.stderr or b"").decode())
        err = proc.stderr.decode()
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("cannot read the clock of store " + url.split("?")[0], err)
        self.assertIn("does not start without it", err)
        self.assertNotIn("listening on", err)

    # ── several instances, one Redis ──

    def redis_url(self, env="IDEM_REDIS_URL_FILE"):
        url_file = os.environ.get(env)
        if not url_file or not os.path.exists(url_file):
            self.fail(f"needs a Redis: set {env} (CTest's redis / redis_tls fixtures do)")
        with open(url_file) as f:
            return f.read().strip()

    def test_concurrent_begins_over_three_instances_execute_once(self):
        self.storm_over_three_instances(self.redis_url())

    def test_concurrent_begins_over_three_instances_on_redis_over_tls_execute_once(self):
        redis_url = self.redis_url("IDEM_REDIS_TLS_URL_FILE")
        self.assertTrue(redis_url.startswith("rediss://"), redis_url)
        self.storm_over_three_instances(redis_url)

    def storm_over_three_instances(self, redis_url):
        servers = [self.serve(store=redis_url) for _ in range(3)]
        turn = "storm-" + uuid.uuid4().hex
        n = 30
        arrived = threading.Semaphore(0)
        go = threading.Barrier(n)
        results = [None] * n
        executions = []

        def attempt(i):
            ledger = idemgate_ledger.Ledger(servers[i % 3].url)
            go.wait()
            arrived.release()
            try:
                with ledger.call(turn, "refund", {"order": 42, "cents": 1999}) as c:
                    if c.replayed:
                        results[i] = ("replay", c.attached, c.outcome)
                        return
                    executions.append(i)
                    # Hold the call until every other attempt has been sent, so that they
                    # find it running and attach to it.
                    for _ in range(n - 1):
                        arrived.acquire(timeout=DEADLINE)
                    threading.Event().wait(1.0)
                    c.complete({"refund": "re_1", "by": i})
                    results[i] = ("execute", False, c.outcome)
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = ("error", False, repr(e))

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE * 2)
        errors = [r for r in results if r is None or r[0] == "error"]
        self.assertEqual(errors, [])
        self.assertEqual(len(executions), 1)
        kinds = [r[0] for r in results]
        self.assertEqual(kinds.count("execute"), 1)
        self.assertEqual(kinds.count("replay"), n - 1)
        outcome = results[executions[0]][2]
        for r in results:
            self.assertEqual(r[2], outcome)
        self.assertGreaterEqual(sum(1 for r in results if r[1]), 1, "nobody attached")
        for s in servers:
            self.assertEqual(s.stop(), 0)

    def metric(self, server, name):
        status, _, text = http("GET", server.url + "/metrics")
        self.assertEqual(status, 200)
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        self.fail(f"{name} not in /metrics")

    def await_metric(self, server, name, at_least):
        deadline = time.monotonic() + DEADLINE
        while self.metric(server, name) < at_least:
            self.assertLess(time.monotonic(), deadline, f"{name} never reached {at_least}")
            threading.Event().wait(0.01)

    def test_an_eviction_through_one_instance_empties_every_instances_replay_cache(self):
        redis_url = self.redis_url()
        a, b = self.serve(store=redis_url), self.serve(store=redis_url)
        metric, await_metric = self.metric, self.await_metric

        # Each cache holds nothing until its eviction feed is subscribed (its second drop).
        await_metric(a, "idemgate_replay_cache_drops_total", 2)
        await_metric(b, "idemgate_replay_cache_drops_total", 2)
        key = "cache-" + uuid.uuid4().hex
        with idemgate_ledger.Ledger(a.url).call(None, "refund", {"order": 7}, key=key) as c:
            self.assertFalse(c.replayed)
            c.complete({"refund": "re_1"})
        hits = metric(b, "idemgate_replay_cache_hits_total")
        for _ in range(2):  # read from Redis and kept, then answered from memory
            with idemgate_ledger.Ledger(b.url).call(None, "refund", {"order": 7}, key=key) as c:
                self.assertTrue(c.replayed)
                self.assertEqual(c.outcome["result"], {"refund": "re_1"})
        self.assertEqual(metric(b, "idemgate_replay_cache_hits_total"), hits + 1)

        drops = metric(b, "idemgate_replay_cache_drops_total")
        status, _, body = http("DELETE", a.url + "/v1/records/" + key)
        self.assertEqual((status, body["evicted"]), (200, True))
        # B hears of it by pub/sub: the retry there executes instead of replaying.
        await_metric(b, "idemgate_replay_cache_drops_total", drops + 1)
        with idemgate_ledger.Ledger(b.url).call(None, "refund", {"order": 7}, key=key) as c:
            self.assertFalse(c.replayed, "B replayed an outcome evicted through A")
            c.complete({"refund": "re_2"})
        for s in (a, b):
            self.assertEqual(s.stop(), 0)

    def test_an_eviction_by_another_process_on_the_sqlite_file_empties_the_replay_cache(self):
        # Two instances on the embedded default, and the operator's `idemgate evict` as a
        # third process: the evict rings the file's eviction bell, which B watches.
        a, b = self.serve(), self.serve()
        key = "cache-" + uuid.uuid4().hex
        with idemgate_ledger.Ledger(a.url).call(None, "refund", {"order": 7}, key=key) as c:
            self.assertFalse(c.replayed)
            c.complete({"refund": "re_1"})
        hits = self.metric(b, "idemgate_replay_cache_hits_total")
        for _ in range(2):  # read from the file and kept, then answered from memory
            with idemgate_ledger.Ledger(b.url).call(None, "refund", {"order": 7}, key=key) as c:
                self.assertTrue(c.replayed)
                self.assertEqual(c.outcome["result"], {"refund": "re_1"})
        self.assertEqual(self.metric(b, "idemgate_replay_cache_hits_total"), hits + 1)

        drops = self.metric(b, "idemgate_replay_cache_drops_total")
        evict = subprocess.run([BINARY, "evict", key, "--store", self.store],
                               capture_output=True, timeout=DEADLINE)
        self.assertEqual(evict.returncode, 0, evict.stderr)
        self.await_metric(b, "idemgate_replay_cache_drops_total", drops + 1)
        with idemgate_ledger.Ledger(b.url).call(None, "refund", {"order": 7}, key=key) as c:
            self.assertFalse(c.replayed, "B replayed an outcome evicted by another process")
            c.complete({"refund": "re_2"})
        for s in (a, b):
            self.assertEqual(s.stop(), 0)

    # ── tenants and admin ──

    def test_tenants_never_share_records(self):
        s = self.serve("--config", self.tenant_config())
        alice = idemgate_ledger.Ledger(s.url, token="t-alice")
        bob = idemgate_ledger.Ledger(s.url, token="t-bob")
        for ledger, who in ((alice, "alice"), (bob, "bob")):
            with ledger.call(None, "create_user", {"email": "x@y"}, key="same-key") as c:
                self.assertFalse(c.replayed, who)  # the other tenant's record is not ours
                c.complete({"created_by": who})
        for ledger, who in ((alice, "alice"), (bob, "bob")):
            with ledger.call(None, "create_user", {"email": "x@y"}, key="same-key") as c:
                self.assertTrue(c.replayed)
                self.assertEqual(c.outcome["result"], {"created_by": who})
        # Derived keys too: same turn, tool and arguments in two tenants.
        with alice.call("t1", "pay", {"cents": 1}) as c:
            c.complete("alice paid")
        with bob.call("t1", "pay", {"cents": 1}) as c:
            self.assertFalse(c.replayed)
            c.complete("bob paid")

    def test_admin_token_needed_for_other_tenants_evict_and_resolve(self):
        s = self.serve("--config", self.tenant_config())
        alice = idemgate_ledger.Ledger(s.url, token="t-alice")
        with alice.call(None, "send_email", {"to": "a@b"}, key="k-1") as c:
            c.complete({"sent": True})
        rec = s.url + "/v1/records/k-1"

        status, _, body = http("GET", rec, token="t-alice")
        self.assertEqual(status, 200)
        self.assertEqual(body["state"], "completed")
        self.assertEqual(body["outcome"], {"status": "success", "result": {"sent": True}})
        self.assertEqual(http("GET", rec, token="t-bob")[0], 404)  # not in bob's tenant
        self.assertEqual(http("GET", rec + "?tenant=alice", token="t-bob")[0], 403)
        self.assertEqual(http("GET", rec + "?tenant=alice", token="t-root")[0], 200)
        status, headers, body = http("GET", rec)
        self.assertEqual(status, 401)
        self.assertEqual(headers.get("WWW-Authenticate"), "Bearer")
        self.assertEqual(http("GET", rec, token="wrong")[0], 401)

        self.assertEqual(http("DELETE", rec, token="t-alice")[0], 403)
        self.assertEqual(http("DELETE", rec)[0], 401)
        self.assertEqual(http("POST", rec + "/resolve", {"release": True}, token="t-alice")[0], 403)
        self.assertEqual(http("GET", s.url + "/v1/attempts?tenant=bob", token="t-alice")[0], 403)
        status, _, body = http("GET", s.url + "/v1/attempts?key=k-1", token="t-alice")
        self.assertEqual(status, 200)
        # Newest first: the claim's entry, written with the claim, then the outcome's.
        self.assertEqual([a["outcome"] for a in body["attempts"]], ["executed", "claimed"])

        # An unknown record, settled by the admin.
        with self.assertRaises(RuntimeError):
            with alice.call(None, "send_email", {"to": "c@d"}, key="k-2"):
                raise RuntimeError("timeout")
        k2 = s.url + "/v1/records/k-2"
        self.assertEqual(http("GET", k2, token="t-alice")[2]["state"], "unknown")
        status, _, body = http("POST", k2 + "/resolve?tenant=alice",
                               {"outcome": {"status": "success", "result": "sent once"}},
                               token="t-root")
        self.assertEqual(status, 200, body)
        with alice.call(None, "send_email", {"to": "c@d"}, key="k-2") as c:
            self.assertTrue(c.replayed)
            self.assertEqual(c.outcome["result"], "sent once")

        status, _, body = http("DELETE", rec + "?tenant=alice", token="t-root")
        self.assertEqual((status, body["evicted"]), (200, True))
        self.assertEqual(http("GET", rec, token="t-alice")[0], 404)
        with alice.call(None, "send_email", {"to": "a@b"}, key="k-1") as c:
            self.assertFalse(c.replayed)  # evicted: the next attempt executes
            c.complete({"sent": "again"})

        # Admin endpoints: health is public, metrics need the admin token.
        self.assertEqual(http("GET", s.url + "/healthz")[0], 200)
        self.assertEqual(http("GET", s.url + "/readyz")[0], 200)
        self.assertEqual(http("GET", s.url + "/metrics")[0], 401)
        self.assertEqual(http("GET", s.url + "/metrics", token="t-alice")[0], 403)
        status, _, text = http("GET", s.url + "/metrics", token="t-root")
        self.assertEqual(status, 200)
        self.assertIn("idemgate_", text)

    def test_non_loopback_bind_needs_tokens_or_insecure_no_auth(self):
        p = subprocess.run([BINARY, "serve", "--listen", "0.0.0.0:0", "--store", self.store],
                           capture_output=True, timeout=DEADLINE)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"--insecure-no-auth", p.stderr)
        self.serve("--listen", "0.0.0.0:0", "--insecure-no-auth").stop()
        self.serve("--listen", "0.0.0.0:0", "--config", self.tenant_config()).stop()

    # ── the steps and bad input ──

    def test_steps_and_fences(self):
        path = os.path.join(self.dir, "short-wait.toml")
        with open(path, "w") as f:
            f.write('[defaults]\nwait = "200ms"\n')  # a duplicate waits this long, then 409
        s = self.serve("--config", path)
        status, _, d = http("POST", s.url + "/v1/calls/begin",
                            {"turn_id": "t", "tool": "deploy", "args": {"v": 1}})
        self.assertEqual(status, 200)
        self.assertEqual(d["decision"], "execute")
        key, fence = d["key"], d["fence"]
        self.assertEqual(d["lease_ms"], 30000)
        step = lambda name, **extra: http("POST", s.url + "/v1/calls/" + name,  # noqa: E731
                                          {"key": key, "fence": fence, **extra})
        status, _, hb = step("heartbeat")
        self.assertEqual(status, 200)
        self.assertIn("lease_expires_at", hb)
        status, _, p = http("POST", s.url + "/v1/calls/complete",
                            {"key": key, "fence": fence + 1,
                             "outcome": {"status": "success", "result": 1}})
        self.assertEqual(status, 409)
        self.assertTrue(p["type"].endswith("/lost-lease"), p)
        status, headers, p = http("POST", s.url + "/v1/calls/begin",
                                  {"turn_id": "t", "tool": "deploy", "args": {"v": 1}})
        self.assertEqual(status, 409)  # still in progress after policy.wait
        self.assertTrue(p["type"].endswith("/in-progress"), p)
        self.assertIn("Retry-After", headers)
        self.assertEqual(step("release")[0], 200)
        status, _, p = step("complete", outcome={"status": "success", "result": 1})
        self.assertEqual(status, 404)
        self.assertTrue(p["type"].endswith("/no-record"))

    def test_bad_input_gets_a_clear_400_and_changes_nothing(self):
        s = self.serve("--max-body-bytes", "2KiB")
        begin = s.url + "/v1/calls/begin"
        with idemgate_ledger.Ledger(s.url).call("t", "keep", {"a": 1}) as c:
            c.complete("kept")
        _, _, before = http("GET", s.url + "/v1/attempts")
        cases = [
            (begin, {"args": {}}, 400, '"tool"'),
            (begin, {"tool": 5}, 400, '"tool" must be a string'),
            (begin, {"tool": "x", "args": [1]}, 400, '"args" must be a JSON object'),
            (begin, {"tool": "x", "mode": "sideways"}, 400, '"mode"'),
            (begin, {"tool": "x", "mode": "explicit"}, 400, '"key"'),
            (begin, {"tool": "x", "key": "has space"}, 400, "key"),
            (begin, {"tool": "x", "tools": "typo"}, 400, 'unknown member "tools"'),
            (begin, {"tool": "x", "mode": "fields"}, 400, '"fields"'),
            (s.url + "/v1/calls/complete", {"key": "k", "fence": "1"}, 400, '"fence"'),
            (s.url + "/v1/calls/complete", {"key": "k", "fence": 1}, 400, '"outcome"'),
            (s.url + "/v1/calls/complete",
             {"key": "k", "fence": 1, "outcome": {"status": "ok"}}, 400, '"outcome.status"'),
            (s.url + "/v1/calls/release", {"fence": 1}, 400, '"key"'),
        ]
        for url, body, want, needle in cases:
            status, headers, p = http("POST", url, body)
            self.assertEqual(status, want, (body, p))
            self.assertEqual(headers.get("Content-Type"), "application/problem+json")
            self.assertIn(needle, p["detail"], body)
        status, _, p = http("POST", begin, raw=b'{"tool": "x", "args": {"a": 1, "a": 2}}')
        self.assertEqual(status, 400)
        self.assertIn("duplicate", p["detail"])
        status, _, p = http("POST", begin, raw=b'{"tool": ')
        self.assertEqual(status, 400)
        self.assertIn("not valid JSON", p["detail"])
        status, _, p = http("POST", begin, raw=b'{"tool":"x"}', content_type="text/plain")
        self.assertEqual(status, 415)
        status, _, p = http("POST", begin, {"tool": "x", "args": {"blob": "z" * 4096}})
        self.assertEqual(status, 413)
        self.assertIn("max_body_bytes", p["detail"])
        status, _, p = http("GET", s.url + "/v1/attempts?outcome=maybe")
        self.assertEqual(status, 400)
        self.assertEqual(http("GET", s.url + "/v1/nope")[0], 404)
        self.assertEqual(http("GET", begin)[0], 405)

        # Nothing was stored or logged by any of them.
        _, _, after = http("GET", s.url + "/v1/attempts")
        self.assertEqual(after, before)
        for tool in ("x", "tools"):
            status, _, d = http("POST", begin, {"tool": tool, "turn_id": "t-check"})
            self.assertEqual(d["decision"], "execute")


if __name__ == "__main__":
    unittest.main()
