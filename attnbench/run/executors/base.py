"""What the runner and an executor exchange: where a worker measures, the jobs it is given, what
comes back, and the ``Executor`` protocol (the machine its workers measure on among it: run.json's
environment and ceilings are the executor's to say, not the runner's).

The runner owns the sweep (order, skips, retries, writing); an executor owns workers. Each idle
worker asks the runner for a job (``take``) and the executor yields each ``JobDone`` as it
arrives, so a serial sweep and one spread over many machines share every other line of code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from attnbench.errors import AttnbenchError, first_line
from attnbench.measure.counts.countcache import DEFAULT_COUNTING, Counting
from attnbench.measure.machine.ceilings_file import machine_ceilings
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.calibration import Calibration
from attnbench.measure.timing.loop import TimingPolicy, TimingStats
from attnbench.spec import Case, Grid


@dataclass(frozen=True)
class Placement:
    """Where a worker measures: its machine, its device and that device's model."""

    node: str  # host name
    device_id: str  # cuda:<index on that machine> or cpu
    device_name: str  # GPU or CPU model: jobs of later rounds stay on the same model
    threads: int  # torch's intra-op threads there


@dataclass(frozen=True)
class Job:
    """One unit of work: a case's measurement (round 1) or one later timing round of it."""

    case: Case
    round: int
    seed: int
    policy: TimingPolicy
    max_case_s: float | None = None
    calibration: Calibration | None = None  # timed just before the case, on the same device
    attempt: int = 1  # 2 when the first worker died in it
    device_name: str | None = None  # later rounds: the device model round 1 ran on
    counting: Counting = DEFAULT_COUNTING  # how the case's exact counts are taken
    # What the job's process may take before it is ended (a fresh process only): seconds of
    # wall time (a hang), and bytes of memory (None: a share of what is available).
    wall_limit_s: float = 900.0
    memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class JobDone:
    """A finished job: ``result`` for round 1, ``timing`` for a later round (None: it failed),
    ``point`` the calibration timed before it; ``lost`` says why the worker died, if it did,
    and ``ended`` how, where the process was watched (``oom``, ``timeout``; "" otherwise).
    ``process`` names the process that measured it, unique within the sweep."""

    job: Job
    where: Placement | None
    result: CaseResult | None = None
    timing: TimingStats | None = None
    point: TimingStats | None = None
    lost: str = ""
    load_1m: float | None = None  # the machine's load when the job ended
    process: str = ""
    ended: str = ""


Take = Callable[[Placement], Job | None]  # the next job for a worker there, or None (none now)


class Executor(Protocol):
    """What the runner needs from an executor (see the module docstring)."""

    name: str
    # True when jobs run in the sweep's own process: a crash in a case then ends the sweep,
    # so the runner records the case in progress for ``--resume`` to find.
    in_process: bool

    def resolve_device(self, name: str, dtype: str) -> str:
        """``--device`` as the workers will see it, checked against what they have."""
        ...

    def environment(self, device: str) -> dict[str, Any]:
        """run.json's environment record."""
        ...

    def start(self, grid: Grid) -> dict[str, Any]:
        """Start the workers (once; later calls return the same record): run.json's cluster."""
        ...

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        """run.json's ``ceilings`` and ``ceilings_error``: the machine the workers measure
        on, from the cache or measured now (``local_ceilings``)."""
        ...

    @property
    def workers(self) -> int:
        """How many jobs can run at once (once started)."""
        ...

    def run(self, take: Take) -> Iterator[JobDone]:
        """Run jobs from ``take`` until it has none for any idle worker and none is running."""
        ...

    def close(self) -> None: ...


def local_ceilings(grid: Grid, fault_cost: float | None = None) -> dict[str, Any]:
    """run.json's ``ceilings`` for the grid's device, dtype and threads on this machine: from
    the cache, or measured now in this process (a few seconds, once per machine; ``attnbench
    machine --remeasure`` measures again). Where they cannot be measured (a driver with fewer
    CPUs than --threads asks of Ray's nodes), ``ceilings`` is None and ``ceilings_error`` says
    why: the run goes on, and ``attnbench predict --machine`` takes a file instead.
    ``fault_cost`` is the run's measured cost of a page fault (``measure.timing.faults``),
    recorded in place of the cached one: one cost a run."""
    threads = grid.threads or torch.get_num_threads()
    try:
        found, _ = machine_ceilings(grid.device, grid.dtype, threads)
    except (AttnbenchError, RuntimeError, OSError) as exc:
        reason = exc.message if isinstance(exc, AttnbenchError) else first_line(exc)
        return {"ceilings": None, "ceilings_error": reason}
    if found.page_fault_s is not None and fault_cost is not None:
        found = replace(found, page_fault_s=fault_cost)
    return {"ceilings": found.to_dict(), "ceilings_error": None}
