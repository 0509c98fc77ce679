"""The serial executor: every job in this process, one after the other (the default)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from attnbench.devices import local_device
from attnbench.errors import AttnbenchError
from attnbench.layers import plugins
from attnbench.measure.timing.loop import Clock
from attnbench.results.environment import environment
from attnbench.run.executors.base import JobDone, Take, local_ceilings
from attnbench.run.executors.worker import Worker
from attnbench.spec import Grid


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

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        return local_ceilings(grid, fault_cost)  # the jobs run in this process

    def start(self, grid: Grid) -> dict[str, Any]:
        if self._worker is None:
            self._threads_before = torch.get_num_threads()  # --threads applies to the sweep only
            self._worker = Worker(
                grid.device,
                grid.threads,
                clock=self.clock,
                metric=grid.metric,
                layers=plugins.shipment(grid.layers, portable=grid.metric == "instructions"),
                allocator=grid.allocator,
            )
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
            self._worker.close()
        self._worker = None
