"""Growth laws fitted to measurements: log-log exponents with confidence intervals (scipy).

A measured exponent says how a metric grows: time ~ n^a at fixed d means a ~ 2 for attention
and a ~ 1 for an RNN.  Small sizes are dominated by fixed overheads, so time is fitted over the
upper part of the range only (``upper_half``); exact counts (steps, path length) over all of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Exponent:
    """Slope of log(y) against log(x): y ~ x^slope."""

    slope: float
    low: float  # 95% confidence interval (nan with two points)
    high: float
    points: int
    x_min: float
    x_max: float

    def label(self, var: str) -> str:
        return f"{var}^{self.slope:.2f}"


def loglog_exponent(x: Sequence[float], y: Sequence[float]) -> Exponent | None:
    """Least-squares slope of log y on log x, with its 95% t-interval; None below two points.

    Non-positive values (a constant zero, say) cannot be logged and are left out.
    """
    pairs = [(a, b) for a, b in zip(x, y, strict=True) if a > 0 and b > 0 and np.isfinite(b)]
    xs = np.array(sorted({a for a, _ in pairs}), dtype=float)
    if len(xs) < 2:
        return None
    lx = np.log([a for a, _ in pairs])
    ly = np.log([b for _, b in pairs])
    fit = stats.linregress(lx, ly)
    if len(pairs) > 2:
        t = stats.t.ppf(0.975, len(pairs) - 2)
        low, high = fit.slope - t * fit.stderr, fit.slope + t * fit.stderr
    else:
        low = high = math.nan
    return Exponent(float(fit.slope), float(low), float(high), len(pairs), xs[0], xs[-1])


def upper_half(values: Sequence[int], minimum: int = 3) -> list[int]:
    """The larger half of the distinct sizes (at least ``minimum`` of them, when there are)."""
    distinct = sorted(set(values))
    keep = max(minimum, math.ceil(len(distinct) / 2))
    return distinct[-keep:]
