"""Where a layer's time shows its work: the sizes where its rate (work per second) has settled.

Below them a time is the machine's fixed costs (Python, dispatch, launches) or a rate still
changing with size (caches filling, another backend taking over), and its growth says nothing
of the chapter's order. Above them a rate may fall again: on this project's CPU conv's rate
held within 20% over n = 1024..8192 and fell to 0.53x by 131072, attention-linear's held over
512..4096 and fell to 0.73x by 32768 (operands outgrowing a cache would do that; not measured
here). The regime is then the plateau below the fall, the largest sizes where the rate settled;
never a plateau the rate climbs on from. One rule, read by the auto sweep (double n until it
holds at the top) and by the fits (fit the time's exponent where it holds).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import ArrayLike

from attnbench.estimators import t_quantile

# Rates within this band of each other: the largest at most (1 + band) times the smallest.
REGIME_BAND = 0.2
# --n auto reads each case's first round alone, and a case's time moves by a few percent as its
# later rounds come in (a first round read 1.5-3% slower than the case's median on 2026-11-30):
# a line stops only where its first rounds settle within this narrower band, so that its final
# times still settle within REGIME_BAND. Within 20%, lstm and conv stopped at 2048 and 8192 in
# a default sweep whose final times then read them unsettled (rates 1.21x apart), and fitted
# them below their regime, at n^0.86 and n^0.80.
AUTO_BAND = 0.15
# Over at least this many sizes (three doublings).
REGIME_SIZES = 4
# ... with no trend: the rate's log-log slope within this of 0, or its 95% interval holding
# 0. As time = work / rate, the time's exponent is then the work's, as a fit judges it.
REGIME_TREND = 0.05
# --n auto's first rounds are too few for the slope's interval to say anything (two degrees of
# freedom: 0 sat inside it for a rate rising 6% a doubling), and the final times narrow it: a
# line whose first rounds read attention-linear's rate rising 0.060 a doubling stopped "with no
# trend", and its final times read a trend (0.068, 0 outside the interval) and marked it
# unsettled. So --n auto stops on the slope itself, within this (its room for the later rounds,
# as AUTO_BAND's: conv's slope moved 0.016 between its first rounds and its final times).
AUTO_TREND = 0.04
# --n auto also stops a line whose rate settled lower down, as attnbench table reads a plateau
# (REGIME_BAND, REGIME_TREND), and then fell under it at this many lengths past it, where the
# table fits it: in default sweeps on 2026-11-30 conv, attention-linear and attention-local,
# whose rates held in cache (their first rounds 15.1-19.5% apart, or rising 0.05 a doubling)
# and fell out of it, ran on to the end of their budget (12-20 s of 60) on lengths the table
# then left out.
PAST_SIZES = 2
# A case whose kernels run under this share of its time is overhead-bound.
OVERHEAD_SHARE = 0.5


def within_band(rates: Sequence[float], band: float = REGIME_BAND) -> bool:
    """Whether positive rates stay within ``band`` of each other."""
    return bool(rates) and min(rates) > 0 and max(rates) <= (1 + band) * min(rates)


def trendless(sizes: Sequence[float], rates: Sequence[float], strict: float | None = None) -> bool:
    """Whether a rate shows no trend with size: its log-log slope within ``REGIME_TREND`` of
    0, or 0 inside the slope's 95% interval (scipy's least squares); with ``strict``, the
    slope within that of 0, whatever its interval (``AUTO_TREND``)."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    x, y = [math.log(s) for s in sizes], [math.log(r) for r in rates]
    if len(set(y)) < 2:
        return True
    fit = stats.linregress(x, y)
    if strict is not None:
        return bool(abs(fit.slope) <= strict)
    reach = t_quantile(0.975, len(x) - 2) * fit.stderr if len(x) > 2 else math.inf
    return bool(abs(fit.slope) <= REGIME_TREND or abs(fit.slope) <= reach)


def settled_sizes(
    sizes: Sequence[int],
    rates: Sequence[float],
    band: float = REGIME_BAND,
    strict: float | None = None,
) -> list[int]:
    """The regime where time grows as the work, smallest first: the longest run of sizes
    whose rates stay within ``band`` with no trend (``trendless``, with ``strict``: the slope
    itself within it), at the top of ``sizes``, or lower down where every rate above it fell
    below the run's (a plateau the rate fell from, not one it climbed on from); [] when no run
    of ``REGIME_SIZES`` sizes does. A size with several rates (several cases) reads their
    median; sizes without a finite positive rate are left out."""
    by_size: dict[int, list[float]] = {}
    for size, rate in zip(sizes, rates, strict=True):
        if rate is not None and math.isfinite(rate) and rate > 0:
            by_size.setdefault(int(size), []).append(float(rate))
    points = [(size, statistics.median(by_size[size])) for size in sorted(by_size, reverse=True)]
    for start in range(len(points) - REGIME_SIZES + 1):  # from the top down
        above = [r for _, r in points[:start]]
        if above and max(above) >= points[start][1]:
            continue  # the rate did not fall past here: a rise or a dip, not the plateau's end
        run: list[tuple[int, float]] = []  # the run within the band, largest size first
        for size, middle in points[start:]:
            if not within_band([r for _, r in run] + [middle], band):
                break
            run.append((size, middle))
        for length in range(len(run), REGIME_SIZES - 1, -1):
            window = run[:length]
            fell = not above or max(above) < min(r for _, r in window)
            if fell and trendless([s for s, _ in window], [r for _, r in window], strict):
                return sorted(s for s, _ in window)
    return []


def overhead_bound(kernel_share: ArrayLike) -> npt.NDArray[np.bool_]:
    """Which cases' kernels run under ``OVERHEAD_SHARE`` of their time (False where not
    known): the cases the table and the charts call overhead-bound."""
    shares = np.asarray(kernel_share, dtype=float)
    bound: npt.NDArray[np.bool_] = np.isfinite(shares) & (shares < OVERHEAD_SHARE)
    return bound
