"""Synthetic results folders, written by the real writer, for the compare tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attnbench.layers import REGISTRY
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.calibration import Calibration
from attnbench.measure.timing.loop import TimingStats
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.results.store import ResultsWriter
from attnbench.spec import Case

ENV = {
    "device_name": "Test CPU 9000",
    "torch_version": "2.13.0+cpu",
    "cuda_version": None,
    "cudnn_version": None,
    "torch_threads": 2,
    "git_commit": "0" * 40,
}
CONFIG = {"device": "cpu", "dtype": "float32", "mode": "forward", "batch": 1}


def noisy(median: float, count: int = 20, spread: float = 0.02, seed: int = 0) -> list[float]:
    """Samples around ``median`` with a relative spread, as a quiet machine gives."""
    rng = np.random.default_rng(seed)
    return list(median * (1 + spread * rng.standard_normal(count)))


def case(layer: str = "conv", n: int = 64, d: int = 16) -> Case:
    options = (("k", 3),) if layer == "conv" else ()
    return Case(layer, n, d, 1, "float32", "cpu", "forward", options)


def small_case(layer: str, n: int = 24, d: int = 16, batch: int = 2, **options: object) -> Case:
    """One case of a real layer, small enough to trace in milliseconds, its options set
    (k = 3, 4 heads, window 5 unless given)."""
    from attnbench.options import build_grid

    given = {"layers": layer, "n": [n], "d": [d], "k": 3, "heads": 4, "window": 5, **options}
    return build_grid({**given, "batch": batch, "device": "cpu"}).cases()[0]


def warm_step(case: Case):  # type: ignore[no-untyped-def]
    """The case's measured call, called once (lazy set-up done), ready to be traced."""
    from attnbench.measure.step import make_step

    step = make_step(case, seed=0)
    step()
    return step


def make_run(
    path: Path,
    cases: dict[tuple[str, int], dict[str, Any]],
    *,
    env: dict[str, Any] | None = None,
    calibration_s: float | None = 1e-3,
    rounds: int = 5,
    meta: dict[str, Any] | None = None,
) -> RunResults:
    """A results folder written by the real writer from synthetic measurements.

    ``cases`` maps (layer, n) to overrides: samples, round_sizes (samples per round), status,
    flops, elements, peak, steps, path, device
    (the model the row names), calibration (that case's GEMM seconds), instructions and load
    (the 1-minute load average it was measured under, on 2 CPUs), faults (minor page
    faults per call, every sample) and left_out (the blocks each round left out). The samples
    are split into ``rounds`` timing rounds, written as a sweep writes them; ``meta`` goes
    into run.json (allocator, fault_cost_s).
    """
    writer = ResultsWriter.create(path, CONFIG, {**ENV, **(env or {})})
    if calibration_s is not None:
        writer.update(calibration=Calibration().describe())
    if meta:
        writer.update(**meta)
    for i, ((layer, n), spec) in enumerate(cases.items()):
        status = spec.get("status", "ok")
        samples = spec.get("samples", noisy(1e-3, seed=i))
        sizes = spec.get("round_sizes")  # samples in each round (else equal rounds)
        if sizes is not None:
            chunks = [list(c) for c in np.split(np.asarray(samples), np.cumsum(sizes)[:-1])]
        else:
            chunks = [list(c) for c in np.array_split(np.asarray(samples), rounds)]
        first = chunks[0]
        faults = spec.get("faults")
        left = spec.get("left_out") or [None] * len(chunks)  # blocks each round left out

        def per_sample(chunk: list[float], faults: Any = faults) -> tuple[float, ...] | None:
            return None if faults is None else (float(faults),) * len(chunk)

        timing = (
            TimingStats(tuple(first), 1, sum(first), faults=per_sample(first), left_out=left[0])
            if status == "ok"
            else None
        )
        point = None
        if calibration_s is not None and status == "ok":
            gemm_s = spec.get("calibration", calibration_s)
            point = TimingStats(tuple(noisy(gemm_s, 5, seed=100 + i)), 1, 5 * gemm_s)
        ok = status == "ok"
        writer.append(
            CaseResult(
                case=case(layer, n),
                status=status,
                threads=2,
                timing=timing,
                peak_bytes=spec.get("peak", 4096) if ok else None,
                flops=spec.get("flops", 1000 * n) if ok else None,
                flops_analytic=float(spec.get("flops", 1000 * n)) if ok else None,
                elementwise=spec.get("elements", 10 * n) if ok else None,
                elementwise_analytic=float(spec.get("elements", 10 * n)) if ok else None,
                bytes=spec.get("bytes", 64 * n) if ok else None,
                ops=spec.get("ops", 12) if ok else None,
                product_bytes=spec.get("product_bytes", 32 * n) if ok else None,
                seq_steps=spec.get("steps", 1) if ok else None,
                path_len=spec.get("path", n // 2) if ok else None,
                error="" if ok else spec.get("error", "RuntimeError: out of memory"),
                device_name=spec.get("device", ""),
                instructions=spec.get("instructions") if ok else None,
                load_1m=spec.get("load", 0.5),
                cpu_count=2,
            ),
            point,
        )
        if status == "ok":
            done = len(first)
            for r, chunk in enumerate(chunks[1:], start=2):
                writer.append_round(
                    case(layer, n).case_id,
                    r,
                    done,
                    TimingStats(tuple(chunk), 1, 0, faults=per_sample(chunk), left_out=left[r - 1]),
                )
                done += len(chunk)
    writer.finish()
    return load_results(path)


def cases_grid(**overrides: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    cases: dict[tuple[str, int], dict[str, Any]] = {
        (layer, n): {} for layer in ("conv", "rnn") for n in (32, 64, 128, 256)
    }
    for key, spec in overrides.items():
        layer, n = key.split("_")
        cases[(layer, int(n))] = spec
    return cases


@contextlib.contextmanager
def registry_restored() -> Iterator[None]:
    """Plugin layers registered inside leave with it: the registry as it was before."""
    before = dict(REGISTRY)
    try:
        yield
    finally:
        REGISTRY.clear()
        REGISTRY.update(before)


def samples_for(run: RunResults, case_id: str) -> list[float]:
    """Every timing sample of a case, all rounds, in seconds per call."""
    return [float(x) for x in run.samples.loc[run.samples["case_id"] == case_id, "time_s"]]


def rounds_for(run: RunResults, case_id: str) -> list[list[float]]:
    """A case's samples grouped by timing round, first round first."""
    return list(run.rounds_of(case_id).values())
