"""The start line's estimate against what the sweep then ran, on a quiet machine and beside a
busy neighbour (``--neighbours`` processes, each a loop of small torch ops in ``--threads``
threads, what slows a sweep most here). Each sweep is the real command in a fresh process, with
``--wait-quiet 0`` so that what it ran is its cases' time, not waits.

In a cache folder of the benchmark's own: ``--first`` runs each side's first sweep with no quiet
level kept (the load decides how busy the machine reads); otherwise a quiet sweep runs first
and leaves the machine's level, as a user's earlier sweeps do (the reference decides).

    python benchmarks/busy_estimate.py [--repeat 2] [--neighbours 3] [--first] [-- sweep options]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# The fixed grid swept unless sweep options are given: a small one, as a first try is.
GRID = ["--layers", "conv,lstm,attention", "--n", "64..512", "--d", "32"]
NEIGHBOUR = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.randn(64, 64), torch.randn(64, 64)
while True:
    a = torch.tanh(a @ b) / 8
"""


@contextlib.contextmanager
def neighbours(count: int, threads: int) -> Iterator[None]:
    """``count`` busy processes for the duration, ended after."""
    started = [
        subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(threads)]) for _ in range(count)
    ]
    try:
        if count:
            time.sleep(60)  # the 1-minute load climbs toward them
        else:  # a quiet side waits (up to 3 min) for the last busy one's load to decay
            cpus, deadline = os.cpu_count() or 1, time.monotonic() + 180
            while os.getloadavg()[0] > cpus / 2 and time.monotonic() < deadline:
                time.sleep(5)
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def sweep(out: Path, cache: Path, extra: list[str]) -> tuple[str, str, float]:
    """The start line's estimate, its busy note ("" when none), and the seconds the sweep ran."""
    env = {**os.environ, "ATTNBENCH_CACHE_DIR": str(cache), "COLUMNS": "1000"}
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", "sweep", "--out", str(out), "--wait-quiet", "0",
         "--no-charts", *extra],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    lines = done.stderr.splitlines()  # the start line and notes go to stderr
    found = (re.search(r", ((about )?[\d.-]+ \w+[^>]*) -> ", line) for line in lines)
    said = next((m.group(1) for m in found if m), "?")
    note = next((line for line in lines if "the machine is busy" in line), "")
    ran = float(json.loads((out / "run.json").read_text())["duration_s"])
    return said, note, ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="each neighbour's torch threads")
    parser.add_argument("--first", action="store_true", help="no quiet level kept: the load")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"] or GRID
    print(f"{'machine':<8} {'said':<34} {'ran s':>6}  busy note")
    with tempfile.TemporaryDirectory(prefix="attnbench-busy-") as tmp:
        for rep in range(args.repeat):
            for busy in (False, True):
                cache = Path(tmp) / (f"cache-{rep}-{busy}" if args.first else "cache")
                count = args.neighbours if busy else 0
                with neighbours(count, args.threads):
                    said, note, ran = sweep(Path(tmp) / f"run-{rep}-{busy}", cache, extra)
                label = "busy" if busy else "quiet"
                print(f"{label:<8} {said:<34} {ran:>6.1f}  {note[:150]}", flush=True)


if __name__ == "__main__":
    main()
