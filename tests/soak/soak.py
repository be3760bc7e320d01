#!/usr/bin/env python3
"""The randomized soak of the crash campaign (issue #6, part 2).

Many client threads send duplicate-heavy traffic through N `idemgate http` instances that share
one store, in front of the example vendor (examples/http-vendor/server.mjs), while a chaos thread
SIGKILLs (now and then SIGTERMs) random instances, restarted on a new port, and SIGKILLs the store
server and the vendor, restarted on the same data and port; random requests ask the vendor for
delays and failures (X-Vendor-Fault). At the end chaos stops, everything is brought up, every key
is settled, and the invariant of docs/DESIGN.md §4/§5 is checked against the vendor's own fsynced
side-effect ledger (each line names the attempt that caused it) and every answer a client saw:

  - at most one execution per key: /v1/tickets does not deduplicate (on_unknown = "fail"), so
    its ledger must hold at most one line per key; /v1/charges deduplicates on the forwarded
    key (on_unknown = "retry"), so its own dedup must hold (one charge per key), and idemgate
    must never deliver two fresh (not replayed) answers for one key;
  - every answer is the first outcome or an explicit condition: all outcomes a key was
    answered with are byte-identical, and an attempt that says nothing ran (store unavailable,
    in progress, upstream unreachable, a replay, a non-executing "unknown") has no ledger line;
  - no completed outcome is lost: a request sent after any client received a key's outcome
    gets that outcome replayed (or a transient error), never a new execution or "unknown".

    python3 tests/soak/soak.py [--seconds 60] [--store redis|postgres|sqlite] [--instances 3]
        [--clients 16] [--keys 8] [--seed N] [--binary build/idemgate]
        [--vendor examples/http-vendor/server.mjs] [--fault-rate 0.15] [--keep]

The seed drives the schedule (chaos, keys, faults, instance choice), never the assertions; it
is printed so a failure can be replayed (thread interleavings still differ). Prints one summary
line; exits 1 with the key, its answers, ledger lines and idemgate's log lines for any
violation. Standard library only; needs node, redis-server (for --store redis) and the
PostgreSQL 15 server binaries (for --store postgres).
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
POSTGRES_SH = os.path.join(ROOT, "tests", "servers", "postgres.sh")
START_DEADLINE = 60.0  # seconds: a safety net for a process to come up, never a timing assumption
REQUEST_TIMEOUT = 10.0  # > wait (2 s) + upstream timeouts (0.9 s) + a loaded machine's slack
SETTLE_DEADLINE = 90.0

# Short lease and wait so dead owners are found within the run; a short upstream timeout so
# some vendor delays end as 504 "outcome unknown" (connect + upstream timeout below the lease, as
# `idemgate http` requires: no lease runs out while the vendor may still act).
CONFIG = """
[defaults]
lease = "1s"
wait = "2s"
on_unknown = "fail"

[[route]]                 # the vendor honours Idempotency-Key here: take over a dead owner's call
match = "/v1/charges"
mode = "explicit"
on_unknown = "retry"

[[route]]                 # the vendor does not deduplicate here: a dead owner's call stays unknown
match = "/v1/tickets"
mode = "explicit"
on_unknown = "fail"

