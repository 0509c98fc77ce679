"""Runs a grid through an executor, writing each finished case at once.

A sweep survives its own cases: out-of-memory and over-long cases are recorded and the larger
cases of that layer skipped; a worker that dies loses only its job, which is run once more
elsewhere; SIGINT / SIGTERM stop it after the rounds now timing; ``resume_sweep`` finishes it.
Which executor ran a case is known only to the executors: the runner hands out jobs and writes
results. The runner starts the executor, prepares the folder and loads a resumed run once each.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from attnbench.errors import AttnbenchError, SweepFailed, SweepInterrupted
from attnbench.layers import plugins
from attnbench.measure.machine.ceilings_file import cache_dir, ceilings_cached
from attnbench.measure.timing.allocator import run_state
from attnbench.measure.timing.faults import fault_cost_s
from attnbench.measure.timing.loop import Clock
from attnbench.options import build_grid, grid_from_config, grid_options
from attnbench.results.environment import changes, key_labels, resume_keys
from attnbench.results.files import default_out_dir, new_out_dir, now_iso
from attnbench.results.loader import load_results
from attnbench.results.reruns import code_of
from attnbench.results.run import RunResults
from attnbench.results.store import ResultsWriter
from attnbench.results.theories import merge, record
from attnbench.run.estimate import (
    CEILINGS_S,
    QUIET,
    estimate_bounds,
    in_cache,
    machine_busy,
    size_warning,
)
from attnbench.run.events import NO_LISTENERS, Listeners, SweepStart
from attnbench.run.executors.base import Executor
from attnbench.run.executors.serial import SerialExecutor
from attnbench.run.queue import DEFAULT_MEASURING, JobQueue, Measuring
from attnbench.run.quiet import MachineQuiet, quiet_file, read_quiet, wait_left, write_quiet
from attnbench.run.reruns import of_layers, other_code, read_reruns, reruns_file, write_reruns
from attnbench.run.resumed import Previous
from attnbench.run.signals import GracefulStop
from attnbench.schema import RunStatus, Status
from attnbench.spec import Grid


def run_sweep(
    grid: Grid | Mapping[str, Any],
    out_dir: Path | str | None = None,
    *,
    executor: Executor | None = None,
    measuring: Measuring = DEFAULT_MEASURING,
    listeners: Listeners = NO_LISTENERS,
    clock: Clock = time.perf_counter,
    allow_large: bool = True,
) -> RunResults:
    """Measure every case of ``grid`` into ``out_dir`` (default: a new folder under results/).

    ``grid`` is a ``Grid``, or ``build_grid`` options, whose device is then resolved by the
    executor (``allow_large=False`` refuses a grid ``size_warning`` warns about). Each case is
    on disk as soon as it finishes, so an interruption keeps what was measured.
    ``executor`` (default: serial, in this process, timed with ``clock``) runs the cases; a
    given ``Grid``'s device must have been resolved by it. ``measuring`` says how each case is
    measured: its timing policy, the calibration GEMM timed between the cases on their worker
    (None: off; a point at most every ``calibration.every_s``), and how its exact counts are
    taken (the count cache, full traces). ``listeners`` hear each case's progress and, once the
    workers are up, what the sweep is about to do. Raises ``SweepInterrupted`` (exit code 130)
    after SIGINT / SIGTERM.
    """
    with _executor(executor, clock) as runs_on:
        if not isinstance(grid, Grid):
            grid = grid_for(grid, runs_on)
        warning = None if allow_large else size_warning(grid)
        if warning:
            raise AttnbenchError(warning)
        config, sources, options = grid.to_dict(), grid.sources(), grid.option_names()
        theories = record(grid)
        with new_out_dir(Path(out_dir) if out_dir is not None else default_out_dir()) as folder:
            early = _ceilings_while_starting(runs_on, grid, listeners)
            cluster = runs_on.start(grid)  # before the environment, which records its threads
        environment = runs_on.environment(grid.device)
        writer = ResultsWriter.create(folder, config, environment, options)
        cost = fault_cost_s()
        writer.update(
            cluster=cluster,
            layers=sources,
            allocator=run_state(cluster.get("workers", [])),
            fault_cost_s=cost,  # what one page fault costs here (measure.timing.faults)
            count_cache={
                "enabled": measuring.counting.cache,
                "folder": str(cache_dir() / "counts"),
            },
        )
        writer.record_theories(theories)
        if early is not None:  # measured as the workers started: the run's fault cost, as below
            writer.update(**_with_fault_cost(early, cost))
        return _start(writer, grid, None, runs_on, cluster, measuring, listeners, fault_cost=cost)


def _with_fault_cost(ceilings: dict[str, Any], cost: float | None) -> dict[str, Any]:
    """run.json's ``ceilings`` with the run's measured page-fault cost, as ``local_ceilings``
    records it."""
    found = ceilings.get("ceilings")
    if not found or found.get("page_fault_s") is None or cost is None:
        return ceilings
    return {**ceilings, "ceilings": {**found, "page_fault_s": cost}}


def _ceilings_while_starting(
    runs_on: Executor, grid: Grid, listeners: Listeners
) -> dict[str, Any] | None:
    """run.json's ``ceilings``, measured here while the executor's processes start and import
    torch, where they run apart from this one and the cache has none (None: not measured).
    A cold default sweep waited 1.8 s for those imports before it measured them. Beside the
    imports, on this project's 2-core CPU (2026-12-01, three pairs taking turns), they read
    what they read alone: peak 178-181 GF/s, bandwidth 13.3-13.6 GB/s, op latency 1.11-1.12 µs."""
    launch = getattr(runs_on, "launch", None)
    threads = grid.threads or torch.get_num_threads()
    if launch is None or runs_on.in_process or ceilings_cached(grid.device, grid.dtype, threads):
        return None
    launch(grid)
    if listeners.on_ceilings is not None:
        listeners.on_ceilings()
    return runs_on.ceilings(grid, None)


def _start(
    writer: ResultsWriter,
    grid: Grid,
    previous: Previous | None,
    runs_on: Executor,
    cluster: dict[str, Any],
    measuring: Measuring,
    listeners: Listeners,
    *,
    fault_cost: float | None,
) -> RunResults:
    """What a new sweep and a resumed one do alike once their folder is open: tell the caller
    what is about to run and how long it should take, get the machine's ceilings (from the
    cache, or measured; not again for a run that has them), then measure the cases."""
    earlier = previous.run if previous is not None else None
    done = 0 if earlier is None else len(earlier.frame)
    total = len(grid.cases())
    on_start = listeners.on_start
    threads = grid.threads or torch.get_num_threads()
    # the machine's quiet levels, read once: the start's estimate and every round judge by them
    # (a resumed run goes on with the level its rounds were judged against)
    machine = quiet_file(threads)
    known = read_quiet(machine)
    # (the cache holds the run's own level by now, left when it ended or was stopped: a resume
    # that read it again would judge its rounds, and a busy machine's intervals
    # (estimators.busy_slowdown), against another level than its first session's)
    level = earlier.record.machine_quiet_s if earlier is not None else known.level
    quiet = _Quiet(machine, known, level)
    if earlier is None:  # a resumed run goes on with the sweeps it found when it began
        path = reruns_file(grid.device, grid.dtype, threads, code_of(writer.meta["environment"]))
        writer.update(
            reruns=of_layers(read_reruns(path), grid.layers),
            reruns_other=of_layers(other_code(path), grid.layers),
        )
    if on_start is not None:
        counting = measuring.counting
        # a resumed run's start says no estimate: no machine to read for one
        busy = machine_busy(quiet.level, threads) if earlier is None else QUIET
        low, high = estimate_bounds(
            grid,
            lambda c: in_cache(c, grid.seed, counting),
            counting,
            not runs_on.in_process,
            busy.slowdown,
        )
    # a new run's may have been measured as its workers started (``_ceilings_while_starting``)
    has_ceilings = (
        earlier.record.ceilings is not None if earlier is not None else "ceilings" in writer.meta
    )
    cached = has_ceilings or ceilings_cached(grid.device, grid.dtype, threads)
    if on_start is not None:
        left = max(0, total - done) / max(1, total) / max(1, runs_on.workers)
        first = 0.0 if cached else CEILINGS_S
        on_start(
            SweepStart(
                grid,
                writer.out_dir,
                cluster,
                runs_on.workers,
                high * left + first,
                earlier,
                ceilings_cached=cached,
                estimate_low_s=low * left + first,
                retried=0 if previous is None else previous.retried,
                waits_s=wait_left(grid.wait_quiet_s, earlier.record.waited_s if earlier else 0),
                busy=busy,
            )
        )
    if not has_ceilings:
        with _stopped_before_cases(writer, total, done):
            writer.update(**runs_on.ceilings(grid, fault_cost))
    return _sweep(writer, grid, previous, measuring, listeners, executor=runs_on, quiet=quiet)


@contextlib.contextmanager
def _stopped_before_cases(writer: ResultsWriter, total: int, done: int = 0) -> Iterator[None]:
    """Ctrl-C before the first case (the ceilings take seconds): the run is recorded
    ``interrupted``, not left ``running``, and the stop says how to finish it."""
    try:
        yield
    except KeyboardInterrupt:
        writer.finish(RunStatus.INTERRUPTED)
        raise SweepInterrupted(str(writer.out_dir), done, total, "SIGINT") from None


@contextlib.contextmanager
def _executor(executor: Executor | None, clock: Clock) -> Iterator[Executor]:
    """The given executor (its caller closes it), or a serial one closed here."""
    if executor is not None:
        yield executor
        return
    serial = SerialExecutor(clock)
    try:
        yield serial
    finally:
        serial.close()


def grid_for(options: Mapping[str, Any], runs_on: Executor) -> Grid:
    """``build_grid`` of ``options`` on the executor's devices. An executor that places a case
    per --threads CPUs (Ray: ``keeps_torch_threads``) keeps torch's own threads where none are
    given, a node's cores to a case, not the one thread a local sweep takes on the CPU."""
    if getattr(runs_on, "keeps_torch_threads", False):
        options = {"threads": None, **options}
    return build_grid(options, runs_on.resolve_device)


