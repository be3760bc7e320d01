#!/usr/bin/env python3
"""deploy/ on a real Prometheus (issue #19): the rules and the Grafana dashboard, end to end.

Checks the rules with `promtool check rules` and their unit tests with `promtool test rules`,
then starts `idemgate serve` and `idemgate http` (in front of a vendor stub of this file) on
port 0 with SQLite stores in a temp dir, and Debian's `prometheus` on loopback scraping both
every second with deploy/prometheus/idemgate.rules.yml loaded as it is (no threshold or `for`
lowered). It then makes what each alert is about happen:

  - a retry storm through both fronts (replays dominate): IdemgateReplaySpike, read `pending`
    (or `firing`) from Prometheus's /api/v1/alerts for both tools;
  - a call marked unknown and retried (serve): IdemgateUnknownOutcomes;
  - serve's SQLite file write-locked by this process while calls and heartbeats keep coming
    (each fails after the store's 5 s busy timeout): IdemgateStoreErrors and
    IdemgateLeaseRenewalsFailing;
  - 17 calls held by the vendor stub on an `idemgate http` allowed 20 connections:
    IdemgateInFlightNearLimit.

Then every rule Prometheus loaded (/api/v1/rules: each one's health must be ok) and every
expression of the dashboard (panel targets, the annotation, the variables' selectors) is
evaluated by that Prometheus (/api/v1/query): no error, and at least one series. There is no
exception: an expression that cannot return series is a failure.

Everything is polled for with a deadline (a condition, never a sleep that assumes how long
something takes), so a slow machine gets the same verdict, only later. Nothing waits out an
alert's `for`: that an alert pending for its `for` fires is Prometheus's own rule, and the
rules' unit tests (`promtool test rules`, on a fake clock) check each `for` as written.

  prometheus_test.py --binary build/idemgate [--prometheus P] [--promtool P]
"""
import argparse
import json
import os
import queue
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http import server as http_server

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
RULES_DIR = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(RULES_DIR, "idemgate.rules.yml")
RULE_TESTS = os.path.join(RULES_DIR, "idemgate.rules.test.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "idemgate.json")

START_DEADLINE = 30   # seconds for a process to say where it listens
STEP_DEADLINE = 60    # seconds for one polled condition (scraped, evaluated)
ALERT_DEADLINE = 120  # seconds for the replay spike to be pending, from the store phase's end
HTTP_TIMEOUT = 30     # seconds for one request (a store-locked one takes the 5 s busy timeout)

SERVE_TOOL = "create_ticket"
HTTP_TOOL = "POST /v1/charges"   # `idemgate http` names a call by its method and path
HELD = 17          # calls the vendor stub holds ...
MAX_CONNECTIONS = 20  # ... of what `idemgate http` may have open: 85%, above the alert's 80%
STORM_KEYS = 5     # distinct calls per front in the storm ...
STORM_ATTEMPTS = 20  # ... each sent this many times: 95 of 100 attempts replayed

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def poll(what, probe, deadline=STEP_DEADLINE):
    """Calls probe() until it returns something truthy; raises, naming `what`, at the deadline."""
    end = time.monotonic() + deadline
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError("gave up after %d s waiting for %s" % (deadline, what))
        time.sleep(0.2)  # between polls only; nothing assumes how long anything takes


def http(method, url, body=None, headers=None, timeout=HTTP_TIMEOUT):
    """Returns (status, body text); a refused connection is status 0."""
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError) as e:
        return 0, str(e)


