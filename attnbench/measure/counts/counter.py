"""The counting process: run under Callgrind by ``InstructionCounter``, it counts the calls of
each case it is asked for, one JSON line each way, until its input ends.

    valgrind --tool=callgrind --instr-atstart=no ... python -m attnbench.measure.counts.counter
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

import torch

from attnbench.errors import first_line
from attnbench.layers import plugins
from attnbench.measure.counts.instructions import CALLS_PER_BLOCK, Callgrind
from attnbench.measure.step import make_step
from attnbench.measure.timing.allocator import DEFAULT_ALLOCATOR, set_allocator
from attnbench.spec import Case


def serve(incoming: IO[str], channel: IO[str]) -> None:
    """Count the cases the worker asks for, one JSON line each way, until it goes away."""
    callgrind: Callgrind | None = None
    for line in incoming:
        request = json.loads(line)
        try:
            if request["op"] == "start":
                set_allocator(request.get("allocator", DEFAULT_ALLOCATOR))  # as the timed side
                plugins.receive(request["layers"])
                torch.set_num_threads(1)  # see InstructionCounter
                callgrind = Callgrind()
                answer: dict[str, Any] = {"op": "ready"}
            else:
                assert callgrind is not None
                case = Case.from_dict(request["case"])
                step = make_step(case, request["seed"])
                step()  # the first call's lazy set-up is not counted, as it is not timed
                blocks = callgrind.count(step)
                answer = {"op": "counted", "blocks": blocks, "calls": CALLS_PER_BLOCK}
        except Exception as exc:  # one line back; the case fails, the sweep goes on
            answer = {"op": "error", "message": first_line(exc)}
        channel.write(json.dumps(answer) + "\n")
        channel.flush()


if __name__ == "__main__":
    channel, sys.stdout = sys.stdout, sys.stderr  # the protocol's channel; prints go to stderr
    serve(sys.stdin, channel)
    # Every count is in its own dump already. Tearing down an interpreter that imported torch,
    # instrumented, took 6.2 s a counter here, for nothing.
    channel.flush()
    sys.stderr.flush()
    os._exit(0)
