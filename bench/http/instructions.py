#!/usr/bin/env python3
"""Instructions per request that `idemgate http` spends, under callgrind.

    python3 bench/http/instructions.py BINARY [BINARY…] [--requests 2000]
                                       [--cases relay,fresh,replay] [--profile DIR]

One keep-alive client (this script) sends `POST /v1/charges` to `valgrind --tool=callgrind
BINARY http --upstream VENDOR --store REDIS/N --config …` one request at a time: 300 warm-up
requests, then the counters are zeroed (callgrind_control -z), --requests more are sent, and
the counters are dumped (callgrind_control -d). Instructions per request = the dump's total /
requests, summed over idemgate's threads. The vendor (examples/http-vendor/server.mjs
--no-fsync) and Redis (tests/servers/redis.sh, appendfsync always) run natively. Counts, not
times: they do not drift with the machine's load, so two binaries compare on a busy machine.
callgrind runs SHA-256 without the CPU's SHA extensions, so the hashes count more than they
cost.

Cases: relay (the route's mode = "off": relayed ungated), fresh (a new Idempotency-Key each:
claim, forward, complete on Redis), replay (one key executed once, then replayed). --profile DIR
keeps each dump as DIR/<case>-<n>.out for callgrind_annotate --inclusive=yes.
"""
import argparse
import http.client
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from callgrind_counts import control, dumped_instructions, measure_all  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR = os.path.join(ROOT, "examples", "http-vendor", "server.mjs")
REDIS_SH = os.path.join(ROOT, "tests", "servers", "redis.sh")
BODY = '{"amount":1999,"currency":"usd","customer":"cus_bench"}'


def listening(proc, what, log):
    """The URL a process prints as "listening on URL", read from its log file."""
    for _ in range(600):  # 60 s: callgrind starts slowly
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}):\n{open(log).read()}")
        m = re.search(r"listening on (http://[^\s/]+)", open(log).read())
        if m:
            return m.group(1)
        time.sleep(0.1)
    raise SystemExit(f"{what}: no 'listening on' after 60 s:\n{open(log).read()}")


def send(conn, key, case, binary):
    conn.request("POST", "/v1/charges", BODY, {"Content-Type": "application/json",
                                               "Idempotency-Key": key})
    r = conn.getresponse()
    r.read()
    if r.status >= 300:
        raise SystemExit(f"{binary} {case}: HTTP {r.status} for key {key}")
    replayed = r.getheader("Idempotent-Replayed") == "true"
    if replayed != (case == "replay"):
        raise SystemExit(f"{binary} {case}: Idempotent-Replayed is {r.getheader('Idempotent-Replayed')}")


def measure(binary, case, requests, tmp, vendor_url, redis_url, profile, index):
    config = os.path.join(tmp, f"{case}.toml")
    with open(config, "w") as f:
        f.write('[[route]]\nmatch = "/v1/charges"\nmethods = ["POST"]\n' +
                ('mode = "off"\n' if case == "relay" else ""))
    out_base = os.path.join(tmp, f"cg-{index}-{case}")
    log = os.path.join(tmp, f"idemgate-{index}-{case}.log")
    with open(log, "w") as out:
        p = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_base}.%p", binary, "http",
             "--listen", "127.0.0.1:0", "--upstream", vendor_url,
             "--store", f"{redis_url}/{index % 16}?prefix=i{index}{case}:", "--config", config],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        url = listening(p, binary, log)
        conn = http.client.HTTPConnection(url.removeprefix("http://"))
        tag = f"{index}-{case}-{time.time_ns()}"
        key = (lambda i: f"{tag}-once") if case == "replay" else (lambda i: f"{tag}-{i}")
        if case == "replay":
            send(conn, key(0), "first", binary)  # executed once; every later one replays
        for i in range(300):
            send(conn, key(-1 - i), case, binary)
        control(p.pid, "-z")
        for i in range(requests):
            send(conn, key(i), case, binary)
        control(p.pid, "-d")
        conn.close()
    finally:
        p.terminate()
        p.wait()
    return dumped_instructions(out_base, p.pid, binary, profile, f"{case}-{index}") / requests


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--cases", default="relay,fresh,replay")
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    cases = args.cases.split(",")
    for case in cases:
        if case not in ("relay", "fresh", "replay"):
            ap.error(f"unknown case {case} (relay, fresh, replay)")
    with tempfile.TemporaryDirectory() as tmp:
        redis_dir = os.path.join(tmp, "redis")
        subprocess.run(["bash", REDIS_SH, "start", redis_dir, "auto"], check=True,
                       stdout=subprocess.DEVNULL)
        vendor_log = os.path.join(tmp, "vendor.log")
        with open(vendor_log, "w") as out:
            vendor = subprocess.Popen(["node", VENDOR, "--no-fsync", "--ledger",
                                       os.path.join(tmp, "ledger.jsonl")],
                                      stdout=out, stderr=subprocess.STDOUT)
        try:
            vendor_url = listening(vendor, "vendor", vendor_log)
            with open(os.path.join(redis_dir, "url")) as f:
                redis_url = f.read().strip()
            measure_all(args.binaries, cases,
                        lambda b, case, index: measure(b, case, args.requests, tmp, vendor_url,
                                                       redis_url, args.profile, index),
                        "request", args.requests)
        finally:
            vendor.terminate()
            vendor.wait()
            subprocess.run(["bash", REDIS_SH, "stop", redis_dir], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
