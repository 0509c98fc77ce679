"""Runs a grid through an executor, writing each finished case at once.

A sweep survives its own cases: out-of-memory and over-long cases are recorded and the larger
cases of that layer skipped; a worker that dies loses only its job, which is run once more
elsewhere; SIGINT / SIGTERM stop it after the running cases; ``resume_sweep`` finishes it.
Which executor ran a case is known only to the executors: the runner hands out jobs and writes
results. The runner starts the executor, prepares the folder and loads a resumed run once each.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnbench.errors import AttnbenchError, SweepInterrupted, first_line
from attnbench.layers import plugins
from attnbench.measure import countcache
from attnbench.measure.allocator import run_state
from attnbench.measure.calibration import DEFAULT_CALIBRATION, Calibration
from attnbench.measure.ceilings_file import cache_dir, ceilings_cached, machine_ceilings
from attnbench.measure.faults import fault_cost_s
from attnbench.measure.timing import Clock, TimingPolicy
from attnbench.results.environment import changes, resume_keys
from attnbench.results.files import default_out_dir, new_out_dir, now_iso
from attnbench.results.run import RunResults
from attnbench.results.store import ResultsWriter, load_results
from attnbench.results.theories import merge, record
from attnbench.run.estimate import (
    CEILINGS_S,
    estimate_bounds,
    estimate_seconds,
    in_cache,
    size_warning,
)
from attnbench.run.events import ProgressCallback, StartCallback, SweepStart
from attnbench.run.executors.base import Executor
from attnbench.run.executors.serial import SerialExecutor
from attnbench.run.queue import JobQueue
from attnbench.run.signals import GracefulStop
from attnbench.spec import Grid, build_grid, grid_from_config


def run_sweep(
    grid: Grid | Mapping[str, Any],
    out_dir: Path | str | None = None,
    *,
    progress: ProgressCallback | None = None,
    on_start: StartCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
    calibration: Calibration | None = DEFAULT_CALIBRATION,
    executor: Executor | None = None,
    allow_large: bool = True,
) -> RunResults:
    """Measure every case of ``grid`` into ``out_dir`` (default: a new folder under results/).

    ``grid`` is a ``Grid``, or ``build_grid`` options, whose device is then resolved by the
    executor (``allow_large=False`` refuses a grid ``size_warning`` warns about). Each case is
    on disk as soon as it finishes, so an interruption keeps what was measured.
    ``calibration`` (None: off) is timed between the measured cases, on their worker (a
    point at most every ``calibration.every_s``).
    ``executor`` (default: serial, in this process, timed with ``clock``) runs the cases; a
    given ``Grid``'s device must have been resolved by it. ``on_start`` hears what the sweep is
    about to do once its workers are up. Raises ``SweepInterrupted`` (exit code 130) after
    SIGINT / SIGTERM.
    """
    with _executor(executor, clock) as runs_on:
        if not isinstance(grid, Grid):
            grid = build_grid(grid, runs_on.resolve_device)
        warning = None if allow_large else size_warning(grid)
        if warning:
            raise AttnbenchError(warning)
        with new_out_dir(Path(out_dir) if out_dir is not None else default_out_dir()) as folder:
            cluster = runs_on.start(grid)  # before the environment, which records its threads
        environment = runs_on.environment(grid.device)
        writer = ResultsWriter.create(folder, grid.to_dict(), environment, grid.option_names())
        cost = fault_cost_s()
        writer.update(
            cluster=cluster,
            layers=grid.sources(),
            allocator=run_state(cluster.get("workers", [])),
            fault_cost_s=cost,  # what one page fault costs here (measure.faults)
            count_cache={"enabled": countcache.enabled(), "folder": str(cache_dir() / "counts")},
        )
        writer.record_theories(record(grid))
        threads = grid.threads or torch.get_num_threads()
        known = ceilings_cached(grid.device, grid.dtype, threads)
        if on_start is not None:
            low, high = estimate_bounds(grid, lambda c: in_cache(c, grid.seed))
            workers, first = max(1, runs_on.workers), 0.0 if known else CEILINGS_S
            start = SweepStart(
                grid, folder, cluster, runs_on.workers, high / workers + first,
                ceilings_cached=known, estimate_low_s=low / workers + first,
            )  # fmt: skip
            on_start(start)
        with _stopped_before_cases(writer, len(grid.cases())):
            writer.update(**run_ceilings(grid, cost))
        return _sweep(
            writer, grid, None, progress=progress, policy=policy, calibration=calibration,
            executor=runs_on,
        )  # fmt: skip


@contextlib.contextmanager
def _stopped_before_cases(writer: ResultsWriter, total: int, done: int = 0) -> Iterator[None]:
    """Ctrl-C before the first case (the ceilings take seconds): the run is recorded
    ``interrupted``, not left ``running``, and the stop says how to finish it."""
    try:
        yield
    except KeyboardInterrupt:
        writer.finish("interrupted")
        raise SweepInterrupted(str(writer.out_dir), done, total, "SIGINT") from None


def run_ceilings(grid: Grid, fault_cost: float | None = None) -> dict[str, Any]:
    """run.json's ``ceilings`` for the run's device, dtype and threads: from the cache, or
    measured now (a few seconds, once per machine; ``attnbench machine --remeasure`` measures
    again). They are this process's device: with Ray, the driver's. Where they cannot be
    measured (a driver with fewer CPUs than --threads asks of Ray's nodes), ``ceilings`` is
    None and ``ceilings_error`` says why: the run goes on, and ``attnbench predict --machine``
    takes a file instead."""
    threads = grid.threads or torch.get_num_threads()
    try:
        found, _ = machine_ceilings(grid.device, grid.dtype, threads)
    except (AttnbenchError, RuntimeError, OSError) as exc:
        reason = exc.message if isinstance(exc, AttnbenchError) else first_line(exc)
        return {"ceilings": None, "ceilings_error": reason}
    if found.page_fault_s is not None and fault_cost is not None:
        # One cost of a fault per run: the one measured now, which fault_cost_s records too.
        found = replace(found, page_fault_s=fault_cost)
    return {"ceilings": found.to_dict(), "ceilings_error": None}


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


def _still_running(meta: Mapping[str, Any]) -> int | None:
    """The pid of a live process on this host that may still be writing the run, if any."""
    pid = meta.get("pid")
    host = meta.get("environment", {}).get("hostname")
    if meta.get("status") != "running" or not isinstance(pid, int) or pid == os.getpid():
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, under another user
    return pid


def resume_sweep(
    out_dir: Path | str,
    overrides: Mapping[str, Any] | None = None,
    *,
    force: bool = False,
    retry: bool = False,
    progress: ProgressCallback | None = None,
    on_start: StartCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
    calibration: Calibration | None = DEFAULT_CALIBRATION,
    executor: Executor | None = None,
) -> RunResults:
    """Measure the cases of a results folder that are not in it yet, with its recorded grid.

    ``overrides`` (build_grid options) or a changed environment are refused unless ``force``;
    forced changes are recorded in run.json under ``resumes``.  A case the previous process
    died in is recorded as failed (it may be what killed it) and blocks its larger cases.
    ``retry`` measures again every case not recorded ``ok`` (failed, oom, timeout, skipped)
    and the one the previous process died in: a kill or a power cut that was blamed on a case,
    or a failure since mended. The cases retried are listed under ``resumes`` in run.json.
    """
    out_dir = Path(out_dir)
    run = load_results(out_dir)  # the one read of the folder before it is reopened
    # The case a killed process was in: recorded failed (it may be what killed it), or with
    # ``retry`` measured again like every case not ok.
    died = run.meta.get("current_case") if run.status == "running" else None
    retried: list[str] = []
    if retry:
        retried = sorted(run.frame.loc[run.frame["status"] != "ok", "case_id"])
        run = run.without(set(retried))
        retried += [died] if died else []
        died = None
    # Plugin layers are loaded again from where they came, before the grid is rebuilt; each is
    # checked against the record before any of its code runs.
    named = (overrides or {}).get("layers") or ()
    layer_changes = plugins.restore(
        run.meta.get("layers", {}),
        force=force,
        results=out_dir,
        named=plugins.named_files(named.split(",") if isinstance(named, str) else named),
    )
    pid = _still_running(run.meta)
    if pid is not None and not force:
        raise AttnbenchError(
            f"--resume {str(out_dir)!r}: process {pid} on this machine may still be writing "
            "this run; stop it first (or pass --force if that process is something else)"
        )
    with _executor(executor, clock) as runs_on:
        try:
            recorded = grid_from_config(run.meta.get("config", {}), runs_on.resolve_device)
        except AttnbenchError as exc:
            raise AttnbenchError(
                f"--resume {str(out_dir)!r}: cannot rebuild the recorded sweep: {exc.message}"
            ) from None
        grid = (
            build_grid({**recorded.to_options(), **overrides}, runs_on.resolve_device)
            if overrides
            else recorded
        )
        cluster = runs_on.start(grid)  # before the environment: the workers' devices, threads
        now_env = runs_on.environment(grid.device)
        config_changes = changes(recorded.to_dict(), grid.to_dict(), grid.to_dict())
        env_changes = changes(run.meta.get("environment", {}), now_env, resume_keys())
        env_changes |= {f"layer {name}": change for name, change in layer_changes.items()}
        if (config_changes or env_changes) and not force:
            listed = ", ".join(
                f"{key} {old!r} -> {new!r}"
                for key, (old, new) in {**config_changes, **env_changes}.items()
            )
            what = "configuration" if config_changes else "environment"
            raise AttnbenchError(
                f"--resume {str(out_dir)!r}: the {what} differs from the recorded run ({listed}); "
                "pass --force to resume anyway (the changes are recorded in run.json)"
            )
        writer = ResultsWriter.reopen(
            run,
            {
                "time": now_iso(),
                "forced": bool(force and (config_changes or env_changes or pid)),
                "config_changes": config_changes,
                "environment_changes": env_changes,
                "environment": now_env,
                "cluster": cluster,
                **({"retried": retried} if retry else {}),
            },
            grid.option_names(),
        )
        writer.update(layers={**run.meta.get("layers", {}), **grid.sources()})
        writer.record_theories(merge(run.theories, record(grid)))
        if config_changes:
            writer.update(config=grid.to_dict())
        # A run stopped while its ceilings were measured (or where they could not be) gets
        # them now, from the cache or measured, as a new run would.
        recorded = run.meta.get("ceilings") is not None
        known = recorded or ceilings_cached(
            grid.device, grid.dtype, grid.threads or torch.get_num_threads()
        )
        if on_start is not None:
            missing = len(grid.cases()) - len(run.frame)
            whole = estimate_seconds(grid, lambda c: in_cache(c, grid.seed))
            estimate = whole * max(0, missing) / max(1, len(grid.cases()))
            estimate += 0.0 if known else CEILINGS_S
            on_start(
                SweepStart(
                    grid, out_dir, cluster, runs_on.workers, estimate, run,
                    ceilings_cached=known, retried=len(retried),
                )
            )  # fmt: skip
        if not recorded:
            with _stopped_before_cases(writer, len(grid.cases()), len(run.frame)):
                writer.update(**run_ceilings(grid, run.meta.get("fault_cost_s")))
        return _sweep(
            writer, grid, run, died=died, progress=progress, policy=policy,
            calibration=calibration, executor=runs_on,
        )  # fmt: skip


def _sweep(
    writer: ResultsWriter,
    grid: Grid,
    previous: RunResults | None,
    *,
    died: str | None = None,
    progress: ProgressCallback | None,
    policy: TimingPolicy | None,
    calibration: Calibration | None,
    executor: Executor,
) -> RunResults:
    # The first call, the FLOP count and the memory profile precede timing: one more warm-up does.
    # The time budget is shared by the rounds.
    policy = policy or TimingPolicy(budget_s=grid.time_budget_s / grid.rounds, warmup_calls=1)
    cases = grid.cases()
    writer.update(cases_total=len(cases))
    if calibration is not None:
        writer.update(calibration=calibration.describe())

    def on_stop(_: str) -> None:
        # Always answered once a case has been seen: a signal between two cases (none running)
        # is as much a request as one inside a case.
        if queue.last is not None:
            queue.notify("stopping", queue.last)

    with GracefulStop(on_stop) as stop:
        queue = JobQueue(
            grid,
            writer,
            previous,
            died=died,
            policy=policy,
            calibration=calibration,
            in_process=executor.in_process,
            progress=progress,
            stop=stop,
        )
        try:
            for done in executor.run(queue.take):
                queue.finish(done)
        except KeyboardInterrupt:
            stop.signal_name = stop.signal_name or "SIGINT"
        except AttnbenchError as exc:
            with contextlib.suppress(AttnbenchError):  # a full disk takes run.json too
                writer.finish("interrupted")
            raise AttnbenchError(
                f"{exc.message}; the {queue.completed} finished case(s) are saved: "
                f"attnbench sweep --resume {writer.out_dir}"
            ) from None
        if stop.requested:
            # The executor ran out of jobs because none were handed out: its workers stopped.
            stopped = getattr(executor, "stopped", None)
            if stopped is not None:
                stopped()
            writer.finish("interrupted")
            raise SweepInterrupted(
                str(writer.out_dir), queue.completed, len(cases), str(stop.signal_name)
            )
    if queue.auto is not None:  # the cases it reached, and what stopped each line
        writer.update(cases_total=queue.completed, auto=queue.auto.describe())
    writer.finish("complete")
    return load_results(writer.out_dir)