def resume_sweep(
    out_dir: Path | str,
    overrides: Mapping[str, Any] | None = None,
    *,
    force: bool = False,
    retry: bool = False,
    executor: Executor | None = None,
    measuring: Measuring = DEFAULT_MEASURING,
    listeners: Listeners = NO_LISTENERS,
    clock: Clock = time.perf_counter,
) -> RunResults:
    """Measure the cases of a results folder that are not in it yet, with its recorded grid.

    ``overrides`` (build_grid options) or a changed environment are refused unless ``force``;
    forced changes are recorded in run.json under ``resumes``.  A case the previous process
    died in is recorded as failed (it may be what killed it) and blocks its larger cases.
    ``retry`` measures again every case not recorded ``ok`` (failed, oom, timeout, skipped)
    and the one the previous process died in: a kill or a power cut that was blamed on a case,
    or a failure since mended. The cases retried are listed under ``resumes`` in run.json.
    ``executor``, ``measuring``, ``listeners`` and ``clock`` are as ``run_sweep`` takes them.
    """
    out_dir = Path(out_dir)
    run, died, retried = _left_to_measure(load_results(out_dir, resuming=True), retry)
    layer_changes, pid = _may_resume(run, out_dir, overrides, force)
    with _executor(executor, clock) as runs_on:
        try:
            recorded = grid_from_config(run.record.config, runs_on.resolve_device)
        except AttnbenchError as exc:
            raise AttnbenchError(
                f"--resume {str(out_dir)!r}: cannot rebuild the recorded sweep: {exc.message}"
            ) from None
        grid = (
            build_grid({**grid_options(recorded), **overrides}, runs_on.resolve_device)
            if overrides
            else recorded
        )
        cluster = runs_on.start(grid)  # before the environment: the workers' devices, threads
        now_env = runs_on.environment(grid.device)
        config_changes = changes(recorded.to_dict(), grid.to_dict(), grid.to_dict())
        env_changes = changes(run.record.environment, now_env, resume_keys())
        if env_changes.get("code_digest", [""])[0] is None:  # a run that did not record it
            del env_changes["code_digest"]
        env_changes |= {f"layer {name}": change for name, change in layer_changes.items()}
        if not force:
            _refuse_changes(out_dir, config_changes, env_changes)
        resumed = {
            "time": now_iso(),
            "forced": bool(force and (config_changes or env_changes or pid)),
            "config_changes": config_changes,
            "environment_changes": env_changes,
            "environment": now_env,
            "cluster": cluster,
            **({"retried": retried} if retry else {}),
        }
        writer = _reopened(run, grid, resumed)
        # A run stopped while its ceilings were measured (or where they could not be) gets
        # them now, from the cache or measured, as a new run would.
        previous = Previous(run, died, len(retried))
        return _start(
            writer,
            grid,
            previous,
            runs_on,
            cluster,
            measuring,
            listeners,
            fault_cost=run.record.fault_cost_s,
        )


