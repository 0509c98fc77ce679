"""Whether a measured law agrees with the chapter's: the one decision the comparison table and
``fit`` make of an exponent, kept apart so that it is pinned by tests of its own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Interval(Protocol):
    """A fitted exponent with its 95% interval (``fits.Exponent``)."""

    @property
    def slope(self) -> float: ...
    @property
    def low(self) -> float: ...
    @property
    def high(self) -> float: ...


# Exact counts carry lower-order terms (an RNN's 3n + 1 steps), which make a tiny interval miss
# the order's exponent; within this distance the order still holds.
EXACT_TOLERANCE = 0.05
# An interval this wide cannot tell n from n² apart: such a fit is reported, but not judged.
INCONCLUSIVE_WIDTH = 1.0
# Exact counts that are the law up to a scale and a constant fit it to this share of their
# spread over the line (to the last bits where they are exactly a·law + b); a law of another
# order misses by more, over three sizes: n·log n against n by 1.7% of the spread, n^1.1
# against n by 1.0%, √n against log n by 5.7%, 10⁶ + n² against n by 8.6%. Against the
# spread, not each count: a large constant would hide any order inside 1% of the counts.
AFFINE_TOLERANCE = 0.005
# Counts that spread less than this share of the largest are flat: judged by their slope.
FLAT = 0.01


def agrees(fit: Interval, theory: float) -> bool | None:
    """Whether the theory's exponent lies in the 95% interval (or within EXACT_TOLERANCE).

    None when there is nothing to judge: no theory, no interval, or an interval wider than
    ``INCONCLUSIVE_WIDTH`` (it would "agree" with almost any law).
    """
    if math.isnan(theory):
        return None
    if abs(fit.slope - theory) <= EXACT_TOLERANCE:
        return True
    if math.isnan(fit.low) or fit.high - fit.low > INCONCLUSIVE_WIDTH:
        return None
    return bool(fit.low <= theory <= fit.high)


def law_fits(counts: Sequence[float], law: Sequence[float]) -> bool:
    """Whether exact counts are the theory's law up to a positive scale and a constant: the
    lower-order term that an order drops and that bends a short line's slope beyond
    ``EXACT_TOLERANCE`` (ssm-scan's 3·log₂ n + 8 steps over n = 64..256 read n^0.15, log n
    n^0.21 there). Least squares of the counts on [law, 1] (scipy's), each count within
    ``AFFINE_TOLERANCE`` of the counts' spread; three sizes at the least, since a line through
    two fits any law, and a law and counts that vary (flat counts: their slope alone)."""
    from scipy import linalg  # lazy: see estimators.t_quantile

    y, x = np.asarray(counts), np.asarray(law)
    if y.size < 3 or y.shape != x.shape:
        return False
    if not (np.isfinite(y).all() and np.isfinite(x).all() and (y > 0).all() and (x > 0).all()):
        return False
    if x.max() == x.min():
        return False
    if y.max() - y.min() <= FLAT * y.max():
        return False  # flat counts: a law that grows fits them only scaled to nothing
    design = np.column_stack([x, np.ones_like(x)])
    (scale, constant), *_ = linalg.lstsq(design, y)
    if scale <= 0:
        return False
    spread = y.max() - y.min()
    return bool(np.max(np.abs(scale * x + constant - y)) <= AFFINE_TOLERANCE * spread)
