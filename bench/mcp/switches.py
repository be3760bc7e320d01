#!/usr/bin/env python3
"""Context switches per pass-through tools/call of one `idemgate mcp`.

    python3 bench/mcp/switches.py BINARY [BINARY…] [--calls 3000] [--http]

One client (this script) sends sequential `list_charges` calls (read-only: passed through,
no store) through each BINARY in front of bench/mcp/echo_server.mjs, after tools/list and
200 warm-up calls, and prints the voluntary and involuntary context switches of the
idemgate process per call, summed over its threads (from /proc/PID/task/*/status), and the
threads that switched. Counts, not times: they hold on a busy machine.

Default: stdio both sides (`idemgate mcp -- node echo_server.mjs`). --http: Streamable HTTP
both sides (`idemgate mcp --listen 127.0.0.1:0 --upstream-url URL` in front of
`echo_server.mjs --http 0`), protocol 2025-06-18, one keep-alive connection for the calls.
"""
import argparse
import glob
import http.client
import json
import os
import re
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ECHO = os.path.join(ROOT, "bench", "mcp", "echo_server.mjs")


def switches(pid):
    out = {}
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        fields = dict(l.split(":\t", 1) for l in open(status).read().splitlines() if ":\t" in l)
        out[status.split("/")[4]] = (int(fields["voluntary_ctxt_switches"]),
                                     int(fields["nonvoluntary_ctxt_switches"]))
    return out


def measure(binary, calls, tmp):
    store = f"sqlite:{tmp}/{abs(hash(binary))}.db"
    p = subprocess.Popen([binary, "mcp", "--store", store, "--", "node", ECHO],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def rpc(obj, answer=True):
        p.stdin.write((json.dumps(obj) + "\n").encode())
        p.stdin.flush()
        if answer:
            json.loads(p.stdout.readline())

    run_calls(p.pid, rpc, calls, binary)
    p.stdin.close()
    p.wait()


def run_calls(pid, rpc, calls, binary):
    """Initialises through `rpc`, warms up, and prints `pid`'s switches per call."""
    rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "switches", "version": "1"}}})
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, answer=False)
    rpc({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"})
    call = {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "list_charges", "arguments": {"customer": "c"}}}
    for i in range(200):
        rpc({**call, "id": i + 1})
    before = switches(pid)
    for i in range(calls):
        rpc({**call, "id": i + 1000})
    after = switches(pid)
    delta = {t: (after[t][0] - before.get(t, (0, 0))[0], after[t][1] - before.get(t, (0, 0))[1])
             for t in after}
    vol = sum(v for v, _ in delta.values()) / calls
    invol = sum(n for _, n in delta.values()) / calls
    busy = sorted(round(v / calls, 2) for v, _ in delta.values() if v / calls > 0.01)
    print(f"{binary}: voluntary {vol:.2f}, involuntary {invol:.2f} context switches per call; "
          f"threads that switched: {busy}")


def listening_url(proc, what):
    """Reads `proc`'s stderr until it prints the URL it listens on."""
    for line in proc.stderr:
        m = re.search(rb"listening on (http://127\.0\.0\.1:(\d+)/mcp)", line)
        if m:
            return int(m.group(2)), m.group(1).decode()
    raise SystemExit(f"{what} did not start")


def measure_http(binary, calls, tmp):
    echo = subprocess.Popen(["node", ECHO, "--http", "0"], stderr=subprocess.PIPE)
    _, upstream_url = listening_url(echo, "the echo server")
    p = subprocess.Popen([binary, "mcp", "--store", f"sqlite:{tmp}/{abs(hash(binary))}-http.db",
                          "--listen", "127.0.0.1:0", "--upstream-url", upstream_url],
                         stderr=subprocess.PIPE)
    port, _ = listening_url(p, "idemgate")
    conn = http.client.HTTPConnection("127.0.0.1", port)
    session = {}

    def rpc(obj, answer=True):
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if session:
            headers["Mcp-Session-Id"] = session["id"]
            headers["MCP-Protocol-Version"] = "2025-06-18"
        conn.request("POST", "/mcp", json.dumps(obj), headers)
        res = conn.getresponse()
        body = res.read()
        if res.getheader("Mcp-Session-Id"):
            session["id"] = res.getheader("Mcp-Session-Id")
        if answer:
            data = [l[5:] for l in body.decode().splitlines() if l.startswith("data:")]
            json.loads(data[-1] if data else body)

    try:
        run_calls(p.pid, rpc, calls, binary)
    finally:
        conn.close()
        p.terminate()
        p.wait()
        echo.terminate()
        echo.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--http", action="store_true", help="Streamable HTTP instead of stdio")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for b in args.binaries:
            (measure_http if args.http else measure)(b, args.calls, tmp)


if __name__ == "__main__":
    main()
