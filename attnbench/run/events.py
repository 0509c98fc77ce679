"""What a sweep tells its caller as it goes: plain data, so the core knows nothing of terminals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingStats
from attnbench.results.run import RunResults
from attnbench.run.estimate import QUIET, Busy
from attnbench.run.executors.base import Placement
from attnbench.spec import Case, Grid


@dataclass(frozen=True)
class SweepStart:
    """A sweep about to measure: its grid, folder and workers (``previous``: the run a resume
    found on disk, repairs listed in its ``warnings``)."""

    grid: Grid
    out_dir: Path
    cluster: dict[str, Any]  # run.json's cluster record
    workers: int
    estimate_s: float  # a rough estimate of the duration, all workers together
    previous: RunResults | None = None
    # False: the machine's ceilings are not cached, and are measured first (a few seconds)
    ceilings_cached: bool = True
    # the estimate where every case's timing stops early (a quiet machine); None: not made
    estimate_low_s: float | None = None
    retried: int = 0  # cases a resume with --retry measures again (off disk in ``previous``)
    # what the rounds may still wait for a quiet machine (--wait-quiet), beside the estimate:
    # no case's time holds it
    waits_s: float = 0.0
    busy: Busy = QUIET  # how busy the machine read at the start: the estimate is scaled by it


@dataclass(frozen=True)
class ProgressEvent:
    """``start`` when a case is handed to a worker, ``done`` after it is written (with its
    result), ``retry`` when its worker died and it is run again (``error`` says why),
    ``stopping`` when a signal asked the sweep to stop after the ``running`` cases (0: none was
    running).  In rounds after the first, ``round`` > 1 and ``timing`` holds that round's
    samples (no ``result``)."""

    kind: Literal["start", "done", "retry", "stopping"]
    index: int  # 0-based position in the grid
    total: int
    case: Case
    result: CaseResult | None = None
    completed: int = 0  # cases of the grid with a row on disk (earlier runs of a resume included)
    round: int = 1
    rounds: int = 1
    units_done: int = 0  # (case, round) pairs finished, out of total * rounds
    timing: TimingStats | None = None
    where: Placement | None = None  # the worker that ran it (done, retry)
    running: int = 0  # jobs running when the event was sent
    error: str = ""


ProgressCallback = Callable[[ProgressEvent], None]
StartCallback = Callable[[SweepStart], None]


@dataclass(frozen=True)
class Listeners:
    """Who hears what a sweep does, from its caller: ``progress`` each case's events,
    ``on_start`` what the sweep is about to do once its workers are up, and ``on_ceilings``
    that it measures the machine's ceilings while they start (None: nobody)."""

    progress: ProgressCallback | None = None
    on_start: StartCallback | None = None
    on_ceilings: Callable[[], None] | None = None


NO_LISTENERS = Listeners()
