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
from collections.abc import Callable, Sequence
from pathlib import Path

READ_CHUNK = 1 << 16
MIN_WAIT_S = 60.0  # how long the other half may take, at the least ...
WAIT_FACTOR = 3.0  # ... or this many times this half's time


def draw_in_two(draw: Callable[[Sequence[str]], list[Path]], names: Sequence[str]) -> list[Path]:
    """``draw(names)``, the names shared between this process and one forked for the other
    half (every second name); the paths written, in ``names``' order."""
    if len(names) < 2 or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        return draw(names)
    mine, theirs = list(names[0::2]), list(names[1::2])
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
