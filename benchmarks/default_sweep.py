"""Wall time of the default `attnbench sweep`, and how much of it is spent inside measured calls.

Runs the real command (process start and torch import included), then reads the per-case
columns it wrote: `wall_s` (the whole case: build, FLOP count, memory profile, warm-up, timing)
and `time_total_s` (seconds inside timed calls).

    python benchmarks/default_sweep.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnbench.results.loader import load_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'run':>3} {'wall s':>8} {'cases':>5} {'in-call share (>=1 ms)':>24} {'min':>6}")
    walls = []
    for rep in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "attnbench", "sweep", "--quiet", "--out", str(out)],
                check=True,
            )
            wall = time.perf_counter() - start
            frame = load_results(out).frame
        walls.append(wall)
        long = frame[frame["time_s"] >= 1e-3]
        share = long["time_total_s"].sum() / long["wall_s"].sum()
        per_case_min = (long["time_total_s"] / long["wall_s"]).min()
        print(f"{rep:>3} {wall:>8.1f} {len(frame):>5} {share:>24.2f} {per_case_min:>6.2f}")
    print(
        f"default sweep wall time: median {sorted(walls)[len(walls) // 2]:.1f} s "
        f"(max {max(walls):.1f} s; target <= 60 s)"
    )


if __name__ == "__main__":
    main()
