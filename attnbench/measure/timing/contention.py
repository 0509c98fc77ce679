"""The CPU other processes used beside a timing round, from the kernel's own accounting.

The machine's reference (``measure.timing.reference``) is a few short calls, timed before and
after a round, their median read: a neighbour that keeps one of this project's two cores busy
leaves it unchanged (0.97-1.02x), since a thread that wakes for a short call preempts a busy
process at once, while a layer that runs both threads for milliseconds at a time shares the core
and ran 1.6x slower beside it at the median of 8 trials (0.81-2.27x; attention at n = 1024,
``benchmarks/neighbour.py``). What the kernel counts is not fooled: the busy CPU seconds of the
CPUs this process may run on (``/proc/stat``) less its own (``getrusage``), over the round's
wall time, are the cores the others used there; less the cores its threads left free, what
they took from it. A round that lost more than
``BUSY_CORES`` ran on a busy machine, and the estimators leave it out as they leave out a round
whose reference read slow (``estimators.kept_rounds``), while two others remain.
Where ``/proc/stat`` cannot be read (not Linux) nothing is known, and nothing is left out.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.devices import usable_cpus

# Cores the other processes took from a round's threads, on average over it, past which the
# round ran on a busy machine: half a core (a neighbour busy half the time on one core; a
# neighbour spinning on one of two cores read 0.75, the machine without it 0.02).
# ``ATTNBENCH_BUSY_CORES`` sets another (``inf``: never busy; the test suite's workers are
# each other's neighbours).
BUSY_CORES = 0.5
BUSY_ENV = "ATTNBENCH_BUSY_CORES"
# The shortest span read: the kernel counts a CPU's busy time by its 10 ms tick, so over a
# span of a few ticks an idle machine reads up to a tick a CPU too much or too little (over
# 21 ms single-threaded here, 0.42 core in 5 of 40 tries); four ticks keep it at most half a
# core on two CPUs. A round shorter than this is not read.
MIN_SPAN_S = 0.04
STAT = "/proc/stat"


@dataclass(frozen=True)
class CpuMark:
    """The machine's busy CPU seconds, this process's, and the wall clock, read together."""

    machine_s: float
    own_s: float
    wall_s: float


def machine_busy_s(path: str = STAT, cpus: frozenset[int] | None = None) -> float | None:
    """Seconds the CPUs this process may run on (``cpus``, its affinity by default) spent
    busy since boot (user, nice, system, irq, softirq and steal: time not idle nor waiting for
    a disk), from their own lines of ``/proc/stat``: a neighbour on a core this process cannot
    use takes nothing from it. None where unreadable, or none of its CPUs is listed."""
    mine = _affinity() if cpus is None else cpus
    total, found = 0, False
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                name = fields[0] if fields else ""
                if not (name.startswith("cpu") and name[3:].isdigit()):
                    continue
                if mine is not None and int(name[3:]) not in mine:
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
                total += user + nice + system + irq + softirq + steal
                found = True
    except (OSError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK") if found else None


def _affinity() -> frozenset[int] | None:
    """The CPUs this process may run on (None where the platform does not say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def own_s() -> float:
    """CPU seconds this process has spent, all its threads."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def mark(
    busy: Callable[[], float | None] = machine_busy_s,
    own: Callable[[], float] = own_s,
    clock: Callable[[], float] = time.monotonic,
) -> CpuMark | None:
    """The three counts now (None where the machine's cannot be read)."""
    machine = busy()
    if machine is None:
        return None
    return CpuMark(machine, own(), clock())


def others_cores(start: CpuMark | None, end: CpuMark | None, free: float = 0.0) -> float | None:
    """Cores the other processes took from this process between two marks, on average: their
    CPU less the ``free`` cores its threads left idle, never under 0; None where either mark
    is missing or the span is shorter than ``MIN_SPAN_S``."""
    if start is None or end is None:
        return None
    wall = end.wall_s - start.wall_s
    if wall < MIN_SPAN_S:
        return None
    others = (end.machine_s - start.machine_s) - (end.own_s - start.own_s)
    return max(0.0, others / wall - free)


def free_cores() -> float:
    """The cores this process's threads leave idle: the CPUs it may run on less torch's
    threads (a neighbour there takes nothing from it)."""
    return float(max(0, usable_cpus() - torch.get_num_threads()))


def busy_cores() -> float:
    """The threshold of ``is_busy``: ``BUSY_CORES``, or the environment's."""
    try:
        return float(os.environ.get(BUSY_ENV, BUSY_CORES))
    except ValueError:
        return BUSY_CORES


def is_busy(others: float | None) -> bool:
    """Whether a round's threads lost more than ``busy_cores`` to other processes."""
    return others is not None and others > busy_cores()
