"""Instructions per call, counted by Valgrind's Callgrind: a measure a busy machine cannot move.

A case is measured as usual where it runs; only its instructions are counted elsewhere, by a
process started once per run under ``valgrind --tool=callgrind --instr-atstart=no
--collect-atstart=no`` (``InstructionCounter``). With instrumentation off, torch imports there at
nearly native speed (about 15 s here, against minutes with it on from the start); the process
then switches it on (``callgrind_control -i on``) and, for each case, builds the layer, runs a
warm-up block and counts blocks of calls, collecting only around them (torch's
``_valgrind_toggle``) and reading each block back from its own dump. The same code on the same
CPU model executes the same instructions (to about 0.2% here), whatever else the machine does.
Calls are counted on one thread, as torch.utils.benchmark counts them: the spinning of a thread
pool would add instructions that depend on timing.

    python -m attnbench.measure.counts.counter   (started by InstructionCounter, under Valgrind)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from attnbench.errors import AttnbenchError
from attnbench.measure.timing.allocator import DEFAULT_ALLOCATOR
from attnbench.spec import Case

# Where the counter asked Callgrind to write its dumps (--callgrind-out-file=$DIR/cg.%p).
DUMP_DIR_ENV = "ATTNBENCH_CALLGRIND_DIR"
COUNTER = "attnbench.measure.counts.counter"  # the program the counting process runs
DUMP_PREFIX = "cg"
CALLS_PER_BLOCK = 10
BLOCKS = 3
# Uncounted calls first: Python specialises bytecode after a few executions and torch fills its
# dispatch caches, so the first calls of a layer run more instructions than the later ones.
WARMUP_CALLS = 50


def require_valgrind() -> str:
    """The valgrind executable, or the one-line error saying how to get it."""
    found = shutil.which("valgrind")
    if found is None or shutil.which("callgrind_control") is None:
        raise AttnbenchError(
            "--metric instructions counts with Valgrind's Callgrind, which is not installed "
            "here: apt-get install valgrind (or brew install valgrind)"
        )
    return found


def read_dump(path: Path) -> int:
    """The instructions (Ir) a Callgrind dump file holds, from its summary line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise AttnbenchError(f"Callgrind wrote no dump at {path}: {exc.strerror}") from None
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        raise AttnbenchError(f"the Callgrind dump {path} holds no summary line")
    return int(found.group(1))


# ----------------------------------------------------------------------------- the counting side


class Callgrind:
    """Counts instructions in this process, which runs under Callgrind (``InstructionCounter``)."""

    def __init__(self) -> None:
        folder = os.environ.get(DUMP_DIR_ENV)
        if not folder or not torch._C._valgrind_supported_platform():
            raise AttnbenchError("instruction counts need a process started under Callgrind")
        self.folder = Path(folder)
        self.pid = os.getpid()
        self.dumps = 0
        # Instrumentation on from here: what ran before (torch's import) was not slowed.
        done = subprocess.run(
            ["callgrind_control", "-i", "on", str(self.pid)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise AttnbenchError(
                f"callgrind_control could not switch instrumentation on: {done.stderr.strip()}"
            )

    def _block(self, fn: Callable[[], object], calls: int) -> int:
        torch._C._valgrind_toggle()  # collect from here ...
        for _ in range(calls):
            fn()
        torch._C._valgrind_toggle_and_dump_stats()  # ... to here, into a file of its own
        self.dumps += 1
        return read_dump(self.folder / f"{DUMP_PREFIX}.{self.pid}.{self.dumps}")

    def count(
        self, fn: Callable[[], object], calls: int = CALLS_PER_BLOCK, blocks: int = BLOCKS
    ) -> list[int]:
        """The instructions of ``blocks`` blocks of ``calls`` calls, after uncounted warm-up calls
        (the first calls of a layer run more instructions than the later ones)."""
        for _ in range(WARMUP_CALLS):
            fn()
        return [self._block(fn, calls) for _ in range(blocks)]


# ----------------------------------------------------------------------------- the asking side


class InstructionCounter:
    """A counting process under Callgrind, started once per worker and asked case by case."""

    def __init__(self, layers: list[dict[str, Any]], allocator: str = DEFAULT_ALLOCATOR) -> None:
        valgrind = require_valgrind()
        self.folder = Path(tempfile.mkdtemp(prefix="attnbench-callgrind-"))
        command = [
            valgrind,
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--callgrind-out-file={self.folder}/{DUMP_PREFIX}.%p",
            f"--log-file={self.folder}/valgrind.log",
            sys.executable,
            "-m",
            COUNTER,
        ]
        # One thread: a pool's spinning threads would execute a number of instructions that
        # depends on timing (Valgrind runs one thread at a time), as torch.utils.benchmark knows.
        # A fixed hash seed: a run's dicts and sets are laid out as the last run's were.
        env = {
            **os.environ,
            DUMP_DIR_ENV: str(self.folder),
            "OMP_NUM_THREADS": "1",
            "PYTHONHASHSEED": "0",
        }
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C is the sweep's to answer, not its
        )
        self.asking = False  # a request sent and not yet answered
        answer = self._ask({"op": "start", "layers": layers, "allocator": allocator})
        if answer.get("op") != "ready":
            self.close()
            raise AttnbenchError(f"the Callgrind counter did not start: {answer.get('message')}")

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.asking = True  # until answered: a second Ctrl-C abandons it here (``close``)
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
            self.asking = False
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise AttnbenchError("the Callgrind counter process ended (see valgrind.log)")
        return cast("dict[str, Any]", json.loads(line))

    def count(self, case: Case, seed: int) -> int:
        """Instructions of one call of the case's layer: the median block over its calls."""
        answer = self._ask({"op": "count", "case": case.to_dict(), "seed": seed})
        if answer.get("op") != "counted":
            raise RuntimeError(f"counting instructions failed: {answer.get('message')}")
        return round(float(statistics.median(answer["blocks"])) / float(answer["calls"]))

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # the counter ends when its input does
            try:
                # abandoned in a count (the sweep stopped at once): it would finish it first
                self.process.wait(timeout=0 if self.asking else 30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
