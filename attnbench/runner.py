"""Runs a grid case by case, writing each finished case at once.

Progress is reported through a plain callback, so the core knows nothing of terminals.  A sweep
survives its own cases: out-of-memory and over-long cases are recorded and the larger cases of
that layer skipped; SIGINT / SIGTERM stop it after the current case; ``resume_sweep`` finishes it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import torch
from torch import nn

from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.layers import build_layer
from attnbench.measure import TimingPolicy, count_flops, peak_bytes, time_call
from attnbench.measure.calibration import DEFAULT_CALIBRATION, Calibration
from attnbench.measure.structure import SEQ_METHOD, path_length, sequential_steps
from attnbench.measure.timing import DEFAULT_POLICY, Clock, TimingStats
from attnbench.results import (
    DIED_ERROR,
    CaseResult,
    ResultsWriter,
    RunResults,
    default_out_dir,
    environment,
    load_results,
    now_iso,
)
from attnbench.spec import DTYPES, Case, Grid, build_grid, grid_from_config
from attnbench.units import fmt_seconds


@dataclass(frozen=True)
class ProgressEvent:
    """``start`` before a case runs, ``done`` after it is written (with its result),
    ``stopping`` when a signal asked the sweep to stop after ``case``.  In rounds after the
    first, ``round`` > 1 and ``timing`` holds that round's samples (no ``result``)."""

    kind: Literal["start", "done", "stopping"]
    index: int  # 0-based position in the grid
    total: int
    case: Case
    result: CaseResult | None = None
    completed: int = 0  # cases of the grid with a row on disk (earlier runs of a resume included)
    round: int = 1
    rounds: int = 1
    units_done: int = 0  # (case, round) pairs finished, out of total * rounds
    timing: TimingStats | None = None


ProgressCallback = Callable[[ProgressEvent], None]


