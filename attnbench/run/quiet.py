"""The machine's quiet level across sweeps, kept in the cache.

A round's machine reference (``measure.timing.reference``) is judged against a quiet level:
each sweep's own (its rounds' fast end, ``estimators.quiet_level``) cannot tell a sweep that
ran busy from start to end, which on this project's shared 2-core VM happened to one
invocation in eight (its reference read 2.1x the quiet level in every round, lstm 2.4x its
quiet time). So every sweep that read references leaves its own level here, the latest
``KEEP`` are kept, and the next sweep judges its rounds against their median as well as against
its own: a sweep busy throughout is one among several, and a machine that has become slower for
good reads its own level again after about half of ``KEEP`` sweeps.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.measure.machine.ceilings_file import cache_dir, cache_key
from attnbench.storage import write_text_atomic

KEEP = 10  # sweeps whose quiet levels are kept


@dataclass(frozen=True)
class MachineQuiet:
    """The quiet levels of this machine's latest sweeps (seconds of one reference call)."""

    levels: tuple[float, ...] = ()

    @property
    def level(self) -> float | None:
        """Their median; None before any sweep left one."""
        return statistics.median(self.levels) if self.levels else None

    def after(self, level: float) -> MachineQuiet:
        """These, with a sweep's own level added (the oldest dropped past ``KEEP``)."""
        if not (level > 0 and math.isfinite(level)):
            return self
        return MachineQuiet((*self.levels, level)[-KEEP:])


def quiet_file(threads: int, folder: Path | None = None) -> Path:
    """Where this machine's levels are kept: one file per host, torch version and thread
    count (the reference is read on the CPU, in float32, whatever the sweep's device)."""
    return (folder or cache_dir()) / "quiet" / f"{cache_key('cpu', 'float32', threads)}.json"


def read_quiet(path: Path) -> MachineQuiet:
    """The levels kept at ``path``; none where the file is missing or unreadable (a cache
    may be cleared or half-written: it is then rebuilt, never an error)."""
    try:
        found = json.loads(path.read_text())["levels"]
        return MachineQuiet(tuple(float(x) for x in found if float(x) > 0)[-KEEP:])
    except (OSError, ValueError, KeyError, TypeError):
        return MachineQuiet()


def write_quiet(path: Path, machine: MachineQuiet) -> None:
    """Keep ``machine``'s levels at ``path``; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"levels": list(machine.levels)}) + "\n")
    except (OSError, AttnbenchError):
        return


def wait_left(allowed_s: float, waited_s: float) -> float:
    """What a run's rounds may still wait for a quiet machine: ``--wait-quiet`` (the whole
    run's, resumes included) less what was waited, or is held by jobs out."""
    return max(0.0, allowed_s - waited_s)
