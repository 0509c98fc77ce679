"""Timing logic on a deterministic fake clock: no real time is measured here."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import pytest

from attnbench.estimators import iqr, median_ci
from attnbench.measure.timing.loop import Stop, TimingPolicy, TimingStats, time_call


class FakeLayer:
    """A call that advances a fake clock by the next scripted duration."""

    def __init__(self, durations: Iterable[float]) -> None:
        self.now = 0.0
        self.calls = 0
        self._durations: Iterator[float] = iter(durations)
        self.log: list[str] = []

    def clock(self) -> float:
        self.log.append("clock")
        return self.now

    def sync(self) -> None:
        self.log.append("sync")

    def __call__(self) -> None:
        self.calls += 1
        self.log.append("call")
        self.now += next(self._durations)


# Blocks of 1 ms keep the scripted calls of 2-3 ms one per block, so samples equal durations.


def constant(value: float) -> Iterator[float]:
    while True:
        yield value


def test_steady_calls_stop_at_min_samples_with_exact_statistics() -> None:
    fake = FakeLayer(constant(2e-3))
    policy = TimingPolicy(min_block_s=1e-3, warmup_calls=2, min_samples=10, min_time_s=0.0)
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.count == 10
    assert stats.calls_per_sample == 1
    assert stats.median_s == pytest.approx(2e-3)
    assert stats.iqr_s == pytest.approx(0.0)
    assert stats.total_s == pytest.approx(10 * 2e-3)
    assert fake.calls == 2 + 10  # warm-up calls are not samples


def test_a_stable_case_is_still_timed_for_min_time() -> None:
    fake = FakeLayer(constant(2e-3))
    policy = TimingPolicy(
        min_block_s=1e-3, warmup_calls=0, min_samples=10, min_time_s=0.05, budget_s=1.0
    )
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.count == 25  # 25 x 2 ms reaches 0.05 s, then the zero spread stops it
    assert stats.total_s == pytest.approx(0.05)


def test_slow_warmup_is_excluded_from_samples() -> None:
    fake = FakeLayer([1.0, 0.5, *[3e-3] * 100])
    stats = time_call(
        fake, TimingPolicy(min_block_s=1e-3, warmup_calls=2, min_samples=10), clock=fake.clock
    )
    assert max(stats.samples_s) == pytest.approx(3e-3)


def test_noisy_calls_repeat_until_the_budget_is_spent() -> None:
    def alternating() -> Iterator[float]:
        while True:
            yield 1e-3
            yield 3e-3

    fake = FakeLayer(alternating())
    policy = TimingPolicy(
        min_block_s=1e-3, warmup_calls=0, min_samples=10, budget_s=0.1, target_rel_ci=0.02
    )
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.rel_ci > 0.02
    assert stats.stop is Stop.BUDGET
    assert 0.1 <= stats.total_s < 0.1 + 3e-3 * 2
    assert stats.count == pytest.approx(0.1 / 2e-3, abs=2)


def test_sampling_stops_once_the_median_is_precise() -> None:
    """A few slow blocks in many steady ones: the median's interval closes on the steady
    time, and sampling ends long before the budget."""
    fake = FakeLayer(itertools.chain([2e-3] * 3, [2.5e-3] * 2, constant(2e-3)))
    policy = TimingPolicy(
        min_block_s=1e-3,
        warmup_calls=0,
        min_samples=10,
        min_time_s=0.02,
        budget_s=10.0,
        target_rel_ci=0.01,
    )
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.stop is Stop.PRECISE
    # at 10 and 11 samples the interval's upper end is a slow sample; at 12 it is not
    assert stats.count == 12 and stats.total_s == pytest.approx(0.025)
    assert stats.ci_s == (pytest.approx(2e-3), pytest.approx(2e-3))


def test_a_wide_interval_keeps_sampling_until_it_narrows() -> None:
    """Half the samples slow at first: the interval reaches the slow ones, so sampling goes
    on until enough steady samples pull both its ends to the steady time."""
    fake = FakeLayer(itertools.chain([1e-3, 3e-3] * 5, constant(1e-3)))
    policy = TimingPolicy(
        min_block_s=1e-3,
        warmup_calls=0,
        min_samples=10,
        min_time_s=0.0,
        budget_s=10.0,
        target_rel_ci=0.01,
    )
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.stop is Stop.PRECISE
    _, high = median_ci(stats.samples_s[:-1])
    assert high == pytest.approx(3e-3)  # one sample fewer and the interval still reached 3 ms
    assert stats.ci_s == (pytest.approx(1e-3), pytest.approx(1e-3))


def test_the_medians_interval_is_scipys_exact_one() -> None:
    """Order statistics of the binomial: the interval scipy's quantile_test gives."""
    from scipy import stats

    rng = np.random.default_rng(1)
    for count in (6, 7, 10, 11, 25, 64, 101, 400):
        samples = list(rng.lognormal(-7.0, 0.4, size=count))
        found = stats.quantile_test(samples, q=float(np.median(samples)), p=0.5)
        reference = found.confidence_interval(0.95)
        assert median_ci(samples) == (reference.low, reference.high)
    assert all(np.isnan(median_ci([1.0, 2.0, 3.0, 4.0, 5.0])))  # none under 6 samples


