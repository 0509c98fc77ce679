"""Runs a grid through an executor, writing each finished case at once.

Progress is reported through a plain callback, so the core knows nothing of terminals.  A sweep
survives its own cases: out-of-memory and over-long cases are recorded and the larger cases of
that layer skipped; a worker that dies loses only its job, which is run once more elsewhere;
SIGINT / SIGTERM stop it after the running cases; ``resume_sweep`` finishes it.  Which executor
ran a case is known only to ``attnbench.execute``: the runner hands out jobs and writes results.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import torch

from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.execute import Executor, Job, JobDone, Placement, SerialExecutor
from attnbench.measure import TimingPolicy
from attnbench.measure.calibration import DEFAULT_CALIBRATION, Calibration
from attnbench.measure.case import (  # noqa: F401  (re-exported: the runner's public names)
    device_sync,
    is_out_of_memory,
    make_step,
    measure_case,
    prime_instruments,
    release_memory,
    retime_case,
)
from attnbench.measure.timing import Clock, TimingStats
from attnbench.results import (
    DIED_ERROR,
    WORKER_DIED_ERROR,
    CaseResult,
    ResultsWriter,
    RunResults,
    default_out_dir,
    load_results,
    now_iso,
)
from attnbench.spec import Case, Grid, build_grid, grid_from_config


@dataclass(frozen=True)
class ProgressEvent:
    """``start`` when a case is handed to a worker, ``done`` after it is written (with its
    result), ``retry`` when its worker died and it is run again (``error`` says why),
    ``stopping`` when a signal asked the sweep to stop after the ``running`` cases.  In rounds
    after the first, ``round`` > 1 and ``timing`` holds that round's samples (no ``result``)."""

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


class _GracefulStop:
    """SIGINT / SIGTERM: the first asks the sweep to stop after the current case, a second one
    stops it at once (KeyboardInterrupt).  Signals that arrive while a case is being written are
    held until the write is done, so a stop never tears a file."""

    def __init__(self, on_request: Callable[[str], None] | None = None) -> None:
        self.on_request = on_request
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._writing = False
        self._held = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> _GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            if self.on_request is not None:
                self.on_request(self.signal_name)
        elif self._writing:
            self._held = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self._held:
            raise KeyboardInterrupt


def _blocking(status: str, error: str) -> bool:
    """Whether a case with this outcome means larger cases of its layer would fail too."""
    return (
        status in ("oom", "timeout") or error == DIED_ERROR or error.startswith(WORKER_DIED_ERROR)
    )


@dataclass(frozen=True)
class _Block:
    layer: str
    n: int
    d: int
    why: str

    def covers(self, case: Case) -> bool:
        """A case at least as long and as wide, of the same layer, would fail the same way."""
        return case.layer == self.layer and case.n >= self.n and case.d >= self.d


def _block(layer: str, n: int, d: int, status: str) -> _Block:
    why = {"oom": "ran out of memory", "timeout": "ran out of time"}.get(status, "crashed")
    return _Block(layer, int(n), int(d), f"{layer} n={n} d={d} {why}")


def run_sweep(
    grid: Grid,
    out_dir: Path | str | None = None,
    *,
    progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
    calibration: Calibration | None = DEFAULT_CALIBRATION,
    executor: Executor | None = None,
) -> RunResults:
    """Measure every case of ``grid`` into ``out_dir`` (default: a new folder under results/).

    Each case is on disk as soon as it finishes, so an interruption keeps what was measured.
    ``calibration`` (None: off) is timed before every measured case, on its worker.
    ``executor`` (default: serial, in this process, timed with ``clock``) runs the cases; the
    grid's device must have been resolved by it (``build_grid(options, executor.resolve_device)``).
    Raises ``SweepInterrupted`` (exit code 130) after SIGINT / SIGTERM.
    """
    with _executor(executor, clock) as runs_on:
        cluster = runs_on.start(grid)  # before the environment, which records its threads
        writer = ResultsWriter.create(
            Path(out_dir) if out_dir is not None else default_out_dir(),
            config=grid.to_dict(),
            environment=runs_on.environment(grid.device),
        )
        writer.set_cluster(cluster)
        return _sweep(
            writer,
            grid,
            None,
            progress=progress,
            policy=policy,
            calibration=calibration,
            executor=runs_on,
        )


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


