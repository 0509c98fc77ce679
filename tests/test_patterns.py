"""Dependency-pattern laws: the shapes read from probe patterns, and the paths they give at n.

The patterns here are written out by hand (numpy masks built in the test, not by the package),
and every law's path is checked against ``path_from_pattern`` on the full pattern at a length
the law was not read at.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from torch import nn

from attnbench.measure.counts.patterns import BlockBand, shape_of
from attnbench.measure.counts.structure import path_from_pattern

PROBES = (16, 32, 64)


def blocked(n: int, width: int, back: int, ahead: int, dilation: int = 1, causal: bool = False):
    """Blocked local attention's mask, written out: query block qb sees key blocks
    qb - back .. qb + ahead, every ``dilation``-th position, causal inside its own block."""
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            qb, kb = i // width, j // width
            mask[i, j] = (qb - back <= kb <= qb + ahead) and (i - j) % dilation == 0
            if causal and qb == kb and j > i:
                mask[i, j] = False
    return mask


def measured_path(pattern: np.ndarray) -> int:
    return path_from_pattern(nn.Identity(), pattern, 1)


@pytest.mark.parametrize(
    ("width", "back", "ahead", "dilation", "causal"),
    [(8, 1, 1, 1, False), (8, 2, 0, 1, False), (8, 1, 0, 1, True), (4, 1, 2, 1, False),
     (8, 1, 1, 2, False), (8, 0, 0, 4, False), (1, 6, 6, 3, False)],
)  # fmt: skip
def test_block_laws_reproduce_the_probes_and_the_path_at_a_longer_length(
    width: int, back: int, ahead: int, dilation: int, causal: bool
) -> None:
    patterns = {p: blocked(p, width, back, ahead, dilation, causal) for p in PROBES}
    shape = shape_of(patterns)
    assert isinstance(shape, BlockBand)
    assert (shape.width, shape.dilation) == (width, dilation)
    for n in (100, 131):  # not a multiple of the block: a partial last block
        assert np.array_equal(shape.pattern(n), blocked(n, width, back, ahead, dilation, causal))
        assert shape.path(n, False, 1) == measured_path(
            blocked(n, width, back, ahead, dilation, causal)
        )


@pytest.mark.parametrize(
    ("n", "width", "back", "ahead"), [(100, 8, 1, 1), (160, 16, 2, 0), (1024, 16, 1, 1)]
)
def test_a_blocked_path_is_the_blocks_to_cross_over_the_reach(
    n: int, width: int, back: int, ahead: int
) -> None:
    shape = shape_of({p: blocked(p, width, back, ahead) for p in (32, 64, 128)})
    assert shape == BlockBand(width, back, ahead)
    blocks = math.ceil(n / width)  # counted by hand: each application crosses `back` blocks
    hand = max(math.ceil((blocks - 1) / r) for r in (back, ahead) if r)
    assert shape.path(n, False, 1) == hand
    assert shape.path(n, False, 3) == 3 * hand  # each stacked application has 3 mixing stages


def test_a_band_is_the_narrowest_shape_width_one() -> None:
    offsets = np.subtract.outer(np.arange(64), np.arange(64))
    shape = shape_of({64: np.abs(offsets) <= 3, 32: np.abs(offsets[:32, :32]) <= 3})
    assert shape == BlockBand(1, 3, 3)
    assert shape.path(100, False, 1) == math.ceil(99 / 3)
    assert shape.path(100, True, 1) == 4  # a recurrence crosses one position per step


def test_whole_sequence_reach_is_none_and_global_patterns_are_bands() -> None:
    assert shape_of({p: np.ones((p, p), dtype=bool) for p in PROBES}) == BlockBand(1, None, None)
    # blocks that see every earlier block: the back reach is the whole sequence
    shape = shape_of({p: blocked(p, 8, p, 0) for p in PROBES})
    assert shape == BlockBand(8, None, 0)
    assert shape.path(1000, False, 1) == 1


def test_a_dilated_band_that_covers_the_sequence_is_global_not_a_finite_reach() -> None:
    shape = shape_of({p: blocked(p, 1, p, p, dilation=2) for p in PROBES})
    assert shape == BlockBand(1, None, None, 2)
    assert shape.path(500, False, 1) == 1


def test_no_shape_when_the_probes_disagree_or_nothing_fits() -> None:
    varying = {16: blocked(16, 4, 1, 1), 32: blocked(32, 8, 1, 1), 64: blocked(64, 8, 1, 1)}
    assert shape_of(varying) is None  # the block width changes with n: no law
    rng = np.random.default_rng(0)
    noise = {p: rng.random((p, p)) < 0.5 for p in PROBES}
    assert shape_of(noise) is None
    grown = {p: blocked(p, 8, p // 16, p // 16) for p in PROBES}  # the reach grows with n
    assert shape_of(grown) is None


def test_paths_with_no_law() -> None:
    assert BlockBand(8, 1, 1).path(100, True, 1) is None  # a recurrence over blocks
    assert BlockBand(4, 1, 1, dilation=8).path(100, False, 1) is None  # residues skip blocks


def test_descriptions_name_the_shape() -> None:
    assert BlockBand(16, 1, 0, 1, "lower").describe() == (
        "blocks of 16, block j-i in [-1, 0], causal inside a block"
    )
    assert BlockBand(1, 6, None, 3).describe() == "band j-i in [-6, all], j-i a multiple of 3"
    assert BlockBand(1, None, 0).describe() == "band j-i in [-all, 0]"
