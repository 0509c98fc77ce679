"""Interleaved A/B runs: a base side and a current side measured alternately in one run.

A stored baseline cannot tell a slower machine from slower code: a shared runner slows down by
1.2-1.8x for tens of seconds at a time. Here each side has its own fork server (a
``ForkExecutor``, the base side possibly in another interpreter), each job a fresh process of
its side, and the runner hands out one job to each in turn, case by case and round after round,
in ABBA order (A B, B A, A B, ...): the two halves of a pair share the machine's state, so a
busy stretch slows both alike, and no pair shares a process with another (a process has a
speed of its own: on the H200 four fresh processes read the same cases 1.12-1.19x apart). The
verdict is drawn from the pairs (``compare.judge_pairs``). Each side is written to an ordinary
results folder, ``base/`` and ``current/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from attnbench.devices import check_threads
from attnbench.errors import AttnbenchError, signal_exit_code
from attnbench.layers import plugins
from attnbench.measure.timing.allocator import run_state
from attnbench.measure.timing.faults import fault_cost_s
from attnbench.options import build_grid
from attnbench.results.files import holds_run, new_out_dir, prepare_out_dir
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.results.store import ResultsWriter
from attnbench.results.theories import record
from attnbench.run.estimate import QUIET, Busy, estimate_bounds, machine_busy, size_warning
from attnbench.run.events import ProgressEvent
from attnbench.run.executors.base import Job, Placement
from attnbench.run.executors.process import ForkExecutor, SubprocessExecutor
from attnbench.run.queue import UNCALIBRATED, JobQueue, Measuring
from attnbench.run.quiet import quiet_file, read_quiet
from attnbench.run.rounds import Replication
from attnbench.run.signals import GracefulStop
from attnbench.schema import RunStatus
from attnbench.spec import Grid
from attnbench.thresholds import DEFAULT_THRESHOLDS, cases_to_judge, rounds_to_reach

SIDES = ("base", "current")
SideProgress = Callable[[str, ProgressEvent], None]


@dataclass(frozen=True)
class ABStart:
    """An A/B run about to measure: both grids, where it writes, and both workers' records."""

    grids: dict[str, Grid]
    out_dir: Path
    clusters: dict[str, dict[str, Any]]
    environments: dict[str, dict[str, Any]]
    estimate_s: float  # a rough estimate of the duration, both sides together
    notes: tuple[str, ...] = ()  # what the caller should know before it starts
    estimate_low_s: float | None = None  # where every case's timing stops early
    waits_s: float = 0.0  # what both sides' rounds may wait for a quiet machine, in no case
    busy: Busy = QUIET  # how busy the machine read at the start: the estimate is scaled by it


@dataclass(frozen=True)
class ABSides:
    """What sets the two sides apart: the base side's layers (None: the current side's; else
    one for each of its layers, in order) and each side's interpreter (None: this one)."""

    base_layers: Sequence[str] | None = None
    base_python: str | None = None
    current_python: str | None = None
    base_compile: str | None = None  # the base side's --compile (None: the current side's)


SAME_SIDES = ABSides()  # an A/A run: the same layers in this interpreter on both sides


@dataclass(frozen=True)
class ABListeners:
    """Who hears what an A/B run does: ``progress`` each case's events with its side, and
    ``on_start`` what is about to be measured once both sides' workers are up."""

    progress: SideProgress | None = None
    on_start: Callable[[ABStart], None] | None = None


NO_AB_LISTENERS = ABListeners()

# Both sides run on this machine at once: no calibration GEMM is needed to compare them.
AB_MEASURING = UNCALIBRATED


@dataclass(frozen=True)
class ABRun:
    """Both sides of a finished run, and the pairs of case ids to judge (base, current)."""

    base: RunResults
    current: RunResults
    pairs: tuple[tuple[str, str], ...]
    out_dir: Path


