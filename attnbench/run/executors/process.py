"""The subprocess and fork executors: jobs run through a child process of any Python
interpreter (``attnbench ab --base-python``): in it (subprocess), or each in a fresh process it
forks (fork, the default of ``attnbench sweep`` and ``ab``).

The child is ``attnbench.run.executors.child``, driven in JSON lines (``wire``): torch's import
is paid once per run. A child that dies in a job loses only that job: it is started again, and
the runner decides whether the job runs once more. A fork server's child never runs a case
itself, so a case that kills its process (out of memory, a crash, a hang) comes back as a lost
job, with how it ended.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnbench._version import __version__
from attnbench.devices import local_device
from attnbench.errors import AttnbenchError
from attnbench.layers import plugins
from attnbench.run.executors.base import Job, JobDone, Placement, Take, local_ceilings
from attnbench.run.executors.wire import PROTOCOL, done_from_wire, job_to_wire
from attnbench.spec import Grid

CHILD = "attnbench.run.executors.child"


def check_python(python: str) -> str:
    """The interpreter's path, or one line saying it is not there."""
    found = shutil.which(python) if os.sep not in python else python
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise AttnbenchError(f"{python!r} is not a Python interpreter that exists here")
    return found


class SubprocessExecutor:
    """Every job in one child process of ``python`` (default: this one), one after another."""

    name = "subprocess"
    in_process = False
    fresh = False  # each job in a process forked for it (a ForkExecutor's server)
    workers = 1  # one job at a time

    def __init__(self, python: str | None = None, label: str = "the worker process") -> None:
        self.python = check_python(python or sys.executable)
        self.label = label  # how errors name this side: "the base side (--base-python ...)"
        self._folder = Path(tempfile.mkdtemp(prefix="attnbench-child-"))
        self._process: subprocess.Popen[str] | None = None
        self._start: dict[str, Any] = {}
        self._ready: dict[str, Any] = {}
        self._busy = False  # a job sent and not yet answered
        self._record: dict[str, Any] = {}

    # -- the child

    def _spawn(self) -> dict[str, Any]:
        self._launch()
        return self._handshake()

    def _launch(self) -> None:
        """Start the child and send it the start message (it imports torch on reading it)."""
        command = [self.python, "-m", CHILD]
        stderr = open(self._folder / "stderr.txt", "a", encoding="utf-8")  # noqa: SIM115
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            # Not this directory: python -m puts its working directory first on sys.path, and
            # a checkout here would shadow the attnbench installed beside the child's Python.
            cwd=self._folder,
            # A session (and process group) of its own: a terminal's Ctrl-C goes to its whole
            # foreground group, and it killed the case in flight, which the sweep had said it
            # would finish; the driver alone is told, and ends the child itself (``_stop``).
            start_new_session=True,
        )
        stderr.close()
        self._send({"op": "start", **self._start})

    def _handshake(self) -> dict[str, Any]:
        """The child's answer to its start message: ready, or one line saying why not."""
        answer = self._read()
        if answer is None or answer.get("op") != "ready":
            raise AttnbenchError(self._why_not(answer))
        return answer

    def _send(self, message: dict[str, Any]) -> bool:
        """Send one line; False when the child is gone."""
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def _read(self) -> dict[str, Any] | None:
        """The child's next line; None when it is gone."""
        process = self._process
        assert process is not None and process.stdout is not None
        line = process.stdout.readline()
        return json.loads(line) if line else None

    def _ask(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Send one line and read the answer; None when the child is gone."""
        return self._read() if self._send(message) else None

    def _stderr_tail(self) -> str:
        try:
            lines = (self._folder / "stderr.txt").read_text(encoding="utf-8").splitlines()
        except OSError:
            return ""
        return next((line.strip() for line in reversed(lines) if line.strip()), "")

    def _why_not(self, answer: dict[str, Any] | None) -> str:
        if answer is not None and answer.get("op") == "error":
            return f"{self.label}: {answer['message']}"
        tail = self._stderr_tail()
        missing = re.search(r"No module named '?([\w.]+)'?", tail)
        install = f"{self.python} -m pip install attnbench (or -e PATH/TO/A/CHECKOUT)"
        if missing and missing.group(1).startswith("attnbench."):
            return (
                f"{self.label}: the attnbench of {self.python} has no worker for this "
                f"(no {missing.group(1)}): install attnbench {__version__} or later there: "
                + install
            )
        if missing:
            return (
                f"{self.label}: {self.python} has no {missing.group(1)}; install attnbench "
                f"there: {install}"
            )
        return f"{self.label}: the worker in {self.python} did not start: {tail or 'no output'}"

    # -- the Executor protocol

    def resolve_device(self, name: str, dtype: str) -> str:
        return local_device(name, dtype)  # the child runs on this machine

    def environment(self, device: str) -> dict[str, Any]:
        """The child's own record: its Python, torch and attnbench, not the driver's."""
        return dict(self._ready.get("environment", {}), device=device)

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        """This machine's, measured here: the child runs on it (``--base-python`` is another
        interpreter, not another machine)."""
        return local_ceilings(grid, fault_cost)

    def start(self, grid: Grid) -> dict[str, Any]:
        if self._record:
            return self._record
        self.launch(grid)
        self._ready = self._handshake()
        return self.describe()

    def launch(self, grid: Grid) -> None:
        """Start the child without waiting for it to be ready (``start`` waits): ``ab`` launches
        both sides before it waits for either, so their imports (and Callgrind's counters, 15 s
        each) overlap."""
        if self._process is None:
            self.prepare(grid)
            self._launch()

    def prepare(self, grid: Grid) -> None:
        """What the child is started with, for ``grid``."""
        self._start = {
            "protocol": PROTOCOL,
            "device": grid.device,
            "threads": grid.threads,
            "names": list(grid.layers),
            "layers": plugins.shipment(grid.layers, portable=True),
            # Another interpreter (ab's --base-python) runs its own copy of a module plugin,
            # and records which; this one must run the driver's.
            "verify_modules": os.path.abspath(self.python) == os.path.abspath(sys.executable),
            "metric": grid.metric,
            "allocator": grid.allocator,
            "fresh": self.fresh,
            # a fork server imports dynamo and inductor once, not every forked process
            "compiles": bool(grid.compile),
        }

    def describe(self) -> dict[str, Any]:
        """run.json's cluster record, once the child is ready."""
        worker = self._ready["worker"]
        self._record = {
            "executor": self.name,
            "python": self.python,
            "nodes": [{"hostname": worker["node"]}],
            "workers": [worker],
            "layers": self._ready["layers"],
            "driver_attnbench_version": __version__,
        }
        return self._record

    @property
    def layers(self) -> dict[str, Any]:
        """Where each layer the child loaded came from (its own registry's sources)."""
        return dict(self._ready.get("layers", {}))

    def run(self, take: Take) -> Iterator[JobDone]:
        if not self._ready:
            raise AttnbenchError("the subprocess executor was not started")
        worker = self._ready["worker"]
        where = Placement(
            worker["node"], worker["device_id"], worker["device_name"], worker["threads"]
        )
        while (job := take(where)) is not None:
            yield self.send(job, where)

    def send(self, job: Job, where: Placement) -> JobDone:
        """Run one job through the child; a child that dies in it is started again."""
        self._busy = True  # until answered: a second Ctrl-C abandons it here (``_stop``)
        answer = self._ask({"op": "job", "job": job_to_wire(job)})
        self._busy = False
        if answer is not None and answer.get("op") == "done":
            return done_from_wire(job, answer["done"])
        reason = self._why_not(answer) if answer else self._death()
        self._stop()
        self._ready = self._spawn()  # a new child for the jobs that follow
        return JobDone(job, where, lost=reason)

    def _death(self) -> str:
        code = self._process.wait(timeout=10) if self._process is not None else None
        tail = self._stderr_tail()
        return f"the worker process exited with status {code}" + (f": {tail}" if tail else "")

    def _stop(self) -> None:
        """Ask the child to stop; one abandoned in a job (the sweep stopped at once), or that
        does not stop, is killed with the processes it forked (its process group)."""
        process, self._process = self._process, None
        busy, self._busy = self._busy, False
        if process is None:
            return
        # abandoned in a job, it would finish the job before it read the stop
        if process.poll() is None and (busy or not _stopped(process)):
            _kill_group(process)
            process.wait()

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self._folder, ignore_errors=True)


