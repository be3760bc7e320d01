"""What bench/mcp/instructions.py and bench/http/instructions.py share: reading callgrind's
counters and printing per-binary ratios."""
import glob
import os
import re
import shutil
import subprocess


def total_instructions(dump):
    with open(dump) as f:
        for line in f:
            m = re.match(r"(?:summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise SystemExit(f"no totals in {dump}")


def control(pid, flag):
    """callgrind_control FLAG PID: -z zeroes the counters, -d dumps them."""
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def dumped_instructions(out_base, pid, binary, profile, name):
    """The instructions of the first dump of process `pid` (written as OUT_BASE.PID.N); with
    `profile`, the dump is kept as PROFILE/NAME.out."""
    dumps = sorted(glob.glob(f"{out_base}.{pid}.*"), key=os.path.getmtime)
    if not dumps:
        raise SystemExit(f"no callgrind dump for {binary}")
    if profile:
        os.makedirs(profile, exist_ok=True)
        shutil.copy(dumps[0], os.path.join(profile, f"{name}.out"))
    return total_instructions(dumps[0])


def print_ratios(results, binaries, cases):
    """For each case, every binary's count over the first's; `results` maps (index, case)."""
    if len(binaries) < 2:
        return
    for case in cases:
        base = results[(0, case)]
        for index in range(1, len(binaries)):
            print(f"{case}: binary {index + 1} / binary 1 = {results[(index, case)] / base:.2f}")
