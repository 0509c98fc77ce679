"""Wall-clock timing with warm-up, device synchronisation and a precision-based stopping rule.

The clock and the synchronisation are plain callables so that tests can drive the logic with a
deterministic fake clock.  Raw samples are kept; statistics are derived from them.
"""

from __future__ import annotations

import enum
import functools
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from attnbench.measure.faults import FaultCounter
from attnbench.schema import Timer

Clock = Callable[[], float]  # returns seconds
NOISY_REL_IQR = 0.1  # IQR/median above this: the samples spread (torch.utils.benchmark's warning)
CONFIDENCE = 0.95  # of the median's confidence interval
# A median whose confidence interval reaches further than this from it is marked imprecise.
IMPRECISE_REL_CI = 0.05


class Stop(str, enum.Enum):
    """Which rule ended a case's sampling (results.csv's ``time_stop``)."""

    PRECISE = "precise"  # the median's confidence interval reached the policy's target
    BUDGET = "budget"  # the timing budget was spent first
    MAX_SAMPLES = "max samples"


def is_noisy(time_s: Any, iqr_s: Any) -> Any:
    """IQR above ``NOISY_REL_IQR`` of the median; works on floats and on pandas columns alike."""
    return iqr_s > NOISY_REL_IQR * time_s


def is_imprecise(time_s: Any, ci_low_s: Any, ci_high_s: Any) -> Any:
    """The median's confidence interval reaches more than ``IMPRECISE_REL_CI`` of it away (or
    there were too few samples for one); floats and pandas columns alike."""
    return rel_ci(time_s, ci_low_s, ci_high_s) > IMPRECISE_REL_CI


def rel_ci(median: Any, low: Any, high: Any) -> Any:
    """How far the confidence interval reaches from the median, as a share of it (the larger
    side); infinite where there is no interval. Floats and pandas columns alike."""
    if isinstance(median, float | int):
        if not (median > 0 and math.isfinite(low) and math.isfinite(high)):
            return math.inf
        return max(median - low, high - median) / median
    reach = ((median - low).abs().combine((high - median).abs(), max)) / median
    return reach.where(median.gt(0) & low.notna() & high.notna(), math.inf)


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(count: int) -> tuple[int, int] | None:
    """0-based ranks of the sorted samples that bound a distribution-free ``CONFIDENCE``
    interval of the median (order statistics, the binomial with p = 1/2); None with too few
    samples for one (under 6 at 95%)."""
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    j = int(stats.binom.ppf((1 - CONFIDENCE) / 2, count, 0.5))  # P(B <= j - 1) < 2.5%
    if j < 1:
        return None
    return j - 1, count - j


def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """The median's ``CONFIDENCE`` interval (seconds); (nan, nan) with too few samples."""
    ranks = median_ci_ranks(len(samples))
    if ranks is None:
        return math.nan, math.nan
    ordered = sorted(samples)
    return ordered[ranks[0]], ordered[ranks[1]]


def _no_sync() -> None:
    return None


@dataclass(frozen=True)
class TimingStats:
    """Per-call times of one case: each sample is a block of ``calls_per_sample`` calls, divided."""

    samples_s: tuple[float, ...]
    calls_per_sample: int
    total_s: float  # seconds spent inside timed blocks (sum of block durations)
    # Minor page faults per call, one per sample (None: not counted, as on CUDA), and the
    # major faults (pages read from disk) of every block together.
    faults: tuple[float, ...] | None = None
    major_faults: int | None = None
    stop: Stop | None = None  # which rule ended the sampling (None: not recorded)
    # The device's SM clock read after each sample, MHz (None: not read, as on the CPU).
    clocks_mhz: tuple[float | None, ...] | None = None

    def per_call(self, calls: int) -> TimingStats:
        """These statistics with each sample divided among ``calls`` calls (a sample that
        timed a CUDA graph of ``calls`` captured calls)."""
        return replace(
            self,
            samples_s=tuple(s / calls for s in self.samples_s),
            calls_per_sample=self.calls_per_sample * calls,
        )

    @property
    def page_faults(self) -> float | None:
        """Minor page faults per call in the median sample, as ``time_s`` is the median time:
        a heap that grows once in a while (fragmentation) faults in a few blocks, not in the
        call the median describes; samples.csv keeps every block's count."""
        return None if not self.faults else statistics.median(self.faults)

    @property
    def major_per_call(self) -> float | None:
        if self.major_faults is None:
            return None
        return self.major_faults / (self.count * self.calls_per_sample)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def iqr_s(self) -> float:
        return iqr(self.samples_s)

    @property
    def rel_iqr(self) -> float:
        """IQR / median; torch.utils.benchmark warns above 0.1."""
        median = self.median_s
        return self.iqr_s / median if median > 0 else math.inf

    @property
    def count(self) -> int:
        return len(self.samples_s)

    @property
    def ci_s(self) -> tuple[float, float]:
        """The median's 95% confidence interval, seconds ((nan, nan) under 6 samples)."""
        return median_ci(self.samples_s)

    @property
    def rel_ci(self) -> float:
        """How far that interval reaches from the median, as a share of it (inf: none)."""
        return float(rel_ci(self.median_s, *self.ci_s))