def _stopped(process: subprocess.Popen[str]) -> bool:
    """Whether a child asked to stop did so within 30 s."""
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps({"op": "stop"}) + "\n")
        process.stdin.close()
        process.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill a child started in a session of its own, and every process it forked."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):  # (no process groups: Windows)
        process.kill()


# Fork servers a fork executor runs: a fork shares its server's address-space layout (where
# exec placed the libraries and the heap), which gives a process a speed of its own as much as
# the fork does (``benchmarks/coverage.py``: 2-3% between servers, as between forks of one), so
# a case's rounds go to different servers. Two: each server imports torch as the sweep starts,
# on this project's two cores beside the driver's own import, and a third cost 0.85 s a sweep
# (4.8 s to a one-case sweep's end against 4.0). Pairs of rounds on two servers spread a little
# more than pairs on one (variance 0.0049 against 0.0037, on 2026-11-30; lower in half the
# cases): a case's rounds alternate between the two, so its interval holds that part too.
SERVERS = 2


def pick_server(used: list[int], last: int | None, servers: int) -> int:
    """The server for a case's next round: one that served it least (``used``: the servers
    its rounds went to), and of those not the one the last job went to, which is still
    reaping that job's process and forking its next (``fresh.fork_spare``)."""
    least = min(used.count(i) for i in range(servers))
    fewest = [i for i in range(servers) if used.count(i) == least]
    others = [i for i in fewest if i != last]
    return (others or fewest)[0]