[http]
upstream_connect_timeout = "200ms"
upstream_timeout = "700ms"
"""

# Vendor faults (X-Vendor-Fault, not part of the request fingerprint, so they may change from
# one attempt of a key to the next), with weights. "400" is rare: it settles a key as a 400.
FAULTS = [("500", 3), ("500-before", 3), ("drop", 3), ("drop-before", 3), ("delay", 6), ("400", 1)]

# What an answer was (`kind`): "fresh" (the vendor's answer to this attempt), "replay"
# (Idempotent-Replayed), "no-answer" (connection refused, reset or timed out), or the slug of a
# problem idemgate answered itself: "store-unavailable", "in-progress",
# "outcome-unknown", "upstream-unreachable", "outcome-not-stored", ...
OUTCOMES = {"fresh", "replay"}
# Answers after which the request may have been executed (its ledger line may exist).
MAY_HAVE_EXECUTED = {"fresh", "no-answer", "outcome-not-stored", "upstream-answer-too-large"}
# Answers that say nothing about the key: a retry must follow.
TRANSIENT = {"no-answer", "store-unavailable", "stopping", "claim-failed"}
# Answers no request of the soak should ever get: every attempt of a key is the same request.
UNEXPECTED = {"drift", "unreadable-outcome", "invalid-idempotency-key",
              "idempotency-key-required", "outcome-too-large"}


class Child:
    """A child process whose output goes to a log file; waits for a line holding `marker` and
    keeps what follows it on that line as `self.address`."""

    def __init__(self, args, marker, log_path, stream="stderr"):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.address = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._pumps = [threading.Thread(target=self._pump, args=(getattr(self.proc, name),
                                                                 name == stream, marker),
                                        daemon=True) for name in ("stdout", "stderr")]
        for t in self._pumps:
            t.start()
        if not self._ready.wait(START_DEADLINE) or self.address is None:
            self.kill()
            raise RuntimeError("%s did not print %r within %.0f s; its output:\n%s" %
                               (" ".join(args), marker, START_DEADLINE, tail(log_path)))

    def _pump(self, pipe, watched, marker):
        for raw in iter(pipe.readline, b""):
            with self._lock:
                self.log.write(raw)
                self.log.flush()
            line = raw.decode("utf-8", "replace")
            if watched and self.address is None and marker in line:
                self.address = line.split(marker, 1)[1].strip()
                self._ready.set()
        pipe.close()
        if watched:
            self._ready.set()  # exited before printing the marker

    def kill(self):
        """SIGKILL, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self._reap()

    def stop(self):
        """SIGTERM (a graceful stop), SIGKILL if that takes longer than the deadline."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(START_DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self):
        self.proc.wait()
        for t in self._pumps:
            t.join(START_DEADLINE)
        self.log.close()


def tail(path, lines=30):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
    except OSError as e:
        return "(no log: %s)" % e


def run(args, what):
    p = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d): %s %s" % (what, p.returncode,
                                                            p.stdout.decode(), p.stderr.decode()))


class Server:
    """A server child that can be SIGKILLed and restarted on the same port (and data), so the
    processes that hold its address find it again. `command(port)` is its command line."""

    def __init__(self, command, marker, log_path, stream):
        self.command, self.marker, self.log_path, self.stream = command, marker, log_path, stream
        self.child = None
        self.port = None

    def start(self):
        for _ in range(3):  # a free port can be taken between the probe and the server's bind
            self.port = free_port()
            try:
                self.restart()
                return
            except RuntimeError as e:
                error = e
        raise error

    def restart(self):
        self.child = Child(self.command(self.port), self.marker, self.log_path, self.stream)

    def crash(self):
        self.child.kill()

    def stop(self):
        if self.child:
            self.child.stop()


def vendor_server(script, workdir):
    """The example vendor; its ledger survives a restart, and so do the charge keys it honours
    (rebuilt from the ledger)."""
    ledger = os.path.join(workdir, "vendor.jsonl")
    server = Server(lambda port: ["node", script, "--port", str(port), "--ledger", ledger],
                    "listening on ", os.path.join(workdir, "vendor.log"), "stdout")
    server.ledger = ledger
    return server


# --- stores --------------------------------------------------------------------------------------
# Each has url, start(), crash() (SIGKILL or the like; None if there is no server), restart()
# (same data, same port) and stop() (and remove its data).


class RedisStore(Server):
    """A redis-server child on a free port: appendonly yes, appendfsync always, so a SIGKILL
    loses nothing it acknowledged (RELIABILITY.md, store durability)."""

    def __init__(self, workdir):
        data = os.path.join(workdir, "redis")
        os.makedirs(data)
        super().__init__(lambda port: ["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                                       "--protected-mode", "yes", "--dir", data, "--appendonly",
                                       "yes", "--appendfsync", "always", "--save", ""],
                         "Ready to accept connections", os.path.join(data, "redis.log"), "stdout")

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port


class PostgresStore:
    """tests/servers/postgres.sh: crash is `pg_ctl stop -m immediate` (no shutdown checkpoint,
    recovery at the restart), restart keeps the data directory and the port."""

    def __init__(self, workdir):
        # The server runs as the postgres OS user, which must be able to traverse the path.
        self.dir = tempfile.mkdtemp(prefix="idemgate-soak-pg-", dir="/tmp")
        os.chmod(self.dir, 0o755)

    def start(self):
        run(["bash", POSTGRES_SH, "start", self.dir], "postgres.sh start")
        with open(os.path.join(self.dir, "url")) as f:
            self.url = f.read().strip()

    def crash(self):
        run(["bash", POSTGRES_SH, "crash", self.dir], "postgres.sh crash")

    restart = start

    def stop(self):
        run(["bash", POSTGRES_SH, "stop", self.dir], "postgres.sh stop")


class SqliteStore:
    """One SQLite file shared by every instance: no server to kill."""

    def __init__(self, workdir):
        self.url = "sqlite:" + os.path.join(workdir, "idemgate.db")

    def start(self):
        pass

    crash = None

    def stop(self):
        pass


STORES = {"redis": RedisStore, "postgres": PostgresStore, "sqlite": SqliteStore}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the system under test -----------------------------------------------------------------------


class Fleet:
    """The instances, by slot. Clients `pick` a live one; the chaos thread replaces them."""

    def __init__(self, args, workdir, vendor_url, store_url):
        self.args, self.workdir = args, workdir
        self.vendor_url, self.store_url = vendor_url, store_url
        self.config = os.path.join(workdir, "idemgate.toml")
        with open(self.config, "w") as f:
            f.write(CONFIG)
        self.lock = threading.Lock()
        self.children = [None] * args.instances
        self.names = [None] * args.instances
        self.generation = [0] * args.instances
        self.logs = []
        for slot in range(args.instances):
            self.start(slot)

    def start(self, slot):
        name = "i%dg%d" % (slot, self.generation[slot])
        log = os.path.join(self.workdir, "idemgate-%s.log" % name)
        self.logs.append((name, log))
        child = Child([self.args.binary, "http", "--listen", "127.0.0.1:0", "--upstream",
                       self.vendor_url, "--store", self.store_url, "--config", self.config, "-v"],
                      "idemgate http: listening on ", log)
        with self.lock:
            self.children[slot], self.names[slot] = child, name
            self.generation[slot] += 1

    def kill(self, slot, graceful=False):
        """SIGKILL (a crash), or SIGTERM (a graceful stop that drains requests in flight)."""
        with self.lock:
            child, self.children[slot] = self.children[slot], None
        child.stop() if graceful else child.kill()

    def pick(self, rng):
        """(name, address) of a random live instance, or None while all are restarting."""
        with self.lock:
            live = [(self.names[i], c.address) for i, c in enumerate(self.children) if c]
        return rng.choice(live) if live else None

    def stop(self):
        for slot, child in enumerate(self.children):
            if child:
                child.stop()
                self.children[slot] = None


class Keys:
    """The active keys: `size` slots, each holding a key until it has had `target` settled
    answers, then a fresh one. Every key ever used is kept for the final check."""

    def __init__(self, size, rng):
        self.rng = rng
        self.lock = threading.Lock()
        self.all = []
        self.slots = [self._new() for _ in range(size)]

    def _new(self):
        n = len(self.all)
        route = "/v1/charges" if self.rng.random() < 0.5 else "/v1/tickets"
        key = "%s-%d" % ("c" if route == "/v1/charges" else "t", n)
        body = ({"amount": 100 + n, "currency": "eur", "customer": "cus_%d" % n}
                if route == "/v1/charges" else {"title": "soak ticket %d" % n})
        k = {"key": key, "route": route, "body": json.dumps(body).encode()}
        self.all.append(k)
        return [k, 0, self.rng.randint(3, 12)]  # key, settled answers, answers before rotation

    def pick(self, rng):
        with self.lock:
            return rng.choice(self.slots)[0]

    def settled(self, k):
        with self.lock:
            for i, slot in enumerate(self.slots):
                if slot[0] is k:
                    slot[1] += 1
                    if slot[1] >= slot[2]:
                        self.slots[i] = self._new()


def send(address, k, fault, phase, instance):
    """One attempt of key `k`; returns its record."""
    attempt = uuid.uuid4().hex
    headers = {"Content-Type": "application/json", "Idempotency-Key": k["key"],
               "X-Soak-Attempt": attempt}
    if fault:
        headers["X-Vendor-Fault"] = fault
    a = {"key": k["key"], "attempt": attempt, "instance": instance, "fault": fault,
         "phase": phase, "t0": time.monotonic(), "status": None, "body": b"", "kind": None,
         "vendor_replayed": False}
    conn = http.client.HTTPConnection(address.split("://", 1)[-1], timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", k["route"], body=k["body"], headers=headers)
        res = conn.getresponse()
        a["status"], a["body"] = res.status, res.read()
        a["kind"] = classify(res, a["body"])
        a["vendor_replayed"] = res.getheader("x-vendor-replayed") == "true"
    except (OSError, http.client.HTTPException) as e:
        a["kind"], a["body"] = "no-answer", repr(e).encode()
    finally:
        conn.close()
    a["t1"] = time.monotonic()
    return a


def classify(res, body):
    if (res.getheader("Content-Type") or "").startswith("application/problem+json"):
        try:
            return json.loads(body)["type"].rsplit("/", 1)[-1]
        except (ValueError, KeyError, AttributeError):
            return "bad-problem"
    return "replay" if res.getheader("Idempotent-Replayed") == "true" else "fresh"


def is_settled(k, a):
    """A settled answer ends a client's retries: an outcome, or on /v1/tickets an explicit
    unknown. On /v1/charges (on_unknown = "retry") an unknown is retried: it must end in an
    outcome."""
    if a["kind"] in OUTCOMES or a["kind"] in UNEXPECTED:
        return True
    return a["kind"] == "outcome-unknown" and k["route"] == "/v1/tickets"


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop_clients = threading.Event()
        self.stop_chaos = threading.Event()
        self.attempts = []
        self.attempts_lock = threading.Lock()
        self.kills = Counter()
        self.errors = []

    def record(self, a):
        with self.attempts_lock:
            self.attempts.append(a)

    def fault(self, rng):
        if rng.random() >= self.args.fault_rate:
            return None
        kind = rng.choices([f for f, _ in FAULTS], [w for _, w in FAULTS])[0]
        return "delay:%d" % rng.randint(50, 1200) if kind == "delay" else kind

    def client(self, index):
        rng = random.Random("%s/client/%d" % (self.args.seed, index))
        while not self.stop_clients.is_set():
            k = self.keys.pick(rng)
            while not self.stop_clients.is_set():  # retry this key until it settles
                picked = self.fleet.pick(rng)
                if picked is None:
                    self.stop_clients.wait(0.05)
                    continue
                a = send(picked[1], k, self.fault(rng), "run", picked[0])
                self.record(a)
                if is_settled(k, a):
                    self.keys.settled(k)
                    break
                self.stop_clients.wait(rng.uniform(0.01, 0.3))  # a client's backoff

    def chaos(self):
        rng = random.Random("%s/chaos" % self.args.seed)
        try:
            while not self.stop_chaos.wait(rng.uniform(0.5, 2.5)):
                victim = rng.choices(["idemgate", "store", "vendor"],
                                     [50, 35 if self.store.crash else 0, 15])[0]
                self.kills[victim] += 1
                if victim == "idemgate":
                    slot = rng.randrange(self.args.instances)
                    graceful = rng.random() < 0.25
                    self.kills["idemgate stopped"] += graceful
                    self.fleet.kill(slot, graceful)
                    self.fleet.start(slot)
                    continue
                server = self.store if victim == "store" else self.vendor
                server.crash()
                self.stop_chaos.wait(rng.uniform(0.05, 1.5))  # down for a while
                server.restart()
        except Exception as e:  # noqa: BLE001 — reported as the soak's failure
            self.errors.append("chaos: %s" % e)
            self.stop_clients.set()

    def settle(self):
        """After chaos: every key ever used, retried until settled or the deadline."""
        rng = random.Random("%s/settle" % self.args.seed)
        deadline = time.monotonic() + SETTLE_DEADLINE
        pending = list(self.keys.all)
        lock = threading.Lock()
        unsettled = []

        def worker():
            while True:
                with lock:
                    if not pending:
                        return
                    k = pending.pop()
                while True:
                    name, address = self.fleet.pick(rng)
                    a = send(address, k, None, "settle", name)
                    self.record(a)
                    if is_settled(k, a):
                        break
                    if time.monotonic() > deadline:
                        with lock:
                            unsettled.append(k["key"])
                        break
                    # in progress: the dead owner's lease (1 s) has to run out
                    time.sleep(0.05 if a["kind"] in TRANSIENT else 0.2)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return unsettled

    def run(self):
        a = self.args
        started = time.monotonic()
        self.workdir = tempfile.mkdtemp(prefix="idemgate-soak-")
        self.store = STORES[a.store](self.workdir)
        self.vendor = self.fleet = None
        try:
            self.store.start()
            self.vendor = vendor_server(a.vendor, self.workdir)
            self.vendor.start()
            self.ledger = self.vendor.ledger
            self.fleet = Fleet(a, self.workdir, "http://127.0.0.1:%d" % self.vendor.port,
                               self.store.url)
            self.keys = Keys(a.keys, self.rng)
            print("soak: seed %d, %s store, %d instances, %d clients, %d keys at a time, %g s "
                  "(replay with --seed %d)" % (a.seed, a.store, a.instances, a.clients, a.keys,
                                               a.seconds, a.seed), flush=True)
            chaos = threading.Thread(target=self.chaos)
            clients = [threading.Thread(target=self.client, args=(i,)) for i in range(a.clients)]
            chaos.start()
            for t in clients:
                t.start()
            self.stop_clients.wait(a.seconds)
            self.stop_chaos.set()
            chaos.join()
            self.stop_clients.set()
            for t in clients:
                t.join()
            if self.errors:
                print("soak: FAILED: %s" % "; ".join(self.errors), file=sys.stderr)
                return 1
            unsettled = self.settle()
            ok = self.check(unsettled, time.monotonic() - started)
            if a.keep:
                print("soak: logs and the vendor's ledger kept in %s" % self.workdir)
            return 0 if ok else 1
        finally:
            if self.fleet:
                self.fleet.stop()
            if self.vendor:
                self.vendor.stop()
            self.store.stop()
            if not a.keep:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the invariant ---------------------------------------------------------------------------

    def check(self, unsettled, wall):
        effects, strangers = read_ledger(self.ledger)
        by_key = defaultdict(list)
        for a in self.attempts:
            by_key[a["key"]].append(a)
        by_attempt = {a["attempt"]: a for a in self.attempts}
        verdict = Verdict()
        for k in self.keys.all:
            verdict.check_key(k["key"], k["route"], sorted(by_key[k["key"]], key=lambda a: a["t0"]),
                              effects.get(k["key"], []), by_attempt)
        for key in unsettled:
            verdict.fail("unsettled", key, "not settled within %.0f s after the run" %
                         SETTLE_DEADLINE)
        if strangers:
            verdict.fail("dishonest", "(no key)", "%d side effects without a key" % len(strangers))

        kinds = Counter(a["kind"] for a in self.attempts)
        print("soak: answers: %s" % ", ".join("%s %d" % kv for kv in sorted(kinds.items())))
        n = verdict.count
        print("soak: %s, %g s, seed %d: calls %d, requests %d, retries %d, idemgate kills %d "
              "(%d of them SIGTERM), store kills %d, vendor kills %d, executions %d, "
              "takeovers %d, duplicates %d, unknowns %d (tickets %d, charges %d; %d with no "
              "side effect), lost outcomes %d, dishonest answers %d, unexpected %d, "
              "unsettled %d, wall %.1f s" % (
                  self.args.store, self.args.seconds, self.args.seed, len(self.keys.all),
                  len(self.attempts), len(self.attempts) - len(self.keys.all),
                  self.kills["idemgate"], self.kills["idemgate stopped"], self.kills["store"],
                  self.kills["vendor"], sum(map(len, effects.values())) + len(strangers),
                  sum(a["kind"] == "fresh" and a["vendor_replayed"] for a in self.attempts),
                  n("duplicate"), verdict.unknowns["/v1/tickets"] + verdict.unknowns["/v1/charges"],
                  verdict.unknowns["/v1/tickets"], verdict.unknowns["/v1/charges"],
                  verdict.unknowns["no side effect"], n("lost"), n("dishonest"), n("unexpected"),
                  n("unsettled"), wall), flush=True)
        if not verdict.problems:
            return True
        print("soak: FAILED: %d keys break the invariant (seed %d)" %
              (len(verdict.problems), self.args.seed), file=sys.stderr)
        for key in sorted(verdict.problems)[:10]:
            self.explain(key, verdict.problems[key], by_key.get(key, []),
                         effects.get(key, strangers))
        return False

    def explain(self, key, what, attempts, effects):
        out = ["", "key %s: %s" % (key, "; ".join(what)), "  answers (t0..t1 from the start):"]
        start = min(a["t0"] for a in self.attempts)
        for a in sorted(attempts, key=lambda a: a["t0"]):
            out.append("    %8.3f..%8.3f %-6s %-7s attempt %s fault %-12s %s %s %s%s" % (
                a["t0"] - start, a["t1"] - start, a["instance"], a["phase"], a["attempt"][:8],
                a["fault"], a["status"], a["kind"],
                a["body"][:160].decode("utf-8", "replace"),
                " (x-vendor-replayed)" if a["vendor_replayed"] else ""))
        out.append("  ledger lines:")
        for line in effects:
            out.append("    %s %s id %s attempt %s" % (line["at"], line["route"], line["id"],
                                                       line.get("headers", {}).get(
                                                           "x-soak-attempt", "?")[:8]))
        out.append("  idemgate log lines naming the key:")
        needle = ("key=%s:" % key).encode()
        for name, path in self.fleet.logs:
            with open(path, "rb") as f:
                for raw in f:
                    if needle in raw:
                        out.append("    [%s] %s" % (name, raw.decode("utf-8", "replace").rstrip()))
        print("\n".join(out), file=sys.stderr)


def read_ledger(path):
    """The vendor's side effects: ({key: [line, ...]}, [lines without a key])."""
    effects, strangers = defaultdict(list), []
    with open(path) as f:
        for raw in f:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # empty, or torn by a vendor kill: the vendor skips it too
            if line.get("idempotency_key") is None:
                strangers.append(line)
            else:
                effects[line["idempotency_key"]].append(line)
    return effects, strangers


