"""Every traced count of one forward call in one pass: FLOPs, elementwise work, bytes moved
and sequential steps.

Each count is a dispatch mode of its own (``flops``, ``elementwise``, ``traffic``,
``structure``) and each runs the call once with torch's fused paths off; in forward mode the
four calls are the same call, so tracing it once and showing every op to all four counters
gives the same counts for a quarter of the dispatch overhead (``benchmarks/overhead.py``). A
counter that fails on an op (a plugin's odd output) fails alone, as it would in its own pass:
its count is None with the reason, the others are kept. A failing FLOP count, or an
allocation failure, ends the case, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.errors import first_line
from attnbench.measure.counts.chains import ChainTracer
from attnbench.measure.counts.elementwise import ElementCounter
from attnbench.measure.counts.flops import FlopCount, FlopCounter, formulas, trace_flops
from attnbench.measure.counts.ops import Args, Kw, TracingMode, unfused
from attnbench.measure.counts.structure import PATH_NONE
from attnbench.measure.counts.traffic import Traffic, TrafficCounter
from attnbench.measure.memory import is_out_of_memory, peak_bytes

# The counts a failure leaves empty; a failing FLOP count fails the case, as it always has.
GUARDED = ("elementwise", "traffic", "steps")


@dataclass(frozen=True)
class Census:
    """The four counts of one forward call; a count that failed is None, and ``errors`` says
    why as the results' *_method columns do ("none: <first line>")."""

    flops: FlopCount
    elementwise: int | None
    traffic: Traffic | None
    steps: int | None
    errors: dict[str, str] = field(default_factory=dict)


class _CensusMode(TracingMode):
    def __init__(self, observers: dict[str, Any]) -> None:
        super().__init__()
        self.observers = observers
        self.errors: dict[str, str] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Args = (), kwargs: Kw = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for name, observer in self.observers.items():
            if name in self.errors:
                continue
            if name not in GUARDED:
                observer.observe(func, args, kwargs, out)
                continue
            try:
                observer.observe(func, args, kwargs, out)
            except Exception as exc:  # one counter's failure leaves the others counting
                if is_out_of_memory(exc):
                    raise
                self.errors[name] = f"{PATH_NONE}: {first_line(exc)}"[:300]
        return out


def take_census(
    forward: Callable[[], torch.Tensor], buffers: Sequence[torch.Tensor] = ()
) -> Census:
    """Trace one forward call (or a decode step, writing into its state's ``buffers``) once,
    with the fused paths off and gradients off, and count."""
    observers: dict[str, Any] = {
        "flops": FlopCounter(formulas()),
        "elementwise": ElementCounter(),
        "traffic": TrafficCounter(),
        "steps": ChainTracer(buffers),
    }
    mode = _CensusMode(observers)
    with unfused(), torch.no_grad(), mode:
        out = forward()
    errors = mode.errors

    def kept(name: str, value: Any) -> Any:
        return None if name in errors else value

    return Census(
        flops=observers["flops"].result(),
        elementwise=kept("elementwise", observers["elementwise"].result()),
        traffic=kept("traffic", observers["traffic"].result()),
        steps=kept("steps", int(observers["steps"].depth.get(out, 0))),
        errors=dict(errors),
    )


@functools.cache  # once a process
def prime_instruments() -> None:
    """Pay the dispatch-mode and profiler start-up (the profiler's first session sets up
    Kineto) once per process, after the case's timing, so neither the timing nor the first
    trace carries it; ``measure_case`` calls it where it will trace, so a sweep the count
    cache holds whole never pays it. Neither loads torch._dynamo (``ops.TracingMode``,
    ``memory._cpu_profile``)."""
    a = torch.ones(4, 4)
    trace_flops(lambda: a @ a)
    peak_bytes(lambda: a @ a, "cpu")