def side_grids(
    options: Mapping[str, Any],
    base_layers: Sequence[str] | None,
    alpha: float,
    base_compile: str | None = None,
) -> dict[str, Grid]:
    """The two sides' grids: the same options, layers matched by position, the base side
    compiled otherwise where ``base_compile`` says (eager against compiled). Unless given, the
    pairs (one process a side each) are enough for the paired test to reach ``alpha`` (one for
    instruction counts)."""
    given = dict(options)
    if given.get("processes") is None and given.get("metric") != "instructions":
        given["processes"] = rounds_to_reach(alpha)
    why = "ab times each case in exactly --processes pairs and adds none"
    for extra, reason in (("max_processes", why), ("precision", why),
                          ("auto_budget", "ab races the lengths given, not --n auto")):  # fmt: skip
        if given.get(extra) is not None:
            raise AttnbenchError(f"{reason}: --{extra.replace('_', '-')} applies to sweep")
    given["max_processes"] = given.get("processes")  # the pairs asked for, no more
    current = build_grid(given)
    if current.n_auto is not None:
        raise AttnbenchError(
            "ab races the same cases on both sides, and --n auto chooses each side's lengths "
            "as it goes: give the lengths (--n 256,1024, say)"
        )
    # old/mine.py:make against mine.py:make: both are mine:make, one name a process holds
    named = [plugins.side_named(spec) for spec in base_layers or ()]
    apart = {"layers": ",".join(named)} if named else {}
    apart |= {} if base_compile is None else {"compile": base_compile}
    base = build_grid({**given, **apart}) if apart else current
    if len(base.layers) != len(current.layers):
        raise AttnbenchError(
            f"--base-layers has {len(base.layers)} layer(s) and --layers {len(current.layers)}: "
            "give one base layer for each layer, in the same order"
        )
    return {"base": base, "current": current}


def _too_few(grid: Grid, alpha: float) -> tuple[str, ...]:
    """A note when ``--processes`` leaves the paired test short of ``alpha``."""
    needed, least = rounds_to_reach(alpha), cases_to_judge(alpha)
    if grid.metric == "instructions" or grid.processes >= needed:
        return ()
    outcome = (
        "every time verdict will be 'too few samples'"
        if grid.processes < least
        else "a pair or two going the other way make a verdict 'not significant'"
    )
    return (
        f"--processes {grid.processes}: the paired test reaches alpha {alpha:g} with {least} pairs "
        f"at the least and tolerates noisy pairs from {needed} (the default); here {outcome}",
    )


def _placement(cluster: Mapping[str, Any]) -> Placement:
    worker = cluster["workers"][0]
    return Placement(worker["node"], worker["device_id"], worker["device_name"], worker["threads"])


