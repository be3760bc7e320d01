#!/usr/bin/env python3
"""The crash campaign's fault points for the two HTTP fronts (issue #6, docs/DESIGN.md §4); the
counterpart of tests/integration/mcp/fault_points.mjs.

idemgate (built with -DIDEM_FAULT_POINTS=ON) SIGKILLs itself at one point of a gated call
(src/core/fault_point.h); a restarted idemgate is asked the same call again until its answer
settles. For each store (SQLite, Redis, PostgreSQL):

  - `idemgate http` in front of the example vendor's non-deduplicating route (POST /v1/tickets),
    killed at after_claim, after_send, after_answer, after_persist, before_reply. Checked from
    the vendor's own fsynced ledger of side effects.
  - `idemgate serve` (the ledger API) with this test as the runtime: begin, the side effect (a
    line appended to a file of its own), complete. Killed at after_claim (in begin),
    before_reply@1 (begin's answer), after_persist and before_reply@2 (in complete).

The invariant: at most one side effect per key; none when killed before anything could run;
every answer of the restarted idemgate is the first outcome (a replay, byte for byte) or an
explicit in-progress / outcome-unknown problem, never a second success; an outcome persisted
before the crash (after_persist, before_reply in complete) is replayed, not lost.

    python3 tests/integration/http/fault_points_test.py --binary build/idemgate \\
        --vendor examples/http-vendor/server.mjs --redis-url-file FILE --postgres-url-file FILE

The URL files come from the `redis` and `postgres` CTest fixtures; without one, that store's
cases fail rather than pass unseen. Standard library only; needs node.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_proxy_test  # noqa: E402  (Process, request, header)
from http_proxy_test import Process, header, request  # noqa: E402

BINARY = None
VENDOR = None
URL_FILES = {}  # store name -> the fixture's URL file
SETTLE_DEADLINE = 20.0  # seconds: a safety net; a case settles once the 1 s lease ran out
RUN = uuid.uuid4().hex[:8]  # a namespace of this run in the shared Redis and PostgreSQL

# A short lease so that a dead owner's record turns unknown within the test; fail on unknown.
# The upstream timeouts stay below the lease, as `idemgate http` requires (guarantees F3).
CONFIG = ('[defaults]\nlease = "1s"\nwait = "200ms"\non_unknown = "fail"\n'
          '[http]\nupstream_connect_timeout = "200ms"\nupstream_timeout = "700ms"\n')

HTTP_POINTS = ["after_claim", "after_send", "after_answer", "after_persist", "before_reply"]
# The ledger API: (IDEMGATE_FAULT_POINT, the step it kills). before_reply's first passage is
# begin's answer, its second complete's.
LEDGER_POINTS = [("after_claim", "begin"), ("before_reply@1", "begin"),
                 ("after_persist", "complete"), ("before_reply@2", "complete")]
# Points after which the outcome is durable: the retry must replay it.
PERSISTED = {"after_persist", "before_reply", "before_reply@2"}
# Points before which nothing can have run: no side effect may exist.
UNSENT = {"after_claim", "before_reply@1"}
# Points after which the side effect certainly happened (the vendor fsyncs before answering).
EXECUTED = {"after_answer", "after_persist", "before_reply"}


def store_url(store, directory, tag):
    """The store URL of one case, in a namespace of its own."""
    if store == "sqlite":
        return "sqlite:" + os.path.join(directory, tag + ".db")
    path = URL_FILES.get(store)
    if not path or not os.path.exists(path):
        raise AssertionError("no %s server: its URL file %r is missing (CTest's %s fixture writes "
                             "it)" % (store, path, store))
    with open(path) as f:
        base = f.read().strip()
    if store == "redis":
        return "%s/0?prefix=%s:" % (base, tag)
    return "%s%sschema=%s" % (base, "&" if "?" in base else "?", tag)


def problem_type(body):
    try:
        return json.loads(body).get("type", "").rsplit("/", 1)[-1]
    except (ValueError, AttributeError):
        return None


class FaultPointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idemgate-http-faults-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.config = os.path.join(self.dir, "idemgate.toml")
        with open(self.config, "w") as f:
            f.write(CONFIG)

    def start_idemgate(self, front, store, fault=None, extra=()):
        env = {k: v for k, v in os.environ.items() if k != "IDEMGATE_FAULT_POINT"}
        if fault:
            env["IDEMGATE_FAULT_POINT"] = fault
        p = Process([BINARY, front, "--listen", "127.0.0.1:0", "--store", store,
                     "--config", self.config, *extra],
                    "idemgate %s: listening on " % front, stream="stderr", env=env)
        self.addCleanup(p.stop)
        return p

    def assert_killed_at(self, p, fault):
        """Waits for `p` to die; it must have SIGKILLed itself at `fault`."""
        try:
            p.proc.wait(timeout=http_proxy_test.DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError("idemgate did not die at %s; output:\n%s" % (fault, "".join(p.log)))
        while p.lines.get(timeout=http_proxy_test.DEADLINE) is not None:
            pass  # until its stderr is drained to the end
        point = fault.split("@")[0]
        self.assertEqual(p.proc.returncode, -signal.SIGKILL,
                         "idemgate exited with %s, not SIGKILL at %s; output:\n%s" %
                         (p.proc.returncode, fault, "".join(p.log)))
        self.assertIn("idemgate: fault point %s reached" % point, "".join(p.log))

    def settle(self, ask, in_progress, fault):
        """Asks the restarted idemgate until its answer settles: a replay or outcome-unknown.
        ask() returns (HTTP status, body, whether it is a replay); `in_progress` is the front's
        problem type for a call still running. Returns every answer as (kind, body); any other
        answer (a second success) fails the test."""
        answers = []
        deadline = time.monotonic() + SETTLE_DEADLINE
        while not answers or answers[-1][0] not in ("replayed", "outcome-unknown"):
            if time.monotonic() > deadline:
                self.fail("no settled answer after %s within %.0f s; answers: %s" %
                          (fault, SETTLE_DEADLINE, [a[0] for a in answers]))
            status, raw, replayed = ask()
            kind = "replayed" if replayed else problem_type(raw) if status == 409 else None
            if kind not in ("replayed", in_progress, "outcome-unknown"):
                self.fail("after %s: neither the first outcome nor an explicit condition (a "
                          "second success?): HTTP %d %r" % (fault, status, raw))
            answers.append((kind, raw))
        return answers

    def report(self, front, store, fault, effects, answers):
        print("%s on %s, %s: %d side effect(s); answers %s" %
              (front, store, fault, effects, ", ".join(a[0] for a in answers)), file=sys.stderr)

    # ── idemgate http ──

    def http_case(self, store, point):
        tag = "hfp_%s_http_%s" % (RUN, point)
        url = store_url(store, self.dir, tag)
        ledger = os.path.join(self.dir, "vendor.jsonl")
        vendor = Process(["node", VENDOR, "--port", "0", "--ledger", ledger], "listening on ")
        self.addCleanup(vendor.stop)
        key = "fault-" + tag
        body = {"title": "fault at " + point}

        def post(proxy):
            return request(proxy.url, "POST", "/v1/tickets", body, {"Idempotency-Key": key})

        # 1. The first attempt: idemgate dies at the point; the client gets no answer.
        first = self.start_idemgate("http", url, point, ("--upstream", vendor.url))
        try:
            lost = post(first)
            self.fail("idemgate answered before dying at %s: %s %r" % (point, lost[0], lost[2]))
        except (http.client.HTTPException, OSError):
            pass
        self.assert_killed_at(first, point)

        # 2. A restarted idemgate, asked again until the answer settles.
        second = self.start_idemgate("http", url, extra=("--upstream", vendor.url))

        def ask():
            status, headers, raw = post(second)
            return status, raw, status == 201 and header(headers, "Idempotent-Replayed") == "true"

        answers = self.settle(ask, "in-progress", point)
        second.stop()
        self.assertEqual(vendor.stop(), 0, "the vendor did not stop cleanly")  # its ledger is final

        # 3. The invariant, from the vendor's ledger.
        with open(ledger) as f:
            effects = [json.loads(line) for line in f if line.strip()]
        self.report("http", store, point, len(effects), answers)
        self.assertLessEqual(len(effects), 1, "at most one side effect: %s" % effects)
        if point in UNSENT:
            self.assertEqual(len(effects), 0, "nothing was sent before %s" % point)
        if point in EXECUTED:
            self.assertEqual(len(effects), 1, "the vendor answered before %s" % point)
        for kind, raw in answers:
            if kind == "replayed":
                self.assertEqual(len(effects), 1, "a replay stands for a side effect that happened")
                self.assertEqual(effects[0]["idempotency_key"], key)
                first_outcome = json.dumps({"id": effects[0]["id"], "object": "ticket",
                                            "title": body["title"]}, separators=(",", ":"))
                self.assertEqual(raw.decode(), first_outcome, "the replay is the first outcome")
        if point in PERSISTED:
            self.assertEqual(answers[-1][0], "replayed",
                             "the outcome persisted before %s is replayed, not lost" % point)

    # ── idemgate serve (the ledger API) ──

    def ledger_case(self, store, fault, dying_step):
        tag = "hfp_%s_serve_%s" % (RUN, fault.replace("@", "_"))
        url = store_url(store, self.dir, tag)
        effects_file = os.path.join(self.dir, "runtime-effects.jsonl")
        key = "fault-" + tag
        begin_body = {"tool": "create_ticket", "key": key, "args": {"title": "fault at " + fault}}
        effect_id = "tkt_" + uuid.uuid4().hex
        outcome = json.dumps({"status": "success", "result": {"id": effect_id}},
                             separators=(",", ":"))

        def begin(serve):
            status, _, raw = request(serve.url, "POST", "/v1/calls/begin", begin_body)
            return status, raw

        # 1. The first attempt, as a runtime: begin; if told to execute, the side effect, then
        #    complete. idemgate dies during `dying_step`; the runtime sees no answer there.
        first = self.start_idemgate("serve", url, fault)
        steps = []
        try:
            status, raw = begin(first)
            steps.append("begin")
            decision = json.loads(raw)
            self.assertEqual((status, decision.get("decision")), (200, "execute"), raw)
            with open(effects_file, "a") as f:
                f.write(json.dumps({"key": key, "id": effect_id}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            complete = '{"key":%s,"fence":%d,"outcome":%s}' % (json.dumps(key), decision["fence"],
                                                             outcome)
            status, _, raw = request(first.url, "POST", "/v1/calls/complete", complete.encode())
            steps.append("complete")
            self.fail("idemgate answered every step without dying at %s: %d %r" %
                      (fault, status, raw))
        except (http.client.HTTPException, OSError):
            pass
        self.assertEqual(steps, ["begin", "complete"][:["begin", "complete"].index(dying_step)],
                         "idemgate should have died in %s" % dying_step)
        self.assert_killed_at(first, fault)

        # 2. A restarted idemgate; the runtime retries from the top until the answer settles.
        second = self.start_idemgate("serve", url)

        def ask():
            status, raw = begin(second)
            return status, raw, status == 200 and json.loads(raw).get("decision") == "replay"

        answers = self.settle(ask, "in-progress", fault)

        # 3. The invariant, from the runtime's own side-effect file.
        try:
            with open(effects_file) as f:
                effects = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            effects = []
        self.report("serve", store, fault, len(effects), answers)
        self.assertLessEqual(len(effects), 1, "at most one side effect: %s" % effects)
        if fault in UNSENT:
            self.assertEqual(len(effects), 0, "the runtime was never told to execute")
        for kind, raw in answers:
            if kind == "replayed":
                self.assertEqual(len(effects), 1, "a replay stands for a side effect that happened")
                self.assertIn(b'"outcome":' + outcome.encode(), raw,
                              "the replay is the stored outcome, byte for byte")
        if fault in PERSISTED:
            self.assertEqual(answers[-1][0], "replayed",
                             "the outcome persisted before %s is replayed, not lost" % fault)


def add_cases():
    for store in ("sqlite", "redis", "postgres"):
        for point in HTTP_POINTS:
            setattr(FaultPointTest, "test_http_%s_%s" % (store, point),
                    lambda self, s=store, p=point: self.http_case(s, p))
        for fault, step in LEDGER_POINTS:
            setattr(FaultPointTest, "test_serve_%s_%s" % (store, fault.replace("@", "_")),
                    lambda self, s=store, f=fault, st=step: self.ledger_case(s, f, st))


add_cases()


def main():
    global BINARY, VENDOR
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--binary", default="build/idemgate")
    parser.add_argument("--vendor", default="examples/http-vendor/server.mjs")
    parser.add_argument("--redis-url-file", default=None)
    parser.add_argument("--postgres-url-file", default=None)
    args, rest = parser.parse_known_args()
    BINARY = os.path.abspath(args.binary)
    VENDOR = os.path.abspath(args.vendor)
    URL_FILES["redis"] = args.redis_url_file
    URL_FILES["postgres"] = args.postgres_url_file
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