class Process:
    """A child whose stderr (and stdout) is drained; `pattern`'s first group is awaited."""

    def __init__(self, name, args, pattern):
        self.name = name
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace")
        self.output = []
        found = queue.Queue()

        def drain():
            for line in self.proc.stdout:
                self.output.append(line)
                m = re.search(pattern, line)
                if m:
                    found.put(m.group(1))
            found.put(None)

        self.reader = threading.Thread(target=drain, daemon=True)
        self.reader.start()
        try:
            self.address = found.get(timeout=START_DEADLINE)
        except queue.Empty:
            self.address = None
        if self.address is None:
            self.stop()
            raise AssertionError("%s did not start (no %r in its output):\n%s" %
                                 (name, pattern, "".join(self.output)))

    def stop(self):
        """SIGTERM to its pid, SIGKILL if it has not exited after START_DEADLINE."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(START_DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(START_DEADLINE)


class Vendor:
    """The HTTP API behind `idemgate http`: /v1/charges answers at once, /v1/hold only once
    release() is called (the calls it holds are the executions in flight)."""

    def __init__(self):
        self.released = threading.Event()
        self.cv = threading.Condition()
        self.holding = 0
        self.charges = 0
        vendor = self

        class Handler(http_server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/hold":
                    with vendor.cv:
                        vendor.holding += 1
                        vendor.cv.notify_all()
                    vendor.released.wait(STEP_DEADLINE * 2)  # a safety net, never reached
                with vendor.cv:
                    vendor.charges += 1
                    n = vendor.charges
                body = json.dumps({"id": "ch_%d" % n}).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


class Prometheus:
    """The Prometheus HTTP API of one server."""

    def __init__(self, base):
        self.base = base

    def api(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        status, text = http("GET", url)
        try:
            doc = json.loads(text)
        except ValueError:
            raise AssertionError("%s: HTTP %d, not JSON: %s" % (url, status, text[:300]))
        return doc

    def query(self, expr):
        """(error or None, result list) of an instant query."""
        doc = self.api("/api/v1/query", query=expr)
        if doc.get("status") != "success":
            return "%s: %s" % (doc.get("errorType"), doc.get("error")), []
        return None, doc["data"]["result"]

    def series_of(self, expr):
        error, result = self.query(expr)
        if error:
            raise AssertionError("query %s failed: %s" % (expr, error))
        return result


# ── the storm and the other traffic ────────────────────────────────────────────────────────


def serve_step(serve, step, body):
    return http("POST", serve + "/v1/calls/" + step, body)


def serve_begin(serve, key, tool=SERVE_TOOL):
    status, text = serve_step(serve, "begin", {"tool": tool, "key": key, "args": {"k": key}})
    return status, (json.loads(text) if text.startswith("{") else {"raw": text})


def serve_call(serve, key):
    """One attempt of a call through the ledger API: begin, and complete if told to execute."""
    status, doc = serve_begin(serve, key)
    if status == 200 and doc.get("decision") == "execute":
        status, _ = serve_step(serve, "complete", {"key": doc["key"], "fence": doc["fence"],
                                                    "outcome": {"status": "success",
                                                                "result": {"key": key}}})
        return status, "executed"
    return status, doc.get("decision")


def http_call(proxy, key, path="/v1/charges", timeout=HTTP_TIMEOUT):
    status, _ = http("POST", proxy + path, {"amount": 1200, "key": key},
                     {"Idempotency-Key": key}, timeout)
    return status


def in_threads(n, fn):
    """Runs fn(i) for i in range(n) on n threads; returns their results in order."""
    results = [None] * n

    def run(i):
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def storm(serve, proxy):
    """Each of STORM_KEYS calls once, then its retries from 4 threads at once (a client that
    retries too hard): replays dominate on both fronts."""
    for k in range(STORM_KEYS):
        key = "storm-%d" % k
        s, how = serve_call(serve, key)
        check(s == 200 and how == "executed", "serve: %s executed (%s %s)" % (key, s, how))
        check(http_call(proxy, key) == 201, "http: %s executed" % key)
        retries = STORM_ATTEMPTS - 1
        got = sum(in_threads(4, lambda i: [(serve_call(serve, key), http_call(proxy, key))
                                           for _ in range(i, retries, 4)]), [])
        check(len(got) == retries and all(g[0] == (200, "replay") for g in got),
              "serve: %d retries of %s replayed" % (retries, key))
        check(all(g[1] == 201 for g in got), "http: %d retries of %s answered 201" % (retries, key))


def unknown_outcome(serve):
    """A call whose owner gave up without knowing (mark_unknown), and its retry: both attempts
    are answered `unknown`, the record waits for an operator."""
    status, doc = serve_begin(serve, "unknown-1")
    check(status == 200 and doc.get("decision") == "execute", "serve: unknown-1 begins")
    status, text = serve_step(serve, "mark_unknown", {"key": doc["key"], "fence": doc["fence"]})
    check(status == 200, "serve: unknown-1 marked unknown (%d %s)" % (status, text[:200]))
    status, doc = serve_begin(serve, "unknown-1")
    check(status == 409 and "outcome-unknown" in json.dumps(doc),
          "serve: the retry of unknown-1 is refused as outcome-unknown (%d)" % status)


def store_locked(serve, db_path, prom, conditions):
    """Write-locks serve's SQLite file from here while a running call's heartbeats and new
    calls keep coming, until Prometheus sees `conditions` (the store-error and lease alerts'
    expressions) return series. Each store write then fails with unavailable after the store's
    busy timeout (5 s). The first error of a kind creates its series, which rate() cannot count,
    so it takes a few rounds: hence a loop until the condition, not a fixed number of calls."""
    status, doc = serve_begin(serve, "long-running")
    check(status == 200 and doc.get("decision") == "execute", "serve: long-running begins")
    lease = {"key": doc["key"], "fence": doc["fence"]}
    status, _ = serve_step(serve, "heartbeat", lease)
    check(status == 200, "serve: a heartbeat renews the lease while the store is free")

    lock = sqlite3.connect(db_path, timeout=HTTP_TIMEOUT, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    stop = threading.Event()
    answers = []

    def heartbeats():
        while not stop.is_set():
            answers.append(("heartbeat", serve_step(serve, "heartbeat", lease)[0]))

    def begins(i):
        n = 0
        while not stop.is_set():
            n += 1
            answers.append(("begin", serve_begin(serve, "locked-%d-%d" % (i, n))[0]))

    workers = [threading.Thread(target=heartbeats)]
    workers += [threading.Thread(target=begins, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    try:
        for expr in conditions:
            poll("Prometheus to see %s" % expr, lambda: prom.series_of(expr))
    finally:
        stop.set()
        for w in workers:
            w.join()
        lock.rollback()
        lock.close()
    check(answers and all(status == 503 for _, status in answers),
          "serve: all %d calls and heartbeats on the locked store answered 503" % len(answers))
    status, _ = serve_step(serve, "complete", {**lease, "outcome": {"status": "success",
                                                                     "result": {}}})
    check(status in (200, 409), "serve: long-running settles once the store is free (%d)" % status)


# ── what is checked ───────────────────────────────────────────────────────────────────────


def count_rules(path):
    """(recording, alerting) rules in the file, counted on its text: the standard library has
    no YAML parser, and /api/v1/rules must list exactly these."""
    text = open(path).read()
    return (len(re.findall(r"^\s*- record:", text, re.M)),
            len(re.findall(r"^\s*- alert:", text, re.M)))


def dashboard_exprs(path):
    """Every PromQL expression of the dashboard, with Grafana's variables as "All" (.*), and
    (kind, title) to name each."""
    dash = json.load(open(path))
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append(("panel", "%s [%s]" % (p["title"], t["refId"]), t["expr"]))
    for a in dash["annotations"]["list"]:
        if a.get("expr"):
            out.append(("annotation", a["name"], a["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
            if not m:
                raise AssertionError("variable %s: not label_values(SELECTOR, LABEL): %s" %
                                     (v["name"], q))
            out.append(("variable", v["name"], m.group(1)))
    resolved = []
    for kind, name, expr in out:
        e = expr.replace("$job", ".*").replace("$tool", ".*")
        if "$" in e:
            raise AssertionError("%s %s: a variable this test does not know: %s" % (kind, name, e))
        resolved.append((kind, name, e))
    return dash, resolved


def check_dashboard_shape(dash):
    """What Grafana needs to import the file as it is."""
    check(dash.get("schemaVersion", 0) >= 36 and dash.get("uid") and dash.get("title"),
          "dashboard: schemaVersion, uid and title")
    names = [v["name"] for v in dash["templating"]["list"]]
    check("DS_PROMETHEUS" in names and
          next(v for v in dash["templating"]["list"] if v["name"] == "DS_PROMETHEUS")["type"]
          == "datasource", "dashboard: a DS_PROMETHEUS data source variable")
    ids = []

    def walk(items):
        for p in items:
            ids.append(p["id"])
            g = p.get("gridPos", {})
            check(all(k in g for k in "xywh") and g["x"] + g["w"] <= 24,
                  "dashboard: panel %r has a gridPos within 24 columns" % p["title"])
            if p["type"] != "row":
                check(p.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}" and p["targets"]
                      and all(t.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}"
                              for t in p["targets"]),
                      "dashboard: panel %r queries ${DS_PROMETHEUS}" % p["title"])
            walk(p.get("panels", []))

    walk(dash["panels"])
    check(len(ids) == len(set(ids)), "dashboard: panel ids are unique")
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for want in ("replay ratio per tool", "executions vs replays", "in progress, unknown, drift",
                 "store latency", "store errors", "leases", "in flight"):
        check(want in titles, "dashboard: has a panel %r" % want)


def evaluate_all(prom, exprs):
    """Each (kind, name, expr) evaluated by Prometheus: an error fails at once; no series is
    waited for (the last scrape or rule evaluation may not have happened yet), then fails."""
    for kind, name, expr in exprs:
        error, result = prom.query(expr)
        if error:
            check(False, "%s %s: %s evaluates (%s)" % (kind, name, expr, error))
            continue
        if not result:
            try:
                result = poll("series from %s" % expr, lambda: prom.query(expr)[1],
                              deadline=STEP_DEADLINE / 2)
            except AssertionError:
                result = []
        check(bool(result), "%s %s: %s returns %d series" % (kind, name, expr, len(result)))


def alert_states_by_tool(prom, alertname):
    doc = prom.api("/api/v1/alerts")
    return {a["labels"].get("tool") or a["labels"].get("instance"): a["state"]
            for a in doc["data"]["alerts"] if a["labels"]["alertname"] == alertname}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--prometheus", default="prometheus")
    ap.add_argument("--promtool", default="promtool")
    args = ap.parse_args()
    for tool in (args.prometheus, args.promtool):
        if not shutil.which(tool):
            sys.exit("%s not found: install Debian's prometheus package (scripts/setup does)" % tool)
    t0 = time.monotonic()

    # The rules and their unit tests, as an operator would check them.
    p = subprocess.run([args.promtool, "check", "rules", RULES], capture_output=True, text=True)
    check(p.returncode == 0, "promtool check rules: " + (p.stdout + p.stderr).strip())
    p = subprocess.run([args.promtool, "test", "rules", RULE_TESTS], capture_output=True,
                       text=True, cwd=RULES_DIR)
    check(p.returncode == 0, "promtool test rules: " + (p.stdout + p.stderr).strip())
    records, alerts = count_rules(RULES)
    dash, dash_exprs = dashboard_exprs(DASHBOARD)
    check_dashboard_shape(dash)

    work = tempfile.mkdtemp(prefix="idemgate-prometheus-")
    started = []
    vendor = None
    try:
        vendor = Vendor()
        serve_db = os.path.join(work, "serve.db")
        serve = Process("idemgate serve",
                        [args.binary, "serve", "--listen", "127.0.0.1:0",
                         "--store", "sqlite:" + serve_db],
                        r"listening on (http://127\.0\.0\.1:\d+)")
        started.append(serve)
        proxy = Process("idemgate http",
                        [args.binary, "http", "--listen", "127.0.0.1:0", "--upstream", vendor.url,
                         "--store", "sqlite:" + os.path.join(work, "http.db"),
                         "--max-connections", str(MAX_CONNECTIONS)],
                        r"listening on (http://127\.0\.0\.1:\d+)")
        started.append(proxy)

        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            # JSON is YAML: no YAML writer needed.
            json.dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                           "evaluation_interval": "1s"},
                "rule_files": [RULES],
                "scrape_configs": [{
                    "job_name": "idemgate",
                    "static_configs": [{"targets": [serve.address.split("//")[1],
                                                    proxy.address.split("//")[1]]}],
                }],
            }, f, indent=2)
        p = subprocess.run([args.promtool, "check", "config", config], capture_output=True,
                           text=True)
        check(p.returncode == 0, "promtool check config of the test's prometheus.yml")
        # Port 0: Prometheus logs the port it bound ("Listening on" address=127.0.0.1:N).
        server = Process("prometheus",
                         [args.prometheus, "--config.file=" + config,
                          "--storage.tsdb.path=" + os.path.join(work, "tsdb"),
                          "--web.listen-address=127.0.0.1:0", "--log.level=info"],
                         r'msg="Listening on" address=(127\.0\.0\.1:\d+)')
        started.append(server)
        prom = Prometheus("http://" + server.address)
        poll("Prometheus ready", lambda: http("GET", prom.base + "/-/ready")[0] == 200)
        poll("both targets up", lambda: len(prom.series_of('up{job="idemgate"} == 1')) == 2)
        print("     Prometheus %s up, scraping serve %s and http %s (%.1f s)" %
              (prom.base, serve.address, proxy.address, time.monotonic() - t0), flush=True)
        # The alerts' expressions as Prometheus loaded them from the file: the test waits for
        # those, never for thresholds of its own.
        alert_expr = {r["name"]: r["query"] for g in prom.api("/api/v1/rules")["data"]["groups"]
                      for r in g["rules"] if r["type"] == "alerting"}

        # One call per front first: idemgate creates a tool's series on its first attempt, and
        # rate() counts only what happens after Prometheus has seen a series.
        check(serve_call(serve.address, "seed")[1] == "executed", "serve: seed call executed")
        check(http_call(proxy.address, "seed") == 201, "http: seed call executed")
        for tool in (SERVE_TOOL, HTTP_TOOL):
            poll("Prometheus to see %s's attempts" % tool, lambda: prom.series_of(
                'idemgate_attempts_total{outcome="replayed",tool="%s"}' % tool))

        storm_start = time.monotonic()
        storm(serve.address, proxy.address)
        print("     retry storm sent (%.1f s to %.1f s)" %
              (storm_start - t0, time.monotonic() - t0), flush=True)
        unknown_outcome(serve.address)
        store_locked(serve.address, serve_db, prom,
                     [alert_expr["IdemgateStoreErrors"], alert_expr["IdemgateLeaseRenewalsFailing"]])
        print("     store errors and failed heartbeats seen by Prometheus (%.1f s)" %
              (time.monotonic() - t0), flush=True)

        # Its condition holds on both tools: pending, firing once `for: 1m` has passed.
        states = poll("IdemgateReplaySpike pending for %s and %s" % (SERVE_TOOL, HTTP_TOOL),
                      lambda: (lambda s: s if all(s.get(t) in ("pending", "firing")
                                                  for t in (SERVE_TOOL, HTTP_TOOL)) else None)(
                          alert_states_by_tool(prom, "IdemgateReplaySpike")),
                      deadline=ALERT_DEADLINE)
        check(True, "IdemgateReplaySpike: %s (%.1f s after the storm began)" %
              (states, time.monotonic() - storm_start))

        # Executions in flight near the limit, held while everything is evaluated.
        held = []  # their answers, once released
        holders = [threading.Thread(target=lambda i=i: held.append(http_call(
            proxy.address, "hold-%d" % i, "/v1/hold", timeout=ALERT_DEADLINE * 2)))
            for i in range(HELD)]
        for h in holders:
            h.start()
        with vendor.cv:
            check(vendor.cv.wait_for(lambda: vendor.holding == HELD, STEP_DEADLINE),
                  "the vendor holds %d calls" % HELD)
        try:
            poll("Prometheus to see %d of %d in flight" % (HELD, MAX_CONNECTIONS),
                 lambda: prom.series_of(alert_expr["IdemgateInFlightNearLimit"]))

            # Every rule as Prometheus loaded it: healthy, and its expression returns series.
            groups = prom.api("/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            check(sum(r["type"] == "recording" for r in rules) == records and
                  sum(r["type"] == "alerting" for r in rules) == alerts,
                  "Prometheus loaded the file's %d recording and %d alerting rules" %
                  (records, alerts))
            for r in rules:
                check(r["health"] == "ok", "rule %s: health %s %s" %
                      (r["name"], r["health"], r.get("lastError", "")))
            evaluate_all(prom, [("rule", r["name"], r["query"]) for r in rules])
            evaluate_all(prom, dash_exprs)
            # Prometheus's own evaluation agrees: each alert is at least pending (the ones
            # with a `for` longer than their condition has held are not firing yet). Polled:
            # the alerts group may not have run since the last recording rule changed.
            def alert_states():
                states = {name: set() for name in alert_expr}
                for a in prom.api("/api/v1/alerts")["data"]["alerts"]:
                    states.setdefault(a["labels"]["alertname"], set()).add(a["state"])
                return states

            try:
                states = poll("every alert pending or firing",
                              lambda: (lambda s: s if all(s.values()) else None)(alert_states()))
            except AssertionError:
                states = alert_states()
            for name in alert_expr:
                check(bool(states[name]), "Prometheus has %s %s" %
                      (name, "/".join(sorted(states[name])) or "inactive"))
        finally:
            vendor.released.set()
            for h in holders:
                h.join()
        check(held == [201] * HELD, "the %d held calls answered 201 once released" % HELD)
    except AssertionError as e:
        check(False, str(e))
    finally:
        for proc in reversed(started):
            proc.stop()
        if vendor:
            vendor.stop()
        if FAILURES or os.environ.get("IDEM_KEEP_OUTPUT"):
            for proc in started:
                print("---- %s output (last 40 lines)\n%s" % (proc.name,
                                                             "".join(proc.output[-40:])))
        shutil.rmtree(work, ignore_errors=True)

    print("%d checks failed (%.1f s)" % (len(FAILURES), time.monotonic() - t0) if FAILURES else
          "all checks passed (%.1f s)" % (time.monotonic() - t0), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:  # before any process started: the files themselves are wrong
        print("FAIL " + str(e), flush=True)
        sys.exit(1)
