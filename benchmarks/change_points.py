"""How well `attnbench history` finds steps: false positives and missed steps on seeded
synthetic histories (tests/histories.py: 200 commits each, noise drawn from a real run's
samples, one run in 20 on a busy machine, steps of 5%, 10% and 30% at known commits).

Mozilla's study of its t-test alerts (Talos) counted 12.5% false-positive alert groups and
6.8% missed regressions; the targets here are 5% and 5% for steps of 10% or more.

    python benchmarks/change_points.py [--histories 500] [--seed 0] [--against-ruptures]

`--against-ruptures` finds the steps again with ruptures' own L1 cost (numpy's median a
segment) and says whether they are the same steps, and each cost's time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from histories import history, score  # the tests' generator, shared

from attnbench.compare import changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--histories", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=changes.BETA, help="PELT's penalty factor")
    parser.add_argument("--confirm-p", type=float, default=changes.CONFIRM_P)
    parser.add_argument("--min-size", type=int, default=changes.MIN_SIZE)
    parser.add_argument("--against-ruptures", action="store_true")
    args = parser.parse_args()
    changes.BETA, changes.CONFIRM_P = args.beta, args.confirm_p
    changes.MIN_SIZE = args.min_size
    print(
        f"PELT penalty {changes.BETA} x sigma x ln n, segments of {changes.MIN_SIZE} or more, "
        f"confirmed at p < {changes.CONFIRM_P}"
    )
    made = [history(args.seed + i) for i in range(args.histories)]
    start = time.perf_counter()
    found = [[s.index for s in changes.find_steps(h.times)] for h in made]
    took = time.perf_counter() - start
    for margin in (10, 5):
        result = score(found, made, margin)
        print(
            f"within {margin} commits: {result['found']} steps found, "
            f"{result['steps_10pct']} steps of 10% or more put; false positives "
            f"{result['false_positive']:.1%} of those found (Mozilla's t-test alerts: "
            f"12.5%), missed {result['missed']:.1%} of those of 10% or more (Mozilla: 6.8%)"
        )
    print(f"{took:.1f} s, {took / args.histories * 1e3:.0f} ms a history of 200 commits")
    if args.against_ruptures:
        import ruptures

        ours = [[(s.index, s.ratio, s.p_value) for s in changes.find_steps(h.times)] for h in made]
        changes.MedianCost = ruptures.costs.CostL1  # type: ignore[misc]
        start = time.perf_counter()
        theirs = [
            [(s.index, s.ratio, s.p_value) for s in changes.find_steps(h.times)] for h in made
        ]
        slow = time.perf_counter() - start
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        print(
            f"ruptures' own L1 cost: {slow:.1f} s ({slow / took:.1f}x this one's); the same "
            f"steps in {same} of {len(made)} histories"
        )


if __name__ == "__main__":
    main()
