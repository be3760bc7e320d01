#!/usr/bin/env python3
"""Instructions per tools/call that `idemgate mcp` spends over stdio, under callgrind.

    python3 bench/mcp/instructions.py BINARY [BINARY…] [--calls 2000] [--cases pass,replay,fresh,hook]
                                      [--profile DIR]

One client (this script) drives `valgrind --tool=callgrind BINARY mcp --store sqlite:… --
node bench/mcp/echo_server.mjs` (the upstream runs natively): initialize, tools/list and 100
warm-up calls, then the counters are zeroed (callgrind_control -z), --calls sequential calls
are made, and the counters are dumped (callgrind_control -d). Instructions per call = the
dump's total / calls, summed over idemgate's threads. Counts, not times: they do not drift with
the machine's load, so two binaries compare on a busy machine.

Cases: pass (read-only `list_charges`, passed through), replay (gated `charge`, the same turn
and arguments every call: answered from the store), fresh (gated `charge`, a new turn each
call: claim, execute, complete in SQLite), hook (gated `charge` as Claude Code sends it, no
turn in `_meta`: the turn is `hook:turn`, which `idemgate hook`, run by this script, the
proxy's parent, recorded before; answered from the store, so `hook` - `replay` is what reading
the turn file costs in user space; the open and read themselves are the kernel's, which
callgrind does not count: `build/bench/host_turn_bench` times them). --profile DIR keeps each dump as
DIR/<case>-<n>.out for callgrind_annotate --inclusive=yes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from callgrind_counts import control, dumped_instructions, measure_all  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ECHO = os.path.join(ROOT, "bench", "mcp", "echo_server.mjs")
TURN = "dev.idemgate/turnId"


def call_of(case, seq):
    if case == "pass":
        params = {"name": "list_charges", "arguments": {"customer": "cus_1"}}
    elif case == "hook":
        params = {"name": "charge",
                  "arguments": {"customer": "cus_1", "amount_cents": 1250, "currency": "EUR"},
                  "_meta": {"claudecode/toolUseId": f"toolu_{seq}", "progressToken": seq}}
    else:
        turn = "replay-turn" if case == "replay" else f"fresh-turn-{seq}"
        params = {"name": "charge",
                  "arguments": {"customer": "cus_1", "amount_cents": 1250, "currency": "EUR"},
                  "_meta": {TURN: turn}}
    return {"jsonrpc": "2.0", "id": seq, "method": "tools/call", "params": params}


def measure(binary, case, calls, tmp, profile, index):
    out_base = os.path.join(tmp, f"cg-{index}-{case}")
    config = []
    if case == "hook":
        # The prompt hook, as Claude Code runs it: this process is the host of both.
        path = os.path.join(tmp, f"{index}-hook.toml")
        with open(path, "w") as f:
            f.write(f'[mcp]\nhook_dir = "{tmp}/hooks-{index}"\n')
        config = ["--config", path]
        prompt = {"session_id": "bench", "prompt_id": "p1", "hook_event_name": "UserPromptSubmit",
                  "prompt": "charge cus_1"}
        hook = subprocess.run([binary, "hook", *config], input=json.dumps(prompt).encode(),
                              capture_output=True)
        if hook.returncode != 0 or hook.stdout or hook.stderr:
            raise SystemExit(f"{binary} hook: {hook}")
    p = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out_base}.%p",
         binary, "mcp", "--store", f"sqlite:{tmp}/{index}-{case}.db", *config, "--", "node", ECHO],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def rpc(obj, answer=True):
        p.stdin.write((json.dumps(obj) + "\n").encode())
        p.stdin.flush()
        if answer:
            reply = json.loads(p.stdout.readline())
            if "error" in reply or reply.get("result", {}).get("isError"):
                raise SystemExit(f"{binary} {case}: unexpected answer {reply}")
            return reply

    rpc({"jsonrpc": "2.0", "id": "init", "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "instructions", "version": "1"}}})
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, answer=False)
    rpc({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"})
    for i in range(100):
        rpc(call_of(case, -1 - i))
    control(p.pid, "-z")
    for i in range(calls):
        reply = rpc(call_of(case, i))
        replayed = reply["result"].get("_meta", {}).get("dev.idemgate/replayed") is True
        if replayed != (case in ("replay", "hook")):
            raise SystemExit(f"{binary} {case}: replayed={replayed}: {reply}")
    control(p.pid, "-d")
    p.stdin.close()
    p.wait()
    return dumped_instructions(out_base, p.pid, binary, profile, f"{case}-{index}") / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--cases", default="pass,replay,fresh")
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        measure_all(args.binaries, cases,
                    lambda b, case, index: measure(b, case, args.calls, tmp, args.profile, index),
                    "call", args.calls)


if __name__ == "__main__":
    main()
