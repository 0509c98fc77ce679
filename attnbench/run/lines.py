"""A line of ``--n auto`` (a layer at one width) and its points, as the plan's predictions
read them, with what a point is read from: a case's result, the work its theory gives, the
memory free for the next one (``run.auto``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.devices import DTYPES, available_bytes, device_kind
from attnbench.measure.record import CaseResult
from attnbench.results.record import Stopped
from attnbench.spec import Case


@dataclass(frozen=True)
class Point:
    """A finished case of a line, as the predictions read it."""

    n: int
    time_s: float
    work: float  # counted FLOPs and elementwise work (nan where not counted)
    peak_bytes: float  # nan where not measured
    wall_s: float  # the whole case, its first round
    timed_s: float  # inside its timed calls
    # what its later rounds may cost (``rounds.cost_of``): as many as a case may get
    # (``Grid.most_rounds``), so that the budget bounds the sweep whatever its intervals ask
    later_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.work / self.time_s if self.time_s > 0 else math.nan


@dataclass
class Line:
    """One layer at one width (and its options)."""

    points: list[Point] = field(default_factory=list)
    running: bool = False
    stopped: Stopped | None = None
    why: str = ""
    at_n: int | None = None  # the longest length it measured
    allowance_s: float = math.inf  # what it may spend in all, read as its next case would start
    reopened: bool = False  # the budget stopped it, and it was given what was left (once)
    # its rate settled while an attention line of its width still went on: why it settled; it
    # is carried on (``AutoPlan._carried``) and stops, for that reason, where attention does
    settled: str = ""
    settled_n: int = 0  # the length it settled at

    @property
    def wall_s(self) -> float:
        """What the line's cases cost, their later rounds included."""
        return sum(p.wall_s + p.later_s for p in self.points)


def line_key(case: Case) -> tuple[Any, ...]:
    return (case.layer, case.d, case.options)


def case_work(case: Case) -> float | None:
    """The work the layer's theory gives a case (FLOPs and elementwise work), None without a
    theory: what the next case's call is predicted from."""
    flops = case.analytic_flops()
    if flops is None:
        return None
    return flops + (case.analytic_elements() or 0.0)


def free_memory(device: str) -> int | None:
    """Bytes free on the device now (None where it cannot be read)."""
    if device_kind(device) == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    if device == "cpu":
        found = available_bytes()
        if found is not None:
            return found
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
        return None if pages is None else int(pages * os.sysconf("SC_PAGE_SIZE"))
    return None


def finite(value: Any) -> float:
    try:
        found = float(value)
    except (TypeError, ValueError):
        return math.nan
    return found


def held_bytes(result: CaseResult) -> int | None:
    """The memory a case needs at its peak: its call's, and in decode mode what its process
    holds for the step besides (the state, and the input of its n + 1 tokens), which grow
    with n where a step's own peak does not."""
    if result.peak_bytes is None or result.case.mode != "decode":
        return result.peak_bytes
    case = result.case
    tokens = case.batch * case.tokens * case.d * DTYPES[case.dtype].itemsize
    return result.peak_bytes + (result.state_bytes or 0) + tokens
