"""The machine's state around a timing round: a small fixed workload timed just before and just
after it, in the round's own process.

A shared machine goes through stretches, seconds to a minute long, in which a neighbour slows small
ops and the synchronisation of torch's threads: on this project's 2-core VM a layer of many small
ops (lstm at n = 512) then runs 1.5-2.7x slower, and this workload with it (their times' logs
correlate at 0.95-0.98 over a minute; ``benchmarks/coverage.py``). A round whose reference ran slow
against the run's quiet reference ran on a disturbed machine, and the estimators leave it out
(``estimators.quiet_rounds``); the reference is read on the CPU whatever the device, since it is the
host that a neighbour slows. A round that knows the machine's quiet level waits, within what its
sweep allows, for the reference to read quiet before it times (``settle``): a round timed in a busy
stretch would be left out, and its replacement started at once would land in the same stretch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from attnbench.estimators import is_disturbed
from attnbench.measure.timing import contention
from attnbench.measure.timing.gputimers import Timed
from attnbench.measure.timing.loop import Clock, TimingPolicy

T = TypeVar("T")
CALLS = 7  # calls each side of a round: about 2 ms on a 2-core CPU
STEPS = 20  # a call: this many small products, each through a tanh
POLL_S = 0.05  # a waiting round reads the reference again after this long, kept busy


@functools.cache  # once a process: the same tensors every reading
def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(1, 32, 64, generator=gen), torch.randn(64, 64, generator=gen) / 8


def reference_call() -> torch.Tensor:
    """One call of the reference: small products and an elementwise op, ``STEPS`` times, what
    a neighbour's contention slows most (dispatch, small kernels, threads meeting)."""
    y, a = _operands()  # (1, 32, 64), (64, 64)
    with torch.no_grad():
        for _ in range(STEPS):
            y = torch.tanh(y @ a)  # (1, 32, 64)
    return y


def read_reference(clock: Clock = time.perf_counter) -> float:
    """The median seconds of one reference call, over ``CALLS`` calls (after one untimed)."""
    reference_call()
    times = []
    for _ in range(CALLS):
        start = clock()
        reference_call()
        times.append(clock() - start)
    return statistics.median(times)


def keep_busy(seconds: float, clock: Clock = time.perf_counter) -> None:
    """Run reference calls for ``seconds``. A vCPU that sat idle runs slow for its first
    0.1-0.2 s of work: on this project's 2-core VM (2026-12-01) the reference read 136-209 µs
    right after a 0.25 s sleep and 125-134 µs after 0.2 s of calls, against 126-129 µs read
    back to back. A round that slept while it waited read the machine disturbed again for
    that alone, and the default sweep waited 12-57 s for quiet."""
    end = clock() + seconds
    while clock() < end:
        reference_call()


def settle(
    quiet_s: float | None,
    wait_s: float,
    clock: Clock = time.perf_counter,
    sleep: Callable[[float], None] = keep_busy,
) -> tuple[float, float]:
    """Read the reference; while it reads the machine disturbed against ``quiet_s`` and
    ``wait_s`` seconds allow, pass ``POLL_S`` (busy: ``keep_busy``) and read again: the last
    reading and the seconds waited (a busy stretch lasts seconds to a minute here)."""
    reading, polls = read_reference(clock), 0
    most = math.floor(wait_s / POLL_S + 1e-9)  # whole polls within the wait allowed
    while is_disturbed(reading, quiet_s) and polls < most:
        sleep(POLL_S)
        polls += 1
        reading = read_reference(clock)
    return reading, polls * POLL_S


@dataclasses.dataclass(frozen=True)
class Around:
    """What a round's timing ran beside: the slower reading of the reference (a round
    disturbed at either end was disturbed), the seconds it waited for quiet first, and the
    cores other processes used while it timed (``contention``; None: not known)."""

    reference_s: float
    waited_s: float
    others_cores: float | None = None


def around(
    timing: Callable[[], T],
    clock: Clock = time.perf_counter,
    quiet_s: float | None = None,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = keep_busy,
) -> tuple[T, Around]:
    """Run ``timing`` between two readings of the reference, after waiting up to ``wait_s``
    for the machine to read quiet (``settle``): its result and what it ran beside."""
    before, waited = settle(quiet_s, wait_s, clock, sleep)
    start = contention.mark()
    found = timing()
    others = contention.others_cores(start, contention.mark())
    return found, Around(max(before, read_reference(clock)), waited, others)


def referenced(timing: Callable[[], Timed], clock: Clock, policy: TimingPolicy) -> Timed:
    """A round's timing between two readings of the machine's reference, which its samples
    carry with the other processes' CPU beside it, once the machine reads quiet or the
    policy's wait is spent (``measure.timing.reference``)."""
    timed, beside = around(timing, clock, policy.quiet_s, policy.wait_s)
    count = timed.stats.count
    stats = dataclasses.replace(
        timed.stats,
        references_s=(beside.reference_s,) * count,
        others_cores=(beside.others_cores,) * count,
        waited_s=beside.waited_s,
    )
    return dataclasses.replace(timed, stats=stats)
