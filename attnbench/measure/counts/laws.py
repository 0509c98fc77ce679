"""Exact laws through traced counts: the polynomial of degree 2 at most through three (n, count)
points, in rational arithmetic, trusted only where it reproduces every further point.

``measure.counts.extend`` extends a long recurrent case's counts by it, and
``measure.machine.rates`` a long fused-LSTM call's FLOPs; this module depends on nothing, so both
can.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction


class Law:
    """The polynomial of degree at most 2 through three (n, value) points, exactly."""

    def __init__(self, points: list[tuple[int, int]]) -> None:
        (x0, y0), (x1, y1), (x2, y2) = points
        # Newton's divided differences: p(n) = y0 + c1 (n - x0) + c2 (n - x0)(n - x1).
        d01 = Fraction(y1 - y0, x1 - x0)
        d12 = Fraction(y2 - y1, x2 - x1)
        self.x0, self.x1, self.y0 = x0, x1, y0
        self.c1 = d01
        self.c2 = (d12 - d01) / (x2 - x0)

    def __call__(self, n: int) -> Fraction:
        return self.y0 + self.c1 * (n - self.x0) + self.c2 * (n - self.x0) * (n - self.x1)

    @property
    def degree(self) -> int:
        return 2 if self.c2 else 1 if self.c1 else 0


def fit_law(values: Mapping[int, int]) -> Law | None:
    """The law through the first three probes, if it reproduces every other probe exactly."""
    points = sorted(values.items())
    law = Law(points[:3])
    if any(law(x) != y for x, y in points[3:]):
        return None
    return law
