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
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from attnbench.estimators import (
    IMPRECISE_REL_CI,
    Between,
    Estimate,
    estimate,
    iqr,
    kept_rounds,
    log_variance,
    median_ci,
    rel_ci,
)
from attnbench.measure.timing.contention import is_busy
from attnbench.measure.timing.faults import FaultCounter
from attnbench.priors import Prior
from attnbench.schema import Timer
from attnbench.spec import DEFAULT_PRECISION

Clock = Callable[[], float]  # returns seconds


class Stop(str, enum.Enum):
    """Which rule ended a case's sampling (results.csv's ``time_stop``)."""

    PRECISE = "precise"  # the time's 95% interval reached the policy's target
    BUDGET = "budget"  # the timing budget was spent first
    MAX_SAMPLES = "max samples"
    MAX_ROUNDS = "max rounds"  # the rounds a sweep adds ran out, the interval still wide
    CODE_CHANGED = "code changed"  # its layer's code changed since its rounds began (a resume)


def is_imprecise(time_s: Any, ci_low_s: Any, ci_high_s: Any) -> Any:
    """The time's 95% interval reaches more than ``IMPRECISE_REL_CI`` of it away (or
    there were too few samples for one); floats and pandas columns alike."""
    return rel_ci(time_s, ci_low_s, ci_high_s) > IMPRECISE_REL_CI


def _no_sync() -> None:
    return None