class Verdict:
    """The invariant, key by key: `problems` {key: [what is wrong]}, and the keys that break
    each part of it by category (duplicate, lost, dishonest, unexpected, unsettled)."""

    def __init__(self):
        self.problems = defaultdict(list)
        self.keys = defaultdict(set)
        self.unknowns = Counter()  # keys that ended unknown: by route, and "no side effect"

    def fail(self, category, key, what):
        self.keys[category].add(key)
        self.problems[key].append(what)

    def count(self, category):
        return len(self.keys[category])

    def check_key(self, key, route, attempts, effects, by_attempt):
        """`attempts`: every answer of the key, by send time; `effects`: its ledger lines."""
        # At most one execution: one ledger line (on /v1/charges the vendor's own dedup), and
        # never two answers that are not replays.
        if len(effects) > 1:
            self.fail("duplicate", key, "%d side effects in the vendor's ledger" % len(effects))
        fresh = [a for a in attempts if a["kind"] == "fresh"]
        if len(fresh) > 1:
            self.fail("duplicate", key, "%d fresh (not replayed) answers" % len(fresh))
        # The first outcome, byte for byte, to everyone; and to every request sent after a client
        # had it, as a replay.
        outcomes = [a for a in attempts if a["kind"] in OUTCOMES]
        if len({(a["status"], a["body"]) for a in outcomes}) > 1:
            self.fail("lost", key, "different outcomes for one key")
        if outcomes:
            first = min(outcomes, key=lambda a: a["t1"])
            for a in attempts:
                if a["t0"] <= first["t1"] or a["kind"] in TRANSIENT:
                    continue
                if a["kind"] != "replay" or (a["status"], a["body"]) != (first["status"],
                                                                        first["body"]):
                    self.fail("lost", key, "attempt %s sent %.3f s after a client had the "
                              "outcome got %s" % (a["attempt"][:8], a["t0"] - first["t1"],
                                                  a["kind"]))
        # Honest answers: the attempt that caused a side effect was not told that nothing ran
        # (store unavailable, upstream unreachable, in progress, a replay, a 409 unknown).
        for line in effects:
            a = by_attempt.get(line.get("headers", {}).get("x-soak-attempt"))
            if a is None:
                self.fail("dishonest", key, "a side effect no attempt of the soak asked for")
            elif not (a["kind"] in MAY_HAVE_EXECUTED or
                      (a["kind"] == "outcome-unknown" and a["status"] != 409)):
                self.fail("dishonest", key, "attempt %s executed but was answered %s (%s)" %
                          (a["attempt"][:8], a["kind"], a["status"]))
        for a in fresh:  # an outcome is a side effect the ledger holds
            answered = json.loads(a["body"]).get("id") if a["status"] == 201 else None
            if answered is not None and answered not in {line["id"] for line in effects}:
                self.fail("lost", key, "answered %s, which the vendor's ledger does not hold" %
                          answered)
        for a in attempts:
            if a["kind"] in UNEXPECTED or a["kind"] == "bad-problem":
                self.fail("unexpected", key, "unexpected answer %s %s" % (a["status"], a["kind"]))
        if attempts and attempts[-1]["kind"] == "outcome-unknown":
            self.unknowns[route] += 1
            self.unknowns["no side effect"] += not effects  # died before sending; -before faults
            if route == "/v1/charges":  # guarantee 5: a retry takes over and executes
                self.fail("unsettled", key, "ended unknown although on_unknown = \"retry\"")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="length of the chaos (default 60)")
    p.add_argument("--store", choices=sorted(STORES), default="redis")
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--clients", type=int, default=16, help="client threads")
    p.add_argument("--keys", type=int, default=8, help="keys in use at a time (few: duplicates)")
    p.add_argument("--seed", type=int, default=None, help="default: random, printed")
    p.add_argument("--fault-rate", type=float, default=0.15,
                   help="share of attempts that ask the vendor for a fault")
    p.add_argument("--binary", default=os.environ.get("IDEMGATE",
                                                      os.path.join(ROOT, "build", "idemgate")))
    p.add_argument("--vendor", default=os.path.join(ROOT, "examples", "http-vendor",
                                                    "server.mjs"))
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (logs, the vendor's ledger)")
    args = p.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    if args.instances < 1 or args.clients < 1 or args.keys < 1 or args.seconds <= 0:
        p.error("--instances, --clients, --keys and --seconds must be positive")
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
