"""What leaving out an ``ab`` run's disturbed pairs would cost its gate: the share of runs a
real regression is found in (a ``regression`` verdict: the median pair ratio over the allowed
slowdown and Wilcoxon's one-sided p under alpha), judged on every pair or on the quiet pairs
only (while enough remain for the test to reach alpha), in a simulation: each pair's log ratio
is the regression plus normal noise, and a disturbed pair carries a little more.

    python benchmarks/pair_power.py [--trials 4000] [--pairs 10] [--alpha 0.01]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from attnbench.compare.verdicts import REGRESSION, judge_pairs
from attnbench.estimators import kept_of
from attnbench.thresholds import Thresholds, cases_to_judge


def found(trials: int, pairs: int, slower: float, noise: float, busy: int, extra: float,
          quiet_only: bool, thresholds: Thresholds, rng: np.random.Generator) -> float:  # fmt: skip
    least = cases_to_judge(thresholds.alpha)
    hits = 0
    for _ in range(trials):
        marks = [i < busy for i in range(pairs)]
        logs = math.log(slower) + rng.normal(0.0, noise, pairs)
        logs += np.where(marks, rng.normal(0.0, extra, pairs), 0.0)
        rounds = kept_of(marks, least) if quiet_only else list(range(pairs))
        base = {r: [1.0] for r in rounds}
        new = {r: [math.exp(logs[r])] for r in rounds}
        hits += judge_pairs(base, new, thresholds).verdict == REGRESSION
    return hits / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.01)
    args = parser.parse_args()
    thresholds = Thresholds(alpha=args.alpha)  # the default slowdown allowed: 10%
    rng = np.random.default_rng(0)
    print(f"{args.pairs} pairs, alpha {args.alpha}, a disturbed pair's extra noise 3%; "
          "the share of runs that find the regression:")  # fmt: skip
    print("  regression  noise  disturbed | every pair  quiet pairs only")
    for slower, noise in ((1.15, 0.08), (1.20, 0.10), (1.12, 0.047), (1.25, 0.05)):
        for busy in (0, 3, 4):
            ways = [
                found(args.trials, args.pairs, slower, noise, busy, 0.03, way, thresholds, rng)
                for way in (False, True)
            ]
            every, quiet = ways
            print(f"  {slower:10.2f}  {noise:5.1%}  {busy:9d} | {every:10.2f}  {quiet:16.2f}")


if __name__ == "__main__":
    main()
