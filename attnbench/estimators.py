"""The estimators every figure of a time is derived from: pure functions of raw samples.

One module, as asv keeps its ``statistics.py``: each function names its source. A case's
samples come in groups, one per timing round; under the default executor each round is a
fresh process, and the between-process spread (a process has a speed of its own, and the
machine's moment changes with it) is the larger part of what a re-run finds. So a case's time
and its interval are taken over the rounds' medians, never over the samples pooled.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnbench.priors import Prior, moderated

CONFIDENCE = 0.95  # of every interval here
# A time whose 95% interval (a re-run's, over rounds) reaches further than this from it is
# marked imprecise (`!`).
IMPRECISE_REL_CI = 0.05
# A round whose machine reference (``measure.timing.reference``) read more than this factor over the
# run's quiet level ran on a disturbed machine; the quiet level is this quantile of the run's
# rounds' references (the fast end: a run may spend half its time disturbed).
QUIET_FACTOR = 1.25
QUIET_QUANTILE = 0.1


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """Student's t distribution's ``q`` quantile with ``df`` degrees of freedom, kept: an
    exponent table asks for the same few hundreds of times. ``scipy.special.stdtrit``, which
    ``scipy.stats.t.ppf`` calls (identical to the bit): the special functions import in 0.2 s
    where ``scipy.stats`` takes 0.8, and every fork server of a sweep imports them."""
    from scipy import special  # lazy: see above

    return float(special.stdtrit(df, q))


@functools.lru_cache(maxsize=16)
def normal_quantile(q: float) -> float:
    """The standard normal distribution's ``q`` quantile, kept as ``t_quantile``:
    ``scipy.special.ndtri``, which ``scipy.stats.norm.ppf`` calls."""
    from scipy import special  # lazy: see t_quantile

    return float(special.ndtri(q))


def binomial_half_ppf(q: float, count: int) -> int:
    """The ``q`` quantile of the binomial of ``count`` trials with p = 1/2: the least k with
    P(B <= k) >= q, found by bisection on ``scipy.special.bdtr`` (the CDF). It equals
    ``scipy.stats.binom.ppf`` (for every count to 60,000 when it was written; a test holds it
    there to 3,000 and at four counts to 12 million) without importing ``scipy.stats`` (see
    ``t_quantile``)."""
    from scipy import special  # lazy: see t_quantile

    low, high = 0, count  # P(B <= count) = 1 >= q
    while low < high:
        middle = (low + high) // 2
        if special.bdtr(middle, count, 0.5) >= q:
            high = middle
        else:
            low = middle + 1
    return low


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(count: int) -> tuple[int, int] | None:
    """0-based ranks of the sorted samples that bound a distribution-free ``CONFIDENCE``
    interval of the median: order statistics, the binomial with p = 1/2 (Hahn & Meeker,
    *Statistical Intervals*, 1991, §5.2; scipy's ``quantile_test`` gives the same). None with
    too few samples for one (under 6 at 95%)."""
    j = binomial_half_ppf((1 - CONFIDENCE) / 2, count)  # P(B <= j - 1) < 2.5%
    if j < 1:
        return None
    return j - 1, count - j


def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """The median's ``CONFIDENCE`` interval from one group's samples (order statistics);
    (nan, nan) with too few samples."""
    ranks = median_ci_ranks(len(samples))
    if ranks is None:
        return math.nan, math.nan
    ordered = sorted(samples)
    return ordered[ranks[0]], ordered[ranks[1]]


def iqr(samples: Sequence[float]) -> float:
    """Interquartile range, linearly interpolated as numpy's default percentile (the
    "inclusive" method, Hyndman & Fan's type 7), in 1 µs rather than numpy's 30: the stopping
    rule reads it between blocks, tens of thousands of times a sweep."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return float(q3 - q1)


def rel_ci(median: Any, low: Any, high: Any) -> Any:
    """How far an interval reaches from its centre, as a share of it (the larger side);
    infinite where there is no interval. Floats and pandas columns alike."""
    if isinstance(median, float | int):
        if not (median > 0 and math.isfinite(low) and math.isfinite(high)):
            return math.inf
        return max(median - low, high - median) / median
    reach = ((median - low).abs().combine((high - median).abs(), max)) / median
    return reach.where(median.gt(0) & low.notna() & high.notna(), math.inf)


@dataclass(frozen=True)
class Estimate:
    """A case's time from its samples in groups (one group a timing round)."""

    center_s: float  # seconds per call
    low_s: float  # the ``CONFIDENCE`` interval (nan where there is none)
    high_s: float
    groups: int  # rounds the estimate is over (1: one group, its samples' interval)
    # Relative standard deviations: of the groups' medians (of their logs), and of the samples
    # within one group (the median group's IQR / 1.349 over its median, the normal's ratio);
    # nan where not defined.
    between_rel: float = math.nan
    within_rel: float = math.nan
    disturbed: int = 0  # rounds whose reference read the machine disturbed
    left_out: int = 0  # of those, left out (all are kept where fewer than two would remain)
    # The variance of the log of ``center_s`` within this run (the rounds' moderated variance
    # over their count; nan with one round): what a later sweep's ``between_sweeps`` reads.
    mean_variance: float = math.nan
    # Where every round was kept with one read disturbed (fewer than two read quiet): how much
    # slower than the quiet level their references read (``busy_slowdown``). The interval's low
    # end is divided by it, so that it holds what a re-run on the quiet machine finds.
    slowdown: float = 1.0

    @property
    def rel_ci(self) -> float:
        return float(rel_ci(self.center_s, self.low_s, self.high_s))

    @property
    def rounds_rel_ci(self) -> float:
        """How far the rounds' own interval reaches, before a busy machine's reach down
        (``slowdown``): what more rounds can narrow, which the stopping rule reads."""
        return float(rel_ci(self.center_s, self.low_s * self.slowdown, self.high_s))


def group_medians(groups: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(g) for g in groups if len(g)]


def quiet_level(references: Sequence[float]) -> float:
    """A run's quiet reference: the ``QUIET_QUANTILE`` of its rounds' readings (nan: none)."""
    found = sorted(r for r in references if r > 0 and math.isfinite(r))
    if not found:
        return math.nan
    return found[min(len(found) - 1, int(QUIET_QUANTILE * len(found)))]


def quieter(*levels: float | None) -> float | None:
    """The lowest of the quiet levels known (None: none is)."""
    known = [x for x in levels if x is not None and x > 0 and math.isfinite(x)]
    return min(known) if known else None


def is_disturbed(reference: float | None, quiet: float | None) -> bool:
    """Whether a round's reference read more than ``QUIET_FACTOR`` over the quiet level."""
    if reference is None or quiet is None or not (quiet > 0 and math.isfinite(reference)):
        return False
    return reference > QUIET_FACTOR * quiet


@dataclass(frozen=True)
class Between:
    """How far a case's time moves between sweeps on this machine beyond what each sweep's own
    rounds hold: the variance of its log (a sweep's moment: what a neighbour, the host and the
    hour do to a whole sweep, which no spread inside one sweep can show), its degrees of
    freedom, and the sweeps it is read from (0: none of this case's; the machine's typical)."""

    variance: float
    df: float
    sweeps: int

    @property
    def spread(self) -> float:
        """The standard deviation of a sweep's log time (about a relative spread)."""
        return math.sqrt(self.variance)


def between_sweeps(entries: Sequence[tuple[float, float]]) -> Between | None:
    """The between-sweep variance of a case from its sweeps' ``(log time, variance of that log
    time within the sweep)``: the variance of the logs less the mean within-sweep part, never
    under 0 (the method of moments of a one-way random-effects model: Searle, Casella &
    McCulloch, *Variance Components*, 1992, §3.5). None under two sweeps."""
    found = [(x, w) for x, w in entries if math.isfinite(x) and math.isfinite(w)]
    if len(found) < 2:
        return None
    spread = statistics.variance([x for x, _ in found])
    own = statistics.fmean(w for _, w in found)
    return Between(max(0.0, spread - own), len(found) - 1.0, len(found))


def moderated_between(own: Between | None, typical: Prior | None) -> Between | None:
    """A case's between-sweep variance shrunk toward the machine's ``typical`` (the median of
    its cases', ``typical_of``) as ``estimate`` shrinks a case's spread between rounds; a case no
    earlier sweep measured takes the typical alone (its ``sweeps`` 0)."""
    if typical is None or not math.isfinite(typical.variance):
        return own
    if own is None:
        return Between(typical.variance, typical.df, 0)
    return Between(*moderated(own.variance, own.df, typical), own.sweeps)


def kept_rounds(
    groups: Sequence[Sequence[float]],
    references: Sequence[float | None] | None = None,
    quiet: float | None = None,
    busy: Sequence[bool] | None = None,
) -> tuple[list[list[float]], int, int]:
    """The groups an estimate is over (those not read disturbed, while two or more remain),
    how many were read disturbed, and how many were left out. A group is read disturbed where
    its reference read over ``QUIET_FACTOR`` of the quiet level, or where ``busy`` says it ran
    beside a busy neighbour (``measure.timing.contention``)."""
    refs = list(references) if references is not None else [None] * len(groups)
    beside = list(busy) if busy is not None else [False] * len(groups)
    measured = [t for t in zip(groups, refs, beside, strict=True) if len(t[0])]
    marks = round_marks(
        [r for _, r, _ in measured], quiet, [b for _, _, b in measured], [g for g, _, _ in measured]
    )
    kept = [list(measured[i][0]) for i in kept_of(marks)]
    return kept, sum(marks), len(marks) - len(kept)


def busy_slowdown(
    groups: Sequence[Sequence[float]],
    references: Sequence[float | None] | None,
    quiet: float | None,
) -> float:
    """How much slower than its quiet level the machine read over a time kept on a busy
    machine's rounds (``kept_of`` keeps every round where fewer than two read quiet): the median
    of the measured rounds' references over ``quiet``, 1 where none reads slower or none was
    read. On this project's shared 2-core VM a busy hour read its reference 1.5-1.8x the quiet
    level, and a round's time followed it, if less far (conv at n = 512: 0.38 ms quiet,
    0.50-0.56 ms busy), so the reach down is a generous one. Rounds kept only for a
    neighbour's CPU beside them, none read slow, are not widened: their reference says
    nothing of how much slower they ran."""
    if references is None or quiet is None or not (quiet > 0 and math.isfinite(quiet)):
        return 1.0
    read = [
        r
        for g, r in zip(groups, references, strict=True)
        if len(g) and r is not None and r > 0 and math.isfinite(r)
    ]
    if not any(is_disturbed(r, quiet) for r in read):  # kept beside a busy neighbour only
        return 1.0
    return max(1.0, statistics.median(read) / quiet)


def round_marks(
    references: Sequence[float | None],
    quiet: float | None,
    busy: Sequence[bool],
    groups: Sequence[Sequence[float]] | None = None,
) -> list[bool]:
    """Which rounds read disturbed: their reference over ``QUIET_FACTOR`` of the quiet level,
    or beside a busy neighbour (``busy``, ``measure.timing.contention``). Given the rounds'
    samples (``groups``, none empty), where ``LEAST_QUIET`` or more read quiet, a round so
    read that ran no slower than the slowest of those (nor than ``QUIET_FACTOR`` times their
    median: one slow quiet round kept them all) is not: a disturbance slows a round, and its
    own time shows none.
    A new user's conv at n = 64 read 98, 70, 29, 29, 30 and 31 µs, the three at 29-30 read
    disturbed by their references: its time was 46 µs ×/÷6.3 over the two others, where a
    re-run read 29."""
    marks = [is_disturbed(r, quiet) or b for r, b in zip(references, busy, strict=True)]
    if groups is None:
        return marks
    medians = group_medians(groups)
    calm = [m for m, bad in zip(medians, marks, strict=True) if not bad]
    if len(calm) < LEAST_QUIET:  # a busy machine's case: kept_of keeps every round
        return marks
    bound = min(max(calm), QUIET_FACTOR * statistics.median(calm))
    return [bad and m > bound for m, bad in zip(medians, marks, strict=True)]


LEAST_QUIET = 2  # rounds an estimate needs to leave the disturbed ones out
# The degrees of freedom an interval needs, its own and its prior's together: below one (a
# one-round case whose layer's cases read far apart, so its prior's weight came out 0.2-0.9),
# the t quantile runs from 23 at 0.8 to 1e12 at 0.1, and the interval read 1e-10 to 1e10
# seconds (a re-run's spread no one measured): that case gets no interval, and reads !.
LEAST_DF = 1.0


def kept_of(disturbed: Sequence[bool], least: int = LEAST_QUIET) -> list[int]:
    """The positions of the rounds an estimate is over, given which read disturbed: the quiet
    ones where ``least`` or more are, else every one (a machine busy throughout is judged so,
    not left without a figure)."""
    quiet = [i for i, bad in enumerate(disturbed) if not bad]
    return quiet if len(quiet) >= least else list(range(len(disturbed)))


def log_variance(groups: Sequence[Sequence[float]]) -> float | None:
    """The variance of the logs of the groups' medians (None under two, or a median not
    positive)."""
    medians = group_medians(groups)
    if len(medians) < 2 or min(medians) <= 0:
        return None
    return statistics.variance([math.log(m) for m in medians])


@functools.lru_cache(maxsize=1 << 14)
def kept_log_variance(
    groups: tuple[tuple[float, ...], ...],
    references: tuple[float | None, ...],
    quiet: float | None,
    busy: tuple[bool, ...],
) -> tuple[float | None, float]:
    """``log_variance`` of the groups ``kept_rounds`` keeps and its degrees of freedom (what
    ``prior_of`` reads), remembered: a sweep reads its prior after every round, over every case
    so far, and most cases have not changed since (recomputed each time, it took 2 s of a
    default sweep's driver, between the rounds)."""
    kept, _, _ = kept_rounds(groups, references, quiet, busy)
    return log_variance(kept), len(kept) - 1.0


def estimate(
    groups: Sequence[Sequence[float]],
    references: Sequence[float | None] | None = None,
    quiet: float | None = None,
    prior: Prior | None = None,
    rerun: int | None = None,
    between: Between | None = None,
    busy: Sequence[bool] | None = None,
) -> Estimate:
    """The time and the interval a re-run's time lands in, from samples in groups;
    ``references``, one a group, with the run's ``quiet`` level, and ``busy``, one a group
    (a neighbour's CPU beside it), leave out the groups taken on a disturbed machine (while two
    or more undisturbed ones remain); ``prior``, the run's, moderates the groups' own variance.

    One group: its median, and the order-statistic interval of that median (``median_ci``), or,
    where the run's other cases give a ``prior``, the interval that prior's spread between
    processes gives (a process's samples cannot show its own speed; none on a prior of under
    ``LEAST_DF``). Several: each group is summarised by its median, and the time is their geometric
    mean; the analysis of cluster means, exact for a nested design whose cluster effects are
    log-normal, and valid from two clusters (Cameron & Miller, "A Practitioner's Guide to
    Cluster-Robust Inference", 2015, §VI). The interval is a Student-t *prediction* interval on
    their logs for the mean of a re-run's ``rerun`` groups (as many as these by default): ``t * s *
    sqrt(1/k + 1/m)`` (Hahn, Meeker & Escobar, *Statistical Intervals*, 2017, §4.7), since what a
    user checks an interval against is a re-run, whose own processes scatter as much as these did;
    a confidence interval for the mean (``sqrt(1/k)``) held the other runs' median in 71% of quiet
    cases where this held 85% (``benchmarks/coverage.py``; with the machine's quiet level and
    waiting, 91-98% of all). The variance of a group's median holds both the between-process spread
    and its own sampling noise, so both are inside the interval. The order statistics of the group
    medians would need six groups for any 95% interval, and a bootstrap over groups covers too
    little with a few (``benchmarks/coverage.py`` compares them on the same runs). Logs, because a
    process's speed and a busy machine scale a time rather than add to it. With a few rounds a
    case's own variance may come out small by chance, and the run's other cases say what is
    typical: the moderated variance (``Prior``) is their weighted mean, with their degrees of
    freedom added.

    ``between``, the case's spread between sweeps on this machine (``between_sweeps``), widens
    the interval by what a re-run's own sweep and this one each add: ``2 * between.variance``,
    with the degrees of freedom of the sum by Welch and Satterthwaite's rule (Satterthwaite,
    "An approximate distribution of estimates of variance components", 1946). Rounds seconds
    apart share their sweep's moment; a re-run minutes later does not.

    Where fewer than two rounds read quiet, every round is kept, and the time is a busy
    machine's: the low end is divided by how much slower the references read than the quiet
    level (``busy_slowdown``), so the interval holds what a re-run on the quiet machine finds
    too. On a busy hour here, six sweeps that never waited held 69% of the other runs' medians
    without it and 81% with it, and six fresh ones with it 94% (``benchmarks/coverage.py``,
    2026-11-30)."""
    kept, disturbed, left_out = kept_rounds(groups, references, quiet, busy)
    slower = busy_slowdown(groups, references, quiet) if disturbed and not left_out else 1.0
    counted: dict[str, Any] = {"disturbed": disturbed, "left_out": left_out, "slowdown": slower}
    if not kept:
        return Estimate(math.nan, math.nan, math.nan, 0)
    within = [w for w in map(_within, kept) if math.isfinite(w)]
    within_rel = statistics.median(within) if within else math.nan
    prior = prior if prior is not None and math.isfinite(prior.variance) else None  # else none
    if len(kept) == 1 and (prior is None or prior.variance <= 0):  # one process, no others':
        center = statistics.median(kept[0])  # its samples' interval
        low, high = median_ci(kept[0])
        return Estimate(center, low / slower, high, 1, within_rel=within_rel, **counted)
    medians = group_medians(kept)
    if min(medians) <= 0:  # a clock that never moved: no logs, no interval
        return Estimate(statistics.median(medians), math.nan, math.nan, len(medians), **counted)
    logs = [math.log(m) for m in medians]
    mean = statistics.fmean(logs)
    spread = statistics.stdev(logs) if len(logs) > 1 else math.nan
    # One round of several cases' (a case whose other rounds failed): the run's spread
    # between processes alone, which its own samples cannot show.
    variance, df = (spread**2, len(logs) - 1.0) if len(logs) > 1 else (0.0, 0.0)
    if prior is not None:
        variance, df = moderated(variance, df, prior)
    if df < LEAST_DF:  # one round, and a prior of under one degree of freedom: no interval
        df = math.nan  # (t, and the interval's ends, nan)
    future = rerun or len(logs)
    spread_variance = variance * (1 / len(logs) + 1 / future)
    if between is not None and between.variance > 0 and between.df > 0:
        sweeps = 2 * between.variance
        df = (spread_variance + sweeps) ** 2 / (spread_variance**2 / df + sweeps**2 / between.df)
        spread_variance += sweeps
    reach = t_quantile((1 + CONFIDENCE) / 2, df) * math.sqrt(spread_variance)
    return Estimate(
        math.exp(mean),
        math.exp(mean - reach) / slower,
        math.exp(mean + reach),
        len(logs),
        between_rel=spread,
        within_rel=within_rel,
        mean_variance=variance / len(logs),
        **counted,
    )


def processes_for(spread: float, target_rel: float, prior_df: float = 0.0) -> int | None:
    """How many processes a case needs for ``estimate``'s interval to reach ``target_rel``
    where its processes' medians spread by ``spread`` (the standard deviation of their logs):
    the least k with ``t(k - 1 + prior_df) * spread * sqrt(2 / k) <= log(1 + target_rel)``, the
    prediction interval for a re-run of as many, with the prior's degrees of freedom added to
    the case's own (none by default: the count that reaches it on the case's own spread alone,
    which a prior no wider than that spread lowers). The normal's z in place of t (before
    2026-12-02) advised counts that still read wider (3 for a spread of 2.5%, whose interval
    then reads ±5.1%). None for a spread that is not positive and finite: nothing to narrow."""
    if not (spread > 0 and math.isfinite(spread)):
        return None
    bound = math.log1p(target_rel)
    z = t_quantile((1 + CONFIDENCE) / 2, math.inf)
    k = max(2, math.ceil(2 * (z * spread / bound) ** 2))  # the normal's count: t's is no fewer
    while t_quantile((1 + CONFIDENCE) / 2, k - 1 + prior_df) * spread * math.sqrt(2 / k) > bound:
        k += 1
    return k


def _within(samples: Sequence[float]) -> float:
    """One group's relative spread: IQR / 1.349 (a normal's standard deviation) over its
    median; nan where the median is not positive."""
    center = statistics.median(samples)
    return iqr(samples) / 1.349 / center if center > 0 else math.nan