class ForkExecutor:
    """Every job in a fresh process, forked from one of ``servers`` children of ``python``
    that have imported torch and attnbench: each timing round of a case is a process of its
    own, no two of its first rounds share a server, a job goes to another server than the job
    before where it can (``pick_server``), and no case runs after another in the same
    process."""

    name = "fork"
    in_process = False
    workers = 1  # one job at a time

    def __init__(
        self, python: str | None = None, label: str = "the worker process", servers: int = SERVERS
    ) -> None:
        self.servers = [_Server(python, label) for _ in range(max(1, servers))]
        self.python = self.servers[0].python
        self._record: dict[str, Any] = {}
        self._last_point: float | None = None  # when a job last took a calibration point
        self._used: dict[Any, list[int]] = {}  # the servers each case's rounds went to
        self._last: int | None = None  # the server the last job went to

    def resolve_device(self, name: str, dtype: str) -> str:
        return local_device(name, dtype)  # the servers run on this machine

    def environment(self, device: str) -> dict[str, Any]:
        return self.servers[0].environment(device)

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        """This machine's, measured here, never in a server: a server that ran a torch op
        could not fork (``fresh``)."""
        return local_ceilings(grid, fault_cost)

    def start(self, grid: Grid) -> dict[str, Any]:
        """Start every server at once (each imports torch: a second or two, together)."""
        if self._record:
            return self._record
        self.launch(grid)
        for server in self.servers:
            server._ready = server._handshake()
        self._record = {**self.servers[0].describe(), "executor": self.name}
        self._record["servers"] = len(self.servers)
        return self._record

    def launch(self, grid: Grid) -> None:
        """Start the servers without waiting for them (``start`` waits)."""
        for server in self.servers:
            server.launch(grid)

    @property
    def layers(self) -> dict[str, Any]:
        return self.servers[0].layers

    def run(self, take: Take) -> Iterator[JobDone]:
        if not self._record:
            raise AttnbenchError("the fork executor was not started")
        worker = self.servers[0]._ready["worker"]
        where = Placement(
            worker["node"], worker["device_id"], worker["device_name"], worker["threads"]
        )
        while (job := take(where)) is not None:
            used = self._used.setdefault(job.case, [])
            self._last = pick_server(used, self._last, len(self.servers))
            used.append(self._last)
            yield self.servers[self._last].send(self._calibrated(job), where)

    def _calibrated(self, job: Job) -> Job:
        """The job as sent: a fresh process would time the calibration kernel every job, so
        the driver keeps its pace (a point at most every ``every_s``)."""
        calibration = job.calibration
        if calibration is None:
            return job
        now = time.monotonic()
        if self._last_point is not None and now - self._last_point < calibration.every_s:
            return replace(job, calibration=None)
        self._last_point = now
        return job

    def close(self) -> None:
        for server in self.servers:
            server.close()


class _Server(SubprocessExecutor):
    """One fork server of a ``ForkExecutor``: its child forks a fresh process for every job."""

    fresh = True