def _may_resume(
    run: RunResults, out_dir: Path, overrides: Mapping[str, Any] | None, force: bool
) -> tuple[dict[str, list[str]], int | None]:
    """Its plugin layers loaded again from where they came, before the grid is rebuilt (each
    checked against the record before any of its code runs): how they changed, and the
    process that may still be writing the run (one line, unless ``force``)."""
    named = (overrides or {}).get("layers") or ()
    layer_changes = plugins.restore(
        run.record.layers,
        force=force,
        results=out_dir,
        named=plugins.named_files(named.split(",") if isinstance(named, str) else named),
    )
    pid = run.record.live_pid()
    if pid is not None and not force:
        raise AttnbenchError(
            f"--resume {str(out_dir)!r}: process {pid} on this machine may still be writing "
            "this run; stop it first (or pass --force if that process is something else)"
        )
    return layer_changes, pid


def _reopened(run: RunResults, grid: Grid, resumed: dict[str, Any]) -> ResultsWriter:
    """The run's folder opened again for its missing cases, with what this resume is (listed
    under ``resumes``), the layers and theories of both processes, and a forced grid."""
    writer = ResultsWriter.reopen(run, resumed, grid.option_names())
    now, ran = grid.sources(), run.record.layers
    theories, before = record(grid), run.theories.get("layers", {})
    # A layer whose code changed (a forced resume) keeps naming the code its cases ran, and
    # that code's theory, until this session runs it (``ResultsWriter.code_to_come``).
    changed = [name for name in now if ran.get(name, now[name]) != now[name]]
    writer.code_to_come = {name: (now[name], theories["layers"].get(name)) for name in changed}
    writer.update(layers={**ran, **now, **{name: ran[name] for name in changed}})
    merged = merge(run.theories, theories)
    merged["layers"].update({name: before[name] for name in changed if name in before})
    writer.record_theories(merged)
    if resumed["config_changes"]:
        writer.update(config=grid.to_dict())
    return writer