def iqr(samples: tuple[float, ...] | list[float]) -> float:
    """Interquartile range, linearly interpolated as numpy's default percentile (the
    "inclusive" method), in 1 µs rather than numpy's 30: the stopping rule reads it between
    blocks, and a sweep reads it tens of thousands of times."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return float(q3 - q1)


@dataclass(frozen=True)
class TimingPolicy:
    """When to stop repeating.

    A block is made long enough (``min_block_s``) that the timer's own overhead vanishes.
    Sampling stops, never before ``min_samples`` samples, once the median is known precisely
    (its 95% confidence interval within ``target_rel_ci`` of it) after at least ``min_time_s``,
    as nvbench stops on its noise criterion; else once ``budget_s`` of timed time is spent, or
    at ``max_samples``. A block never holds more than ``max_block_calls`` calls (a clock that
    reads 0 for a fast call would otherwise grow it without end).
    """

    warmup_calls: int = 2
    min_block_s: float = 2e-3
    min_samples: int = 10
    max_samples: int = 10_000
    target_rel_ci: float = 0.02
    min_time_s: float = 0.05
    budget_s: float = 0.25
    max_block_calls: int = 1_000_000
    timer: str = Timer.BLOCKS.value  # what a sample times (``schema.Timer``): text on the wire


DEFAULT_POLICY = TimingPolicy()
# A block is sized this far past min_block_s: sized to it exactly, one fast case in three fell
# short and its block was thrown away (0.55 s of a warm default sweep here; 0.21 s at 1.25).
BLOCK_MARGIN = 1.25


def time_call(
    fn: Callable[[], object],
    policy: TimingPolicy = DEFAULT_POLICY,
    *,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] = _no_sync,
    faults: FaultCounter | None = None,
    read_clock: Callable[[], float | None] | None = None,
) -> TimingStats:
    """Time ``fn`` (one layer call) and return per-call samples.

    ``sync`` waits for queued device work (``torch.cuda.synchronize`` on CUDA); it runs before a
    block starts and before its end is read, so asynchronous kernels are inside the measurement.
    ``faults`` (a process's fault counters) is read around each block, outside the clock, and
    ``read_clock`` (the device's SM clock) after it.
    Python's cyclic garbage collector is off inside each block, as timeit and
    torch.utils.benchmark have it: its pauses grow with every object the process holds (the
    tool's own, pandas'), not with the layer; ``ssm``, a Python loop, read 3% slower with it on.
    """
    per_block: list[tuple[int, int]] = []  # (minor, major) faults of each timed block
    clocks: list[float | None] = []  # the device's clock after each timed block

    def timed_block(calls: int) -> float:
        sync()
        before = faults() if faults else (0, 0)
        collecting = gc.isenabled()
        gc.disable()  # as timeit does: a cyclic collection's pause depends on the process
        try:
            start = clock()
            for _ in range(calls):
                fn()
            sync()
            elapsed = clock() - start
        finally:
            if collecting:
                gc.enable()  # between blocks, outside the clock, garbage is collected
        if faults:
            after = faults()
            per_block.append((after[0] - before[0], after[1] - before[1]))
        if read_clock is not None:
            clocks.append(read_clock())
        return elapsed

    # The last warm-up call is timed, never a sample: it sizes the first block, so a fast call
    # is not probed again by a one-call block that would be thrown away.
    for _ in range(policy.warmup_calls - 1):
        fn()
    estimate = None
    if policy.warmup_calls > 0:
        sync()
        begin = clock()
        fn()
        sync()
        estimate = clock() - begin
    sync()

    # Size the block from that call (or from a one-call probe), then grow it until a block is
    # long enough; a block sized BLOCK_MARGIN past min_block_s rarely falls short and is wasted.
    calls = 1
    if estimate is not None and 0 < estimate < policy.min_block_s:
        calls = math.ceil(BLOCK_MARGIN * policy.min_block_s / estimate)
        calls = min(calls, policy.max_block_calls)
    probe = timed_block(calls)
    while (
        probe < policy.min_block_s
        and probe * 2 < policy.budget_s
        and calls < policy.max_block_calls
    ):
        grown = math.ceil(calls * BLOCK_MARGIN * policy.min_block_s / max(probe, 1e-9))
        calls = min(max(calls * 2, grown), policy.max_block_calls)
        probe = timed_block(calls)

    samples: list[float] = [probe / calls]
    total = probe
    del per_block[:-1]  # the calibration's blocks are not samples; its last one is
    del clocks[:-1]
    while (stop := _stop(samples, total, policy)) is None:
        elapsed = timed_block(calls)
        total += elapsed
        samples.append(elapsed / calls)
    return TimingStats(
        samples_s=tuple(samples),
        calls_per_sample=calls,
        total_s=total,
        faults=tuple(minor / calls for minor, _ in per_block) if faults else None,
        major_faults=sum(major for _, major in per_block) if faults else None,
        stop=stop,
        clocks_mhz=tuple(clocks) if read_clock is not None else None,
    )


def sample_until(
    sample: Callable[[], float],
    policy: TimingPolicy = DEFAULT_POLICY,
    *,
    clock: Clock = time.perf_counter,
    read_clock: Callable[[], float | None] | None = None,
    wall_factor: float = 4.0,
) -> TimingStats:
    """Samples that time themselves (``sample()`` returns one call's seconds, read on the
    device's own clock: CUDA events), under ``time_call``'s stopping rule: ``policy``'s
    warm-up samples thrown away, then at least ``min_samples``, until the median is precise
    or the sampled seconds reach the budget. What each sample costs besides itself (a held
    stream, a flushed cache, the synchronisation) is bounded too: sampling stops once
    ``wall_factor`` times the budget has passed on ``clock``."""
    for _ in range(policy.warmup_calls):
        sample()
    samples: list[float] = []
    clocks: list[float | None] = []
    total = 0.0
    begin = clock()
    overrun = lambda: clock() - begin >= wall_factor * policy.budget_s  # noqa: E731
    while (stop := _stop(samples, total, policy, overrun)) is None:
        seconds = sample()
        if read_clock is not None:
            clocks.append(read_clock())
        total += seconds
        samples.append(seconds)
    return TimingStats(
        samples_s=tuple(samples),
        calls_per_sample=1,
        total_s=total,
        stop=stop,
        clocks_mhz=tuple(clocks) if read_clock is not None else None,
    )


def _stop(
    samples: list[float],
    total: float,
    policy: TimingPolicy,
    overrun: Callable[[], bool] = lambda: False,
) -> Stop | None:
    """The rule that ends sampling now (None: take another sample): never before
    ``min_samples``; precise once the median is known to the target after ``min_time_s``;
    budget once ``total`` seconds of samples (or ``overrun``) reach it; else max samples."""
    if len(samples) >= policy.max_samples:
        return Stop.MAX_SAMPLES
    if len(samples) < policy.min_samples:
        return None
    if total >= min(policy.min_time_s, policy.budget_s) and _precise(samples, policy):
        return Stop.PRECISE
    if total >= policy.budget_s or overrun():
        return Stop.BUDGET
    return None


def _precise(samples: list[float], policy: TimingPolicy) -> bool:
    """Whether the median's confidence interval is within the policy's target of it (a
    median of zero, a clock that never moved, never is)."""
    median = statistics.median(samples)
    return median > 0 and bool(rel_ci(median, *median_ci(samples)) <= policy.target_rel_ci)
