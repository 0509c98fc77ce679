"""Charts drawn in two processes at once: each figure is drawn alone, and saving the default
run's charts (ten figures of five panels, PNG and SVG) takes about as long as the whole
sweep's counting, with one core idle. A process forked for half of them draws what this one
would, byte for byte; where it cannot (no fork, one core, a child that dies), this process
draws them all."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

READ_CHUNK = 1 << 16
# Seconds each chart took to build and save as PNG and SVG, a cold default sweep's run on this
# project's 2-core CPU (2026-11-30): the two drawing processes split them by it. Every second
# chart in CHARTS' order gave one process 4.6 s and the other 3.3 s.
DRAW_COST = {"time": 1.0, "time-d": 1.0, "memory": 0.73, "flops": 0.73, "elementwise": 0.94,
             "seq_steps": 0.78, "path_len": 0.83, "normalized": 0.55, "crossover": 0.28,
             "roofline": 0.22, "time-split": 1.81}  # fmt: skip
MIN_WAIT_S = 60.0  # how long the other half may take, at the least ...
WAIT_FACTOR = 3.0  # ... or this many times this half's time


def halves(
    names: Sequence[str], cost: Mapping[str, float] | None = None
) -> tuple[list[str], list[str]]:
    """``names`` in two halves of about equal ``cost`` (each name's, 1 where not given), the
    costliest placed first, each into the cheaper half; in ``names``' order within each. With
    no costs, every second name."""
    if cost is None:
        return list(names[0::2]), list(names[1::2])
    sums: list[float] = [0.0, 0.0]
    parts: list[list[str]] = [[], []]
    for name in sorted(names, key=lambda n: -cost.get(n, 1.0)):
        lighter = 0 if sums[0] <= sums[1] else 1
        parts[lighter].append(name)
        sums[lighter] += cost.get(name, 1.0)
    order = {name: i for i, name in enumerate(names)}
    first, second = (sorted(part, key=order.__getitem__) for part in parts)
    return first, second


def draw_in_two(
    draw: Callable[[Sequence[str]], list[Path]],
    names: Sequence[str],
    cost: Mapping[str, float] | None = None,
) -> list[Path]:
    """``draw(names)``, the names shared between this process and one forked for the other
    half (``halves``: by ``cost``, each name's time to draw, or every second name); the paths
    written, in ``names``' order."""
    if len(names) < 2 or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        return draw(names)
    mine, theirs = halves(names, cost)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked half; what it writes is what the tests read
        os.close(read)
        code = 0
        try:
            data = json.dumps([str(p) for p in draw(theirs)]).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write, view) :]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    start = time.monotonic()
    try:
        drawn = draw(mine)
    finally:
        # the other half takes about as long as this one: a child far past that is stuck
        deadline = time.monotonic() + max(MIN_WAIT_S, WAIT_FACTOR * (time.monotonic() - start))
        chunks, status = _collect(read, pid, deadline)
    try:
        found = json.loads(b"".join(chunks)) if status == 0 else None
    except ValueError:
        found = None
    others = [Path(p) for p in found] if isinstance(found, list) else draw(theirs)
    order = {name: i for i, name in enumerate(names)}
    return sorted([*drawn, *others], key=lambda p: (order.get(p.stem, len(order)), p.suffix))


def _collect(read: int, pid: int, deadline: float) -> tuple[list[bytes], int]:
    """What the child wrote, and how it ended (killed, status -1, past ``deadline``)."""
    chunks: list[bytes] = []
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read], [], [], left)
            if not ready:
                break
            chunk = os.read(read, READ_CHUNK)
            if not chunk:
                _, status = os.waitpid(pid, 0)
                return chunks, status
            chunks.append(chunk)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return [], -1
    finally:
        os.close(read)
