"""A call's time split in two: the time its kernels ran, and the overhead around them.

The overhead is everything a call pays that is not a kernel computing: Python, module calls,
the dispatcher, an op's fixed set-up, kernel launches. The split is read by torch's profiler
over a few calls, outside the timed blocks:

- on the CPU, the kernels' time is each computing aten op's own (self) time, less what an op
  that computes next to nothing costs (``ProfilerCost.op_floor_s``: the dispatcher and the
  op's set-up) and less the profiler's own cost of recording the ops nested in it;
  views and renames compute nothing and count as overhead;
- on CUDA, it is the time the device was busy with the call's kernels (the union of their
  intervals, copies and fills included).

The share of the kernels is taken within the profiled calls (their wall time, the profiler's
measured cost per recorded op taken out), so a machine that is busier while they run than
while the case was timed does not move it; ``kernel_time_s`` is that share of ``time_s``.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.autograd.profiler import profile

from attnbench.measure.ops import ALIASES, is_view

Clock = Callable[[], float]
PROFILED_S = 0.01  # profile calls until about this much wall time (at least one call)
MAX_PROFILED_CALLS = 20
# ... and about this many recorded ops: reading them back costs ~5 µs an op, which for a
# recurrence of thousands of ops a call would cost more than the calls.
MAX_PROFILED_OPS = 3000


@dataclass(frozen=True)
class OpEvent:
    """One op the profiler recorded on the host: its name, own time, and ops nested in it."""

    name: str  # "aten::mm"
    self_s: float  # its own time, seconds (its nested ops' time excluded)
    children: int  # ops recorded inside it


@dataclass(frozen=True)
class Interval:
    """One kernel (or copy, or fill) the device ran, seconds on the device's clock."""

    start_s: float
    end_s: float


@dataclass(frozen=True)
class ProfilerCost:
    """What the profiler and the dispatcher cost per op on this process's host, measured.

    ``per_op_s``: the wall time the profiler adds per recorded op (profiled minus unprofiled
    time of a loop of tiny ops); an op's recording runs inside its parent's interval, so it is
    taken out of the parent's self time, and out of the profiled calls' wall time.
    ``op_floor_s``: the self time the profiler reads for an op that computes nothing but one
    element (an ``add`` into a one-element tensor): the dispatcher and the op's set-up.
    """

    per_op_s: float
    op_floor_s: float


@dataclass(frozen=True)
class KernelSplit:
    """The kernels' share of a call and how it was read."""

    share: float  # kernels' time / the call's time, in [0, 1]
    kernel_s: float  # kernels' seconds per profiled call (before scaling to time_s)
    wall_s: float  # wall seconds per profiled call, the profiler's cost taken out
    calls: int
    method: str

    def kernel_time_s(self, time_s: float) -> float:
        """The kernels' seconds of a call timed at ``time_s``: its share of it."""
        return self.share * time_s


@functools.cache
def _computes(name: str) -> bool:
    """Whether a recorded aten op computes: not a view or a rename of its input's memory."""
    op = name.removeprefix("aten::")
    if op in ALIASES:
        return False
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return True
    overloads = [getattr(packet, o) for o in packet.overloads()]
    return not (overloads and all(is_view(o) for o in overloads))


def host_kernel_seconds(events: Iterable[OpEvent], cost: ProfilerCost) -> float:
    """Seconds the computing ops ran, over ``events``: each op's own time less the profiler's
    cost of the ops nested in it and less the floor of an op that computes nothing."""
    total = 0.0
    for event in events:
        if not event.name.startswith("aten::") or not _computes(event.name):
            continue
        own = event.self_s - event.children * cost.per_op_s - cost.op_floor_s
        total += max(0.0, own)
    return total


def busy_seconds(intervals: Iterable[Interval]) -> float:
    """Seconds the device was busy: the union of the intervals (kernels on several streams
    that overlap count once)."""
    total, end = 0.0, -math.inf
    for interval in sorted(intervals, key=lambda i: i.start_s):
        start = max(interval.start_s, end)
        if interval.end_s > start:
            total += interval.end_s - start
        end = max(end, interval.end_s)
    return total


def split_of(kernel_s: float, wall_s: float, ops: float, cost: ProfilerCost) -> float:
    """The kernels' share of profiled calls: ``kernel_s`` over the calls' ``wall_s`` with
    the profiler's cost of ``ops`` recorded ops taken out, in [0, 1] (per call or in total)."""
    unprofiled = wall_s - ops * cost.per_op_s
    if unprofiled <= 0:
        return 1.0 if kernel_s > 0 else 0.0
    return min(1.0, max(0.0, kernel_s / unprofiled))


@dataclass(frozen=True)
class Profiled:
    """What one profile of ``calls`` calls recorded."""

    calls: int
    wall_s: float  # all the calls together, profiler running
    ops: list[OpEvent]  # host ops
    device: list[Interval]  # device kernels (empty on the CPU)


