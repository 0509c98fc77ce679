"""A worker in a process of its own, driven by ``SubprocessExecutor`` over stdin and stdout.

    python -m attnbench.run.executors.child

One JSON object per line. The driver sends ``start`` (device, threads, the sweep's layers, and
what to measure), then one ``job`` at a time, then ``stop``; the child answers
``ready`` (or ``error`` with one line), then ``done`` for each job. What libraries print goes to
stderr, so stdout carries the protocol only.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from attnbench._version import __version__
from attnbench.errors import AttnbenchError, first_line
from attnbench.run.executors.fresh import Limits

if TYPE_CHECKING:
    from attnbench.run.executors.base import Job
    from attnbench.run.executors.fresh import Spare
    from attnbench.run.executors.worker import Worker


def _reply(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(incoming: IO[str], channel: IO[str]) -> int:
    """Answer the driver until it says stop (or goes away); the exit status.

    With ``fresh`` in the start message this process is a fork server: it imports and loads
    the plugins once, then runs each job (and the description of a worker) in a process
    forked for it (``_ForkServer``), so no torch op ever runs here.
    """
    # Imported here: a child that cannot import torch still answers with one line.
    from attnbench.layers import plugins
    from attnbench.run.executors.wire import PROTOCOL, job_from_wire

    worker: Worker | None = None
    server: _ForkServer | None = None  # with ``fresh`` in the start message
    for line in incoming:
        message = json.loads(line)
        if message["op"] == "stop":
            if worker is not None:
                worker.close()
            if server is not None:  # no torch op ran here, nothing to tear down
                server.stop()
                _leave(channel)
            return 0
        if message["op"] == "start":
            if message["protocol"] != PROTOCOL:
                _reply(
                    channel,
                    {
                        "op": "error",
                        "message": (
                            f"attnbench {__version__} there speaks protocol {PROTOCOL}, the driver "
                            f"{message['protocol']}: install the same attnbench on both sides"
                        ),
                    },
                )
                return 2
            plugins.receive(message["layers"], message.get("verify_modules", True))
            names = [plugins.resolve(name).name for name in message["names"]]
            if message.get("fresh"):
                server = _ForkServer(message)
                _reply(channel, server.describe(names))
                continue
            worker = _worker(message)
            _reply(channel, _ready(worker, message, names))
        elif message["op"] == "job" and server is not None:
            answer = server.answer(message["job"])
            # the next job's process forked, set up and the last one gone before the driver
            # hears: done while another server's job timed, they took a core from it
            server.ahead(settle_s=SETTLE_S)
            _reply(channel, answer)
        elif message["op"] == "job" and worker is not None:
            _reply(channel, _run(worker, job_from_wire(message["job"])))
    return 0


# How long a server waits for its next job's process to set itself up before it answers.
SETTLE_S = 30.0


class _ForkServer:
    """A fork server's side of the protocol: it imports what every job needs, then runs each
    job in a process forked ahead for it (``fresh.fork_spare``), a spare always waiting."""

    def __init__(self, start: dict[str, Any]) -> None:
        _preload(compiles=bool(start.get("compiles")))
        self.start = start
        self.spare: Spare | None = None

    def describe(self, names: list[str]) -> dict[str, Any]:
        """The first process's description of a worker, then the first spare forked."""
        from attnbench.run.executors.fresh import run_fresh

        outcome = run_fresh(functools.partial(_describe, self.start, names), _LIMITS)
        if outcome.answer is None:
            raise AttnbenchError(f"the first worker process did not start: {outcome.reason}")
        self.ahead(settle_s=SETTLE_S)
        return outcome.answer

    def answer(self, wire: dict[str, Any]) -> dict[str, Any]:
        """A job's answer, from its spare (forked again where it died waiting for it)."""
        from attnbench.run.executors.fresh import discard, run_spare
        from attnbench.run.executors.wire import job_from_wire, lost_to_wire

        if self.spare is not None and os.waitpid(self.spare.pid, os.WNOHANG)[0]:
            discard(self.spare)  # gone before its job came: that is not the job's end
            self.spare = None
        self.ahead()
        assert self.spare is not None
        spare, self.spare = self.spare, None
        outcome = run_spare(spare, wire, job_limits(job_from_wire(wire)))
        answer = outcome.answer
        if answer is None:
            answer = {"op": "done", "done": lost_to_wire(outcome)}
        cost = answer.pop(PROFILER, None)
        if cost and not self.start.get(PROFILER):  # every later process of this server's
            self.start = {**self.start, PROFILER: cost}
        return answer

    def ahead(self, settle_s: float = 0.0) -> None:
        """Reap the processes that answered, then fork the next job's (with ``settle_s``,
        waiting up to that long for it to set itself up)."""
        from attnbench.run.executors.fresh import fork_spare, reap

        reap()
        if self.spare is None:
            self.spare = fork_spare(functools.partial(_prepared, self.start), settle_s)

    def stop(self) -> None:
        """End the waiting spare (it leaves on an empty message) and reap it."""
        from attnbench.run.executors.fresh import discard, reap

        if self.spare is not None:
            discard(self.spare)
            self.spare = None
        reap()