def test_fast_calls_are_grouped_into_blocks_of_at_least_min_block() -> None:
    fake = FakeLayer(constant(10e-6))
    stats = time_call(fake, TimingPolicy(warmup_calls=0, min_block_s=1e-3), clock=fake.clock)
    assert stats.calls_per_sample >= 100
    assert stats.median_s == pytest.approx(10e-6)
    assert all(s == pytest.approx(10e-6) for s in stats.samples_s)


def test_max_samples_caps_the_loop() -> None:
    fake = FakeLayer(1e-3 if i % 2 else 5e-3 for i in range(10_000))
    policy = TimingPolicy(
        min_block_s=1e-3, warmup_calls=0, min_samples=3, max_samples=7, budget_s=100
    )
    assert time_call(fake, policy, clock=fake.clock).count == 7


def test_slow_call_still_gets_min_samples_past_the_budget() -> None:
    fake = FakeLayer(constant(0.5))
    policy = TimingPolicy(
        min_block_s=1e-3, warmup_calls=1, min_samples=4, budget_s=0.25, target_rel_ci=0.0
    )
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.count == 4
    assert stats.calls_per_sample == 1


def test_device_is_synchronised_around_every_block() -> None:
    fake = FakeLayer(constant(2e-3))
    time_call(
        fake,
        TimingPolicy(min_block_s=1e-3, warmup_calls=1, min_samples=3),
        clock=fake.clock,
        sync=fake.sync,
    )
    log = fake.log
    # the last warm-up call is timed as a block is (its time sizes the blocks), then a sync,
    # then each block: sync, clock, call(s), sync, clock
    assert log[:6] == ["sync", "clock", "call", "sync", "clock", "sync"]
    blocks = log[6:]
    assert blocks[:5] == ["sync", "clock", "call", "sync", "clock"]
    assert blocks.count("clock") == 2 * blocks.count("call")
    for i, event in enumerate(blocks):
        if event == "clock" and i + 1 < len(blocks) and blocks[i + 1] == "call":
            assert blocks[i - 1] == "sync"  # a block never starts with work still queued


def test_stats_derive_from_raw_samples() -> None:
    samples = (1.0, 2.0, 3.0, 4.0, 10.0)
    stats = TimingStats(samples_s=samples, calls_per_sample=1, total_s=20.0)
    assert stats.median_s == 3.0
    q1, q3 = np.percentile(samples, [25, 75])
    assert stats.iqr_s == pytest.approx(q3 - q1)
    assert iqr([5.0]) == 0.0


