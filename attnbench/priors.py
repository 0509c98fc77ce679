"""A run's typical spread between a case's rounds, which each case's own few rounds are shrunk
toward (a moderated t: Smyth, "Linear models and empirical Bayes methods for assessing
differential expression", 2004).

A case gets three rounds or so, two degrees of freedom: its own spread is a guess, and the
run's other cases say what is typical. Which others: a layer's cases share its ops, and with
them its noise (the committed runs, each layer's median spread between a case's kept rounds:
cpu-reference's ssm and ssm-scan 6.4-6.7% where the rest read 1.5-3.4%, ci-reference's
attention-local 12.5% and ssm 8.9% where the rest read 1.1-2.6%), so each case is shrunk
toward its own layer's cases (``Priors``; a layer with its options, dtype, device, mode and
compile: ``spec.spread_group``), the run's where its layer has too few (ci-reference's two a
layer). Shrunk toward the whole run's, a noisy layer's intervals held a re-run 80-82% of the
time in a simulation of nine layers at 2% and two at 8% (three rounds a case, three to six
cases a layer), where by layer every layer's held 92-94%, and the quiet layers' read ±3.5%
where the run's read ±4.3% (``benchmarks/priors.py``; ``tests/test_priors.py`` holds it).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# The weight, in degrees of freedom, of a typical spread taken as the median of a few
# (``typical_of``: the machine's spread between sweeps, read from a handful of sweeps).
PRIOR_DF = 4.0


@dataclass(frozen=True)
class Prior:
    """A run's typical variance of the logs of a case's rounds' medians, and its weight in
    degrees of freedom: the prior of a moderated t (Smyth, "Linear models and empirical Bayes
    methods for assessing differential expression", 2004), which each case's own variance is
    shrunk toward (``prior_of`` reads both from the run's cases)."""

    variance: float
    df: float = PRIOR_DF


def moderated(variance: float, df: float, prior: Prior) -> tuple[float, float]:
    """A variance of ``df`` degrees of freedom shrunk toward ``prior``: their weighted mean,
    with the prior's degrees of freedom added (Smyth, 2004)."""
    total = prior.df + df
    return (prior.df * prior.variance + df * variance) / total, total


def typical_of(variances: Sequence[float | None]) -> Prior | None:
    """The median of a few variances, of ``PRIOR_DF`` (None without two): the machine's typical
    spread between sweeps, whose cases' variances are often 0 (cut there, ``between_sweeps``),
    which ``prior_of``'s logs cannot take."""
    found = [v for v in variances if v is not None and math.isfinite(v)]
    return Prior(statistics.median(found)) if len(found) >= 2 else None


def prior_of(entries: Sequence[tuple[float | None, float]]) -> Prior | None:
    """A run's prior from its cases' ``(variance, degrees of freedom)``: the scale and the
    degrees of freedom of the scaled inverse chi-square their variances are drawn from, both
    estimated from the logs of the variances by Smyth's moments (2004, §6.2; limma's
    ``fitFDist``). Where the cases spread far apart (a run of quiet and noisy layers), the
    degrees of freedom come out few and a noisy case keeps most of its own spread; a fixed
    weight of 4 (before 2026-12-02) pulled it toward the quiet cases' (a simulation of 36 cases
    at 2% and 4 at 10%: 74% of the noisy cases' intervals held a re-run), where committed runs
    read 1.1-2.6. The weight is never more than the cases' own degrees of freedom together: a
    prior knows no more than the rounds it is read from. None without two positive variances."""
    found = tuple(
        (float(v), float(df))
        for v, df in entries
        if v is not None and v > 0 and math.isfinite(v) and df > 0
    )
    return _fitted(found) if len(found) >= 2 else None


@functools.lru_cache(maxsize=1024)
def _fitted(found: tuple[tuple[float, float], ...]) -> Prior:
    """``prior_of`` over two or more positive variances, remembered: a sweep reads its priors
    after every round, and every layer but the one whose round ended is as it was (each fit
    recomputed took 11 ms a read of a default sweep's 77 cases, 4 s a sweep)."""
    import numpy as np
    from scipy import special  # lazy: see estimators.t_quantile

    variances, dfs = np.array(found).T
    halves = dfs / 2
    logs = np.log(variances) - special.psi(halves) + np.log(halves)
    center = float(logs.mean())
    # the spread of the logs beyond what sampling gives (trigamma(x) = zeta(2, x))
    excess = float(logs.var(ddof=1) - special.zeta(2, halves).mean())
    pooled = float(dfs.sum())
    if excess <= 0:  # no more spread than sampling gives: one variance, the cases' pooled
        return Prior(float((variances * dfs).sum()) / pooled, pooled)
    df = 2 * _trigamma_inverse(excess)  # the scale is read at the estimated weight; the
    scale = math.exp(center + float(special.psi(df / 2)) - math.log(df / 2))
    return Prior(scale, min(df, pooled))  # weight cut to what the cases themselves hold


def _trigamma_inverse(x: float) -> float:
    """The y whose trigamma is ``x`` (x > 0), by Newton's method from 0.5 + 1/x, as limma's
    ``trigammaInverse`` (Smyth, 2004)."""
    from scipy import special  # lazy: see estimators.t_quantile

    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):  # trigamma(y) = zeta(2, y), its derivative -2 zeta(3, y)
        tri = float(special.zeta(2, y))
        step = tri * (1 - tri / x) / (-2 * float(special.zeta(3, y)))
        y += step
        if -step / y < 1e-8:
            break
    return y


# The cases a group needs for a prior of its own (else the run's): in the simulation above,
# groups of three held a re-run 92-93% of the time (``benchmarks/priors.py``); the cases of a
# grid of two lengths a layer, cut to two rounds each and shrunk by layer, 88% where the run's
# prior held 98% (``benchmarks/coverage.py --analyse``, 2026-12-02).
LEAST_GROUP = 3


@dataclass(frozen=True)
class Priors:
    """Each group's prior (``prior_of`` over its own cases: a layer's, ``spec.spread_group``),
    and the run's over every case, for a group with too few variances of its own."""

    groups: Mapping[str, Prior] = field(default_factory=dict)
    run: Prior | None = None

    def of(self, group: str) -> Prior | None:
        """The prior a case of ``group`` is shrunk toward."""
        return self.groups.get(group, self.run)


def priors_of(entries: Iterable[tuple[str, float | None, float]]) -> Priors:
    """The priors of a run from its cases' ``(group, variance, degrees of freedom)``."""
    found = list(entries)
    by_group: dict[str, list[tuple[float | None, float]]] = {}
    for group, variance, df in found:
        by_group.setdefault(group, []).append((variance, df))
    groups = {group: prior_of(mine) for group, mine in by_group.items() if len(mine) >= LEAST_GROUP}
    return Priors(
        {group: prior for group, prior in groups.items() if prior is not None},
        prior_of([(variance, df) for _, variance, df in found]),
    )
