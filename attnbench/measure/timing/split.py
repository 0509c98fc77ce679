"""A call's time split in two: the time its kernels ran, and the overhead around them.

The overhead is everything a call pays that is not a kernel computing: Python, module calls,
the dispatcher, an op's fixed set-up, kernel launches. The split is read by torch's profiler
over a few calls, outside the timed blocks, with as many calls timed unprofiled around them:

- on the CPU, the kernels' time is each computing aten op's own (self) time (and a compiled
  call's generated kernels', ``measure.compiled``), less what an op
  that computes one element takes (``ProfilerCost.op_floor_s``: the dispatcher and the op's
  set-up), and less the profiler's own cost of recording the ops nested in it; views and
  renames compute nothing and count as overhead;
- on CUDA, it is the time the device was busy with the call's kernels (the union of their
  intervals, copies and fills included).

The kernels' share is their time over the calls' own time without the profiler: the
profiled calls' wall time less the host's calibrated cost per recorded op, or, where the
recording is a large part of it (thousands of small ops), the unprofiled calls' measured
around them, whose difference is then the cost. A machine busier while they run than while
the case was timed does not move it; ``kernel_time_s`` is that share of ``time_s``.
"""

from __future__ import annotations

import functools
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.autograd import DeviceType  # type: ignore[attr-defined]  # exported, not declared
from torch.autograd.profiler import profile, record_function

from attnbench.measure.counts.ops import ALIASES, is_view
from attnbench.measure.timing.loop import TimingPolicy, TimingStats
from attnbench.schema import Timer

Clock = Callable[[], float]
PROFILED_S = 0.005  # profile calls until about this much wall time (at least one call)
MAX_PROFILED_CALLS = 20
# ... and about this many dispatched ops: the profiler records about four events an op
# (views included), each ~15 µs to stop the profiler, read back and nest: a recurrence of
# thousands of ops a call costs more to read than to run.
MAX_PROFILED_OPS = 1000


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
    """What the profiler and the dispatcher cost per op, measured.

    ``per_op_s``: the wall time the profiler adds per recorded op: profiled calls' wall time
    less the same calls' unprofiled, over the ops recorded. An op's recording runs inside its
    parent's interval, so it is taken out of the parent's self time.
    ``op_floor_s``: the self time the profiler reads for an op that computes one element (an
    ``add`` of one-element tensors): the dispatcher, the op's set-up, its output tensor.
    """

    per_op_s: float
    op_floor_s: float


@dataclass(frozen=True)
class KernelSplit:
    """The kernels' share of a call and how it was read."""

    share: float  # kernels' time / the call's time, in [0, 1]
    kernel_s: float  # kernels' seconds per profiled call (before scaling to time_s)
    wall_s: float  # wall seconds per call, unprofiled, around the profile
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


# How inductor names the kernels it generates for the CPU, in the profiler's events when
# ``cpp.enable_kernel_profile`` is on (``measure.compiled``): "graph_0_cpp_fused_add_mul_0".
_GENERATED = "_cpp_fused_"


def _generated(name: str) -> bool:
    """Whether a recorded event is a kernel inductor generated (a compiled call's kernels are
    its own and the aten ops it calls outside them, matrix products mostly)."""
    return _GENERATED in name


def host_kernel_seconds(events: Iterable[OpEvent], cost: ProfilerCost) -> float:
    """Seconds the computing ops ran, over ``events``: each op's own time less the profiler's
    cost of the ops nested in it and less the floor of an op that computes nothing."""
    total = 0.0
    for event in events:
        if not (
            _generated(event.name) or (event.name.startswith("aten::") and _computes(event.name))
        ):
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


def kernel_share(
    split: KernelSplit | None, timing: TimingStats | None, policy: TimingPolicy
) -> float | None:
    """The kernels' share of ``time_s``. The profiled calls are eager calls, as the blocks
    timer's are: their share carries over. The other timers time the kernels themselves, so
    the share is the profiled kernels' seconds over the time they read (at most 1)."""
    if split is None:
        return None
    if Timer(policy.timer) is Timer.BLOCKS or timing is None:
        return split.share
    return split_of(split.kernel_s, timing.median_s)


def split_of(kernel_s: float, plain_s: float) -> float:
    """The kernels' share of calls that took ``plain_s`` unprofiled, in [0, 1]."""
    if plain_s <= 0:
        return 1.0 if kernel_s > 0 else 0.0
    return min(1.0, max(0.0, kernel_s / plain_s))


