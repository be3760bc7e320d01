"""What bench/mcp/instructions.py and bench/http/instructions.py share: reading callgrind's
counters, and measuring every case of every binary with the ratios between binaries."""
import glob
import os
import re
import shutil
import subprocess
import time


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


def measure_all(binaries, cases, measure, unit, count):
    """Runs measure(binary, case, index), which returns instructions per `unit`, for every case
    of every binary, printing each as it comes; then, for each case, every binary's count over
    the first's."""
    results = {}
    for index, binary in enumerate(binaries):
        for case in cases:
            start = time.time()
            results[(index, case)] = measure(binary, case, index)
            print(f"{binary} {case}: {results[(index, case)]:,.0f} instructions per {unit} "
                  f"({count} {unit}s, {time.time() - start:.0f} s)", flush=True)
    for case in cases:
        base = results[(0, case)]
        for index in range(1, len(binaries)):
            print(f"{case}: binary {index + 1} / binary 1 = {results[(index, case)] / base:.2f}")
