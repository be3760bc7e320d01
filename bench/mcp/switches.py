#!/usr/bin/env python3
"""Context switches per pass-through tools/call of one `idemgate mcp` (stdio both sides).

    python3 bench/mcp/switches.py BINARY [BINARY…] [--calls 3000]

One client (this script) sends sequential `list_charges` calls (read-only: passed through,
no store) through each BINARY in front of bench/mcp/echo_server.mjs, after tools/list and
200 warm-up calls, and prints the voluntary and involuntary context switches of the
idemgate process per call, summed over its threads (from /proc/PID/task/*/status), and the
threads that switched. Counts, not times: they hold on a busy machine.
"""
import argparse
import glob
import json
import os
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

    rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "switches", "version": "1"}}})
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, answer=False)
    rpc({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"})
    call = {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "list_charges", "arguments": {"customer": "c"}}}
    for i in range(200):
        rpc({**call, "id": i + 1})
    before = switches(p.pid)
    for i in range(calls):
        rpc({**call, "id": i + 1000})
    after = switches(p.pid)
    p.stdin.close()
    p.wait()
    delta = {t: (after[t][0] - before.get(t, (0, 0))[0], after[t][1] - before.get(t, (0, 0))[1])
             for t in after}
    vol = sum(v for v, _ in delta.values()) / calls
    invol = sum(n for _, n in delta.values()) / calls
    busy = sorted(round(v / calls, 2) for v, _ in delta.values() if v / calls > 0.01)
    print(f"{binary}: voluntary {vol:.2f}, involuntary {invol:.2f} context switches per call; "
          f"threads that switched: {busy}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for b in args.binaries:
            measure(b, args.calls, tmp)


if __name__ == "__main__":
    main()
