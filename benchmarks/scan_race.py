"""The state-space scan against the step-by-step recurrence and attention, on this CPU.

Runs ``attnbench sweep`` on ssm, ssm-scan, attention-sdpa and attention at n = 64..8192 and
d = 64 (the rounds interleave the layers, so a busy moment slows them all alike), then prints
each layer's median time, the time ratios, the crossovers (interpolated in log-log between the
sizes), the counted sequential steps and elementwise work that explain them, and the fitted
exponent of the traced steps in n over n = 64..4096.

    python benchmarks/scan_race.py [--n 64..8192] [--d 64] [--rounds 3] [--out DIR]
    python benchmarks/scan_race.py --analyse DIR   # read a kept run again
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from attnbench.fits import describe_crossover, loglog_exponent, measured_crossover
from attnbench.results.loader import load_results

LAYERS = ("ssm", "ssm-scan", "attention-sdpa", "attention")
PAIRS = (
    ("ssm-scan", "ssm"),
    ("attention-sdpa", "ssm"),
    ("attention-sdpa", "ssm-scan"),
    ("attention", "ssm"),
    ("attention", "ssm-scan"),
)


def sweep(args: argparse.Namespace, out: Path) -> None:
    """The race itself: one real sweep, its rounds interleaving the layers."""
    subprocess.run(
        [sys.executable, "-m", "attnbench", "sweep", "--layers", ",".join(LAYERS),
         "--n", args.n, "--d", args.d, "--processes", str(args.rounds), "--time-budget",
         args.time_budget, "--no-charts", "--quiet", "--yes", "--out", str(out)],
        check=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="64..8192")
    parser.add_argument("--d", default="64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-budget", default="0.5")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here")
    parser.add_argument("--analyse", type=Path, default=None, help="only read this kept run")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    out = args.analyse or args.out or Path(tmp.name) / "run"
    start = time.perf_counter()
    if args.analyse is None:
        sweep(args, out)
    wall = time.perf_counter() - start
    run = load_results(out)
    frame, rounds = run.measured, run.rounds
    for d, at_d in frame.groupby("d"):
        times = at_d.pivot_table(index="n", columns="layer", values="time_s")[list(LAYERS)]
        print(f"\nd = {d}: median time per call (ms), {rounds} interleaved rounds")
        print((times * 1e3).round(3).to_string())
        ratios = pd.DataFrame({f"{a} / {b}": times[a] / times[b] for a, b in PAIRS})
        print("\ntime ratios")
        print(ratios.round(3).to_string())
        print("\ncrossovers: the n above which the first layer is the slower")
        ns = times.index.tolist()
        for a, b in PAIRS:
            found = measured_crossover(ns, (times[a] / times[b]).tolist())
            print(f"  {a} against {b}: {describe_crossover(found, ns)}")
        counts = at_d.pivot_table(index="n", columns="layer", values=["seq_steps", "elementwise"])
        print("\nsequential steps (traced) and elementwise work (counted) per call")
        print(counts.astype("int64").to_string())
        steps = at_d[at_d["n"].between(64, 4096)]
        for layer in ("ssm", "ssm-scan"):
            line = steps[steps["layer"] == layer]
            fit = loglog_exponent(line["n"].tolist(), line["seq_steps"].astype(float).tolist())
            if fit is not None:
                print(f"  {layer}: seq_steps ~ n^{fit.slope:.3f} over n = 64..4096")
    if args.analyse is None:
        print(f"\nthe sweep took {wall:.0f} s; results in {out}")


if __name__ == "__main__":
    main()
