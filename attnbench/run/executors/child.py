"""A worker in a process of its own, driven by ``SubprocessExecutor`` over stdin and stdout.

    python -m attnbench.run.executors.child

One JSON object per line. The driver sends ``start`` (device, threads, the sweep's layers, and
what to measure), then one ``job`` at a time, then ``stop``; the child answers
``ready`` (or ``error`` with one line), then ``done`` for each job. What libraries print goes to
stderr, so stdout carries the protocol only.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from attnbench._version import __version__
from attnbench.errors import AttnbenchError, first_line


def _reply(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(incoming: IO[str], channel: IO[str]) -> int:
    """Answer the driver until it says stop (or goes away); the exit status."""
    # Imported here: a child that cannot import torch still answers with one line.
    from attnbench.layers import plugins
    from attnbench.layers.registry import entry
    from attnbench.measure.allocator import DEFAULT_ALLOCATOR
    from attnbench.results.environment import environment
    from attnbench.run.executors.wire import PROTOCOL, done_to_wire, job_from_wire
    from attnbench.run.executors.worker import Worker

    worker: Worker | None = None
    for line in incoming:
        message = json.loads(line)
        if message["op"] == "stop":
            if worker is not None:
                worker.close()
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
            worker = Worker(
                message["device"],
                message["threads"],
                metric=message["metric"],
                layers=message["layers"],
                allocator=message.get("allocator", DEFAULT_ALLOCATOR),
            )
            _reply(
                channel,
                {
                    "op": "ready",
                    "protocol": PROTOCOL,
                    "worker": worker.describe(),
                    "environment": environment(message["device"]),
                    "layers": {name: entry(name).source.to_dict() for name in names},
                },
            )
        elif message["op"] == "job" and worker is not None:
            done = worker.run(job_from_wire(message["job"]))
            _reply(channel, {"op": "done", "done": done_to_wire(done)})
    return 0


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