# What must match for a resumed run to be comparable with its first part.
RESUME_ENVIRONMENT_KEYS = (
    "attnbench_version",
    "torch_version",
    "python_version",
    "hostname",
    "cpu_model",
    "device_name",
    "torch_threads",
    "cuda_version",
    "cudnn_version",
    "git_commit",
)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], keys: Any) -> dict[str, Any]:
    return {
        key: [before.get(key), after.get(key)] for key in keys if before.get(key) != after.get(key)
    }


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
    progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
    calibration: Calibration | None = DEFAULT_CALIBRATION,
    executor: Executor | None = None,
) -> RunResults:
    """Measure the cases of a results folder that are not in it yet, with its recorded grid.

    ``overrides`` (build_grid options) or a changed environment are refused unless ``force``;
    forced changes are recorded in run.json under ``resumes``.  A case the previous process
    died in is recorded as failed (it may be what killed it) and blocks its larger cases.
    """
    out_dir = Path(out_dir)
    run = load_results(out_dir)
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
        config_changes = _changes(recorded.to_dict(), grid.to_dict(), grid.to_dict())
        env_changes = _changes(run.meta.get("environment", {}), now_env, RESUME_ENVIRONMENT_KEYS)
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
            out_dir,
            {
                "time": now_iso(),
                "forced": bool(force and (config_changes or env_changes or pid)),
                "config_changes": config_changes,
                "environment_changes": env_changes,
                "environment": now_env,
                "cluster": cluster,
            },
        )
        if config_changes:
            writer.meta["config"] = grid.to_dict()
        died = run.meta.get("current_case") if run.status == "running" else None
        return _sweep(
            writer,
            grid,
            run,
            died=died,
            progress=progress,
            policy=policy,
            calibration=calibration,
            executor=runs_on,
        )


