"""How much a time depends on the process that took it: the same cases timed in several fresh
processes, one after another, each printing its medians; then, per case, the slowest process
over the fastest, and each process's geometric mean over all processes'.

An A/B run times each side in one long-lived process. If two processes of the same code read
times that differ by more than the gate's threshold, an A/A run can read a change: this prints
how large that difference is here.

    python benchmarks/process_spread.py [--device cuda] [--processes 4] [--cases conv@256,...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys

CHILD = """
import json, sys
from attnbench.devices import device_sync
from attnbench.measure.step import make_step
from attnbench.measure.timing.gputimers import time_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import build_grid

device, d, budget, cases = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].split(",")
out = {}
for _ in range(2):  # the second pass is the one printed: the first warms the process up
    for spec in cases:
        layer, n = spec.split("@")
        (case,) = build_grid({"layers": layer, "n": n, "d": d, "device": device}).cases()
        step = make_step(case, seed=0)
        step()
        policy = TimingPolicy(budget_s=budget, warmup_calls=1)
        timed = time_step(step.call, policy, case.device, sync=device_sync(case.device))
        out[spec] = timed.stats.median_s
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--cases", default="conv@256,rnn@256,attention@256,attention-sdpa@2048")
    parser.add_argument("--d", default="64")
    parser.add_argument("--budget", type=float, default=0.2)
    args = parser.parse_args()
    runs = []
    for i in range(args.processes):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, args.device, args.d, str(args.budget), args.cases],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode:
            print(f"process {i}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"process {i}: " + ", ".join(f"{k} {v * 1e6:.1f}us" for k, v in runs[-1].items()))
    if len(runs) < 2:
        return
    for spec in runs[0]:
        values = [r[spec] for r in runs]
        print(f"{spec:24} slowest / fastest process: {max(values) / min(values):.3f}")
    logs = [[math.log(r[spec]) for spec in runs[0]] for r in runs]
    middle = [statistics.mean(col) for col in zip(*logs, strict=True)]
    for i, row in enumerate(logs):
        gm = math.exp(statistics.mean(a - b for a, b in zip(row, middle, strict=True)))
        print(f"process {i}: geometric mean over all processes' {gm:.3f}")


if __name__ == "__main__":
    main()