def test_iqr_is_numpys_linear_percentile_at_any_count() -> None:
    """The stopping rule's quick IQR reads what numpy's default percentile reads."""
    rng = np.random.default_rng(0)
    for count in (2, 3, 4, 5, 7, 10, 33, 250):
        samples = list(rng.lognormal(-7.0, 0.5, size=count))
        q1, q3 = np.percentile(samples, [25, 75])
        assert iqr(samples) == pytest.approx(q3 - q1, rel=1e-12)


def test_default_blocks_last_at_least_2_ms() -> None:
    """1 ms blocks read sub-millisecond calls ~6% high against torch.utils.benchmark, 2 ms
    blocks within 1-4% (benchmarks/timing_fidelity.py, docs/benchmarks.md)."""
    fake = FakeLayer(constant(0.4e-3))
    stats = time_call(fake, TimingPolicy(warmup_calls=0), clock=fake.clock)
    assert stats.calls_per_sample * 0.4e-3 >= 2e-3
    assert stats.median_s == pytest.approx(0.4e-3)


def test_imprecise_rule_on_floats_and_columns() -> None:
    """A median is marked when its interval reaches over 5% away on either side, or when it
    has none."""
    import pandas as pd

    from attnbench.measure.timing.loop import is_imprecise

    assert is_imprecise(1.0, 0.99, 1.06) and not is_imprecise(1.0, 0.96, 1.04)
    assert is_imprecise(1.0, float("nan"), float("nan"))
    found = is_imprecise(
        pd.Series([1.0, 1.0, 2.0]), pd.Series([0.9, 0.99, None]), pd.Series([1.0, 1.01, None])
    )
    assert found.tolist() == [True, False, True]


def test_the_garbage_collector_is_off_inside_timed_blocks_only() -> None:
    import gc

    fake = FakeLayer(constant(2e-3))
    seen: list[bool] = []

    def call() -> None:
        seen.append(gc.isenabled())
        fake()

    def clock() -> float:
        seen_at_clock.append(gc.isenabled())
        return fake.clock()

    seen_at_clock: list[bool] = []
    policy = TimingPolicy(min_block_s=1e-3, warmup_calls=2, min_samples=5, min_time_s=0.0)
    assert gc.isenabled()
    time_call(call, policy, clock=clock)
    assert seen[:2] == [True, True]  # warm-up calls run as the program would
    assert seen[2:] and not any(seen[2:])  # every timed call: no collection pause
    # the timed warm-up call's two clock reads run as the program would; every block's do not
    assert seen_at_clock[:2] == [True, True] and not any(seen_at_clock[2:])
    assert gc.isenabled()  # back on between blocks and after
    gc.disable()
    try:  # a caller that turned it off keeps it off
        time_call(call, policy, clock=clock)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_last_warm_up_call_sizes_the_first_block_so_no_block_is_thrown_away() -> None:
    fake = FakeLayer(constant(10e-6))
    policy = TimingPolicy(warmup_calls=2, min_block_s=1e-3, min_samples=10, min_time_s=0.0)
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.calls_per_sample == 125  # 1.25 x the 1 ms minimum, from the warm-up's 10 us
    assert fake.calls == 2 + stats.count * stats.calls_per_sample  # every other call a sample


def test_a_block_that_falls_short_is_regrown_with_a_margin() -> None:
    # The warm-up call reads 20 us, the steady calls 5 us: a first block of 63 calls is short.
    fake = FakeLayer(itertools.chain([20e-6], constant(5e-6)))
    policy = TimingPolicy(warmup_calls=1, min_block_s=1e-3, min_samples=10, min_time_s=0.0)
    stats = time_call(fake, policy, clock=fake.clock)
    assert stats.calls_per_sample == 250  # 1.25 x the 1 ms minimum at 5 us a call
    assert fake.calls == 1 + 63 + stats.count * 250  # the one short block thrown away