class _Queue:
    """The sweep's state, and the jobs it hands to idle workers in order: retries first, then
    each case's first round in grid order, then later rounds (round by round, in grid order,
    each on the device model its first round ran on).  Cases covered by a failure of a smaller
    one, and one the previous process died in, are written as they come up, without a worker."""

    def __init__(
        self,
        grid: Grid,
        writer: ResultsWriter,
        previous: RunResults | None,
        *,
        died: str | None,
        policy: TimingPolicy,
        calibration: Calibration | None,
        in_process: bool,
        notify: Callable[..., None],
        stop: _GracefulStop,
    ) -> None:
        self.grid, self.writer, self.notify, self.stop = grid, writer, notify, stop
        self.cases = grid.cases()
        self.index = {case.case_id: i for i, case in enumerate(self.cases)}
        self.died, self.policy, self.calibration = died, policy, calibration
        self.in_process = in_process
        self.done: set[str] = set()
        self.ok: set[str] = set()
        self.rounds_done: dict[str, set[int]] = {}  # case_id -> rounds finished (or failed)
        self.next_sample: dict[str, int] = {}
        self.device_of: dict[str, str] = {}  # case_id -> device model of its first round
        self.blocks: list[_Block] = []
        self.running: set[tuple[str, int]] = set()  # (case_id, round) of the jobs out
        self.retries: deque[Job] = deque()
        self.later: list[tuple[int, int]] = []  # heap of (round, grid index)
        if previous is not None:
            for row in previous.frame.itertuples():
                self.done.add(row.case_id)
                if row.status == "ok":
                    self.ok.add(row.case_id)
                    self.device_of[row.case_id] = row.device_name
                if _blocking(row.status, row.error):
                    self.blocks.append(_block(row.layer, row.n, row.d, row.status))
            for case_id, group in previous.samples.groupby("case_id"):
                self.rounds_done[str(case_id)] = set(group["round"].tolist())
                self.next_sample[str(case_id)] = int(group["sample"].max()) + 1
            for case_id in self.ok:
                if case_id in self.index:
                    self._queue_next_round(case_id)
        self.first = deque(i for i, case in enumerate(self.cases) if case.case_id not in self.done)

    @property
    def completed(self) -> int:
        """Cases of the grid with a row on disk (earlier runs of a resume included)."""
        return sum(case.case_id in self.done for case in self.cases)

    def units_done(self) -> int:
        """(case, round) pairs done: a case that did not measure has nothing left to do."""
        total = 0
        for case in self.cases:
            if case.case_id in self.ok:
                rounds = self.rounds_done.get(case.case_id, set())
                total += len(rounds & set(range(1, self.grid.rounds + 1)))
            elif case.case_id in self.done:
                total += self.grid.rounds
        return total

    def _job(self, case: Case, round_: int) -> Job:
        return Job(
            case=case,
            round=round_,
            seed=self.grid.seed,
            policy=self.policy,
            max_case_s=self.grid.max_case_s,
            calibration=self.calibration,
            device_name=self.device_of.get(case.case_id) if round_ > 1 else None,
        )

    def _queue_next_round(self, case_id: str) -> None:
        missing = set(range(2, self.grid.rounds + 1)) - self.rounds_done.get(case_id, set())
        if missing:
            heapq.heappush(self.later, (min(missing), self.index[case_id]))

    def take(self, where: Placement) -> Job | None:
        """The next job for a worker at ``where``, or None when there is none for it now."""
        if self.stop.requested:
            return None
        job = self._next(where)
        if job is None:
            return None
        self.running.add((job.case.case_id, job.round))
        if self.in_process:
            # What a resumed run learns if this process dies: the case it died in.
            if job.round == 1:
                self.writer.begin(job.case)
            elif self.writer.meta.get("current_case") is not None:
                self.writer.begin(None)
        self.notify("start", job.case, round_=job.round)
        return job

    def _next(self, where: Placement) -> Job | None:
        for _ in range(len(self.retries)):
            job = self.retries.popleft()
            if job.device_name in (None, where.device_name):
                return job
            self.retries.append(job)
        while self.first:
            case = self.cases[self.first.popleft()]
            unrun = self._unrun(case)
            if unrun is None:
                return self._job(case, 1)
            self._write(unrun)  # never runs: written at once
        passed: list[tuple[int, int]] = []
        try:
            while self.later:
                round_, i = heapq.heappop(self.later)
                case = self.cases[i]
                if self.device_of.get(case.case_id, where.device_name) == where.device_name:
                    return self._job(case, round_)
                passed.append((round_, i))  # for a worker on its own device model
        finally:
            for item in passed:
                heapq.heappush(self.later, item)
        return None

    def _unrun(self, case: Case) -> CaseResult | None:
        """The row of a case that is not to be run (died in before, or blocked), else None."""
        threads = self.grid.threads or torch.get_num_threads()
        if case.case_id == self.died:
            return CaseResult(case=case, status="failed", threads=threads, error=DIED_ERROR)
        for block in self.blocks:
            if block.covers(case):
                return CaseResult(
                    case=case, status="skipped", threads=threads, error=f"after {block.why}"
                )
        return None

    def _write(self, result: CaseResult, point: TimingStats | None = None) -> None:
        case = result.case
        if _blocking(result.status, result.error):
            self.blocks.append(_block(case.layer, case.n, case.d, result.status))
        with self.stop.writing():
            self.writer.append(result, point)
        self.done.add(case.case_id)
        if result.status == "ok" and result.timing is not None:
            self.ok.add(case.case_id)
            self.rounds_done[case.case_id] = {1}
            self.next_sample[case.case_id] = result.timing.count
            self.device_of[case.case_id] = result.device_name
            self._queue_next_round(case.case_id)
        self.notify("done", case, result)

    def finish(self, done: JobDone) -> None:
        """Write what a worker sends back; a job whose worker died runs once more elsewhere."""
        job = done.job
        case = job.case
        self.running.discard((case.case_id, job.round))
        if done.lost and job.attempt == 1:
            self.retries.append(replace(job, attempt=2))
            self.notify("retry", case, round_=job.round, where=done.where, error=done.lost)
            return
        if job.round == 1:
            result = done.result
            if done.lost or result is None:
                where = done.where
                result = CaseResult(
                    case=case,
                    status="failed",
                    threads=where.threads if where else self.grid.threads or 0,
                    error=f"{WORKER_DIED_ERROR}: {done.lost or 'no result came back'}"[:300],
                    node=where.node if where else "",
                    device_id=where.device_id if where else "",
                    device_name=where.device_name if where else "",
                )
            self._write(result, done.point)
            return
        timing = None if done.lost else done.timing
        if timing is not None:
            first = self.next_sample.get(case.case_id, 0)
            with self.stop.writing():
                self.writer.append_round(case.case_id, job.round, first, timing, done.point)
            self.next_sample[case.case_id] = first + timing.count
        self.rounds_done.setdefault(case.case_id, set()).add(job.round)  # failed: not retried
        self._queue_next_round(case.case_id)
        self.notify("done", case, round_=job.round, timing=timing, where=done.where)


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
    writer.set_total(len(cases))
    if calibration is not None:
        writer.set_calibration(calibration.describe())
    last: dict[str, Any] = {}

    def notify(kind: Any, case: Case, result: CaseResult | None = None, **more: Any) -> None:
        last.update(case=case)
        if progress is not None:
            progress(
                ProgressEvent(
                    kind,
                    queue.index[case.case_id],
                    len(cases),
                    case,
                    result,
                    queue.completed,
                    more.pop("round_", 1),
                    grid.rounds,
                    queue.units_done(),
                    running=len(queue.running),
                    **more,
                )
            )

    def on_stop(_: str) -> None:
        if queue.running and "case" in last:
            notify("stopping", last["case"])

    with _GracefulStop(on_stop) as stop:
        queue = _Queue(
            grid,
            writer,
            previous,
            died=died,
            policy=policy,
            calibration=calibration,
            in_process=executor.in_process,
            notify=notify,
            stop=stop,
        )
        try:
            for done in executor.run(queue.take):
                queue.finish(done)
        except KeyboardInterrupt:
            stop.signal_name = stop.signal_name or "SIGINT"
        except AttnbenchError as exc:
            writer.finish("interrupted")
            raise AttnbenchError(
                f"{exc.message}; the {queue.completed} finished case(s) are saved: "
                f"attnbench sweep --resume {writer.out_dir}"
            ) from None
        if stop.requested:
            writer.finish("interrupted")
            raise SweepInterrupted(
                str(writer.out_dir), queue.completed, len(cases), str(stop.signal_name)
            )
    writer.finish("complete")
    return load_results(writer.out_dir)