def run_ab(
    options: Mapping[str, Any],
    out_dir: Path | str,
    *,
    sides: ABSides = SAME_SIDES,
    alpha: float = DEFAULT_THRESHOLDS.alpha,
    measuring: Measuring = AB_MEASURING,
    listeners: ABListeners = NO_AB_LISTENERS,
    allow_large: bool = True,
    started: Mapping[str, ForkExecutor] | None = None,
) -> ABRun:
    """Measure the base side and the current side alternately into ``out_dir``/base and
    ``out_dir``/current; the pairs to judge. ``sides`` says how the base side differs (by
    default it is the current side: an A/A run). Both sides run on this machine at once, so no
    calibration GEMM is needed to compare them (a ``measuring`` with one times it anyway);
    ``measuring.counting`` says how both sides take their cases' exact counts. Raises an
    ``AttnbenchError`` with exit code 130 after SIGINT / SIGTERM (what was measured stays on
    disk). Every job of either side runs in a fresh process of its side (``--metric
    instructions``: one process a side, which counts under Callgrind). ``started`` holds a
    side's fork servers kept by the caller across runs (``bisect``'s base side, the same in
    every race): used as they are, and left running."""
    grids = side_grids(options, sides.base_layers, alpha, sides.base_compile)
    for grid in grids.values():  # both sides run here, on this process's CPUs: refused at once
        if grid.threads:
            check_threads(grid.threads)
    warning = None if allow_large else size_warning(grids["current"])
    if warning:
        raise AttnbenchError(warning.replace("this sweep", "each side"))
    for side in SIDES:  # before either side starts (seconds): ab has no --resume to offer
        if holds_run(Path(out_dir) / side):
            raise AttnbenchError(
                f"--out {str(out_dir)!r} already holds an A/B run; choose a new folder (an A/B "
                "run does not resume: results are never overwritten)"
            )
    ids = {side: [c.case_id for c in grids[side].cases()] for side in SIDES}
    pairs = tuple(zip(ids["base"], ids["current"], strict=True))
    pythons = {"base": sides.base_python, "current": sides.current_python}
    labels = {side: f"the {side} side ({pythons[side] or 'this interpreter'})" for side in SIDES}
    with contextlib.ExitStack() as stack:
        out_dir = stack.enter_context(new_out_dir(Path(out_dir)))  # none left by a refused start
        executors: dict[str, SubprocessExecutor | ForkExecutor] = {}
        for side in SIDES:
            if started is not None and side in started:
                executors[side] = started[side]
                continue
            kind = SubprocessExecutor if grids[side].metric == "instructions" else ForkExecutor
            made = kind(pythons[side], label=labels[side])
            stack.callback(made.close)
            executors[side] = made
        for side in SIDES:  # both sides' imports at once, before either is waited for
            executors[side].launch(grids[side])
        clusters = {side: executors[side].start(grids[side]) for side in SIDES}
        environments = {side: executors[side].environment(grids[side].device) for side in SIDES}
        writers = {}
        cost = fault_cost_s()  # what one page fault costs here (measure.timing.faults)
        for side in SIDES:
            grid = grids[side]
            writer = ResultsWriter.create(
                prepare_out_dir(out_dir / side),
                grid.to_dict(),
                environments[side],
                grid.option_names(),
            )
            writer.update(
                cluster=clusters[side],
                layers=executors[side].layers,
                ab=SIDES.index(side),
                ab_pairs=[list(pair) for pair in pairs],  # compare reads the sides as ab did
                allocator=run_state(clusters[side].get("workers", [])),
                fault_cost_s=cost,
            )
            writer.record_theories(record(grid))
            writers[side] = writer
        if listeners.on_start is not None:
            threads = grids["current"].threads or torch.get_num_threads()
            busy = machine_busy(read_quiet(quiet_file(threads)).level, threads)
            ends = [estimate_bounds(g, slowdown=busy.slowdown) for g in grids.values()]
            low, high = sum(e[0] for e in ends), sum(e[1] for e in ends)
            notes = _too_few(grids["current"], alpha)
            waits = sum(g.wait_quiet_s for g in grids.values())  # each side's --wait-quiet
            listeners.on_start(
                ABStart(grids, out_dir, clusters, environments, high, notes, low, waits, busy)
            )
        _interleave(grids, writers, executors, clusters, listeners.progress, measuring)
    runs = {side: load_results(out_dir / side) for side in SIDES}
    return ABRun(runs["base"], runs["current"], pairs, out_dir)


