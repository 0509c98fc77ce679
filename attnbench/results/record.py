"""run.json read once into a typed record: what code decides on, never the raw mapping.

The loader checks each entry's type (``results.loader.META_TYPES``) and brings the mapping to
today's format (``attnbench.formats``); an entry a run has not written (yet) reads as not
recorded (an empty mapping, None). The writer keeps the mapping it writes (``results.store``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from attnbench.results.reruns import Entry, parse_entries
from attnbench.schema import RunStatus


class Stopped(StrEnum):
    """Why a line of an auto sweep (``--n auto``: one layer at one width) went no further, as
    run.json's ``auto`` holds it (``run.auto``)."""

    REGIME = "regime"  # its rate settled: the time grows as the work
    TIME = "time"  # the next call would take longer than the per-case limit
    MEMORY = "memory"  # the next case's peak would not fit in the free memory
    BUDGET = "budget"  # the next case would overrun the line's share of the budget
    LONGEST = "longest n"  # no length left on the ladder
    FAILED = "failed"  # a case of the line failed (out of memory, out of time, an error)


# What stopped a line short of its regime, and what takes it further, in the words the
# summary's note and the table's use: "{their}" and "{them}" for the lines so stopped.
SHORT_OF_REGIME: dict[Stopped, tuple[str, str]] = {
    Stopped.BUDGET: ("on {their} share of the budget", "a larger --auto-budget takes {them} on"),
    Stopped.TIME: ("on the per-call limit", "a larger --max-case-seconds takes {them} on"),
    Stopped.MEMORY: ("on the free memory", ""),
    Stopped.LONGEST: ("at the ladder's last length", "a longer --n auto ladder takes {them} on"),
    Stopped.FAILED: ("on a failed case", ""),
}


@dataclass(frozen=True)
class AutoLine:
    """One line of an auto sweep (``--n auto``) as run.json's ``auto`` records it: a layer at a
    width, the longest length it measured, and what stopped it (None: it had not stopped)."""

    layer: str
    d: int
    stopped: Stopped | None
    at_n: int | None
    why: str
    settled_n: int | None = None  # where its rate settled, a rival carried on past it

    @classmethod
    def parse(cls, line: Mapping[str, Any]) -> AutoLine:
        raw = line.get("stopped")
        return cls(
            layer=str(line.get("layer", "")),
            d=int(line.get("d") or 0),
            stopped=Stopped(raw) if raw in tuple(Stopped) else None,
            at_n=None if line.get("at_n") is None else int(line["at_n"]),
            why=str(line.get("why") or ""),
            settled_n=int(line["settled_n"]) if line.get("settled_n") else None,
        )


