"""Whether a fork server's next process, set up while another server's job times, slows it.

Sweeps the same small grid with two attnbench checkouts in turn (ABBA order, so neither always
runs first while a neighbour's load moves), each in fresh sweeps, and prints each case's
geometric mean time per checkout, their ratio and each sweep's duration:

    git worktree add /tmp/base <commit>
    python benchmarks/spare_overlap.py --base /tmp/base --pairs 5

2026-12-03, this project's 2-core VM (a neighbour at load 1.8-2.6), base = the commit before
the spares settled (its next process forked and set up while the other server's job timed),
current = spares settled before the server answers; ten sweeps of conv, attention, lstm at
n = 32, 64, d = 16:

    head   attention n=32: 213-330 us   settled 171-178 us
    head   lstm n=32:      180-263 us   settled 172-181 us
    head   conv n=32:       43-71 us    settled  43-47 us
    sweep: 2.32-2.46 s head, 2.79-2.86 s settled (18 rounds: about 25 ms a round)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parents[1]
GRID = ["--layers", "conv,attention,lstm", "--n", "32,64", "--d", "16", "--time-budget", "0.1"]
GRID += ["--processes", "3", "--max-processes", "3", "--no-charts", "--no-cache"]


def sweep(checkout: Path, out: Path) -> tuple[pd.DataFrame, float]:
    """One sweep with ``checkout``'s attnbench: its results and its duration."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "ATTNBENCH_WAIT_QUIET": "0"}
    command = [sys.executable, "-m", "attnbench", "sweep", *GRID, "--out", str(out)]
    subprocess.run(command, env=env, cwd=out.parent, check=True, capture_output=True)
    duration = json.loads((out / "run.json").read_text())["duration_s"]
    return pd.read_csv(out / "results.csv"), float(duration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a worktree of the base commit")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    sides = {"base": args.base.resolve(), "current": HERE}
    order = [("base", "current")[(i + i // 2) % 2] for i in range(2 * args.pairs)]  # ABBA...
    rows, durations = [], {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder:
        for i, side in enumerate(order):
            found, took = sweep(sides[side], Path(folder) / f"{side}-{i}")
            durations[side].append(took)
            rows += [(side, r.layer, r.n, r.time_s) for r in found.itertuples()]
            print(f"sweep {i + 1}/{len(order)} ({side}): {took:.2f} s", file=sys.stderr)
    frame = pd.DataFrame(rows, columns=["side", "layer", "n", "time_s"])
    for (layer, n), group in frame.groupby(["layer", "n"]):
        means = {
            side: math.exp(group.loc[group.side == side, "time_s"].map(math.log).mean())
            for side in sides
        }
        spread = {
            side: f"{group.loc[group.side == side, 'time_s'].min() * 1e6:.0f}-"
            f"{group.loc[group.side == side, 'time_s'].max() * 1e6:.0f} us"
            for side in sides
        }
        print(
            f"{layer:>10} n={n:<4} base {spread['base']:>12}  current {spread['current']:>12}  "
            f"current/base {means['current'] / means['base']:.2f}"
        )
    for side, took in durations.items():
        print(f"{side}: sweeps of {min(took):.2f}-{max(took):.2f} s")


if __name__ == "__main__":
    main()
