"""Instructions per call, counted by Valgrind's Callgrind: a measure a busy machine cannot move.

The process runs under ``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no``,
so torch is imported at nearly native speed (about 15 s here, against minutes with
instrumentation on from the start). Once the process is ready, ``Callgrind`` switches
instrumentation on (``callgrind_control -i on``), and each count collects only around the
measured calls (torch's ``_valgrind_toggle``), dumping the events of that block to a file of its
own, which is read back. The same code on the same CPU model executes the same instructions
(to about 0.2% here), whatever else the machine is doing.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.errors import AttnbenchError

# Where the launcher asked Callgrind to write its dumps (--callgrind-out-file=$DIR/cg.%p).
DUMP_DIR_ENV = "ATTNBENCH_CALLGRIND_DIR"
DUMP_PREFIX = "cg"
CALLS_PER_BLOCK = 10
BLOCKS = 3


def require_valgrind() -> str:
    """The valgrind executable, or the one-line error saying how to get it."""
    found = shutil.which("valgrind")
    if found is None or shutil.which("callgrind_control") is None:
        raise AttnbenchError(
            "--metric instructions counts with Valgrind's Callgrind, which is not installed "
            "here: apt-get install valgrind (or brew install valgrind)"
        )
    return found


def callgrind_command(python: str, dump_dir: Path) -> list[str]:
    """How to start ``python`` under Callgrind with instrumentation off until asked."""
    return [
        require_valgrind(),
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-atstart=no",
        f"--callgrind-out-file={dump_dir}/{DUMP_PREFIX}.%p",
        f"--log-file={dump_dir}/valgrind.%p.log",
        python,
    ]


@dataclass(frozen=True)
class InstructionCount:
    """Instructions per call: the median over blocks of ``calls`` calls, each block's kept."""

    per_call: int
    blocks: tuple[int, ...]  # instructions of each block
    calls: int


class Callgrind:
    """Counts instructions in this process, which must run under ``callgrind_command``."""

    def __init__(self) -> None:
        folder = os.environ.get(DUMP_DIR_ENV)
        if not folder or not torch._C._valgrind_supported_platform():
            raise AttnbenchError("instruction counts need a worker started under Callgrind")
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
    ) -> InstructionCount:
        """Instructions of one call of ``fn``: a warm-up block (the first instrumented calls
        run a few percent more), then the median of ``blocks`` blocks."""
        self._block(fn, calls)
        counted = tuple(self._block(fn, calls) for _ in range(blocks))
        return InstructionCount(round(statistics.median(counted) / calls), counted, calls)


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
