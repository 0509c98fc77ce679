"""Runs a grid case by case, writing each finished case at once.

Progress is reported through a plain callback, so the core knows nothing of terminals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from attnbench.layers import build_layer
from attnbench.measure import TimingPolicy, count_flops, peak_bytes, time_call
from attnbench.measure.timing import DEFAULT_POLICY, Clock
from attnbench.results import (
    CaseResult,
    ResultsWriter,
    RunResults,
    default_out_dir,
    environment,
    load_results,
)
from attnbench.spec import DTYPES, Case, Grid
from attnbench.theory import analytic_flops


@dataclass(frozen=True)
class ProgressEvent:
    """``start`` before a case runs, ``done`` after it is written (with its result)."""

    kind: Literal["start", "done"]
    index: int  # 0-based position in the grid
    total: int
    case: Case
    result: CaseResult | None = None


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


def make_step(case: Case, seed: int) -> Callable[[], torch.Tensor]:
    """One measured call: forward, or forward + backward (input and weight gradients)."""
    options = {name: v for name, v in (("k", case.k), ("heads", case.heads)) if v is not None}
    layer = build_layer(case.layer, case.d, seed=seed, **options)
    layer = layer.to(device=case.device, dtype=DTYPES[case.dtype])
    x = make_input(case, seed)  # (B, n, d)
    if case.mode == "forward":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return layer(x)

        return forward

    x.requires_grad_(True)
    grad_out = torch.randn_like(x)  # (B, n, d)

    def train() -> torch.Tensor:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        out.backward(grad_out)
        return out

    return train


def measure_case(
    case: Case,
    *,
    seed: int = 0,
    policy: TimingPolicy = DEFAULT_POLICY,
    clock: Clock = time.perf_counter,
) -> CaseResult:
    """Measure one case: FLOPs (counted), peak memory (one call), then time (many calls)."""
    start = clock()
    threads = torch.get_num_threads()
    sync = device_sync(case.device)
    try:
        step = make_step(case, seed)
        step()  # first call: lazy initialisation (positional table, kernels) stays unmeasured
        sync()
        flops = count_flops(step)
        peak = peak_bytes(step, case.device)
        timing = time_call(step, policy, clock=clock, sync=sync)
    except torch.OutOfMemoryError as exc:
        return _failed(case, "oom", exc, threads, clock() - start)
    except Exception as exc:  # a case that breaks is recorded; the sweep goes on
        return _failed(case, "failed", exc, threads, clock() - start)
    analytic = analytic_flops(
        case.layer, batch=case.batch, n=case.n, d=case.d, k=case.k or 0, mode=case.mode
    )
    return CaseResult(
        case=case,
        status="ok",
        threads=threads,
        timing=timing,
        peak_bytes=peak,
        flops=flops,
        flops_analytic=analytic,
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


def prime_instruments() -> None:
    """Pay the dispatch-mode and profiler start-up (about a second, once per process) up front,
    so it is not charged to the first case's wall time."""
    a = torch.ones(4, 4)
    count_flops(lambda: a @ a)
    peak_bytes(lambda: a @ a, "cpu")


def run_sweep(
    grid: Grid,
    out_dir: Path | str | None = None,
    *,
    progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
    policy: TimingPolicy | None = None,
) -> RunResults:
    """Measure every case of ``grid`` into ``out_dir`` (default: a new folder under results/).

    Each case is on disk before the next starts, so an interruption keeps what was measured.
    """
    if grid.threads is not None:
        torch.set_num_threads(grid.threads)
    # The first call, the FLOP count and the memory profile precede timing: one more warm-up does.
    policy = policy or TimingPolicy(budget_s=grid.time_budget_s, warmup_calls=1)
    prime_instruments()
    writer = ResultsWriter(
        Path(out_dir) if out_dir is not None else default_out_dir(),
        config=grid.to_dict(),
        environment=environment(grid.device),
    )
    cases = grid.cases()
    writer.set_total(len(cases))
    for index, case in enumerate(cases):
        if progress:
            progress(ProgressEvent("start", index, len(cases), case))
        result = measure_case(case, seed=grid.seed, policy=policy, clock=clock)
        writer.append(result)
        if progress:
            progress(ProgressEvent("done", index, len(cases), case, result))
    writer.finish()
    return load_results(writer.out_dir)