def _record(fn: Callable[[], object], calls: int, device: str, clock: Clock,
            sync: Callable[[], None]) -> Profiled:  # fmt: skip
    """Profile ``calls`` calls of ``fn``: host ops with their own times, and on CUDA the
    device's kernels."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "10")  # keep Kineto's session lines off stderr
    on_cuda = device.startswith("cuda")
    collecting = gc.isenabled()
    gc.disable()
    try:
        with profile(use_device="cuda" if on_cuda else None) as prof:
            sync()
            start = clock()
            for _ in range(calls):
                fn()
            sync()
            wall = clock() - start
    finally:
        if collecting:
            gc.enable()
    host: list[tuple[int, int, int, str]] = []  # (thread, start, end, name), ns
    kernels = []
    for e in prof.kineto_results.events():
        kind = e.device_type()
        if kind == torch.autograd.DeviceType.CPU:
            start = e.start_ns()
            host.append((e.start_thread_id(), start, start + e.duration_ns(), e.name()))
        elif on_cuda and kind == torch.autograd.DeviceType.CUDA:
            start_s = e.start_ns() * 1e-9
            kernels.append(Interval(start_s, start_s + e.duration_ns() * 1e-9))
    return Profiled(calls, wall, nest(host), kernels)


def nest(spans: list[tuple[int, int, int, str]]) -> list[OpEvent]:
    """Host ops from their (thread, start, end, name) spans in nanoseconds: an op inside
    another's span on the same thread is nested in it, and its time is not the outer op's
    own."""
    found: list[OpEvent] = []
    ordered = sorted(spans, key=lambda s: (s[0], s[1], -s[2]))
    stack: list[list] = []  # [thread, end, name, own ns, children] of the ops still open

    def close(frame: list) -> None:
        found.append(OpEvent(frame[2], frame[3] * 1e-9, frame[4]))

    for thread, start, end, name in ordered:
        while stack and (stack[-1][0] != thread or stack[-1][1] <= start):
            close(stack.pop())
        if stack:
            stack[-1][3] -= end - start  # the outer op's own time leaves this one out
            stack[-1][4] += 1
        stack.append([thread, end, name, end - start, 0])
    while stack:
        close(stack.pop())
    return found


Recorder = Callable[[Callable[[], object], int, str], Profiled]


@functools.cache
def profiler_cost(repeats: int = 5, loop: int = 400) -> ProfilerCost:
    """``ProfilerCost`` of this process's host, measured once: a loop of one-element adds,
    timed plain and under the profiler (medians of ``repeats`` each)."""
    x, y, out = torch.ones(1), torch.ones(1), torch.empty(1)

    def tiny() -> None:
        for _ in range(loop):
            torch.add(x, y, out=out)

    tiny()
    plain, profiled, floors = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tiny()
        plain.append(time.perf_counter() - start)
        found = _record(tiny, 1, "cpu", time.perf_counter, lambda: None)
        profiled.append(found.wall_s)
        floors.append(statistics.median(e.self_s for e in found.ops))
        ops = len(found.ops)
    per_op = max(0.0, (statistics.median(profiled) - statistics.median(plain)) / ops)
    return ProfilerCost(per_op, statistics.median(floors))


def kernel_split(
    fn: Callable[[], object],
    device: str,
    call_s: float,
    ops: int | None = None,
    *,
    cost: ProfilerCost | None = None,
    record: Recorder | None = None,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
) -> KernelSplit:
    """Profile a few calls of ``fn`` (one call takes about ``call_s`` and dispatches about
    ``ops`` ops, where known) and split them.

    ``cost`` and ``record`` are this host's profiler cost and the profiler itself by default;
    tests pass their own.
    """
    calls = min(MAX_PROFILED_CALLS, math.ceil(PROFILED_S / max(call_s, 1e-9)))
    if ops:
        calls = min(calls, MAX_PROFILED_OPS // ops)
    calls = max(1, calls)
    cost = cost if cost is not None else profiler_cost()
    found = (
        record(fn, calls, device)
        if record is not None
        else _record(fn, calls, device, clock, sync)
    )
    on_device = device.startswith("cuda")
    kernel = busy_seconds(found.device) if on_device else host_kernel_seconds(found.ops, cost)
    share = split_of(kernel, found.wall_s, len(found.ops), cost)
    where = "the device's kernels' busy time" if on_device else "the aten ops' own time"
    method = (
        f"profiled: {found.calls} call(s), {where}; the profiler's "
        f"{cost.per_op_s * 1e6:.2f} µs a recorded op and an op's floor "
        f"{cost.op_floor_s * 1e6:.2f} µs taken out"
    )
    return KernelSplit(
        share=share,
        kernel_s=kernel / found.calls,
        wall_s=(found.wall_s - len(found.ops) * cost.per_op_s) / found.calls,
        calls=found.calls,
        method=method,
    )