def _interleave(
    grids: Mapping[str, Grid],
    writers: Mapping[str, ResultsWriter],
    executors: Mapping[str, SubprocessExecutor | ForkExecutor],
    clusters: Mapping[str, Mapping[str, Any]],
    progress: SideProgress | None,
    measuring: Measuring,
) -> None:
    """Hand one job to each side in turn, A B then B A, until both queues are empty."""

    def tell(side: str) -> Callable[[ProgressEvent], None] | None:
        return None if progress is None else (lambda event: progress(side, event))

    def on_stop(_: str) -> None:
        for queue in queues.values():
            if queue.last is not None:
                queue.notify("stopping", queue.last)
                return

    with GracefulStop(on_stop) as stop:
        queues = {}
        for side in SIDES:
            grid, writer = grids[side], writers[side]
            writer.update(cases_total=len(grid.cases()))
            if measuring.calibration is not None:
                writer.update(calibration=measuring.calibration.describe())
            known = read_quiet(quiet_file(grid.threads or torch.get_num_threads()))
            writer.update(quiet={"machine_s": known.level, "sweeps": len(known.levels)})
            queues[side] = JobQueue(
                grid,
                writer,
                measuring=replace(measuring, quiet_s=known.level),  # judged as a sweep's
                in_process=False,
                progress=tell(side),
                stop=stop,
                replication=Replication(grid.processes, grid.processes),  # the pairs asked for
            )
        where = {side: _placement(clusters[side]) for side in SIDES}
        pair = 0
        try:
            while not stop.requested:
                jobs = {side: queues[side].take(where[side]) for side in SIDES}
                if all(job is None for job in jobs.values()):
                    break
                for side in SIDES if pair % 2 == 0 else SIDES[::-1]:  # ABBA
                    job = jobs[side]
                    if job is not None:
                        for done in executors[side].run(_once(job)):
                            queues[side].finish(done)
                pair += 1
        except KeyboardInterrupt:
            stop.signal_name = stop.signal_name or "SIGINT"
        finally:
            for side, writer in writers.items():
                quiet = {
                    **writer.meta.get("quiet", {}),
                    "waited_s": round(queues[side].waited_s, 3),
                }
                writer.update(quiet=quiet)  # each side's waits for a quiet machine
                writer.finish(RunStatus.INTERRUPTED if stop.requested else RunStatus.COMPLETE)
        if stop.requested:
            out = writers["base"].out_dir.parent
            raise AttnbenchError(
                f"{stop.signal_name}: stopped after {pair} pair(s); what was measured is in "
                f"{out}/base and {out}/current (an A/B run does not resume: run it again)",
                exit_code=signal_exit_code(str(stop.signal_name)),
            )


def _once(job: Job) -> Callable[[Placement], Job | None]:
    """A ``take`` that hands out ``job`` once, then nothing (one job through the seam)."""
    left = [job]
    return lambda where: left.pop() if left else None


def describe_sides(start: ABStart) -> list[str]:
    """What is being compared: each side's interpreter, attnbench (with its code's digest and
    commit where the sides' code differs: a maintainer's two checkouts of one version, attention
    edited on one, read alike), torch and layers."""
    digests = {str(start.environments[side].get("code_digest") or "") for side in SIDES}
    lines = []
    for side in SIDES:
        env, cluster = start.environments[side], start.clusters[side]
        sources = cluster.get("layers") or {}
        layers = ", ".join(
            _with_digest(name, sources.get(name)) for name in start.grids[side].layers
        )
        code = _code(env) if len(digests) > 1 else ""
        lines.append(
            f"{side}: attnbench {env.get('attnbench_version')}{code}, "
            f"torch {env.get('torch_version')}, "
            f"Python {env.get('python_version')} ({cluster.get('python')}); layers {layers}"
        )
    return lines


def _code(env: Mapping[str, Any]) -> str:
    """ " (code sha256 1a2b3c4d5e6f, commit 474a0027f7, with changes)" from a side's
    environment; the parts it does not record are left out."""
    parts = []
    if env.get("code_digest"):
        parts.append(f"code sha256 {str(env['code_digest'])[:12]}")
    if env.get("git_commit"):
        dirty = ", with changes" if env.get("git_dirty") else ""
        parts.append(f"commit {str(env['git_commit'])[:10]}{dirty}")
    return f" ({', '.join(parts)})" if parts else ""


def _with_digest(name: str, source: Any) -> str:
    """A layer as the start line names it: a plugin with the digest of the code its side ran
    (two copies of one module under one name differ there alone)."""
    found = source.get("digest") if isinstance(source, dict) else None
    return f"{name} (sha256 {found})" if found else name


__all__ = [
    "AB_MEASURING",
    "SIDES",
    "ABListeners",
    "ABRun",
    "ABSides",
    "ABStart",
    "describe_sides",
    "run_ab",
    "side_grids",
]
