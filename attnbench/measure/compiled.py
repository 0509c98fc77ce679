"""A case's layer under torch.compile (``--compile``): compiled as asked, its compile read from
dynamo's and inductor's own counters, and its output checked against the eager layer's.

The counts (FLOPs, elementwise work, steps, path length, bytes) stay the eager layer's: they
describe the layer's work, which a compile fuses but does not remove. The time, the kernels'
split and the peak memory are the compiled call's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import torch
from torch import nn

from attnbench.compiling import CompileSpec
from attnbench.devices import relative_difference, tolerance, within_tolerance
from attnbench.errors import AttnbenchError, first_line
from attnbench.measure.memory import is_out_of_memory
from attnbench.measure.record import CaseResult
from attnbench.schema import Status


class Called(Protocol):
    """What a compiled case's step holds (``measure.step.Step``): the eager layer, the layer
    compiled, the input, and the call."""

    @property
    def layer(self) -> nn.Module: ...

    @property
    def model(self) -> nn.Module | None: ...

    @property
    def x(self) -> torch.Tensor: ...

    def __call__(self) -> torch.Tensor: ...

    def check(self, out: torch.Tensor) -> None: ...


# Reasons of a graph break kept in compile_break_reasons, most frequent first.
REASONS_KEPT = 3


class CompileFailed(AttnbenchError):
    """torch.compile refused the layer (an op inductor cannot lower, a break under fullgraph):
    the case is failed with dynamo's first line, and the sweep goes on."""


def compiled(layer: nn.Module, spec: CompileSpec) -> nn.Module:
    """The layer compiled as ``spec`` says, dynamo's counters cleared, so that what they count
    next is this layer's compile. On the CPU, inductor's generated kernels are recorded by the
    profiler (``cpp.enable_kernel_profile``), so the kernels' split sees them as kernels."""
    import torch._dynamo
    import torch._inductor.config as inductor

    inductor.cpp.enable_kernel_profile = True
    torch._dynamo.reset()  # another case's graphs and guards (one process, several cases)
    _counters().clear()
    mode = None if spec.mode == "default" else spec.mode
    return cast(
        "nn.Module",
        torch.compile(layer, mode=mode, dynamic=spec.dynamic, fullgraph=spec.fullgraph),
    )


def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


@dataclass(frozen=True)
class CompileStats:
    """What compiling a case's layer took, read from dynamo's and inductor's counters."""

    compile_s: float  # the first call, the compile included
    graphs: int  # graphs compiled for the call
    breaks: int  # graph breaks
    reasons: str  # their reasons' first lines, with counts
    frames: int  # frames dynamo compiled (a recompile is one more)
    cache: str  # hit, miss, mixed, or "" (inductor's on-disk cache did not say)


def compile_stats(compile_s: float) -> CompileStats:
    """The counters after the first call: what its compile made."""
    found = _counters()
    reasons = _reasons({**found.get("unimplemented", {}), **found.get("graph_break", {})})
    inductor = found.get("inductor", {})
    hits, misses = inductor.get("fxgraph_cache_hit", 0), inductor.get("fxgraph_cache_miss", 0)
    cache = "mixed" if hits and misses else "hit" if hits else "miss" if misses else ""
    return CompileStats(
        compile_s=compile_s,
        graphs=int(found.get("stats", {}).get("unique_graphs", 0)),
        breaks=int(sum(reasons.values())),
        reasons="; ".join(f"{why} (x{count})" for why, count in reasons.items()),
        frames=frames_compiled(),
        cache=cache,
    )


def frames_compiled() -> int:
    """Frames dynamo has compiled since the layer was: one more is a recompile."""
    return int(_counters().get("frames", {}).get("total", 0))


def _reasons(found: Mapping[str, int]) -> dict[str, int]:
    """Each reason's first line and its count, most frequent first, the first few."""
    merged: dict[str, int] = {}
    for text, count in found.items():
        line = (str(text).strip().splitlines() or ["unknown"])[0]
        merged[line] = merged.get(line, 0) + int(count)
    ranked = sorted(merged.items(), key=lambda item: -item[1])
    kept = dict(ranked[:REASONS_KEPT])
    rest = sum(count for _, count in ranked[REASONS_KEPT:])
    return {**kept, "other reasons": rest} if rest else kept


def compile_check(eager: nn.Module, model: nn.Module, x: torch.Tensor) -> float:
    """The largest difference between the compiled and the eager layer's output on x, relative
    to the eager output's largest value."""
    with torch.no_grad():
        want = cast("torch.Tensor", eager(x))
        got = cast("torch.Tensor", model(x))
    return relative_difference(got, want)


@dataclass(frozen=True)
class Compiled:
    """A compiled case's own measurements: its compile, the graphs compiled again while it was
    timed, and its output against the eager layer's."""

    stats: CompileStats
    recompiles: int
    check: float


def first_call(step: Called, clock: Callable[[], float], sync: Callable[[], None]) -> tuple[
    float, CompileStats | None
]:  # fmt: skip
    """The step's first call (lazy set-up, and the compile where the layer is compiled): the
    seconds of one call past it (a compiled layer is called once more, its compile apart), and
    what its compile made. A compile that fails raises ``CompileFailed`` with dynamo's line."""
    start = clock()
    try:
        out = step()
    except Exception as exc:
        if step.model is None or is_out_of_memory(exc):
            raise
        raise CompileFailed(first_line(exc)) from exc
    sync()
    first = clock() - start
    step.check(out)
    if step.model is None:
        return first, None
    # A second call: a layer whose first call changed its own state (a positional table grown
    # on demand) is compiled again here, before any timed call, and counted with the compile.
    start = clock()
    step()
    sync()
    return clock() - start, compile_stats(first)


def finished(step: Called, stats: CompileStats | None) -> Compiled | None:
    """After the case's calls: the recompiles they caused, and the compile check."""
    if step.model is None or stats is None:
        return None
    recompiles = frames_compiled() - stats.frames
    return Compiled(stats, recompiles, compile_check(step.layer, step.model, step.x))


def with_compile(result: CaseResult, done: Compiled | None) -> CaseResult:
    """The case's record with its compile, failed (its measurements kept) where the compiled
    output is not the eager layer's: a miscompiled layer must not read as fast."""
    if done is None:
        return result
    stats = done.stats
    result = replace(
        result,
        compile_s=stats.compile_s,
        compile_cache=stats.cache,
        compile_graphs=stats.graphs,
        compile_breaks=stats.breaks,
        compile_break_reasons=stats.reasons,
        compile_recompiles=done.recompiles,
        compile_check=done.check,
    )
    # The dtype's own tolerance on any device: the compiled call and the eager one run the same
    # cuDNN ops where they run any (0 apart on an H200), so TF32 grants nothing here.
    if within_tolerance(done.check, result.case.dtype) is not False:
        return result
    allowed = tolerance(result.case.dtype)
    return replace(
        result,
        status=Status.FAILED,
        error=f"its compiled output differs from the eager layer's by {done.check:.2g} "
        f"(relative; {result.case.dtype} allows {allowed:g})",
    )
