"""Whether a measured law agrees with the chapter's: the one decision the comparison table and
``fit`` make of an exponent, kept apart so that it is pinned by tests of its own."""

from __future__ import annotations

import math
from typing import Protocol


class Interval(Protocol):
    """A fitted exponent with its 95% interval (``fits.Exponent``)."""

    @property
    def slope(self) -> float: ...
    @property
    def low(self) -> float: ...
    @property
    def high(self) -> float: ...


# Exact counts carry lower-order terms (an RNN's 3n + 2 steps), which make a tiny interval miss
# the order's exponent; within this distance the order still holds.
EXACT_TOLERANCE = 0.05
# An interval this wide cannot tell n from n² apart: such a fit is reported, but not judged.
INCONCLUSIVE_WIDTH = 1.0


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