@dataclass(frozen=True)
class Profiled:
    """What one profile of ``calls`` calls recorded, and the same calls unprofiled."""

    calls: int
    wall_s: float  # all the calls together, profiler running
    plain_s: float  # as many calls without it, around the profile (their mean)
    ops: list[OpEvent]  # host ops
    device: list[Interval]  # device kernels (empty on the CPU)
    # the median self time of one-element adds profiled just before the calls (nan: none)
    floor_s: float = math.nan

    @property
    def per_op_s(self) -> float:
        """The wall time the profiler added per recorded op (nan: no unprofiled calls)."""
        return max(0.0, (self.wall_s - self.plain_s) / len(self.ops)) if self.ops else 0.0


def _record(
    fn: Callable[[], object],
    calls: int,
    device: str,
    clock: Clock,
    sync: Callable[[], None],
    plain: bool = True,
) -> Profiled:
    """Profile ``calls`` calls of ``fn`` (with ``plain``, as many timed unprofiled before and
    after: else ``plain_s`` is nan): host ops with their own times, and on CUDA the device's
    kernels."""
    on_cuda = device.startswith("cuda")

    def timed() -> float:
        sync()
        start = clock()
        for _ in range(calls):
            fn()
        sync()
        return clock() - start

    collecting = gc.isenabled()
    gc.disable()
    try:
        before = timed() if plain else math.nan
        with profile(use_device="cuda" if on_cuda else None) as prof:
            with record_function(FLOOR_LABEL):
                _tiny_adds(FLOOR_OPS)
            wall = timed()
        unprofiled = (before + timed()) / 2 if plain else math.nan
    finally:
        if collecting:
            gc.enable()
    events = prof.kineto_results.events()
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    host = [
        (e.start_thread_id(), e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
        for e in events
        if e.device_type() == cpu
    ]  # (thread, start, end, name), ns
    kernels = [
        Interval(e.start_ns() * 1e-9, (e.start_ns() + e.duration_ns()) * 1e-9)
        for e in (events if on_cuda else ())
        if e.device_type() == gpu
    ]
    floor, ops = _floor_apart(host)
    return Profiled(calls, wall, unprofiled, ops, kernels, floor)


def _tiny_adds(count: int) -> None:
    """``count`` adds of one-element tensors: ops that compute next to nothing, and pay what
    an op pays besides (the dispatcher, its set-up, a new output tensor)."""
    x, y = torch.ones(1), torch.ones(1)
    for _ in range(count):
        torch.add(x, y)


def _floor_apart(spans: list[tuple[int, int, int, str]]) -> tuple[float, list[OpEvent]]:
    """The median self time of the ops inside the ``FLOOR_LABEL`` region (nan without one),
    and the call's own ops: every op outside it."""
    label = next((s for s in spans if s[3] == FLOOR_LABEL), None)
    if label is None:
        return math.nan, nest(spans)
    thread, start, end, _ = label

    def inside(span: tuple[int, int, int, str]) -> bool:
        return span[0] == thread and start <= span[1] and span[2] <= end

    floor = [e.self_s for e in nest([s for s in spans if inside(s) and s is not label])]
    own = nest([s for s in spans if not inside(s)])
    return (statistics.median(floor) if floor else math.nan), own


def nest(spans: list[tuple[int, int, int, str]]) -> list[OpEvent]:
    """Host ops from their (thread, start, end, name) spans in nanoseconds: an op inside
    another's span on the same thread is nested in it, and its time is not the outer op's
    own. (A recurrence records ~200k spans a call: the loop is kept plain.)"""
    found: list[OpEvent] = []
    append = found.append
    # the ops still open, innermost last: [thread, end, name, own ns, children]
    stack: list[list[Any]] = []
    for thread, start, end, name in sorted(spans, key=lambda s: (s[0], s[1], -s[2])):
        while stack and (stack[-1][0] != thread or stack[-1][1] <= start):
            done = stack.pop()
            append(OpEvent(done[2], done[3] * 1e-9, done[4]))
        if stack:
            outer = stack[-1]
            outer[3] -= end - start  # the outer op's own time leaves this one out
            outer[4] += 1
        stack.append([thread, end, name, end - start, 0])
    while stack:
        done = stack.pop()
        append(OpEvent(done[2], done[3] * 1e-9, done[4]))
    return found


Recorder = Callable[[Callable[[], object], int, str], Profiled]


# Ahead of a case's calls, inside the same profile, this many one-element adds give the op
# floor of that moment (a machine slowed by a neighbour slows its ops and its floor alike).
FLOOR_LABEL, FLOOR_OPS = "attnbench.op_floor", 100
# Where the profiler's recording would take at least this share of a call (the host's cost
# per op times the ops the call dispatches), its cost is measured on the case's own calls (as
# many timed unprofiled around them); below it, the host's calibrated cost per recorded op is
# taken out of the profiled calls' own wall time, which keeps the share immune to a slow call
# outside them.
OWN_COST_SHARE = 0.05


_HOST: list[ProfilerCost] = []  # this host's, once known (measured here, or handed in)


def use_profiler_cost(cost: ProfilerCost) -> None:
    """Take this host's profiler cost as measured in another process of it (a case's process
    before it, on the same fork server: ``run.executors.child``), so that a process made for
    one case need not measure it."""
    _HOST[:] = [cost]


def known_profiler_cost() -> ProfilerCost | None:
    """This host's profiler cost where this process measured it or was handed it, else None."""
    return _HOST[0] if _HOST else None


def profiler_cost(repeats: int = 7, loop: int = 200) -> ProfilerCost:
    """``ProfilerCost`` of this process's host, measured once a process (about 25 ms here; a
    later call's arguments are not read again): a loop of
    one-element adds, profiled between two plain runs (the median of ``repeats`` such
    differences), and the self time the profiler reads for one such add (where a profile has
    no floor of its own)."""
    if not _HOST:
        _HOST.append(_measured_cost(repeats, loop))
    return _HOST[0]


def _measured_cost(repeats: int, loop: int) -> ProfilerCost:

    def tiny() -> None:
        _tiny_adds(loop)

    tiny()
    found = [_record(tiny, 1, "cpu", time.perf_counter, lambda: None) for _ in range(repeats)]
    return ProfilerCost(
        statistics.median(f.per_op_s for f in found),
        statistics.median(e.self_s for f in found for e in f.ops),
    )


# A split is read from up to this many profiles, and the median share kept: one profile of a
# call of many tiny ops (ssm, a recurrence) read its kernels' share 0.37-0.82 over eight
# profiles in one process (ssm, n = 256, 2026-11-30), where conv's and lstm's read within 0.02
# (benchmarks/kernel_split.py --readings). Two readings within ``AGREE`` end it at two (their
# mean), and no profile is added that would bring the split past ``SPLIT_BUDGET_S`` (one of
# thousands of events costs tens of ms to read back).
READINGS, AGREE, SPLIT_BUDGET_S = 3, 0.05, 0.25
# A profile whose kernels read longer than this share of the call's own time did not split it:
# what it takes out (the profiler's cost, an op's floor) did not hold while it ran. A new
# user's rnn at n = 256 read 100% in both of its profiles (a floor of 1.59 µs and 1.38 µs an
# op, about twice this host's), between 31% at n = 128 and 512; a kernel-bound call reads
# 0.9-1.0. Such profiles are left out, and a split of none left records no share.
PAST_CALL = 1.1
TOP_SHARE = 0.99  # a share this high from one profile is checked by another, budget or not


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
    ``ops`` ops, where known) and split them: up to ``READINGS`` profiles, the median share.

    ``cost`` (the host's calibrated profiler cost and op floor) and ``record`` (the profiler)
    are this host's by default; tests pass their own.
    """
    start = clock()

    def read() -> KernelSplit:
        return _read_split(fn, device, call_s, ops, cost, record, clock, sync)

    readings = [read()]
    while len(readings) < READINGS:
        spent = clock() - start
        # one reading at the top of its range cannot be told from one past the call alone (ssm
        # at n = 2048 read 100% in a profile the budget let stand alone): a second is taken
        alone = len(readings) == 1 and readings[0].share >= TOP_SHARE
        if spent * (len(readings) + 1) / len(readings) > SPLIT_BUDGET_S and not alone:
            break  # another profile, as long as these, would pass the split's budget
        kept = [r for r in readings if _within_call(r)]
        if len(kept) == 2 and abs(kept[0].share - kept[1].share) <= AGREE:
            break
        readings.append(read())
    kept = [r for r in readings if _within_call(r)]
    if not kept:
        past = min(r.kernel_s / r.wall_s if r.wall_s > 0 else math.inf for r in readings)
        raise ValueError(
            f"its kernels read {past:.2f}x the call's own time or more in {len(readings)} "
            "profile(s): the profiler's cost and an op's floor, taken out, did not hold then"
        )
    found = median_split(kept)
    if len(kept) < len(readings):
        left = len(readings) - len(kept)
        found = replace(found, method=f"{found.method}; {left} profile(s) past the call left out")
    return found


def _within_call(reading: KernelSplit) -> bool:
    """Whether a profile's kernels read within ``PAST_CALL`` of the call's own time."""
    return reading.kernel_s <= PAST_CALL * reading.wall_s


def median_split(readings: list[KernelSplit]) -> KernelSplit:
    """The reading of the median share (of two, their mean), its method saying how many
    profiles were read and how far apart their shares lay."""
    if len(readings) == 1:
        return readings[0]
    ordered = sorted(readings, key=lambda r: r.share)
    low, high = ordered[0], ordered[-1]
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]  # one, or the two
    return KernelSplit(
        share=statistics.fmean(r.share for r in middle),
        kernel_s=statistics.fmean(r.kernel_s for r in middle),
        wall_s=statistics.fmean(r.wall_s for r in middle),
        calls=sum(r.calls for r in readings),
        # how the (first) middle profile was read: its calls, its floor, its cost per op
        method=f"{middle[0].method}; the median of {len(readings)} profiles' shares "
        f"({low.share:.2f}..{high.share:.2f})",
    )


def _read_split(
    fn: Callable[[], object],
    device: str,
    call_s: float,
    ops: int | None,
    cost: ProfilerCost | None,
    record: Recorder | None,
    clock: Clock,
    sync: Callable[[], None],
) -> KernelSplit:
    """One profile of ``fn``'s calls, split (``kernel_split``)."""
    calls = min(MAX_PROFILED_CALLS, math.ceil(PROFILED_S / max(call_s, 1e-9)))
    if ops:
        calls = min(calls, MAX_PROFILED_OPS // ops)
    calls = max(1, calls)
    host = cost if cost is not None else profiler_cost()
    # the recording a large part of the calls (thousands of small ops): its cost is read on
    # them, against as many unprofiled around them; ``ops`` unknown (a compiled call), the
    # plain calls are timed, and the ops the profile recorded decide
    own = ops is None or host.per_op_s * ops >= OWN_COST_SHARE * call_s
    found = (
        record(fn, calls, device)
        if record is not None
        else _record(fn, calls, device, clock, sync, plain=own)
    )
    if ops is None:
        # A few dozen events a call make the profiled calls' excess over the plain ones a
        # timing of its own, which a busy machine's noise swamps: read per event, it took
        # 15.88 µs and a compiled nn.MultiheadAttention's kernels 5% of its call (47% eager).
        # The events recorded (views and a compiled region's wrappers too) are what the
        # recording costs per; a known ``ops`` counts the dispatched ops alone, fewer.
        recorded = len(found.ops) / max(1, found.calls)
        own = host.per_op_s * recorded >= OWN_COST_SHARE * call_s
    on_device = device.startswith("cuda")
    own = own and math.isfinite(found.plain_s)
    floor = found.floor_s if math.isfinite(found.floor_s) else host.op_floor_s
    if own:
        cost, plain = ProfilerCost(found.per_op_s, floor), found.plain_s
    else:
        cost, plain = (
            ProfilerCost(host.per_op_s, floor),
            found.wall_s - host.per_op_s * len(found.ops),
        )
    if on_device:
        cost = ProfilerCost(cost.per_op_s, 0.0)
    if on_device and not found.device and found.ops:
        raise ValueError(
            "the profiler recorded the call's ops but no kernel on the device (no CUPTI here?)"
        )
    kernel = busy_seconds(found.device) if on_device else host_kernel_seconds(found.ops, cost)
    where = (
        "the device's kernels' busy time"
        if on_device
        else f"the aten ops' own time less an op's floor of {cost.op_floor_s * 1e6:.2f} µs and"
    )
    against = "as many unprofiled around them" if own else "themselves"
    method = (
        f"profiled: {found.calls} call(s), against {against}; {where} the profiler's "
        f"{cost.per_op_s * 1e6:.2f} µs a recorded op taken out"
    )
    return KernelSplit(
        share=split_of(kernel, plain),
        kernel_s=kernel / found.calls,
        wall_s=plain / found.calls,
        calls=found.calls,
        method=method,
    )
