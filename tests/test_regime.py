"""The regime rule: where a layer's rate (work per second) has settled, read by the auto sweep
and by the fits alike."""

from __future__ import annotations

import math

from attnbench.regime import (
    REGIME_BAND,
    REGIME_SIZES,
    overhead_bound,
    settled_sizes,
    trendless,
    within_band,
)

NS = [64, 128, 256, 512, 1024, 2048]


def test_the_band_bounds_the_largest_rate_by_the_smallest() -> None:
    assert within_band([10.0, 11.0, 12.0])
    assert not within_band([10.0, 10.0 * (1 + REGIME_BAND) * 1.01])
    assert not within_band([]) and not within_band([0.0, 1.0])


def test_a_rate_that_drifts_steadily_has_a_trend_and_scatter_alone_does_not() -> None:
    assert not trendless(NS[:4], [10.0, 10.6, 11.2, 11.9])  # 6% a doubling, steadily
    assert trendless(NS[:4], [10.0, 11.0, 9.9, 10.8])  # up and down: 0 inside the interval
    assert trendless(NS[:4], [10.0, 10.1, 10.2, 10.3])  # a slope under REGIME_TREND
    assert trendless(NS[:4], [5.0] * 4)
    # strict: the slope itself, whatever its interval (--n auto's few first rounds)
    assert not trendless(NS[:4], [10.0, 11.0, 9.9, 11.4], strict=0.04)  # slope 0.042
    assert trendless(NS[:4], [10.0, 11.0, 9.9, 11.4])
    assert trendless(NS[:4], [10.0, 10.1, 10.2, 10.3], strict=0.04)


def test_the_regime_is_the_longest_trendless_run_within_the_band_from_the_top() -> None:
    rates = [1.0, 3.0, 8.0, 10.0, 10.4, 9.8, 10.1]
    assert settled_sizes([*NS, 4096], rates) == [512, 1024, 2048, 4096]
    assert settled_sizes(NS[:3] + NS[4:], [1.0, 3.0, 8.0, 10.4, 9.8]) == []  # 3 sizes only
    assert len(settled_sizes(NS, [5.0] * 6)) == len(NS)  # flat from the first size


def test_a_plateau_the_rate_falls_from_is_the_regime() -> None:
    """Past a plateau a rate may fall at longer lengths (conv on this project's
    CPU: within 20% over n = 1024..8192, 0.53x of it by 131072): the regime is the plateau,
    the largest sizes where the rate settled, not none."""
    sizes = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    rates = [70.0, 96.0, 118.0, 133.0, 140.0, 131.0, 113.0, 90.0]
    assert settled_sizes(sizes, rates) == [1024, 2048, 4096, 8192]
    # of two plateaus, the upper one
    two = [10.0, 10.2, 10.1, 10.3, 20.0, 20.4, 20.2, 20.1]
    assert settled_sizes(sizes, two) == [4096, 8192, 16384, 32768]
    # never a plateau the rate climbs on from, nor one below a dip back to its level
    assert settled_sizes(sizes, [*two[:6], 40.0, 80.0]) == []
    assert settled_sizes(sizes, [*rates[:6], 100.0, 135.0]) == []


def test_the_regime_reads_a_sizes_median_and_leaves_out_missing_rates() -> None:
    sizes = [256, 256, 256, 512, 1024, 2048, 4096]
    rates = [10.0, 30.0, 10.5, 10.2, math.nan, 9.9, 10.1]  # 256: median 10.5; 1024: none
    assert settled_sizes(sizes, rates) == [256, 512, 2048, 4096]
    assert REGIME_SIZES == 4


def test_a_case_is_overhead_bound_when_its_kernels_are_under_half_its_time() -> None:
    found = overhead_bound([0.3, 0.5, math.nan, 0.49, 1.0])
    assert found.tolist() == [True, False, False, True, False]
