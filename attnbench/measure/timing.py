"""Wall-clock timing with warm-up, device synchronisation and adaptive repetition.

The clock and the synchronisation are plain callables so that tests can drive the logic with a
deterministic fake clock.  Raw samples are kept; statistics are derived from them.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.measure.faults import FaultCounter

Clock = Callable[[], float]  # returns seconds
NOISY_REL_IQR = 0.1  # IQR/median above this marks a noisy measurement (as torch.utils.benchmark)


def is_noisy(time_s: Any, iqr_s: Any) -> Any:
    """IQR above ``NOISY_REL_IQR`` of the median; works on floats and on pandas columns alike."""
    return iqr_s > NOISY_REL_IQR * time_s


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
    Sampling stops, never before ``min_samples`` samples, once ``budget_s`` of timed time is
    spent, or earlier once the spread is small (IQR/median at most ``target_rel_iqr``) after at
    least ``min_time_s`` (as torch.utils.benchmark's adaptive_autorange), or at ``max_samples``.
    A block never holds more than ``max_block_calls`` calls (a clock that reads 0 for a fast call
    would otherwise grow it without end).
    """

    warmup_calls: int = 2
    min_block_s: float = 10e-3
    min_samples: int = 10
    max_samples: int = 10_000
    target_rel_iqr: float = 0.02
    min_time_s: float = 0.1
    budget_s: float = 0.25
    max_block_calls: int = 1_000_000


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
) -> TimingStats:
    """Time ``fn`` (one layer call) and return per-call samples.

    ``sync`` waits for queued device work (``torch.cuda.synchronize`` on CUDA); it runs before a
    block starts and before its end is read, so asynchronous kernels are inside the measurement.
    ``faults`` (a process's fault counters) is read around each block, outside the clock.
    Python's cyclic garbage collector is off inside each block, as timeit and
    torch.utils.benchmark have it: its pauses grow with every object the process holds (the
    tool's own, pandas'), not with the layer; ``ssm``, a Python loop, read 3% slower with it on.
    """
    per_block: list[tuple[int, int]] = []  # (minor, major) faults of each timed block

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
    while len(samples) < policy.max_samples:
        if len(samples) >= policy.min_samples:
            if total >= policy.budget_s:
                break
            if total >= min(policy.min_time_s, policy.budget_s):  # the spread may end it now
                median = statistics.median(samples)
                if median > 0 and iqr(samples) / median <= policy.target_rel_iqr:
                    break
        elapsed = timed_block(calls)
        total += elapsed
        samples.append(elapsed / calls)
    return TimingStats(
        samples_s=tuple(samples),
        calls_per_sample=calls,
        total_s=total,
        faults=tuple(minor / calls for minor, _ in per_block) if faults else None,
        major_faults=sum(major for _, major in per_block) if faults else None,
    )
