"""Change points in a history: where a case's time stepped, and between which commits.

A time is a noisy series: one commit's run on a busy machine is an outlier, not a step, and a
step of 10% hides in noise judged point by point. The steps are found in two stages, both
deterministic:

1. ``ruptures``' PELT proposes break points in the log of the times, with the L1 cost (a
   segment's absolute deviations from its median, so one outlying run costs what it deviates,
   not its square) and a penalty of ``BETA`` x sigma x ln(points), sigma the noise's scale read
   robustly from the successive differences (their median absolute value).
2. Each proposed break is confirmed by a Mann-Whitney U test between the up to ``WINDOW``
   points on either side (to the next break); the weakest break whose p-value is not under
   ``CONFIRM_P`` is dropped and its neighbours tested again, merged, until every break stands.

Chosen on seeded synthetic histories (``benchmarks/change_points.py``, docs/history.md): the
rank cost missed a third of the 10% steps, and breaks tested once, not merged, missed more than
the targets allow. Exact metrics (FLOPs, bytes, steps, path) change exactly: any change is a
step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.metrics import EXACT_METRICS

BETA = 1.5
CONFIRM_P = 0.003
WINDOW = 60
MIN_SIZE = 5  # points a segment holds at the least
# A step in any of these is a change of the code: the device-free counts, and peak memory,
# which a series, one machine and device, makes comparable (it was stored and documented, and
# a +89% step went unreported). Not instructions: Callgrind's agree to about 0.2%, and any
# change would read as a step (compare allows them 1%).
EXACT = tuple(m.column for m in EXACT_METRICS if m.column != "instructions")


@dataclass(frozen=True)
class Step:
    """A step in a series: it starts at point ``index`` (the first point after it)."""

    index: int
    ratio: float  # the median after over the median before (counts: the value after / before)
    p_value: float  # the confirming test's (0 for an exact count)


def find_steps(values: Sequence[float]) -> list[Step]:
    """The steps in a series of positive times, in order (none under 2 x ``MIN_SIZE`` points)."""
    y = np.log(np.asarray(values, dtype=float))
    n = len(y)
    if n < 2 * MIN_SIZE or not np.all(np.isfinite(y)):
        return []
    import ruptures  # lazy: a history reads it, a sweep never does
    from scipy import stats

    spread = float(np.median(np.abs(np.diff(y)))) / 0.6745 / math.sqrt(2)
    if spread <= 0:  # a series that never moves between neighbours: exact values
        return exact_steps(values)
    ruptures.base.BaseCost.register(MedianCost)  # PELT takes a cost it recognises
    cost = MedianCost()
    algo = ruptures.Pelt(custom_cost=cost, min_size=MIN_SIZE, jump=1).fit(y)
    assert algo.cost is cost  # not ruptures' L2 default, which an unrecognised cost would get
    breaks = [int(b) for b in algo.predict(pen=BETA * spread * math.log(n))[:-1]]

    def tested(breaks: list[int]) -> list[tuple[int, float, float]]:
        edges = [0, *breaks, n]
        out = []
        for i, b in enumerate(breaks):
            left, right = y[max(edges[i], b - WINDOW) : b], y[b : min(edges[i + 2], b + WINDOW)]
            p = float(stats.mannwhitneyu(left, right).pvalue)
            out.append((b, p, math.exp(float(np.median(right) - np.median(left)))))
        return out

    while True:
        found = tested(breaks)
        weak = [f for f in found if not f[1] < CONFIRM_P]
        if not weak:
            break
        drop = max(weak, key=lambda f: f[1])[0]
        breaks = [b for b in breaks if b != drop]
    return [Step(b, ratio, p) for b, p, ratio in found]


class MedianCost:
    """ruptures' L1 cost ("l1": a segment's absolute deviations from its median) on a list of
    floats, for PELT (registered as a ``ruptures.base.BaseCost``). PELT asks for the cost of
    about n²/2 segments, and ruptures' own computes each through numpy's median (60 µs a call
    for a slice of a few dozen points): the 200 seeded histories took 40 s, a history of many
    cases as long. Sorting a short list costs microseconds, and each deviation is summed exactly
    (``math.fsum``): the same steps as ruptures' own in each of the 200 seeded histories the
    tests check (``benchmarks/change_points.py --histories 200 --against-ruptures``)."""

    model = "l1"
    min_size = 2

    def fit(self, signal: np.ndarray) -> MedianCost:
        self.signal = np.asarray(signal, dtype=float).reshape(-1, 1)  # PELT reads its length
        self.points = [float(v) for v in self.signal[:, 0]]
        return self

    def error(self, start: int, end: int) -> float:
        if end - start < self.min_size:
            from ruptures.costs import NotEnoughPoints

            raise NotEnoughPoints
        part = sorted(self.points[start:end])
        half, odd = divmod(len(part), 2)
        middle = part[half] if odd else (part[half - 1] + part[half]) / 2
        return math.fsum([v - middle for v in part[half:]] + [middle - v for v in part[:half]])


def exact_steps(values: Sequence[float]) -> list[Step]:
    """Every change of an exact count."""
    out = []
    for i in range(1, len(values)):
        before, after = values[i - 1], values[i]
        if before != after:
            ratio = after / before if before else math.inf
            out.append(Step(i, float(ratio), 0.0))
    return out


def confirmable(before: int, after: int) -> bool:
    """Whether a step with ``before`` and ``after`` points either side can pass: PELT keeps
    ``MIN_SIZE`` a side, and the exact two-sided Mann-Whitney's least p-value is
    2 / C(before + after, after), which must be under ``CONFIRM_P`` (5 and 5: 0.0079)."""
    least = min(before, after)
    return least >= MIN_SIZE and 2 / math.comb(before + after, least) < CONFIRM_P


def confirm_note(frame: pd.DataFrame) -> str:
    """What a history's length lets its time steps show (a maintainer's 3.5x step at the 6th
    of 10 commits read "0 change points" and nothing more): none in a series' last
    ``MIN_SIZE`` - 1 commits, one ``MIN_SIZE`` from the end only with enough before it, and
    none in a series too short for any."""
    from attnbench.results.history import SERIES_KEYS

    keys = ["machine", *SERIES_KEYS, "case_id"]
    longest = int(frame.groupby(keys, dropna=False)["commit"].nunique().max()) if len(frame) else 0
    total = next(t for t in range(2 * MIN_SIZE, 200) if confirmable(t - t // 2, t // 2))
    before = next(b for b in range(MIN_SIZE, 200) if confirmable(b, MIN_SIZE))
    note = (
        f"a step in time is confirmed (p < {CONFIRM_P:g}) with at least {MIN_SIZE} commits "
        f"after it and {total} in all: none can show yet in the last {MIN_SIZE - 1} commits of "
        f"a series, and one {MIN_SIZE} from the end only with {before} before it"
    )
    if longest < total:
        note += f"; none in these: the longest series has {longest} commit(s), under {total}"
    return note


def history_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """Every step of every series in a history (``results.history.load_history``'s frame): one
    row per step, with its series, case, metric, the last commit before and the first after it,
    its size and confidence. Commits are taken in the history's ``order`` (the repository's
    ancestry); a commit run more than once counts once, at its runs' median."""
    from attnbench.results.history import SERIES_KEYS

    rows = []
    keys = ["machine", *SERIES_KEYS, "case_id"]
    for group_key, group in frame.groupby(keys, sort=True, dropna=False):
        ordered = (
            group.groupby("commit", sort=False)
            .agg(
                order=("order", "first"),
                subject=("subject", "first"),
                layer=("layer", "first"),
                n=("n", "first"),
                d=("d", "first"),
                **{m: (m, "median") for m in ("time_s", *EXACT)},
            )
            .sort_values("order", kind="stable")
        )
        commits = ordered.index.tolist()
        for metric in ("time_s", *EXACT):
            series = ordered[metric]
            if series.isna().any() or len(series) < 2:
                continue
            values = series.tolist()
            steps = find_steps(values) if metric == "time_s" else exact_steps(values)
            for step in steps:
                rows.append(
                    {
                        **dict(zip(keys, group_key, strict=True)),
                        "layer": ordered["layer"].iloc[0],
                        "n": int(ordered["n"].iloc[0]),
                        "d": int(ordered["d"].iloc[0]),
                        "metric": metric,
                        "before": commits[step.index - 1],
                        "after": commits[step.index],
                        "subject": ordered["subject"].iloc[step.index],
                        "index": step.index,
                        "points": len(values),
                        "ratio": step.ratio,
                        "p_value": step.p_value,
                    }
                )
    columns = [
        *keys,
        "layer",
        "n",
        "d",
        "metric",
        "before",
        "after",
        "subject",
        "index",
        "points",
        "ratio",
        "p_value",
    ]
    return pd.DataFrame(rows, columns=columns)