def _left_to_measure(run: RunResults, retry: bool) -> tuple[RunResults, str | None, list[str]]:
    """A run to resume (the one read of its folder), less what ``retry`` measures again: the
    run, the case a killed process was in (recorded failed: it may be what killed it; with
    ``retry`` measured again like every case not ok), and the cases retried."""
    died = run.record.current_case if run.status == RunStatus.RUNNING else None
    retried: list[str] = []
    if retry:
        retried = sorted(run.frame.loc[run.frame["status"] != Status.OK, "case_id"])
        run = run.without(set(retried))
        retried += [died] if died else []
        died = None
    return run, died, retried


def _refuse_changes(
    out_dir: Path,
    config_changes: Mapping[str, Sequence[Any]],
    env_changes: Mapping[str, Sequence[Any]],
) -> None:
    """One line naming what differs from the recorded run, where anything does (without
    --force, a resumed run is the same sweep on the same machine)."""
    if not (config_changes or env_changes):
        return
    # "attnbench's code", not code_digest (a new user could not tell); a label that is also a
    # setting changed beside it ("threads") keeps its key
    said = {key: label for key, label in key_labels().items() if label not in config_changes}
    listed = ", ".join(
        f"{said.get(key, key)} {old!r} -> {new!r}"
        for key, (old, new) in {**config_changes, **env_changes}.items()
    )
    what = "configuration" if config_changes else "environment"
    raise AttnbenchError(
        f"--resume {str(out_dir)!r}: the {what} differs from the recorded run ({listed}); "
        "pass --force to resume anyway (the changes are recorded in run.json)"
    )


