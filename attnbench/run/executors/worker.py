"""A worker: measures jobs in the process it lives in, on one device.

Every executor runs its jobs through a ``Worker``: the serial executor in the sweep's own
process, the Ray executor inside each actor.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from attnbench._version import __version__
from attnbench.devices import device_name, device_sync, machine_load, set_threads
from attnbench.layers.registry import entry
from attnbench.measure.case import measure_case, retime_case
from attnbench.measure.counts.instructions import InstructionCounter
from attnbench.measure.step import release_memory
from attnbench.measure.timing.allocator import DEFAULT_ALLOCATOR, set_allocator
from attnbench.measure.timing.calibration import Calibration
from attnbench.measure.timing.faults import FaultCounter, fault_counter
from attnbench.measure.timing.loop import Clock, TimingStats
from attnbench.run.executors.base import Job, JobDone, Placement
from attnbench.schema import Status


class Worker:
    """Measures jobs in the process it lives in, on one device; start-up (threads, CUDA
    context) is paid once, when it is made; the tracers' (``prime_instruments``) before the
    first case that traces."""

    def __init__(
        self,
        device: str,
        threads: int | None,
        *,
        device_id: str | None = None,
        clock: Clock = time.perf_counter,
        metric: str = "time",
        layers: list[dict[str, Any]] | None = None,
        allocator: str = DEFAULT_ALLOCATOR,
        faults: Callable[[str], FaultCounter | None] = fault_counter,
    ) -> None:
        # Before anything is allocated for a case: every block freed from here on stays mapped.
        self.allocator = set_allocator(allocator)
        self.faults = faults
        if threads is not None:
            set_threads(threads)
        self.device = device
        self.clock = clock
        # --metric instructions: a process under Callgrind counts each case's calls; ``layers``
        # are the plugins it must load (plugins.shipment).
        self.counter = (
            InstructionCounter(layers or [], allocator) if metric == "instructions" else None
        )
        if device.startswith("cuda"):
            torch.ones(1, device=device)  # the CUDA context, made here rather than in a case
        self.where = Placement(
            node=socket.gethostname(),
            device_id=device_id or device,
            device_name=device_name(device),
            threads=torch.get_num_threads(),
        )
        # This process, unique within a sweep: a pid can be given again to a later process.
        self.process = f"{self.where.node}:{os.getpid()}:{time.time_ns()}"
        self._timers: dict[Calibration, Callable[[], TimingStats]] = {}
        self._last_point: float | None = None  # when this worker's last calibration point began

    def describe(self) -> dict[str, Any]:
        """This worker, for run.json's cluster record."""
        return {
            **asdict(self.where),
            "pid": os.getpid(),
            "attnbench_version": __version__,
            "torch_version": torch.__version__,
            "allocator": self.allocator.to_dict(),
        }

    def close(self) -> None:
        if self.counter is not None:
            self.counter.close()

    def run(self, job: Job) -> JobDone:
        point = self._calibration_point(job.calibration)
        case = job.case
        if job.round > 1:
            timing = retime_case(
                case,
                seed=job.seed,
                policy=job.policy,
                clock=self.clock,
                faults=self.faults(case.device),
            )
            return JobDone(
                job,
                self.where,
                timing=timing,
                point=point,
                load_1m=machine_load(),
                process=self.process,
            )
        result = measure_case(
            case,
            seed=job.seed,
            policy=job.policy,
            clock=self.clock,
            max_case_s=job.max_case_s,
            counter=self.counter,
            faults=self.faults(case.device),
            counting=job.counting,
        )
        if result.status != Status.OK:
            release_memory(case.device)
        where, load = self.where, machine_load()
        result = replace(
            result,
            node=where.node,
            device_id=where.device_id,
            device_name=where.device_name,
            layer_source=entry(case.layer).source.describe(),  # the code this process ran
            load_1m=load,
            cpu_count=os.cpu_count(),
        )
        return JobDone(job, where, result=result, point=point, load_1m=load, process=self.process)

    def _calibration_point(self, calibration: Calibration | None) -> TimingStats | None:
        """One calibration point, or None: off, less than ``calibration.every_s`` since this
        worker's last point began, or the GEMM failed (the case is measured anyway)."""
        if calibration is None:
            return None
        now = self.clock()
        if self._last_point is not None and now - self._last_point < calibration.every_s:
            return None
        self._last_point = now
        try:
            if calibration not in self._timers:
                sync = device_sync(self.device)
                self._timers[calibration] = calibration.timer(self.device, sync, self.clock)
            return self._timers[calibration]()
        except Exception:
            return None
