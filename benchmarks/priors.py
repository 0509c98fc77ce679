"""The run's prior (``attnbench.priors``): how often each layer's stated 95% interval holds a
re-run when cases are shrunk toward their own layer's spread or toward the whole run's, and what
a sweep's read of its priors costs.

1. Coverage, simulated (seeded): eleven layers, nine at 2% between processes and two at 8%
   (``--noisy``), ``--cases`` cases a layer at three rounds each; each case's interval (the
   moderated t of ``estimators.estimate``) against a re-run of as many rounds. For each group
   size, by layer (``priors.Priors``, the run's under ``LEAST_GROUP``) and over the run alone.
2. Cost: ``priors_of`` over a default sweep's 77 cases in 11 layers, read as the queue reads it,
   after a round: one case changed since the last read.

    python benchmarks/priors.py [--trials 300] [--cases 2,3,4,6] [--noisy 0.08]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from attnbench.estimators import estimate, log_variance
from attnbench.priors import LEAST_GROUP, priors_of


def coverage(
    spreads: list[float], per: int, by_layer: bool, trials: int, seed: int = 5
) -> dict[float, tuple[float, float]]:
    """Each spread's share of intervals holding a re-run, and their median reach."""
    rng = np.random.default_rng(seed)
    held: dict[float, list[bool]] = {s: [] for s in spreads}
    reach: dict[float, list[float]] = {s: [] for s in spreads}
    for _ in range(trials):
        layers = [
            [[[float(math.exp(rng.normal(0, s)))] for _ in range(3)] for _ in range(per)]
            for s in spreads
        ]
        priors = priors_of(
            (str(j) if by_layer else "run", log_variance(case), 2.0)
            for j, cases in enumerate(layers)
            for case in cases
        )
        for j, (s, cases) in enumerate(zip(spreads, layers, strict=True)):
            prior = priors.of(str(j) if by_layer else "run")
            for case in cases:
                found = estimate(case, prior=prior)
                rerun = math.exp(statistics.fmean(rng.normal(0, s, 3)))
                held[s].append(found.low_s <= rerun <= found.high_s)
                reach[s].append(found.rel_ci)
    return {s: (float(np.mean(held[s])), float(np.median(reach[s]))) for s in spreads}


def read_cost(reads: int = 300) -> float:
    """Milliseconds a read of the priors takes, one case changed since the read before."""
    rng = np.random.default_rng(0)
    entries = [(f"layer{i % 11}", float(rng.chisquare(2) / 2 * 1e-3), 2.0) for i in range(77)]
    priors_of(entries)
    start = time.perf_counter()
    for k in range(reads):
        group, _, df = entries[k % 77]
        entries[k % 77] = (group, float(rng.chisquare(2) / 2 * 1e-3), df)
        priors_of(entries)
    return (time.perf_counter() - start) / reads * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--cases", default="2,3,4,6", help="cases a layer, each size in turn")
    parser.add_argument("--noisy", type=float, default=0.08, help="two noisy layers' spread")
    args = parser.parse_args()
    spreads = [0.02] * 9 + [args.noisy] * 2
    print(
        f"coverage of a re-run, nine layers at 2% and two at {args.noisy:.0%}, three rounds a case"
    )
    print(f"(a group under {LEAST_GROUP} cases takes the run's prior)")
    heads = ("cases a layer", "prior", "quiet: held, reach", "noisy: held, reach")
    print(f"{heads[0]:>13} {heads[1]:>8}  {heads[2]:>20}  {heads[3]:>20}")
    for per in (int(c) for c in args.cases.split(",")):
        for by_layer in (True, False):
            found = coverage(spreads, per, by_layer, args.trials)
            quiet, noisy = found[0.02], found[args.noisy]
            print(
                f"{per:>13} {'layer' if by_layer else 'run':>8}  "
                f"{quiet[0]:>10.1%}, ±{quiet[1]:>6.1%}  {noisy[0]:>10.1%}, ±{noisy[1]:>6.1%}"
            )
    print(f"a read of the priors, 77 cases in 11 layers, one changed: {read_cost():.2f} ms")


if __name__ == "__main__":
    main()
