"""Verdicts on one case's times and exact metrics, and on a run overall (scipy's tests).

A shared CI runner swings timings by 2x between jobs, so one ratio is no verdict. A time
regression needs both a median ratio above the allowed slowdown and a one-sided test below
``alpha``: Welch's t-test on the logs of the rounds' medians of two runs (each round a process:
what a re-run varies by), Mann-Whitney U on the raw samples where a run has one round, or
Wilcoxon's signed-rank test on the paired per-round ratios of an interleaved run
(``attnbench ab``). The
overall row is the geometric mean of the ratios, tested across cases with Wilcoxon's test.
Exact metrics (FLOPs, steps, path length, memory and instructions on the same device) fail on
any increase beyond their tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from math import comb
from typing import Any

import numpy as np
import pandas as pd

from attnbench.estimators import Between, estimate, group_medians
from attnbench.thresholds import DEFAULT_THRESHOLDS, Thresholds, cases_to_judge

# Verdicts, worst first: what a case, a metric or the overall row can be judged.
REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
# past the threshold but the samples could be noise, or its interval reaching over it (a move
# the test found, under the threshold, may still be one past it)
NOT_SIGNIFICANT = "not significant"
TOO_FEW = "too few samples"  # no test at this alpha can be significant with so few
NOT_COMPARED = "not compared"  # missing on a side, not measured, or another device
THROTTLED = "throttled"  # moved, but the GPU's clock moved too: the card's state, not the code
VERDICTS = (
    REGRESSION, NOT_SIGNIFICANT, THROTTLED, TOO_FEW, UNCHANGED, IMPROVEMENT, NOT_COMPARED
)  # fmt: skip  # worst first, on one line
# A GPU's SM clock that differs between two sides by more than this share, or a side with at
# least ``THROTTLED_MOST`` of its samples taken throttled, makes a time's move "throttled".
CLOCK_TOLERANCE = 0.05
THROTTLED_MOST = 0.5

# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class TimeVerdict:
    """One case's time: median ratio current / baseline, the one-sided p-value in the
    direction the median moved (NaN when untested), and the verdict."""

    ratio: float
    p_value: float
    verdict: str
    # the ratio's interval (nan: none), the one its test is dual to: two-sided at 1 - 2 alpha
    # (98% at alpha 0.01), so a slowdown is significant exactly where ``low`` is above 1 (and a
    # speed-up where ``high`` is below it): Welch's t on the rounds' logs (compare), the
    # Wilcoxon signed-rank's Walsh averages on the pairs' logs (ab). A ratio read alone said
    # nothing of its noise; a 95% interval beside a test at 0.01 contradicted it.
    low: float = math.nan
    high: float = math.nan


def interval_level(alpha: float) -> str:
    """The level of the interval a one-sided test at ``alpha`` is dual to: "98%" at 0.01."""
    return f"{1 - 2 * alpha:.0%}"


def fmt_interval(low: Any, high: Any) -> str:
    """A ratio's interval as text ("1.21..1.52"), "" where it has none. An end past 100x either
    way reads "<0.01" or ">100": two kept rounds a side gave 2e-06..194200, which printed
    "0.00..194200.00" and was cut at the column's edge."""
    known = all(isinstance(x, float | int) and math.isfinite(x) for x in (low, high))
    return f"{_end(low)}..{_end(high)}" if known else ""


def _end(x: float) -> str:
    return "<0.01" if x < 0.01 else ">100" if x > 100 else f"{x:.2f}"


def smallest_p(n_base: int, n_new: int) -> float:
    """The smallest one-sided p-value a Mann-Whitney U test can give with these sample sizes."""
    return 1 / comb(n_base + n_new, n_base)


