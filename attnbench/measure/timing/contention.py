"""The CPU other processes took from a timing round: how long its threads waited for one.

The machine's reference (``measure.timing.reference``) is a few short calls, timed before and
after a round, their median read: a neighbour that keeps one of this project's two cores busy
leaves it unchanged (within 4% in 19 of 20 trials), since a thread that wakes for a short call
preempts a busy process at once, while a layer that runs both threads for milliseconds at a
time shares the core and ran 1.65x slower beside it at the median of 20 trials (0.81-2.27x;
attention at n = 1024, ``benchmarks/neighbour.py``). The kernel's scheduler is not fooled: it
counts, for each thread,
the nanoseconds it was ready to run but waited for a CPU (the second field of
``/proc/self/task/<tid>/schedstat``). Taken thread by thread across the round (a thread that
began in it from nothing; one that ended in it is not known, and takes nothing away), summed
and divided by its wall time, that is how many cores' worth of them the others kept
waiting: 0.00-0.07 beside nothing here and 0.5-1.0 beside a process spinning on one core,
over spans of 10 to 40 ms alike. A
thread also waits for its own process's threads where they outnumber the cores, so the
reading is capped, a quarter of a core past (``CAP_SLACK``), by the cores the process left
unused (the CPUs it may use less the first field, the time its threads ran): all another
process can have taken. Beside a process spinning on a core the cap moves nothing (2
threads: 0.50-1.00, the waits never past the cores left); 4 threads on 2 cores beside nothing
read 0.77-0.88, still over the line capped (their barriers leave a core idle while they
wait): attnbench refuses ``--threads`` past the CPUs, so only a layer that starts threads of
its own reads so. A round kept waiting more than ``BUSY_CORES`` ran on
a busy machine, and the estimators leave it
out as they leave out a round whose reference read slow (``estimators.kept_rounds``), while two
others remain. Where the counts cannot be read (not Linux, or a kernel without scheduler
statistics) nothing is known, and nothing is left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.devices import usable_cpus

# Cores' worth of a round's threads the others kept waiting, on average over it, past which
# the round ran on a busy machine: a quarter of a core. Here rounds beside nothing read
# 0.00-0.21 (all but one under 0.14), rounds beside a process spinning on one of the two cores
# 0.49-0.89, and rounds a burst of it began or ended in between (``benchmarks/neighbour.py``).
# ``ATTNBENCH_BUSY_CORES`` sets another (``inf``: never busy; the test suite's workers are
# each other's neighbours).
BUSY_CORES = 0.25
BUSY_ENV = "ATTNBENCH_BUSY_CORES"
# How far past the cores a process left unused its waits may still be read: the run times
# lag by up to a scheduler tick (4 ms here) a running thread, a quarter of a core over a
# 30 ms round of two, so a neighbour's share is not cut below what it took by that lag; a
# round that ran on every core can still read a little over it where the lag ran the other
# way.
CAP_SLACK = 0.25


# The CPUs this process may use, read as it imports this module: before torch's OpenMP
# threads start, whose binding (``OMP_PROC_BIND``) would narrow the main thread's own mask.
PROCESS_CPUS = usable_cpus()
# The shortest span read: the counts are in nanoseconds, but a span shorter than a scheduler's
# time slice says little of a neighbour's share.
MIN_SPAN_S = 0.005
TASKS = "/proc/self/task"


@dataclass(frozen=True)
class CpuMark:
    """Seconds this process's threads have waited for a CPU, all together, the wall clock,
    and the seconds they ran on one, read together; and each thread's own (its id, ran,
    waited), where they were read one by one."""

    waited_s: float
    wall_s: float
    ran_s: float
    threads: tuple[tuple[str, float, float], ...] | None = None


def thread_counts(tasks: str = TASKS) -> tuple[tuple[str, float, float], ...] | None:
    """Each thread of this process: its id, the seconds it has run on a CPU and spent ready
    to run but waiting for one (the first two fields of its ``schedstat``); None where none
    can be read."""
    try:
        names = os.listdir(tasks)
    except OSError:
        return None
    found = []
    for name in names:
        try:
            with open(f"{tasks}/{name}/schedstat", encoding="ascii") as fh:
                fields = fh.read().split()
            found.append((name, int(fields[0]) / 1e9, int(fields[1]) / 1e9))
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or no statistics
    return tuple(found) or None


def counts(tasks: str = TASKS) -> tuple[float, float] | None:
    """Seconds this process's threads have run on a CPU and spent ready to run but waiting
    for one, each summed over its threads (``thread_counts``); None where none can be read."""
    threads = thread_counts(tasks)
    if threads is None:
        return None
    return sum(ran for _, ran, _ in threads), sum(waited for _, _, waited in threads)


def mark(
    read: Callable[[], tuple[float, float] | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CpuMark | None:
    """The counts now (None where they cannot be read): each thread's, or ``read``'s totals
    (tests pass one)."""
    if read is not None:
        found = read()
        return None if found is None else CpuMark(found[1], clock(), found[0])
    threads = thread_counts()
    if threads is None:
        return None
    ran, waited = sum(t[1] for t in threads), sum(t[2] for t in threads)
    return CpuMark(waited, clock(), ran, threads)


def _between(start: CpuMark, end: CpuMark) -> tuple[float, float]:
    """Seconds the threads ran and waited between two marks: by thread where both were read
    so (a thread that began between them from nothing; one that ended between them is not
    known, and takes nothing away: summed, its whole life before the span would), else the
    totals'."""
    if start.threads is None or end.threads is None:
        return end.ran_s - start.ran_s, end.waited_s - start.waited_s
    before = {tid: (ran, waited) for tid, ran, waited in start.threads}
    ran = waited = 0.0
    for tid, ran_now, waited_now in end.threads:
        ran_then, waited_then = before.get(tid, (0.0, 0.0))
        if ran_now < ran_then or waited_now < waited_then:  # its id reused by a new thread
            ran_then = waited_then = 0.0
        ran, waited = ran + ran_now - ran_then, waited + waited_now - waited_then
    return ran, waited


def others_cores(
    start: CpuMark | None, end: CpuMark | None, cpus: int | None = None
) -> float | None:
    """Cores' worth of this process's threads kept waiting for a CPU between two marks, on
    average, at most ``CAP_SLACK`` past the cores it left unused of the ``cpus`` it may use:
    what other processes took from it, never under 0. None where either mark is missing or
    the span is shorter than ``MIN_SPAN_S``. The CPUs are ``PROCESS_CPUS``, read at import:
    a thread pinned later by ``OMP_PROC_BIND`` reads an affinity of one, which would cap every
    reading to nothing."""
    if start is None or end is None:
        return None
    wall = end.wall_s - start.wall_s
    if wall < MIN_SPAN_S:
        return None
    ran, waited = _between(start, end)
    left = (cpus or PROCESS_CPUS) - ran / wall
    return max(0.0, min(waited / wall, left + CAP_SLACK))  # past it: its own threads waiting


def busy_cores() -> float:
    """The threshold of ``is_busy``: ``BUSY_CORES``, or the environment's."""
    try:
        return float(os.environ.get(BUSY_ENV, BUSY_CORES))
    except ValueError:
        return BUSY_CORES


def is_busy(others: float | None) -> bool:
    """Whether a round's threads were kept waiting more than ``busy_cores``."""
    return others is not None and others > busy_cores()
