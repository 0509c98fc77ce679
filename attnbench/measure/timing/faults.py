"""Page faults: how often a call touched memory the kernel had to map in afresh.

A CPU time depends on the allocator's history: glibc maps large tensors afresh (or takes them
from a heap it trimmed), and each fresh 4 KiB page faults and is zeroed before the call can use
it. The timed blocks read the process's fault counters (``getrusage``) around themselves, so
every sample says how many faults it paid; ``fault_cost_s`` measures what one costs here, so a
summary can say what share of a time went to faults. Counters are process-wide: torch's worker
threads fault for the call too.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None  # type: ignore[assignment]  # no resource module off POSIX

# Cumulative (minor, major) page faults of this process.
FaultCounter = Callable[[], tuple[int, int]]
PAGE = mmap.PAGESIZE
# A case whose faults cost more than this share of its median time is flagged.
FAULT_SHARE = 0.2


def process_faults() -> tuple[int, int]:
    """Minor and major page faults of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_majflt


def fault_counter(device: str) -> FaultCounter | None:
    """The counter for a case on ``device``; None where faults do not describe the call's
    memory (CUDA and MPS keep tensors in device memory) or cannot be read."""
    if device != "cpu" or resource is None:
        return None
    return process_faults


def fault_cost_s(
    pages: int = 4096,
    *,
    clock: Callable[[], float] = time.perf_counter,
    faults: FaultCounter | None = None,
) -> float | None:
    """Seconds one minor fault costs on this machine: pages of a fresh anonymous mapping
    touched once (each faults and is zeroed), less the same pages touched again (resident).

    None where faults cannot be counted or none happened.
    """
    faults = faults or (process_faults if resource is not None else None)
    if faults is None:
        return None  # type: ignore[unreachable]  # resource is None off POSIX
    area = mmap.mmap(-1, pages * PAGE)
    try:
        before = faults()[0]
        start = clock()
        for offset in range(0, pages * PAGE, PAGE):
            area[offset] = 1  # first touch: a fault, and a page of zeros
        fresh = clock() - start
        faulted = faults()[0] - before
        start = clock()
        for offset in range(0, pages * PAGE, PAGE):
            area[offset] = 2  # resident: the loop's own cost
        resident = clock() - start
    finally:
        area.close()
    if faulted <= 0:
        return None
    return max(fresh - resident, 0.0) / faulted