def device_sync(device: str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        dev = torch.device(device)
        return lambda: torch.cuda.synchronize(dev)
    if device == "mps":
        return torch.mps.synchronize
    return lambda: None


def make_input(case: Case, seed: int) -> torch.Tensor:
    """The seeded (batch, n, d) input every layer of a case gets."""
    # seed + 1: the input must not be the same random stream as the layer's weights.
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(case.batch, case.n, case.d, generator=gen)  # (B, n, d)
    return x.to(device=case.device, dtype=DTYPES[case.dtype])


@dataclass(frozen=True)
class Step:
    """One measured call of a case's layer on its input (calling it runs the call)."""

    layer: nn.Module
    x: torch.Tensor  # (B, n, d)
    call: Callable[[], torch.Tensor]

    def __call__(self) -> torch.Tensor:
        return self.call()

    def forward(self) -> torch.Tensor:
        """A plain forward call (what ``seq_steps`` describes, in either mode)."""
        with torch.no_grad():
            return self.layer(self.x)


def make_step(case: Case, seed: int) -> Step:
    """One measured call: forward, or forward + backward (input and weight gradients)."""
    layer = build_layer(case.layer, case.d, seed=seed, **case.layer_options())
    layer = layer.to(device=case.device, dtype=DTYPES[case.dtype])
    x = make_input(case, seed)  # (B, n, d)
    if case.mode == "forward":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return layer(x)

        return Step(layer, x, forward)

    x_train = x.clone().requires_grad_(True)
    grad_out = torch.randn_like(x)  # (B, n, d)

    def train() -> torch.Tensor:
        layer.zero_grad(set_to_none=True)
        x_train.grad = None
        out = layer(x_train)
        out.backward(grad_out)
        return out

    return Step(layer, x, train)


def layer_builder(case: Case, seed: int) -> Callable[[int], nn.Module]:
    """Builds the case's layer for any length n (for path-length probes); carries a cache key."""
    options = case.layer_options()

    def build(n: int) -> nn.Module:
        return build_layer(case.layer, case.d, seed=seed, **{**options, "n": n})

    build.cache_key = (case.layer, case.k, case.heads, case.window, seed)  # type: ignore[attr-defined]
    return build


# How allocation failures read when they are not torch.OutOfMemoryError: the CPU allocator's
# RuntimeError ("DefaultCPUAllocator: can't allocate memory"), MPS, and oneDNN scratchpads.
_OOM_TEXT = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure, on any device."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def release_memory(device: str) -> None:
    """Give memory held by a failed case back, so the next case starts clean."""
    gc.collect()  # the failed call's tensors may sit in reference cycles through its traceback
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


def measure_case(
    case: Case,
    *,
    seed: int = 0,
    policy: TimingPolicy = DEFAULT_POLICY,
    clock: Clock = time.perf_counter,
    max_case_s: float | None = None,
) -> CaseResult:
    """Measure one case: FLOPs (counted), peak memory (one call), then time (many calls).

    A first call slower than ``max_case_s`` ends the case as ``timeout`` before the many timed
    calls; an allocation failure ends it as ``oom``; any other error as ``failed``.
    """
    start = clock()
    threads = torch.get_num_threads()
    sync = device_sync(case.device)
    try:
        step = make_step(case, seed)
        sync()
        first_start = clock()
        step()  # first call: lazy initialisation (positional table, kernels) stays unmeasured
        sync()
        first = clock() - first_start
        if max_case_s is not None and first > max_case_s:
            return CaseResult(
                case=case,
                status="timeout",
                threads=threads,
                wall_s=clock() - start,
                error=f"one call took {fmt_seconds(first)}, over --max-case-seconds "
                f"{fmt_seconds(max_case_s)}",
            )
        seq_steps = sequential_steps(step.forward)
        path = path_length(
            layer_builder(case, seed), case.n, case.d, scale=max(case.k or 0, case.window or 0)
        )
        flops = count_flops(step)
        peak = peak_bytes(step, case.device)
        timing = time_call(step, policy, clock=clock, sync=sync)
    except Exception as exc:  # a case that breaks is recorded; the sweep goes on
        status = "oom" if is_out_of_memory(exc) else "failed"
        return _failed(case, status, exc, threads, clock() - start)
    return CaseResult(
        case=case,
        status="ok",
        threads=threads,
        timing=timing,
        peak_bytes=peak,
        flops=flops,
        flops_analytic=float(case.analytic_flops()),
        seq_steps=seq_steps,
        seq_steps_method=SEQ_METHOD,
        path_len=path.value,
        path_len_method=path.method,
        wall_s=clock() - start,
    )


def _failed(case: Case, status: str, exc: BaseException, threads: int, wall: float) -> CaseResult:
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return CaseResult(
        case=case,
        status=status,
        threads=threads,
        wall_s=wall,
        error=f"{type(exc).__name__}: {message}"[:300],
    )


def retime_case(
    case: Case, *, seed: int, policy: TimingPolicy, clock: Clock = time.perf_counter
) -> TimingStats | None:
    """Another timing round of a case measured before: a fresh layer, one untimed call, then
    the timed calls. None when it fails this time (the round is left out, the case kept)."""
    sync = device_sync(case.device)
    try:
        step = make_step(case, seed)
        step()  # (B, n, d): lazy initialisation stays unmeasured, as in the first round
        sync()
        return time_call(step, policy, clock=clock, sync=sync)
    except Exception:
        release_memory(case.device)
        return None


def prime_instruments() -> None:
    """Pay the dispatch-mode and profiler start-up (about a second, once per process) up front,
    so it is not charged to the first case's wall time."""
    a = torch.ones(4, 4)
    count_flops(lambda: a @ a)
    peak_bytes(lambda: a @ a, "cpu")


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
    return status in ("oom", "timeout") or error == DIED_ERROR


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


def _prepare(grid: Grid) -> None:
    if grid.threads is not None:
        torch.set_num_threads(grid.threads)


def run_sweep(
    grid: Grid,
    out_dir: Path | str | None = None,
    *,
    progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
    calibration: Calibration | None = DEFAULT_CALIBRATION,
) -> RunResults:
    """Measure every case of ``grid`` into ``out_dir`` (default: a new folder under results/).

    Each case is on disk before the next starts, so an interruption keeps what was measured.
    ``calibration`` (None: off) is timed before every measured case.
    Raises ``SweepInterrupted`` (exit code 130) after SIGINT / SIGTERM.
    """
    _prepare(grid)
    writer = ResultsWriter.create(
        Path(out_dir) if out_dir is not None else default_out_dir(),
        config=grid.to_dict(),
        environment=environment(grid.device),
    )
    return _sweep(
        writer, grid, None, progress=progress, clock=clock, policy=policy, calibration=calibration
    )


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
    try:
        recorded = grid_from_config(run.meta.get("config", {}))
    except AttnbenchError as exc:
        raise AttnbenchError(
            f"--resume {str(out_dir)!r}: cannot rebuild the recorded sweep: {exc.message}"
        ) from None
    grid = build_grid({**recorded.to_options(), **overrides}) if overrides else recorded
    _prepare(grid)
    now_env = environment(grid.device)
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
        clock=clock,
        policy=policy,
        calibration=calibration,
    )


