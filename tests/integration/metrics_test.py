#!/usr/bin/env python3
"""/readyz and /metrics of `idemgate mcp --listen` (docs/DESIGN.md §6.4, §7), end to end.

Starts the real binary in front of the example MCP server, makes a gated tool call and
its retry with a minimal JSON-RPC-over-HTTP client, then checks that /metrics passes
`promtool check metrics` (no lint problems) and counts executed=1, replayed=1 for the
tool, that /readyz is 200, and that with tokens configured /metrics needs an admin
tenant's token while /healthz and /readyz need none, and that [alert] fires its log line,
gauges and webhook on a replay spike.

  metrics_test.py --binary build/idemgate --server examples/mcp-server/server.js [--promtool P]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from http import server as http_server

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


class Idemgate:
    """`idemgate mcp --listen 127.0.0.1:0 -- node server.js`, stopped by its pid."""

    def __init__(self, binary, server, workdir, config=None):
        args = [binary, "mcp", "--store", "sqlite:" + os.path.join(workdir, "idem.db")]
        if config:
            args[2:2] = ["--config", config]
        args += ["--listen", "127.0.0.1:0", "--", "node", server]
        env = dict(os.environ, EXAMPLE_LEDGER=os.path.join(workdir, "ledger.jsonl"))
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, text=True)
        self.stderr = []
        found = threading.Event()
        self.base = None

        def read():
            for line in self.proc.stderr:
                self.stderr.append(line)
                m = re.search(r"idemgate: listening on (http://127\.0\.0\.1:\d+)/mcp", line)
                if m and not found.is_set():
                    self.base = m.group(1)
                    found.set()
            found.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not found.wait(60) or self.base is None:
            self.stop()
            raise RuntimeError("idemgate did not start listening:\n" + "".join(self.stderr))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(30)  # every line of stderr read


def http(method, url, body=None, headers=None):
    """Returns (status, headers, body text)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, res.headers, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


class McpClient:
    """Just enough Streamable HTTP: JSON or SSE answers, the session header."""

    def __init__(self, base, token=None):
        self.url = base + "/mcp"
        self.token = token
        self.session = None
        self.next_id = 1

    def _headers(self):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "MCP-Protocol-Version": "2025-06-18"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        status, _, _ = http("POST", self.url, json.dumps(msg).encode(), self._headers())
        return status

    def request(self, method, params):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        headers = self._headers()
        if method == "initialize":
            headers.pop("MCP-Protocol-Version")
        status, res_headers, text = http("POST", self.url, json.dumps(msg).encode(), headers)
        if status != 200:
            raise RuntimeError(f"{method}: HTTP {status}: {text}")
        if res_headers.get("Mcp-Session-Id"):
            self.session = res_headers["Mcp-Session-Id"]
        if "text/event-stream" in res_headers.get("Content-Type", ""):
            for line in text.splitlines():
                if line.startswith("data:"):
                    answer = json.loads(line[5:])
                    if answer.get("id") == msg["id"]:
                        return answer
            raise RuntimeError(f"{method}: no answer in the stream: {text}")
        return json.loads(text)


def session(base, token=None):
    client = McpClient(base, token)
    init = client.request("initialize", {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "metrics_test", "version": "1"}})
    check("result" in init, "initialize answered")
    check(client.notify("notifications/initialized") == 202, "notifications/initialized accepted")
    return client


def charge(client, turn):
    return client.request("tools/call", {
        "name": "charge",
        "arguments": {"customer": "cus_1", "amount_cents": 500, "currency": "EUR"},
        "_meta": {"dev.idemgate/turnId": turn}})


def sample(text, name_and_labels):
    for line in text.splitlines():
        if line.startswith(name_and_labels + " "):
            return line.split(" ", 1)[1]
    return None


