"""Synthetic histories for the change-point tests and benchmark: 200 commits of one case, its
noise drawn from a real run's samples, steps injected at known commits.

Each commit's point is the median of 30 samples drawn with replacement from one case of
results/cpu-machine (its samples divided by their median), as a run's time is the median of
its samples; one run in 20 lands on a busy machine and is slowed 1.2-1.8x whole (what a
neighbour does to this shared machine for tens of seconds). Up to three steps of 5%, 10% or
30%, slower or faster, at least 20 commits apart and 10 from either end.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SIZES = (0.05, 0.10, 0.30)
COMMITS = 200
BUSY = 0.05  # the share of runs on a busy machine
# A step found this many commits or fewer from where it was put is found: ruptures' own
# precision_recall margin (10); the benchmark quotes 5 too.
TOLERANCE = 10


@dataclass(frozen=True)
class History:
    times: np.ndarray  # seconds, one point a commit
    steps: tuple[tuple[int, float], ...]  # (first commit after the step, its size)


@cache
def real_samples() -> tuple[np.ndarray, ...]:
    """Each case's samples in the committed run, as logs of their ratio to its median."""
    samples = pd.read_csv(ROOT / "results" / "cpu-machine" / "samples.csv")
    return tuple(
        np.log(group.to_numpy() / np.median(group.to_numpy()))
        for _, group in samples.groupby("case_id")["time_s"]
        if len(group) >= 20
    )


def history(seed: int) -> History:
    rng = np.random.default_rng(seed)
    wanted = int(rng.integers(0, 4))
    steps: list[tuple[int, float]] = []
    while len(steps) < wanted:
        at = int(rng.integers(10, COMMITS - 10))
        if all(abs(at - other) >= 20 for other, _ in steps):
            steps.append((at, float(rng.choice(SIZES)) * float(rng.choice([-1.0, 1.0]))))
    level = np.zeros(COMMITS)
    for at, size in steps:
        level[at:] += np.log1p(size)
    pool = real_samples()[int(rng.integers(len(real_samples())))]
    noise = np.array([np.median(rng.choice(pool, 30)) for _ in range(COMMITS)])
    busy = rng.random(COMMITS) < BUSY
    noise[busy] += np.log(rng.uniform(1.2, 1.8, int(busy.sum())))
    return History(1e-3 * np.exp(level + noise), tuple(sorted(steps)))


def score(
    found: list[list[int]], histories: list[History], tolerance: int = TOLERANCE
) -> dict[str, float]:
    """False positives (steps found where none was put, over all found) and missed steps
    of 10% or more (over all such steps put), as Mozilla counts its alerts; a step found
    within ``tolerance`` commits of one put is that one."""
    hits = false = missed = big = 0
    for where, made in zip(found, histories, strict=True):
        matched = set()
        for index in where:
            near = [i for i, (at, _) in enumerate(made.steps) if abs(at - index) <= tolerance]
            if near:
                matched.add(near[0])
                hits += 1
            else:
                false += 1
        for i, (_, size) in enumerate(made.steps):
            if abs(size) >= 0.10 - 1e-9:
                big += 1
                missed += i not in matched
    return {
        "found": hits + false,
        "false_positive": false / max(1, hits + false),
        "steps_10pct": big,
        "missed": missed / max(1, big),
    }
