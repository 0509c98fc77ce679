"""The executors, chosen by name from a registry.

Each entry names the module and class that implement it, imported only when that executor is
made: Ray is imported for ``--executor ray`` alone, and no executor module imports another.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, cast

from attnbench.errors import AttnbenchError
from attnbench.run.executors.base import Executor


@dataclass(frozen=True)
class ExecutorEntry:
    module: str
    cls: str
    help: str  # what it does, for --executor's help
    options: tuple[str, ...] = ()  # the keyword options its class takes (--address, --workers)


EXECUTORS: dict[str, ExecutorEntry] = {
    "fork": ExecutorEntry(
        "attnbench.run.executors.process",
        "ForkExecutor",
        "each job (a case's timing round) in a fresh process, forked from a server that has "
        "imported torch and attnbench: a process costs milliseconds, and one that dies, runs "
        "out of memory or hangs takes its case with it, never the sweep",
        ("python",),
    ),
    "serial": ExecutorEntry(
        "attnbench.run.executors.serial",
        "SerialExecutor",
        "one case after the other in this process",
    ),
    "ray": ExecutorEntry(
        "attnbench.run.executors.ray",
        "RayExecutor",
        'on the workers of a Ray cluster (pip install "attnbench[ray]"), one case per GPU, '
        "or per --threads CPUs, at a time",
        ("address", "workers"),
    ),
    "subprocess": ExecutorEntry(
        "attnbench.run.executors.process",
        "SubprocessExecutor",
        "one case after the other in a child process of this interpreter",
        ("python",),
    ),
}


def default_executor(metric: str = "") -> str:
    """The executor a sweep runs on unless told: a fresh process for every timing round
    (fork), except for instruction counts (serial: Callgrind's counts do not vary between
    processes, and each would start it again) and where this system cannot fork."""
    return "serial" if metric == "instructions" or not hasattr(os, "fork") else "fork"


def make_executor(name: str, **options: Any) -> Executor:
    """The executor called ``name``, made with the ``options`` given (None: not given)."""
    entry = EXECUTORS.get(name)
    if entry is None:
        raise AttnbenchError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
    given = {key: value for key, value in options.items() if value is not None}
    unknown = [key for key in given if key not in entry.options]
    if unknown:
        flags = " and ".join("--" + key.replace("_", "-") for key in unknown)
        users = [n for n, e in EXECUTORS.items() if set(unknown) <= set(e.options)]
        raise AttnbenchError(
            f"{flags} apply only with --executor {' or '.join(users) or 'none'}, not {name}"
        )
    factory = getattr(importlib.import_module(entry.module), entry.cls)  # may say: install Ray
    return cast("Executor", factory(**given))