def _sweep(
    writer: ResultsWriter,
    grid: Grid,
    previous: Previous | None,
    measuring: Measuring,
    listeners: Listeners,
    *,
    executor: Executor,
    quiet: _Quiet,
) -> RunResults:
    calibration = measuring.calibration

    queue: JobQueue | None = None

    def on_stop(_: str) -> None:
        # Always answered once a case has been seen: a signal between two cases (none running)
        # is as much a request as one inside a case (and before the queue is made, none).
        if queue is not None and queue.last is not None:
            queue.notify("stopping", queue.last)

    machine, known, level = quiet.path, quiet.known, quiet.level
    # a resumed run goes on with its waits: --wait-quiet is the whole run's
    waited = previous.run.record.waited_s if previous is not None else 0.0
    with GracefulStop(on_stop) as stop:
        queue = JobQueue(
            grid,
            writer,
            previous,
            measuring=replace(measuring, quiet_s=level),
            in_process=executor.in_process,
            progress=listeners.progress,
            stop=stop,
        )
        queue.waited_s = waited  # --wait-quiet is the whole run's, resumes included
        writer.update(cases_total=len(queue.cases), quiet=_quiet_record(level, known, waited))
        if calibration is not None:
            writer.update(calibration=calibration.describe())
        hard = False  # a second signal, which may land between a round's row and its next
        try:
            for done in executor.run(queue.take):
                queue.finish(done)
        except KeyboardInterrupt:
            stop.signal_name, hard = stop.signal_name or "SIGINT", True
        except AttnbenchError as exc:
            with contextlib.suppress(AttnbenchError):  # a full disk takes run.json too
                writer.update(round_stops=queue.round_stops)
                writer.finish(RunStatus.INTERRUPTED)
            raise SweepFailed(
                exc.message, str(writer.out_dir), queue.completed, exc.exit_code
            ) from None
        writer.update(
            quiet=_quiet_record(level, known, queue.waited_s), round_stops=queue.round_stops
        )
        own = queue.own_quiet()
        if own is not None and previous is None:  # a resumed run's first session left it
            write_quiet(machine, known.after(own))
        if stop.requested and (hard or not queue.drained):
            # The executor ran out of jobs because none were handed out: its workers stopped.
            stopped = getattr(executor, "stopped", None)
            if stopped is not None:
                stopped()
            writer.finish(RunStatus.INTERRUPTED)
            least, ran = queue.replication.least, queue.rounds_done
            short = sum(len(ran.get(c, ())) < least for c in queue.ok - queue.ended)
            raise SweepInterrupted(
                str(writer.out_dir), queue.completed, queue.planned, str(stop.signal_name),
                short, upto=queue.auto is not None,
            )  # fmt: skip
    if queue.auto is not None:  # the cases it reached, and what stopped each line
        writer.update(cases_total=queue.completed, auto=queue.auto.describe())
    left = bool(writer.meta.get("reruns_left"))  # a completed run resumed: already left
    if not left:
        writer.update(reruns_left=True)
    writer.finish(RunStatus.COMPLETE)
    run = load_results(writer.out_dir)
    if not left:  # what this sweep leaves for the next's spread between sweeps (run.reruns)
        threads = grid.threads or torch.get_num_threads()
        code = code_of(run.record.environment)
        write_reruns(reruns_file(grid.device, grid.dtype, threads, code), run.entries)
    return run


@dataclass(frozen=True)
class _Quiet:
    """This machine's quiet levels as the sweep found them (``run.quiet``): where they are kept,
    what was kept, and the level its rounds are judged against."""

    path: Path
    known: MachineQuiet
    level: float | None


def _quiet_record(level: float | None, known: MachineQuiet, waited_s: float) -> dict[str, Any]:
    """run.json's ``quiet``: the machine's quiet level its rounds were judged against as well
    as the sweep's own (``run.quiet``; null: none kept yet), from how many sweeps, and the
    seconds its rounds waited for a quiet machine (a resumed run's: every session's)."""
    return {"machine_s": level, "sweeps": len(known.levels), "waited_s": round(waited_s, 3)}