def judge_time(
    base: Sequence[float], new: Sequence[float], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> TimeVerdict:
    """Regression when the median is more than ``max_slowdown`` slower *and* the samples are
    slower with p < alpha; improvement symmetrically; "too few samples" when no outcome of the
    test could reach alpha."""
    base_a = np.asarray(base, dtype=float)
    new_a = np.asarray(new, dtype=float)
    if base_a.size == 0 or new_a.size == 0:
        return TimeVerdict(math.nan, math.nan, NOT_COMPARED)
    if min(base_a.size, new_a.size) < thresholds.min_samples:
        return TimeVerdict(_median_ratio(base_a, new_a), math.nan, TOO_FEW)
    return _judge(_median_ratio(base_a, new_a), base_a, new_a, thresholds)


def judge_rounds(
    base: Sequence[Sequence[float]],
    new: Sequence[Sequence[float]],
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    between: Between | None = None,
) -> tuple[TimeVerdict, str]:
    """A case timed in rounds (each, by default, a process of its own): with two or more on
    each side, the ratio of the two times over their rounds (``estimators.estimate``) and a
    one-sided Welch t-test on the logs of the rounds' medians (``"rounds"``), the statistics
    the interval is made of; with one round a side, all samples (``"samples"``). ``between``,
    the case's spread between sweeps on this machine (``results.reruns``): two runs are two
    sweeps, each with a moment of its own, so the test's variance holds twice it as well, its
    degrees of freedom by Satterthwaite's rule (as the interval's)."""
    base_kept = [list(r) for r in base if len(r)]
    new_kept = [list(r) for r in new if len(r)]
    if min(len(base_kept), len(new_kept)) < 2:
        flat = [[s for r in side for s in r] for side in (base_kept, new_kept)]
        return judge_time(flat[0], flat[1], thresholds), "samples"
    before, after = estimate(base_kept).center_s, estimate(new_kept).center_s
    ratio = after / before if before > 0 else math.inf
    base_logs = np.log([m for m in group_medians(base_kept) if m > 0])
    new_logs = np.log([m for m in group_medians(new_kept) if m > 0])
    if min(base_logs.size, new_logs.size) < 2:
        return TimeVerdict(ratio, math.nan, TOO_FEW), "rounds"
    sweeps = 2 * between.variance if between is not None and between.df > 0 else 0.0
    if not (np.ptp(base_logs) or np.ptp(new_logs) or sweeps):  # the medians say it all
        p, low, high = (0.0 if ratio != 1 else 1.0), ratio, ratio
    else:
        p, low, high = _welch(new_logs, base_logs, ratio >= 1, sweeps, between, thresholds.alpha)
    return _bounded(_verdict(ratio, p, thresholds), low, high, thresholds), "rounds"


def _welch(
    new_logs: np.ndarray,
    base_logs: np.ndarray,
    slower: bool,
    sweeps: float,
    between: Between | None,
    alpha: float,
) -> tuple[float, float, float]:
    """Welch's t-test, one-sided in the direction the median moved, with ``sweeps`` added to
    the variance of the difference (Welch's own where it is 0: scipy's ``ttest_ind`` with
    ``equal_var=False``, to the bit's rounding); its p, and the ratio's interval from the same
    t, two-sided at 1 - 2 ``alpha`` (of the geometric means: the logs' means)."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    parts = [(float(np.var(x, ddof=1)) / x.size, x.size - 1.0) for x in (new_logs, base_logs)]
    if sweeps > 0 and between is not None:
        parts.append((sweeps, between.df))
    variance = sum(v for v, _ in parts)
    df = variance**2 / sum(v**2 / d for v, d in parts)
    shift = float(new_logs.mean()) - float(base_logs.mean())
    t = shift / math.sqrt(variance)
    reach = float(stats.t.ppf(1 - alpha, df)) * math.sqrt(variance)
    p = float(stats.t.sf(t, df) if slower else stats.t.cdf(t, df))
    return p, math.exp(shift - reach), math.exp(shift + reach)


def _median_ratio(base: np.ndarray, new: np.ndarray) -> float:
    base_median = float(np.median(base))
    return float(np.median(new)) / base_median if base_median > 0 else math.inf


def _judge(
    ratio: float, base_a: np.ndarray, new_a: np.ndarray, thresholds: Thresholds
) -> TimeVerdict:
    """The verdict from a ratio and the units the one-sided test compares."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    if smallest_p(base_a.size, new_a.size) >= thresholds.alpha:
        return TimeVerdict(ratio, math.nan, TOO_FEW)
    slower = ratio >= 1
    p = float(stats.mannwhitneyu(new_a, base_a, alternative="greater" if slower else "less").pvalue)
    return _verdict(ratio, p, thresholds)


def _bounded(verdict: TimeVerdict, low: float, high: float, thresholds: Thresholds) -> TimeVerdict:
    """``verdict`` with its interval; an "unchanged" whose interval reaches past the threshold
    is "not significant": the test cannot tell it from a slowdown past the threshold, whether
    or not it found a move (a new user's ab read "unchanged" at a ratio of 1.039 whose 98%
    interval ran to 1.76; a significant +4.5% whose interval ran to +30% read "unchanged
    (+4.5%, significant; under the +10% threshold)", which only its estimate was)."""
    reaches = math.isfinite(high) and high > 1 + thresholds.max_slowdown
    # (a significant speed-up's interval ends under 1, the test's dual, so never reaches it)
    kind = NOT_SIGNIFICANT if verdict.verdict == UNCHANGED and reaches else verdict.verdict
    return replace(verdict, verdict=kind, low=low, high=high)


def _verdict(ratio: float, p: float, thresholds: Thresholds) -> TimeVerdict:
    """Past the threshold in the direction the one-sided p-value tested, and significant."""
    slower = ratio >= 1
    limit = 1 + thresholds.max_slowdown
    significant = p < thresholds.alpha
    if slower and ratio > limit:
        return TimeVerdict(ratio, p, REGRESSION if significant else NOT_SIGNIFICANT)
    if not slower and ratio < 1 / limit and significant:
        return TimeVerdict(ratio, p, IMPROVEMENT)
    return TimeVerdict(ratio, p, UNCHANGED)


def pair_ratios(
    base: Mapping[int, Sequence[float]], new: Mapping[int, Sequence[float]]
) -> list[float]:
    """Current over base, per round both sides measured: each pair was measured back to back,
    in ABBA order, so a slow moment of the machine slows both of its halves alike."""
    out = []
    for round_ in sorted(set(base) & set(new)):
        below = float(np.median(base[round_]))
        if below > 0:
            out.append(float(np.median(new[round_])) / below)
    return out


def pair_rounds(
    base: Mapping[int, Sequence[float]],
    new: Mapping[int, Sequence[float]],
    disturbed: tuple[Mapping[int, bool], Mapping[int, bool]],
) -> tuple[list[int], list[int]]:
    """The rounds both sides measured (the pairs), and those of them neither half of which
    read disturbed (``disturbed``: each side's marks by round, ``RunResults.disturbed_of``).
    Every pair is judged; the disturbed ones are counted, not left out: a pair's halves run a
    tenth of a second apart and mostly share a neighbour's burst (an A/A race beside one read
    its ratios 1.0% from 1 at the median with every pair, ``benchmarks/neighbour.py --ab``),
    while judging only the quiet pairs cuts the test to the fewest that can reach alpha (a 15%
    regression found in 0.70 of runs with 3 of 10 pairs left out, 0.91 judged on all,
    ``benchmarks/pair_power.py``) and could drop the very rounds a change that makes the
    layer's own threads wait slows. The quiet pairs check a move instead (``compare_runs``)."""
    pairs = sorted(set(base) & set(new))
    quiet = [r for r in pairs if not (disturbed[0].get(r, False) or disturbed[1].get(r, False))]
    return pairs, quiet


def pairs_note(times: pd.DataFrame) -> str | None:
    """How many of the judged pairs had a half read disturbed (``pair_rounds``)."""
    if "pairs_disturbed" not in times or not times["pairs_disturbed"].any():
        return None
    counts = times["pairs_disturbed"]
    disturbed, cases = int(counts.sum()), int(counts.gt(0).sum())
    return (
        f"{disturbed} pair(s) of {cases} case(s) had a half read disturbed (its machine "
        "reference slow, or its threads kept waiting for a CPU: a neighbour's, or the layer's "
        "own threads); they are judged with the rest, as a pair's halves mostly share a "
        "neighbour's burst (pairs_disturbed in the JSON)"
    )


def quiet_pairs_note(times: pd.DataFrame) -> str | None:
    """The cases whose move, judged on every pair, their quiet pairs alone do not show."""
    if "verdict_quiet_pairs" not in times:
        return None
    moved = times["verdict"].isin((REGRESSION, IMPROVEMENT))  # a throttled move is no move
    checked = times[moved & (times["verdict_quiet_pairs"].fillna("").astype(str) != "")]
    apart = checked[checked["verdict_quiet_pairs"] != checked["verdict"]]
    if apart.empty:
        return None
    # too few quiet pairs for the test is no check made, not a move unseen: a new user's
    # 1.92x slowdown read "not on their quiet pairs alone (too few samples)"
    few = apart[apart["verdict_quiet_pairs"] == TOO_FEW]
    seen = apart[apart["verdict_quiet_pairs"] != TOO_FEW]
    notes = []
    if not seen.empty:
        names = ", ".join(f"{r.case_id} ({r.verdict_quiet_pairs})" for r in seen.itertuples())
        notes.append(
            f"{len(seen)} case(s) moved, judged on all their pairs, but not on their quiet pairs "
            f"alone: {names}; their pairs with a disturbed half may carry the move (a neighbour "
            "that slowed one side's halves, or that side's own threads waiting for each other)"
        )
    if not few.empty:
        notes.append(
            f"{len(few)} case(s) moved, judged on all their pairs, had too few quiet pairs for "
            f"the test to check the move on them alone: {', '.join(few['case_id'])}"
        )
    return "; ".join(notes)


def judge_pairs(
    base: Mapping[int, Sequence[float]],
    new: Mapping[int, Sequence[float]],
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> TimeVerdict:
    """An interleaved case (``attnbench ab``): the median of its paired per-round ratios against
    the allowed slowdown, and a one-sided Wilcoxon signed-rank test on their logs below alpha.
    "too few samples" while no outcome of the test could reach alpha (0.5^pairs >= alpha)."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    ratios = pair_ratios(base, new)
    if not ratios:
        return TimeVerdict(math.nan, math.nan, NOT_COMPARED)
    ratio = float(np.median(ratios))
    if len(ratios) < cases_to_judge(thresholds.alpha):  # its smallest p reaches no alpha
        return TimeVerdict(ratio, math.nan, TOO_FEW)
    logs = np.log(ratios)
    low, high = walsh_interval(logs, thresholds.alpha)
    if not np.any(logs):
        return TimeVerdict(ratio, 1.0, UNCHANGED, low, high)
    alternative = "greater" if ratio >= 1 else "less"
    p = float(stats.wilcoxon(logs, alternative=alternative).pvalue)
    return _bounded(_verdict(ratio, p, thresholds), low, high, thresholds)


def walsh_interval(logs: np.ndarray, alpha: float) -> tuple[float, float]:
    """The ratio's interval the one-sided Wilcoxon signed-rank tests at ``alpha`` are dual to
    (two-sided at 1 - 2 alpha): the Walsh averages of the logs, (x_i + x_j) / 2 for i <= j,
    between the ranks their exact null distribution gives (Hollander, Wolfe & Chicken,
    *Nonparametric Statistical Methods*, 2014, §3.3); (nan, nan) where no outcome reaches
    alpha. T+, the signed-rank statistic, is the count of positive Walsh averages."""
    count = int(logs.size)
    # the null distribution of T+: ways of summing distinct ranks 1..count to each total
    ways = np.zeros(count * (count + 1) // 2 + 1)
    ways[0] = 1.0
    for rank in range(1, count + 1):
        ways[rank:] = ways[rank:] + ways[:-rank]  # the right side is read whole first
    upper = np.cumsum(ways[::-1])[::-1] / ways.sum()  # P(T+ >= t)
    critical = np.flatnonzero(upper <= alpha)
    if critical.size == 0:
        return math.nan, math.nan
    c = int(critical[0])  # the least T+ the test rejects at
    i, j = np.triu_indices(count)
    walsh = np.sort((logs[i] + logs[j]) / 2)
    total = walsh.size
    return math.exp(float(walsh[total - c])), math.exp(float(walsh[c - 1]))


def judge_overall(
    ratios: Sequence[float], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> TimeVerdict:
    """The geometric mean of the cases' ratios, tested across cases: a one-sided Wilcoxon
    signed-rank test on the log ratios says whether the cases moved together."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    logs = np.log(np.asarray([r for r in ratios if r > 0 and math.isfinite(r)], dtype=float))
    if logs.size == 0:
        return TimeVerdict(math.nan, math.nan, NOT_COMPARED)
    geomean = float(np.exp(logs.mean()))
    if logs.size < cases_to_judge(thresholds.alpha):  # its smallest p reaches no alpha
        return TimeVerdict(geomean, math.nan, TOO_FEW)
    slower = geomean >= 1
    if not np.any(logs):
        return TimeVerdict(geomean, 1.0, UNCHANGED)
    p = float(stats.wilcoxon(logs, alternative="greater" if slower else "less").pvalue)
    return _verdict(geomean, p, thresholds)


def throttle(
    verdict: TimeVerdict,
    clock_ratio: float,
    throttled: tuple[float | None, float | None] = (None, None),
    max_slowdown: float = DEFAULT_THRESHOLDS.max_slowdown,
) -> TimeVerdict:
    """A time that moved (a regression, an improvement, or past the threshold without
    significance) while the GPU's SM clock moved more than ``CLOCK_TOLERANCE`` between the
    sides (``clock_ratio``, current over base; NaN where not read), or while most of a side's
    samples were throttled (``throttled``: each side's share), is "throttled": the card's state
    changed, so the move says nothing of the code."""
    if verdict.verdict not in (REGRESSION, IMPROVEMENT, NOT_SIGNIFICANT):
        return verdict
    if verdict.verdict == NOT_SIGNIFICANT and not verdict.ratio > 1 + max_slowdown:
        return verdict  # undecided for its wide interval, not for a move the clock explains
    moved = math.isfinite(clock_ratio) and clock_ratio > 0
    moved = moved and abs(math.log(clock_ratio)) > math.log1p(CLOCK_TOLERANCE)
    held = any(share is not None and share >= THROTTLED_MOST for share in throttled)
    if moved or held:
        return replace(verdict, verdict=THROTTLED)
    return verdict


def judge_count(base: Any, new: Any, tolerance: float = 0.0) -> str:
    """An exact metric: any increase beyond ``tolerance`` (a fraction) is a regression."""
    if base is None or new is None or pd.isna(base) or pd.isna(new):
        return NOT_COMPARED
    if new > base * (1 + tolerance):
        return REGRESSION
    if new < base * (1 - tolerance):
        return IMPROVEMENT
    return UNCHANGED