@dataclass(frozen=True)
class TimingStats:
    """Per-call times of one case: each sample is a block of ``calls_per_sample`` calls, divided.

    Samples of several timing rounds (each, by default, a process of its own) carry their
    round in ``rounds``; the time and its interval are then taken over the rounds
    (``estimators.estimate``), never over the samples pooled.
    """

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
    rounds: tuple[int, ...] | None = None  # each sample's timing round (None: all one round)
    # Each sample's round's machine reference (``measure.timing.reference``, seconds; None: not
    # read),
    # and the run's quiet level of it: rounds read disturbed are left out of the estimate.
    references_s: tuple[float | None, ...] | None = None
    quiet_s: float | None = None
    # Each sample's round's cores of other processes' CPU beside it (``measure.timing.
    # contention``; None: not read): a round beside a busy neighbour is left out as well.
    others_cores: tuple[float | None, ...] | None = None
    prior: Prior | None = None  # the run's typical spread between rounds (estimators.Prior)
    # The case's spread between this machine's sweeps (estimators.Between; None: none known)
    between: Between | None = None
    waited_s: float = 0.0  # seconds the round waited for a quiet machine before it timed
    # What ended the case's rounds where the sweep recorded it (``run.rounds.Replication.
    # stop_of``; None: not recorded): ``overall_stop`` reads it.
    rounds_stop: Stop | None = None
    precision: float = DEFAULT_PRECISION  # the run's --precision: rounds were added until it
    # Blocks of the round left out of its samples as warm-up, its settled heap grown again in
    # them (``_kept``); samples.csv's ``blocks_left_out`` (None: not recorded).
    left_out: int | None = None

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

    def groups(self) -> list[list[float]]:
        """The samples by timing round, first round first (one group without rounds)."""
        return [samples for samples, _, _ in self._rounds()]

    def _rounds(self) -> list[tuple[list[float], float | None, bool]]:
        """Each round's samples, its machine reference and whether it ran beside a busy
        neighbour (``contention.is_busy``), first round first."""
        rounds = self.rounds or (0,) * self.count
        references = self.references_s or (None,) * self.count
        others = self.others_cores or (None,) * self.count
        by_round: dict[int, tuple[list[float], float | None, bool]] = {}
        for round_, sample, ref, beside in zip(
            rounds, self.samples_s, references, others, strict=True
        ):
            by_round.setdefault(round_, ([], ref, is_busy(beside)))[0].append(sample)
        return [by_round[r] for r in sorted(by_round)]

    @functools.cached_property
    def estimate(self) -> Estimate:
        """The time and its interval over the rounds (``estimators.estimate``), rounds read
        disturbed left out."""
        return self._over_rounds(self.between)

    @functools.cached_property
    def run_estimate(self) -> Estimate:
        """The same over this run's rounds alone, without the spread between sweeps: what more
        rounds narrow, so what the stopping rule reads."""
        return self._over_rounds(None)

    def _over_rounds(self, between: Between | None) -> Estimate:
        samples, references, busy = self._by_round()
        return estimate(samples, references, self.quiet_s, self.prior, between=between, busy=busy)

    def _by_round(self) -> tuple[list[list[float]], list[float | None], list[bool]]:
        rounds = self._rounds()
        return [s for s, _, _ in rounds], [r for _, r, _ in rounds], [b for _, _, b in rounds]

    def kept_variance(self) -> tuple[float | None, float]:
        """The variance of the logs of its kept rounds' medians and its degrees of freedom (a
        run's ``Prior`` reads them, ``estimators.prior_of``)."""
        samples, references, busy = self._by_round()
        kept, _, _ = kept_rounds(samples, references, self.quiet_s, busy)
        return log_variance(kept), len(kept) - 1.0

    @property
    def median_s(self) -> float:
        """Seconds per call: the samples' median in one round; over several, the rounds'
        medians' geometric mean (``estimators.estimate``)."""
        return self.estimate.center_s

    @property
    def iqr_s(self) -> float:
        return iqr(self.samples_s)

    @property
    def count(self) -> int:
        return len(self.samples_s)

    @property
    def overall_stop(self) -> Stop | None:
        """The rule that ended the case: one round's own, or over several, precise where their
        interval reaches the run's ``precision``, else what the sweep recorded ended its rounds
        (precise, budget), or max rounds (also where nothing was recorded)."""
        if len(set(self.rounds or ())) < 2:
            return self.stop
        reach = self.run_estimate.rounds_rel_ci  # what more rounds could have narrowed
        if reach <= self.precision:
            return Stop.PRECISE
        return self.rounds_stop or Stop.MAX_ROUNDS

    @property
    def ci_s(self) -> tuple[float, float]:
        """The time's 95% interval (a re-run's, over rounds), seconds ((nan, nan) where there
        is none: one round of under 6 samples)."""
        return self.estimate.low_s, self.estimate.high_s

    @property
    def rel_ci(self) -> float:
        """How far that interval reaches from the median, as a share of it (inf: none)."""
        return float(rel_ci(self.median_s, *self.ci_s))


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
    # Seconds of calls after the warm-up calls, before the first sample: a fresh process's
    # first blocks run slow while its pages fault in and its caches fill.
    warmup_s: float = 0.0
    # The machine's quiet reference (``measure.timing.reference``), and the seconds a round
    # may wait for the machine to read quiet before it times (0: none; the sweep sets both).
    quiet_s: float | None = None
    wait_s: float = 0.0
    # Seconds of the energy pass after the first round's timed calls (``measure.timing.energy``,
    # --energy; 0: none).
    energy_s: float = 0.0
    # Seconds of calls, at the most, after the warm-up, while the heap still grows
    # (``_settle_heap``; 0: none).
    settle_s: float = 0.1


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

    first_call_s, quiet = _warm_up(fn, policy, clock, sync, faults)
    settled = faults is not None and _settle_heap(fn, policy.settle_s, faults, clock, sync, quiet)
    calls, probe = _block_size(timed_block, first_call_s, policy)
    del per_block[:-1]  # the calibration's blocks are not samples; its last one is
    del clocks[:-1]
    times, total = [probe / calls], probe  # every block's seconds a call, the probe first
    kept = _kept(1, per_block, calls, settled)  # the probe too may have grown the heap
    while (stop := _stop([times[i] for i in kept], total, policy)) is None:
        elapsed = timed_block(calls)
        times.append(elapsed / calls)
        total += elapsed
        kept = _kept(len(times), per_block, calls, settled)
    samples = [times[i] for i in kept]
    if faults:
        per_block[:] = [per_block[i] for i in kept]
    if read_clock is not None:
        clocks[:] = [clocks[i] for i in kept]
    return TimingStats(
        samples_s=tuple(samples),
        calls_per_sample=calls,
        total_s=total,
        faults=tuple(minor / calls for minor, _ in per_block) if faults else None,
        major_faults=sum(major for _, major in per_block) if faults else None,
        stop=stop,
        clocks_mhz=tuple(clocks) if read_clock is not None else None,
        left_out=len(times) - len(kept),
    )


def _kept(blocks: int, per_block: list[tuple[int, int]], calls: int, settled: bool) -> list[int]:
    """Which of ``blocks`` blocks are samples: all but those in which a settled heap grew again
    (over ``SETTLED_FAULTS`` a call), while they are ``MAX_GREW`` or fewer; past that the heap
    grows as the layer runs, and every block is one (as is every block of a process whose
    faults are not counted)."""
    grew = [settled and minor > SETTLED_FAULTS * calls for minor, _ in per_block]
    if len(grew) != blocks or sum(grew) > MAX_GREW:
        return list(range(blocks))
    return [i for i, g in enumerate(grew) if not g]