def test_metrics(args, workdir):
    gate = Idemgate(args.binary, args.server, workdir)
    try:
        client = session(gate.base)
        first = charge(client, "turn-1")
        retry = charge(client, "turn-1")
        check("result" in first and "result" in retry, "the call and its retry answered")
        check(first.get("result", {}).get("structuredContent") ==
              retry.get("result", {}).get("structuredContent"), "the retry replays the charge")

        status, headers, ready = http("GET", gate.base + "/readyz")
        check(status == 200, f"/readyz is 200 (got {status}: {ready.strip()})")
        status, headers, text = http("GET", gate.base + "/metrics")
        check(status == 200, f"/metrics is 200 (got {status})")
        check(headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
              "/metrics has the 0.0.4 content type")
        lint = subprocess.run([args.promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True)
        check(lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(),
              "promtool check metrics: exit 0, no problems" +
              (f"\n{lint.stdout}{lint.stderr}" if lint.returncode or lint.stdout or lint.stderr
               else ""))
        # The host label is the client's clientInfo.name.
        labels = '{front="mcp",tool="charge",outcome="%s",host="metrics_test"}'
        check(sample(text, "idemgate_attempts_total" + labels % "executed") == "1",
              "attempts_total executed = 1")
        check(sample(text, "idemgate_attempts_total" + labels % "replayed") == "1",
              "attempts_total replayed = 1")
        check(sample(text, 'idemgate_replay_ratio{tool="charge"}') == "0.5", "replay_ratio = 0.5")
        check(sample(text, 'idemgate_in_flight_calls{front="mcp"}') == "0", "nothing in flight")
        check(sample(text, 'idemgate_in_flight_limit{front="mcp"}') == "256",
              "the in-flight limit is [mcp] max_in_flight's default")
        check(sample(text, 'idemgate_store_operation_duration_seconds_count{op="claim"}') not in
              (None, "0"), "store claims are timed")
        for reason in ("backlog", "store_error"):
            check(sample(text, 'idemgate_audit_entries_dropped_total{reason="%s"}' % reason) ==
                  "0", f"no audit entry dropped ({reason})")
    finally:
        gate.stop()


def test_admin_token(args, workdir):
    config = os.path.join(workdir, "idemgate.toml")
    with open(config, "w") as f:
        f.write('[[tenant]]\nname = "ops"\ntokens = ["ops-token"]\nadmin = true\n\n'
                '[[tenant]]\nname = "agent"\ntokens = ["agent-token"]\n')
    gate = Idemgate(args.binary, args.server, workdir, config)
    try:
        check(http("GET", gate.base + "/healthz")[0] == 200, "tokens: /healthz needs none")
        check(http("GET", gate.base + "/readyz")[0] == 200, "tokens: /readyz needs none")
        check(http("GET", gate.base + "/metrics")[0] == 401, "tokens: /metrics without one is 401")
        status = http("GET", gate.base + "/metrics", headers={"Authorization": "Bearer agent-token"})[0]
        check(status == 403, f"tokens: /metrics with a non-admin token is 403 (got {status})")
        status, _, text = http("GET", gate.base + "/metrics",
                               headers={"Authorization": "Bearer ops-token"})
        check(status == 200 and "idemgate_build_info" in text,
              "tokens: /metrics with an admin token is 200")
    finally:
        gate.stop()


def test_alert(args, workdir):
    """[alert] from the config: a spike fires the log line, the gauges and the webhook."""
    posts = []
    posted = threading.Event()

    class Hook(http_server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posts.append((self.path, self.headers.get("Content-Type"), body.decode()))
            self.send_response(204)
            self.end_headers()
            posted.set()

        def log_message(self, *a):
            pass

    hook = http_server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    config = os.path.join(workdir, "idemgate.toml")
    with open(config, "w") as f:
        f.write('[alert]\nwindow = "5m"\nmin_attempts = 2\nreplay_ratio = 0.4\n'
                f'webhook = "http://127.0.0.1:{hook.server_address[1]}/hook"\n')
    gate = Idemgate(args.binary, args.server, workdir, config)
    try:
        client = session(gate.base)
        charge(client, "turn-1")
        charge(client, "turn-1")
        _, _, text = http("GET", gate.base + "/metrics")  # every scrape judges the windows
        check(sample(text, 'idemgate_replay_alert{tool="charge"}') == "1", "alert gauge is 1")
        check(sample(text, 'idemgate_alerts_total{tool="charge"}') == "1", "alerts_total = 1")
        check(posted.wait(30), "the webhook was POSTed")
        if posts:
            path, ctype, body = posts[0]
            doc = json.loads(body)
            check(path == "/hook" and ctype == "application/json", "webhook path and content type")
            check(doc.get("status") == "firing" and doc.get("tool") == "charge" and
                  doc.get("attempts") == 2 and doc.get("replays") == 1 and
                  doc.get("threshold") == 0.4, f"webhook document: {body}")
    finally:
        gate.stop()
        hook.shutdown()
    log = "".join(gate.stderr)
    check(log.count('ALERT replay ratio of tool "charge"') == 1,
          "one ALERT line on stderr")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--promtool", default="promtool")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="idemgate-metrics-") as workdir:
        os.makedirs(os.path.join(workdir, "a"))
        os.makedirs(os.path.join(workdir, "b"))
        os.makedirs(os.path.join(workdir, "c"))
        test_metrics(args, os.path.join(workdir, "a"))
        test_admin_token(args, os.path.join(workdir, "b"))
        test_alert(args, os.path.join(workdir, "c"))
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
