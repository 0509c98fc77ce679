"""The timers beside the default blocks (``timing.Timer``): the kernels alone, and a cold cache.

- ``kernels``: the call captured into a CUDA graph (several calls to a graph, so that one replay
  runs for about ``GRAPH_S``), each replay timed alone between CUDA events on an idle device,
  as Triton's ``do_bench_cudagraph`` times it. A replay launches every kernel of the graph at
  once, so the Python, module calls, the dispatcher and the launches of eager calls vanish;
  the graph's own launch stays inside, shared by its calls. Replays timed back to back hid it
  (a replay queued behind another launches while that one runs): on an H200 they read 0.84-0.93
  of ``do_bench_cudagraph`` on five cases of 22 (ssm at n = 256: 693 against 880 µs), while one
  replay between events read as it does (858 µs). A call that cannot be captured (a host
  synchronisation inside it, a CPU op) is timed as ``cold`` is, without the flush, and the
  method says so.
- ``cold``: one call between two CUDA events, with the L2 flushed before it, by writing a
  buffer twice the L2's size (as Triton's ``do_bench`` does; its 256 MB is replaced by the
  device's own L2 size). A flush was chosen over rotating inputs through buffers larger than
  the L2 (flashinfer's way under graphs) because a layer's weights live in its module: rotating
  them would mean copies of the module, and the weights would stay hot. Before the events the
  stream is held by a spinning kernel (``torch.cuda._sleep``, nvbench's blocking kernel) long
  enough for the host to queue the whole call behind it, so the events see the kernels run
  back to back, not the host issuing them.

Both run only on CUDA: on the CPU a call's time is its kernels and its overhead together, and
``kernel_time_s`` splits them.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from attnbench.errors import first_line
from attnbench.measure.timing.clocks import clock_probe
from attnbench.measure.timing.faults import FaultCounter
from attnbench.measure.timing.loop import (
    Clock,
    TimingPolicy,
    TimingStats,
    sample_until,
    time_call,
)
from attnbench.measure.timing.split import KernelSplit, kernel_split, split_of
from attnbench.schema import Timer

GRAPH_S = 1e-3  # a graph holds enough calls for one replay to run about this long
MAX_GRAPH_CALLS = 64
HOLD_MARGIN = 1.5  # the stream is held this many times the host's time for one call
MAX_HOLD_S = 0.25  # ... and never longer: a slower host's launches show in the time
BLOCKS_METHOD = "blocks: synchronised blocks of back-to-back calls"
REPLAYS_METHOD = "kernels: CUDA graph replays"  # how time_method begins for graph replays
Probe = Callable[[], float | None]


class DeviceTimers(Protocol):
    """What the timers ask of a CUDA device (``CudaTimers``; tests pass fakes)."""

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object]:
        """A replay of ``calls`` calls of ``fn`` captured into one graph (raises when the call
        cannot be captured)."""
        ...

    def event_time(self, fn: Callable[[], object], hold_s: float, cold: bool) -> float:
        """Seconds between CUDA events around one call, the stream held ``hold_s`` before it
        and, ``cold``, the L2 flushed before that."""
        ...

    def replay_time(self, replay: Callable[[], object]) -> float:
        """Seconds between CUDA events around one ``replay`` of a captured graph, the device
        idle before it: its launch and its kernels."""
        ...

    def flush_bytes(self) -> int:
        """Bytes a flush writes (twice the L2)."""
        ...


@dataclass(frozen=True)
class Timed:
    """A case's timing statistics and how they were taken (results.csv's ``time_method``)."""

    stats: TimingStats
    method: str
    replays: bool = False  # the samples are CUDA graph replays: the call's kernels alone


def time_step(
    fn: Callable[[], object],
    policy: TimingPolicy,
    device: str,
    *,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
    faults: FaultCounter | None = None,
    read_clock: Probe | None = None,
    timers: DeviceTimers | None = None,
) -> Timed:
    """Time ``fn`` (one call of a case's layer) with ``policy.timer``, reading ``read_clock``
    with the samples (by default the device's SM clock, where it can be read)."""
    timer = Timer(policy.timer)
    read_clock = read_clock if read_clock is not None else clock_probe(device)
    if timer is Timer.BLOCKS:
        stats = time_call(fn, policy, clock=clock, sync=sync, faults=faults, read_clock=read_clock)
        return Timed(stats, BLOCKS_METHOD)
    if not device.startswith("cuda"):
        raise ValueError(f"the {timer.value} timer needs a CUDA device, not {device}")
    timers = timers if timers is not None else cuda_timers(device)
    if timer is Timer.KERNELS:
        try:
            calls, replay = graph_of(fn, timers, clock=clock, sync=sync)
        except Exception as exc:  # a call that cannot be captured: events, the stream held
            found = _events(
                fn, policy, timers, cold=False, clock=clock, sync=sync, read_clock=read_clock
            )
            why = first_line(exc)[:120]
            return Timed(found.stats, f"kernels: {found.method} (no graph: {why})")
        stats = sample_until(
            lambda: timers.replay_time(replay), policy, clock=clock, read_clock=read_clock
        ).per_call(calls)
        method = f"{REPLAYS_METHOD}, {calls} call(s) a graph, each replay between CUDA events"
        return Timed(stats, method, replays=True)
    found = _events(fn, policy, timers, cold=True, clock=clock, sync=sync, read_clock=read_clock)
    return Timed(found.stats, f"cold: {found.method}")


# A split's graph replays: a few samples suffice, their median is a kernel's steady time.
SPLIT_POLICY = TimingPolicy(warmup_calls=1, min_samples=5, budget_s=0.05, min_time_s=0.01)


def device_split(
    fn: Callable[[], object],
    device: str,
    call_s: float,
    ops: int | None = None,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
    replays: bool = False,
    *,
    timers: DeviceTimers | None = None,
) -> KernelSplit:
    """A call's split into kernels and overhead (``measure.timing.split``). On CUDA the kernels'
    time is that of a CUDA graph of the call, its replays timed back to back: the kernels the call
    runs, without the host's Python, dispatch and launches. Where the call cannot be captured,
    the profiler's busy time of the device is taken (``kernel_split``); elsewhere the
    profiler's split is the only one. A time taken from graph ``replays`` (``Timed.replays``)
    is the kernels' time itself: it is not taken again."""
    if replays:  # the time was taken from graph replays already
        return KernelSplit(1.0, call_s, call_s, 0, "the timed CUDA graph replays themselves")
    if device.startswith("cuda"):
        timers = timers if timers is not None else cuda_timers(device)
        try:
            calls, replay = graph_of(fn, timers, clock=clock, sync=sync)
        except Exception as exc:
            why = first_line(exc)[:100]
            found = kernel_split(fn, device, call_s, ops, clock=clock, sync=sync)
            return replace(found, method=f"{found.method} (no graph: {why})")
        stats = time_call(replay, SPLIT_POLICY, clock=clock, sync=sync).per_call(calls)
        kernel = stats.median_s
        return KernelSplit(
            share=split_of(kernel, call_s),
            kernel_s=kernel,
            wall_s=call_s,
            calls=stats.count * stats.calls_per_sample,
            method=f"CUDA graph replays, {calls} call(s) a graph: the call's kernels without "
            "the host's launches",
        )
    return kernel_split(fn, device, call_s, ops, clock=clock, sync=sync)


def graph_of(
    fn: Callable[[], object],
    timers: DeviceTimers,
    *,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
) -> tuple[int, Callable[[], object]]:
    """A graph of as many calls as run for about ``GRAPH_S`` (one call's graph timed first),
    and how many calls it holds."""
    one = timers.capture(fn, 1)
    one()  # a first replay uploads the graph
    sync()
    start = clock()
    one()
    sync()
    took = clock() - start
    calls = max(1, min(MAX_GRAPH_CALLS, math.ceil(GRAPH_S / max(took, 1e-7))))
    return (1, one) if calls == 1 else (calls, timers.capture(fn, calls))


def hold_for(fn: Callable[[], object], clock: Clock, sync: Callable[[], None]) -> float:
    """How long to hold the stream before a call: ``HOLD_MARGIN`` times one synchronised call
    (at least the host's time for it), at most ``MAX_HOLD_S``."""
    sync()
    start = clock()
    fn()
    sync()
    return min(MAX_HOLD_S, HOLD_MARGIN * (clock() - start))


def _events(
    fn: Callable[[], object],
    policy: TimingPolicy,
    timers: DeviceTimers,
    *,
    cold: bool,
    clock: Clock,
    sync: Callable[[], None],
    read_clock: Probe | None,
) -> Timed:
    hold = hold_for(fn, clock, sync)
    stats = sample_until(
        lambda: timers.event_time(fn, hold, cold), policy, clock=clock, read_clock=read_clock
    )
    flushed = (
        f", the L2 flushed ({timers.flush_bytes() / 1e6:.0f} MB written) before each"
        if cold
        else ""
    )
    return Timed(
        stats, f"CUDA events around each call behind a {hold * 1e6:.0f} µs held stream{flushed}"
    )


class CudaTimers:
    """``DeviceTimers`` of one CUDA device."""

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self._l2 = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        self._buffer: Any = None  # a tensor of flush_bytes(), made at the first flush

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object]:
        torch = self._torch
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            for _ in range(2):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        replay: Callable[[], object] = graph.replay
        return replay

    def flush_bytes(self) -> int:
        return 2 * self._l2

    def event_time(self, fn: Callable[[], object], hold_s: float, cold: bool) -> float:
        torch = self._torch
        with torch.cuda.device(self.device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if cold:
                if self._buffer is None:
                    self._buffer = torch.empty(
                        self.flush_bytes(), dtype=torch.int8, device=self.device
                    )
                self._buffer.zero_()
            if hold_s > 0:
                torch.cuda._sleep(int(hold_s * _cycles_per_s(str(self.device))))
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) * 1e-3

    def replay_time(self, replay: Callable[[], object]) -> float:
        torch = self._torch
        with torch.cuda.device(self.device):
            torch.cuda.current_stream(self.device).synchronize()  # idle: the launch shows
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) * 1e-3


@functools.cache
def cuda_timers(device: str) -> CudaTimers:
    return CudaTimers(device)


@functools.cache
def _cycles_per_s(device: str) -> float:
    """The spinning kernel's cycles per second on ``device``: it counts the SM's clock, so a
    hold is sized by timing spins between events. The fastest of three: a card idle before
    runs its first spin at a low clock, and a rate read there would hold too briefly later."""
    import torch

    rates = []
    with torch.cuda.device(torch.device(device)):
        cycles = 5_000_000
        torch.cuda._sleep(cycles // 10)  # warm: the first launch loads the kernel
        for _ in range(3):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / max(float(start.elapsed_time(end)) * 1e-3, 1e-6))
    return max(rates)