def _leave(channel: IO[str]) -> None:
    """End a fork server at once. An interpreter that imported torch takes about half a second
    to tear itself down, and a sweep stops two servers (``ab`` four, one after another):
    seconds at every end, for nothing a server holds."""
    channel.flush()
    sys.stderr.flush()
    os._exit(0)


# The first process of a fork server only describes itself: a minute is plenty.
_LIMITS = Limits(wall_s=60.0)


def job_limits(job: Job) -> Limits:
    """What the process of one job may take (``Job.wall_limit_s``, ``Job.memory_limit_bytes``)."""
    return Limits(wall_s=job.wall_limit_s, memory_bytes=job.memory_limit_bytes)


def _preload(compiles: bool = False) -> None:
    """What every job's process runs, imported once here (the fork shares it): torch, the
    worker, the measurements, scipy's special functions (the estimators' quantiles; not
    ``scipy.stats``, 0.6 s more a server), and for a sweep that compiles, dynamo and inductor
    (about 1.8 s a process here otherwise). Importing runs no torch op."""
    import scipy.special  # noqa: F401

    if compiles:
        import torch._dynamo
        import torch._inductor.compile_fx  # noqa: F401

    import attnbench.measure.case
    import attnbench.results.environment
    import attnbench.run.executors.wire
    import attnbench.run.executors.worker  # noqa: F401


def _worker(message: dict[str, Any]) -> Worker:
    from attnbench.measure.timing.allocator import DEFAULT_ALLOCATOR
    from attnbench.run.executors.worker import Worker

    return Worker(
        message["device"],
        message["threads"],
        metric=message["metric"],
        layers=message["layers"],
        allocator=message.get("allocator", DEFAULT_ALLOCATOR),
    )


def _ready(worker: Worker, message: dict[str, Any], names: list[str]) -> dict[str, Any]:
    from attnbench.layers.registry import entry
    from attnbench.results.environment import environment
    from attnbench.run.executors.wire import PROTOCOL

    return {
        "op": "ready",
        "protocol": PROTOCOL,
        "worker": worker.describe(),
        "environment": environment(message["device"]),
        "layers": {name: entry(name).source.to_dict() for name in names},
    }


# The host's profiler cost (``split.profiler_cost``): measured in the first case's process of a
# fork server that splits a call's time (in the sweep, as before), then handed to every later
# job's process of that server: measured in each, it took 25 ms of each case's first round.
PROFILER = "profiler_cost"


def _describe(message: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return _ready(_worker(message), message, names)


def _prepared(start: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What a job's process makes before its job comes: the worker (its threads, allocator,
    the host's profiler cost where the server knows it); then the job, from its wire form,
    and its answer, with the profiler's cost where this process measured it."""
    from attnbench.measure.timing.split import ProfilerCost, known_profiler_cost, use_profiler_cost
    from attnbench.run.executors.wire import job_from_wire

    handed = start.get(PROFILER)
    if handed:
        use_profiler_cost(ProfilerCost(*handed))
    worker = _worker(start)

    def work(wire: dict[str, Any]) -> dict[str, Any]:
        answer = _run(worker, job_from_wire(wire))
        cost = known_profiler_cost()
        if cost is not None and not handed:
            answer[PROFILER] = [cost.per_op_s, cost.op_floor_s]
        return answer

    return work


def _run(worker: Worker, job: Job) -> dict[str, Any]:
    from attnbench.run.executors.wire import done_to_wire

    return {"op": "done", "done": done_to_wire(worker.run(job))}


def main() -> int:
    channel, sys.stdout = sys.stdout, sys.stderr  # the protocol's channel; prints go to stderr
    try:
        return serve(sys.stdin, channel)
    except AttnbenchError as exc:
        _reply(channel, {"op": "error", "message": exc.message})
        return 2
    except Exception as exc:  # one line for the driver, whatever broke
        _reply(channel, {"op": "error", "message": first_line(exc)})
        return 1


if __name__ == "__main__":
    sys.exit(main())