def _warm_up(
    fn: Callable[[], object],
    policy: TimingPolicy,
    clock: Clock,
    sync: Callable[[], None],
    faults: FaultCounter | None = None,
) -> tuple[float | None, int]:
    """The policy's warm-up calls; the last is timed, never a sample (None: no warm-up): it
    sizes the first block, so a fast call is not probed again by a one-call block that would
    be thrown away. With ``faults``, also how many of its last calls in a row left the heap
    as they found it (``_settle_heap`` counts them)."""
    quiet = 0

    def call(timed: bool = False, counted: bool = True) -> float:
        nonlocal quiet
        counted = counted and faults is not None
        before = faults()[0] if faults and counted else 0
        took = 0.0
        if timed:
            sync()
            begin = clock()
            fn()
            sync()
            took = clock() - begin
        else:
            fn()
        if faults and counted:
            quiet = quiet + 1 if faults()[0] - before <= SETTLED_FAULTS else 0
        return took

    for _ in range(policy.warmup_calls - 1):
        call()
    first_call_s = call(timed=True) if policy.warmup_calls > 0 else None
    if first_call_s is not None and first_call_s > 0 and policy.warmup_s > first_call_s:
        more = min(math.ceil(policy.warmup_s / first_call_s) - 1, policy.max_block_calls)
        for i in range(more):  # the faults of the last few alone: a 10 µs call makes hundreds
            call(counted=i >= more - SETTLED_CALLS)
    sync()
    return first_call_s, quiet


# A call that faults at most this many pages leaves the heap as it found it: one still growing
# (glibc carving a tensor past the heap's top, each fresh page faulted and zeroed) faults
# thousands: explicit attention at n = 1024 faulted 4,098 pages (its 16 MiB of weights) in
# four of its first five calls in a fresh process, at 1.8x the time of the calls after.
SETTLED_FAULTS = 16
SETTLED_CALLS = 2  # calls in a row under SETTLED_FAULTS that settle the heap
SETTLE_MAX_CALLS = 20
# A heap that settled can grow again later: a small block left in a freed tensor's place splits
# it, and the next call carves that tensor past the top. A block that faults over
# SETTLED_FAULTS a call is then taken as warm-up, not a sample, up to this many a round; past
# them the heap grows as the layer runs, and every block is a sample again (none left out, so
# a steady growth is timed, not its quiet blocks alone). In two sweeps of attention and
# ssm-scan at n = 512, 1024 on 2026-11-30, 5-14 of 48 rounds had such a block (500-4,100
# faults a call), reading up to 1.8x the round's other blocks.
MAX_GREW = 3


def _settle_heap(
    fn: Callable[[], object],
    settle_s: float,
    faults: FaultCounter,
    clock: Clock,
    sync: Callable[[], None],
    quiet: int = 0,
) -> bool:
    """Calls after the warm-up until the heap stops growing: ``SETTLED_CALLS`` in a row that
    fault at most ``SETTLED_FAULTS`` pages each (the warm-up's last ``quiet`` calls count:
    a 30 ms call was called twice more otherwise), within ``settle_s`` seconds and
    ``SETTLE_MAX_CALLS`` calls. A fresh process's heap grows over its first calls as glibc
    places each size anew; a sample taken while it grows times the kernel zeroing pages, and
    a round that took it read 1.3-1.8x the others of its case (``ssm-scan`` at n = 1024: 9.9-10.4
    ms in rounds without faults, 13.2-14.6 ms in rounds with 500-1,000 a call, 2026-11-30). A
    heap that faults on every call (``--allocator system``) is not waited for past the limits.
    Whether the heap settled."""
    begin, settled = clock(), quiet
    for _ in range(SETTLE_MAX_CALLS):
        if settled >= SETTLED_CALLS or clock() - begin >= settle_s:
            break
        before = faults()[0]
        fn()
        sync()
        settled = settled + 1 if faults()[0] - before <= SETTLED_FAULTS else 0
    return settled >= SETTLED_CALLS


def _block_size(
    timed_block: Callable[[int], float], first_call_s: float | None, policy: TimingPolicy
) -> tuple[int, float]:
    """Calls a block, and the last block's seconds: sized from the warm-up's timed call (or a
    one-call probe), then grown until a block is long enough; a block sized BLOCK_MARGIN past
    min_block_s rarely falls short and is wasted."""
    calls = 1
    if first_call_s is not None and 0 < first_call_s < policy.min_block_s:
        calls = math.ceil(BLOCK_MARGIN * policy.min_block_s / first_call_s)
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
    return calls, probe


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
        left_out=0,  # a sample that times itself has no block to leave out
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
    if len(samples) < max(1, policy.min_samples):
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
