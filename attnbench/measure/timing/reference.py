"""The machine's state around a timing round: a small fixed workload timed just before and just
after it, in the round's own process.

A shared machine goes through stretches, seconds long, in which a neighbour slows small ops and
the synchronisation of torch's threads: on this project's 2-core VM a layer of many small ops
(lstm at n = 512) then runs 1.5-2.7x slower, and this workload with it (their times' logs
correlate at 0.95-0.98 over a minute; ``benchmarks/coverage.py``). A round whose reference ran
slow against the run's quiet reference ran on a disturbed machine, and the estimators leave it
out (``estimators.quiet_rounds``); the reference is read on the CPU whatever the device, since
it is the host that a neighbour slows.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from attnbench.measure.timing.loop import Clock

T = TypeVar("T")
CALLS = 7  # calls each side of a round: about 2 ms on a 2-core CPU
STEPS = 20  # a call: this many small products, each through a tanh


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


def around(timing: Callable[[], T], clock: Clock = time.perf_counter) -> tuple[T, float]:
    """Run ``timing`` between two readings of the reference: its result, and the slower
    reading (a round disturbed at either end was disturbed)."""
    before = read_reference(clock)
    found = timing()
    return found, max(before, read_reference(clock))
