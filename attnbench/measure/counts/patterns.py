"""Dependency-pattern laws: shapes proven at probe lengths, and the path length they give at any n.

A law is read from the measured patterns (``D[i, j]``: output i depends on input j) at three
probe lengths, accepted only if it reproduces each of them exactly, and then gives the maximum
path length at a length too long to measure directly.  One family of shapes, ``BlockBand``:
the sequence cut into blocks of ``width`` from position 0, each query block seeing ``left``
blocks back and ``right`` forward, optionally only every ``dilation``-th position, with the
diagonal block full or causal. Width 1 is a band, ``j - i`` in ``[-left, right]`` (a
convolution, sliding-window attention, an RNN's causal triangle, full attention); wider blocks
are blocked local attention, as the local-attention package computes it, and dilated blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

WITHIN = ("full", "lower", "upper")  # the diagonal block: all of it, j <= i, or j >= i


def stacked_path(left: int, right: int, m: int, stages: int) -> int:
    """Applications needed to cross m positions (or blocks) moving at most ``left`` back and
    ``right`` forward per application, times the layer's mixing stages; at least one."""
    if m <= 1 or not (left or right):
        return stages
    return max(math.ceil((m - 1) / reach) for reach in (left, right) if reach > 0) * stages


def _reach_law(values: list[tuple[int, int]]) -> int | bool | None:
    """One direction's reach from (extent - 1, reach) at each probe: None when it is the whole
    extent at every probe, a fixed reach shorter than the longest probe shows, else False."""
    if all(v == full for full, v in values):
        return None
    reach = max(v for _, v in values)
    if reach < values[-1][0] and all(v == min(reach, full) for full, v in values):
        return reach
    return False


@dataclass(frozen=True)
class BlockBand:
    """D[i, j] when j's block is at most ``left`` blocks before i's and ``right`` after, the
    blocks being ``width`` positions from position 0, and ``i - j`` a multiple of
    ``dilation``; inside i's own block only where ``within`` allows.  None: every block.

    Width 1 and dilation 1 is a plain band, ``j - i`` in ``[-left, right]``."""

    width: int
    left: int | None
    right: int | None
    dilation: int = 1
    within: str = "full"

    def blocks(self, n: int) -> int:
        return math.ceil(n / self.width)

    def pattern(self, n: int) -> np.ndarray:
        pos = np.arange(n)
        block = pos // self.width
        ahead = block[None, :] - block[:, None]  # (n, n): j's block minus i's block
        last = self.blocks(n) - 1
        left = last if self.left is None else self.left
        right = last if self.right is None else self.right
        offset = pos[None, :] - pos[:, None]  # (n, n): j - i
        keep = (ahead >= -left) & (ahead <= right) & (offset % self.dilation == 0)
        if self.within == "lower":
            keep &= ~((ahead == 0) & (offset > 0))
        elif self.within == "upper":
            keep &= ~((ahead == 0) & (offset < 0))
        return cast("np.ndarray", keep)

    @property
    def is_band(self) -> bool:
        return self.width == 1 and self.dilation == 1

    def path(self, n: int, recurrent: bool, stages: int) -> int | None:
        """Applications needed to cross the blocks; a recurrence over a band crosses one
        position per step (None where no law is known: a recurrence over blocks, or a dilation
        wider than a block, whose residues skip blocks)."""
        if recurrent:
            if not self.is_band:
                return None
            reach = [n - 1 if r is None else min(r, n - 1) for r in (self.left, self.right)]
            return max(reach) + 1
        if self.width == 1:  # a dilated band: each residue class is a band of reach // dilation
            m = math.ceil(n / self.dilation)
            reach = [m - 1 if r is None else r // self.dilation for r in (self.left, self.right)]
        elif self.dilation <= self.width:
            m = self.blocks(n)
            reach = [m - 1 if r is None else r for r in (self.left, self.right)]
        else:
            return None
        return stacked_path(min(reach[0], m - 1), min(reach[1], m - 1), m, stages)

    def describe(self) -> str:
        side: dict[int | None, int | str] = {None: "all"}
        text = (
            f"blocks of {self.width}, block j-i in "
            f"[-{side.get(self.left, self.left)}, {side.get(self.right, self.right)}]"
        )
        if self.width == 1:
            text = f"band j-i in [-{side.get(self.left, self.left)}, " + (
                f"{side.get(self.right, self.right)}]"
            )
        if self.dilation > 1:
            text += f", j-i a multiple of {self.dilation}"
        if self.within != "full":
            text += f", {'causal' if self.within == 'lower' else 'anti-causal'} inside a block"
        return text


def _block_candidate(pattern: np.ndarray) -> BlockBand | None:
    """The narrowest block shape that reproduces one pattern exactly, if any."""
    n = len(pattern)
    i, j = np.nonzero(pattern)
    if not len(i):
        return None
    dilation = int(np.gcd.reduce(np.abs(i - j))) or 1
    for width in range(1, n // 2 + 1):  # two blocks at least, or nothing shows the blocking
        ahead = j // width - i // width
        left, right = int(max((-ahead).max(), 0)), int(max(ahead.max(), 0))
        for within in WITHIN if width > 1 else ("full",):
            candidate = BlockBand(width, left, right, dilation, within)
            if np.array_equal(pattern, candidate.pattern(n)):
                return candidate
    return None


def _reaches(shape: BlockBand, pattern: np.ndarray) -> tuple[int, int, int]:
    """(the farthest reach possible, the reach back, the reach forward) of one pattern, in
    blocks, or in positions for a (dilated) band, whose farthest is a multiple of its step."""
    n = len(pattern)
    i, j = np.nonzero(pattern)
    if shape.width == 1:
        full, ahead = (n - 1) // shape.dilation * shape.dilation, j - i
    else:
        full, ahead = shape.blocks(n) - 1, j // shape.width - i // shape.width
    return full, int(max((-ahead).max(), 0)), int(max(ahead.max(), 0))


def shape_of(patterns: dict[int, np.ndarray]) -> BlockBand | None:
    """The narrowest band or block shape, read at the longest probe, that every measured
    pattern has exactly (None: there is none).

    A reach that covers the whole extent at every probe becomes None (the whole sequence); a
    finite one must be shorter than the longest probe's extent, or nothing proves it finite.
    """
    shape = _block_candidate(patterns[max(patterns)])
    if shape is None:
        return None
    reaches = [_reaches(shape, patterns[n]) for n in sorted(patterns)]
    left = _reach_law([(full, back) for full, back, _ in reaches])
    right = _reach_law([(full, ahead) for full, _, ahead in reaches])
    if left is False or right is False:
        return None
    shape = BlockBand(shape.width, left, right, shape.dilation, shape.within)
    if all(np.array_equal(pattern, shape.pattern(n)) for n, pattern in patterns.items()):
        return shape
    return None