def _sweep(
    writer: ResultsWriter,
    grid: Grid,
    previous: RunResults | None,
    *,
    died: str | None = None,
    progress: ProgressCallback | None,
    clock: Clock,
    policy: TimingPolicy | None,
    calibration: Calibration | None,
) -> RunResults:
    # The first call, the FLOP count and the memory profile precede timing: one more warm-up does.
    # The time budget is shared by the rounds.
    policy = policy or TimingPolicy(budget_s=grid.time_budget_s / grid.rounds, warmup_calls=1)
    cases = grid.cases()
    writer.set_total(len(cases))
    done: set[str] = set()
    ok: set[str] = set()
    rounds_done: dict[str, set[int]] = {}  # case_id -> rounds with samples on disk
    next_sample: dict[str, int] = {}
    blocks: list[_Block] = []
    if previous is not None:
        for row in previous.frame.itertuples():
            done.add(row.case_id)
            if row.status == "ok":
                ok.add(row.case_id)
            if _blocking(row.status, row.error):
                blocks.append(_block(row.layer, row.n, row.d, row.status))
        for case_id, group in previous.samples.groupby("case_id"):
            rounds_done[str(case_id)] = set(group["round"].tolist())
            next_sample[str(case_id)] = int(group["sample"].max()) + 1
    completed = sum(case.case_id in done for case in cases)

    def count_units() -> int:
        """(case, round) pairs done: a case that did not measure has nothing left to do."""
        total = 0
        for case in cases:
            if case.case_id in ok:
                total += len(rounds_done.get(case.case_id, set()) & set(range(1, grid.rounds + 1)))
            elif case.case_id in done:
                total += grid.rounds
        return total

    def notify(
        kind: Any,
        index: int,
        case: Case,
        result: CaseResult | None = None,
        round_: int = 1,
        timing: TimingStats | None = None,
    ) -> None:
        if progress is not None:
            progress(
                ProgressEvent(
                    kind,
                    index,
                    len(cases),
                    case,
                    result,
                    completed,
                    round_,
                    grid.rounds,
                    count_units(),
                    timing,
                )
            )

    current: dict[str, Any] = {}

    def on_stop(_: str) -> None:
        if current:
            notify("stopping", current["index"], current["case"])

    calibrate = None
    if calibration is not None:
        calibrate = calibration.timer(grid.device, device_sync(grid.device), clock)
        writer.set_calibration(calibration.describe())

    with _GracefulStop(on_stop) as stop:
        try:
            prime_instruments()
            for index, case in enumerate(cases):
                if case.case_id in done:
                    continue
                if stop.requested:
                    break
                current.update(index=index, case=case)
                notify("start", index, case)
                result, point = _run_one(case, grid, blocks, writer, died, policy, clock, calibrate)
                if _blocking(result.status, result.error):
                    blocks.append(_block(case.layer, case.n, case.d, result.status))
                with stop.writing():
                    writer.append(result, point)
                completed += 1
                done.add(case.case_id)
                if result.status == "ok" and result.timing is not None:
                    ok.add(case.case_id)
                    rounds_done[case.case_id] = {1}
                    next_sample[case.case_id] = result.timing.count
                notify("done", index, case, result)
            # Later rounds: every measured case timed again, in grid order, round after round,
            # so each round of a case lies at another moment of the sweep.
            for round_ in range(2, grid.rounds + 1):
                if stop.requested:
                    break
                writer.begin(None)
                for index, case in enumerate(cases):
                    if case.case_id not in ok or round_ in rounds_done.setdefault(
                        case.case_id, set()
                    ):
                        continue
                    if stop.requested:
                        break
                    current.update(index=index, case=case)
                    notify("start", index, case, round_=round_)
                    point = _calibration_point(calibrate)
                    timing = retime_case(case, seed=grid.seed, policy=policy, clock=clock)
                    if timing is not None:
                        with stop.writing():
                            writer.append_round(
                                case.case_id,
                                round_,
                                next_sample.get(case.case_id, 0),
                                timing,
                                point,
                            )
                        next_sample[case.case_id] = next_sample.get(case.case_id, 0) + timing.count
                    rounds_done[case.case_id].add(round_)  # a failed round is not retried
                    notify("done", index, case, round_=round_, timing=timing)
        except KeyboardInterrupt:
            stop.signal_name = stop.signal_name or "SIGINT"
        if stop.requested:
            writer.finish("interrupted")
            raise SweepInterrupted(
                str(writer.out_dir), completed, len(cases), str(stop.signal_name)
            )
    writer.finish("complete")
    return load_results(writer.out_dir)


def _calibration_point(calibrate: Callable[[], TimingStats] | None) -> TimingStats | None:
    """One calibration point, or None (off, or the GEMM failed: the case is measured anyway)."""
    if calibrate is None:
        return None
    try:
        return calibrate()
    except Exception:
        return None


def _run_one(
    case: Case,
    grid: Grid,
    blocks: list[_Block],
    writer: ResultsWriter,
    died: str | None,
    policy: TimingPolicy,
    clock: Clock,
    calibrate: Callable[[], TimingStats] | None,
) -> tuple[CaseResult, TimingStats | None]:
    """One case's result, and the calibration point timed just before it (if it was run)."""
    threads = torch.get_num_threads()
    if case.case_id == died:
        return CaseResult(case=case, status="failed", threads=threads, error=DIED_ERROR), None
    for block in blocks:
        if block.covers(case):
            skipped = CaseResult(
                case=case, status="skipped", threads=threads, error=f"after {block.why}"
            )
            return skipped, None
    writer.begin(case)
    point = _calibration_point(calibrate)
    result = measure_case(
        case, seed=grid.seed, policy=policy, clock=clock, max_case_s=grid.max_case_s
    )
    if result.status != "ok":
        release_memory(case.device)
    return result, point
