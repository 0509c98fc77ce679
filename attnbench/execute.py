"""The executor seam: where and how the cases of a sweep are run.

The runner owns the sweep (order, skips, retries, writing); an executor owns workers. Each idle
worker asks the runner for a job (``take``) and the executor yields each ``JobDone`` as it
arrives, so a serial sweep and one spread over many machines share every other line of code.
``serial`` runs the jobs in this process, one at a time; ``ray`` (``attnbench.ray_executor``,
imported only when chosen) runs them on the workers of a Ray cluster.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import torch

from attnbench import __version__
from attnbench.errors import AttnbenchError
from attnbench.measure.calibration import Calibration
from attnbench.measure.case import (
    device_sync,
    measure_case,
    prime_instruments,
    release_memory,
    retime_case,
)
from attnbench.measure.timing import Clock, TimingPolicy, TimingStats
from attnbench.results import CaseResult, device_name, environment
from attnbench.spec import Case, Grid, local_device

EXECUTORS = ("serial", "ray")


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


@dataclass(frozen=True)
class JobDone:
    """A finished job: ``result`` for round 1, ``timing`` for a later round (None: it failed),
    ``point`` the calibration timed before it; ``lost`` says why the worker died, if it did."""

    job: Job
    where: Placement | None
    result: CaseResult | None = None
    timing: TimingStats | None = None
    point: TimingStats | None = None
    lost: str = ""


Take = Callable[[Placement], Job | None]  # the next job for a worker there, or None (none now)


class Worker:
    """Measures jobs in the process it lives in, on one device; start-up (threads, CUDA
    context, profiler) is paid once, when it is made."""

    def __init__(
        self,
        device: str,
        threads: int | None,
        *,
        device_id: str | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = device
        self.clock = clock
        if device.startswith("cuda"):
            torch.ones(1, device=device)  # the CUDA context, made here rather than in a case
        self.where = Placement(
            node=socket.gethostname(),
            device_id=device_id or device,
            device_name=device_name(device),
            threads=torch.get_num_threads(),
        )
        self._timers: dict[Calibration, Callable[[], TimingStats]] = {}
        prime_instruments()

    def describe(self) -> dict[str, Any]:
        """This worker, for run.json's cluster record."""
        return {
            **asdict(self.where),
            "pid": os.getpid(),
            "attnbench_version": __version__,
            "torch_version": torch.__version__,
        }

    def run(self, job: Job) -> JobDone:
        point = self._calibration_point(job.calibration)
        case = job.case
        if job.round > 1:
            timing = retime_case(case, seed=job.seed, policy=job.policy, clock=self.clock)
            return JobDone(job, self.where, timing=timing, point=point)
        result = measure_case(
            case, seed=job.seed, policy=job.policy, clock=self.clock, max_case_s=job.max_case_s
        )
        if result.status != "ok":
            release_memory(case.device)
        where = self.where
        result = replace(
            result, node=where.node, device_id=where.device_id, device_name=where.device_name
        )
        return JobDone(job, where, result=result, point=point)

    def _calibration_point(self, calibration: Calibration | None) -> TimingStats | None:
        """One calibration point, or None (off, or the GEMM failed: the case is measured anyway)."""
        if calibration is None:
            return None
        try:
            if calibration not in self._timers:
                sync = device_sync(self.device)
                self._timers[calibration] = calibration.timer(self.device, sync, self.clock)
            return self._timers[calibration]()
        except Exception:
            return None


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

    @property
    def workers(self) -> int:
        """How many jobs can run at once (once started)."""
        ...

    def run(self, take: Take) -> Iterator[JobDone]:
        """Run jobs from ``take`` until it has none for any idle worker and none is running."""
        ...

    def close(self) -> None: ...


class SerialExecutor:
    """Every job in this process, one after the other (the default)."""

    name = "serial"
    in_process = True

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self._worker: Worker | None = None
        self._record: dict[str, Any] = {}
        self._threads_before = torch.get_num_threads()

    def resolve_device(self, name: str, dtype: str) -> str:
        return local_device(name, dtype)

    def environment(self, device: str) -> dict[str, Any]:
        return environment(device)

    def start(self, grid: Grid) -> dict[str, Any]:
        if self._worker is None:
            self._threads_before = torch.get_num_threads()  # --threads applies to the sweep only
            self._worker = Worker(grid.device, grid.threads, clock=self.clock)
            self._record = {
                "executor": self.name,
                "nodes": [{"hostname": self._worker.where.node}],
                "workers": [self._worker.describe()],
            }
        return self._record

    @property
    def workers(self) -> int:
        return 1

    def run(self, take: Take) -> Iterator[JobDone]:
        if self._worker is None:
            raise AttnbenchError("the serial executor was not started")
        while (job := take(self._worker.where)) is not None:
            yield self._worker.run(job)

    def close(self) -> None:
        if self._worker is not None:
            torch.set_num_threads(self._threads_before)
        self._worker = None


def make_executor(name: str, *, address: str | None = None, workers: int | None = None) -> Executor:
    """The executor called ``name``; Ray is imported only when asked for."""
    if name == "serial":
        if address is not None or workers is not None:
            raise AttnbenchError("--address and --workers apply only with --executor ray")
        return SerialExecutor()
    if name == "ray":
        from attnbench.ray_executor import RayExecutor  # imports ray, or says how to install it

        return RayExecutor(address=address, workers=workers)
    raise AttnbenchError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