def run_status(meta: Mapping[str, Any]) -> RunStatus:
    """A run.json's status; one that holds none is complete where it has an end time (as
    ``formats`` reads such a folder), else it was killed before it finished (running)."""
    raw = meta.get("status")
    if raw in tuple(RunStatus):
        return RunStatus(raw)
    return RunStatus.COMPLETE if meta.get("end_time") else RunStatus.RUNNING


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, as this boot's id and its start in clock ticks since boot
    (``/proc/<pid>/stat``'s 22nd field): with the pid, one process on this machine ever (a pid
    alone is reused once its process is gone, so a run killed days ago read "running" while an
    unrelated process held its pid). None where /proc cannot say (macOS, a process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": the comm may hold spaces
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


@dataclass(frozen=True)
class RunRecord:
    """What run.json says of a run (``RunResults.record``)."""

    status: RunStatus
    config: dict[str, Any] = field(default_factory=dict)  # the grid, as ``spec`` writes it
    environment: dict[str, Any] = field(default_factory=dict)  # ``results.environment``
    layers: dict[str, Any] = field(default_factory=dict)  # each layer's source
    start_time: str | None = None
    end_time: str | None = None
    pid: int | None = None
    # The process's start (``process_start``): a pid the kernel gave to another process since
    # reads as gone (None: not recorded, or a system without /proc; the pid alone is asked).
    pid_start: str | None = None
    current_case: str | None = None  # the case being measured when it last wrote
    cases_total: int | None = None
    duration_s: float | None = None
    fault_cost_s: float | None = None  # one page fault's cost, measured at the start
    allocator: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, Any] | None = None  # the machine's, recorded at the start
    ceilings_error: str | None = None  # why they could not be measured
    calibration: Any = None  # the calibration kernel's description
    # The machine's quiet reference its rounds were judged against as well as the run's own
    # (``run.quiet``; None: no sweep had kept one), and what its rounds waited for quiet.
    machine_quiet_s: float | None = None
    waited_s: float = 0.0
    # The entries of this machine's earlier sweeps the run found (``results.reruns``), by case
    # key: what its cases' spread between sweeps is read from (empty: none known).
    reruns: Mapping[str, tuple[Entry, ...]] = field(default_factory=dict)
    # Those of the same layers swept with other attnbench code (``results.reruns.betweens``):
    # what the machine's typical spread between sweeps also reads.
    reruns_other: Mapping[str, tuple[Entry, ...]] = field(default_factory=dict)
    # Columns of results.csv the run did not record (empty in every row it has; the loader
    # keeps the list so as it reads the rows).
    unrecorded: tuple[str, ...] = ()
    # An auto sweep's lines and what stopped each (empty: the sweep ran a fixed grid).
    auto: tuple[AutoLine, ...] = ()
    # The rule that ended each case's rounds, by case_id (``run.rounds.Replication.stop_of``:
    # precise, budget or max rounds; absent where not recorded, as before it was).
    round_stops: Mapping[str, str] = field(default_factory=dict)

    @property
    def processes(self) -> int:
        """``--processes``: the rounds the sweep gave each case at the least (1 where run.json
        does not say)."""
        return int(self.config.get("processes") or 1)

    def on_this_host(self) -> bool:
        """Whether the run recorded running on this machine (a pid means something here)."""
        return self.pid is not None and self.environment.get("hostname") == socket.gethostname()

    def live_pid(self) -> int | None:
        """The pid of a live process on this host, not this one, that may still be writing
        the run (None: none, or not a running run of this host)."""
        pid = self.pid
        if (
            self.status != RunStatus.RUNNING
            or not self.on_this_host()
            or pid in (None, os.getpid())
        ):
            return None
        assert pid is not None  # on_this_host: a pid was recorded
        try:
            os.kill(pid, 0)  # signal 0: only asks if it exists
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # it exists, under another user
        if self.pid_start is not None and process_start(pid) not in (None, self.pid_start):
            return None  # the pid is another process's now (the run's was killed, long ago)
        return pid

    @classmethod
    def parse(cls, meta: Mapping[str, Any]) -> RunRecord:
        """The record of a run.json mapping, whose types the loader has checked
        (``results.loader.META_TYPES``); a run killed before it finished reads ``running``."""
        status = run_status(meta)
        ceilings = meta.get("ceilings")
        quiet = meta.get("quiet") or {}
        return cls(
            status=status,
            config=dict(meta.get("config") or {}),
            environment=dict(meta.get("environment") or {}),
            layers=dict(meta.get("layers") or {}),
            start_time=meta.get("start_time"),
            end_time=meta.get("end_time"),
            pid=meta.get("pid"),
            pid_start=meta.get("pid_start"),
            current_case=meta.get("current_case"),
            cases_total=meta.get("cases_total") or None,
            duration_s=meta.get("duration_s"),
            fault_cost_s=meta.get("fault_cost_s"),
            allocator=dict(meta.get("allocator") or {}),
            ceilings=None if ceilings is None else dict(ceilings),
            ceilings_error=meta.get("ceilings_error") or None,
            calibration=meta.get("calibration"),
            unrecorded=tuple(meta.get("unrecorded") or ()),
            machine_quiet_s=quiet.get("machine_s"),
            waited_s=float(quiet.get("waited_s") or 0.0),
            reruns=parse_entries(meta.get("reruns")),
            reruns_other=parse_entries(meta.get("reruns_other")),
            auto=_auto_lines(meta.get("auto") or {}),
            round_stops={
                str(case): str(stop) for case, stop in (meta.get("round_stops") or {}).items()
            },
        )


def _auto_lines(auto: Mapping[str, Any]) -> tuple[AutoLine, ...]:
    """An auto sweep's lines; one that does not read as a line (a hand-edited run.json) is left
    out, as a summary can do without it."""
    lines = auto.get("lines")
    found = []
    for line in lines if isinstance(lines, list) else []:
        try:
            found.append(AutoLine.parse(line))
        except (AttributeError, TypeError, ValueError):
            continue
    return tuple(found)
