"""The calibration kernel: a fixed GEMM timed between the cases of a sweep.

Its time measures the machine rather than any layer, so dividing a case's time by it
(``attnbench compare --normalize``) lets a baseline taken on one runner be compared on another.
It is timed between the cases, on the worker that measures them, so it sees the conditions the
cases see: before a case whenever half a second or more of the worker's time has passed since
its last point (before every case of a sweep whose cases take longer, before one in two or
three of the default grid's quick ones).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.measure.timing.loop import Clock, TimingPolicy, TimingStats, time_call

# Three short blocks: about 6 ms per case on a 2-core CPU (one 512^3 GEMM each), 3% of a
# default sweep. The run's calibration is the median over every case's samples (hundreds),
# so a case needs few of its own; five blocks of two GEMMs cost 19 ms, 10% of the sweep.
# A point at most every half second of a worker's time: the machine's state is sampled at the
# same rate whatever the cases' length. Before every case, the default grid's 110 quick cases
# paid 1.1 s for it (3% of a cold sweep, 4% of a warm one); replayed on nine runs' case times,
# the rule keeps a third of their points, whose median is within 0.8% of all of them (1.6% on
# the noisiest), where the same median moves 25% from run to run on this machine.
CALIBRATION_EVERY_S = 0.5
CALIBRATION_POLICY = TimingPolicy(
    warmup_calls=1,
    min_block_s=1e-3,
    min_samples=3,
    max_samples=20,
    target_rel_ci=math.inf,  # three samples, then stop: a point, not a precise median
    min_time_s=0.0,
    budget_s=0.01,
    max_block_calls=256,
)


@dataclass(frozen=True)
class Calibration:
    """A square float32 matrix product of side ``size``; ``describe()`` goes into run.json, and
    two runs are normalised against each other only when their descriptions match."""

    size: int = 512
    policy: TimingPolicy = field(default=CALIBRATION_POLICY)
    # The least time between two points on a worker (0: before every case). Not part of
    # ``describe()``: it says how often the kernel is timed, not what the kernel is.
    every_s: float = CALIBRATION_EVERY_S

    def describe(self) -> dict[str, Any]:
        return {
            "kernel": "matmul",
            "m": self.size,
            "n": self.size,
            "k": self.size,
            "dtype": "float32",
            "flops": 2 * self.size**3,
        }

    def timer(
        self, device: str, sync: Callable[[], None], clock: Clock = time.perf_counter
    ) -> Callable[[], TimingStats]:
        """A function that times one calibration point on ``device`` (operands made once)."""
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(self.size, self.size, generator=gen).to(device)  # (s, s)
        b = torch.randn(self.size, self.size, generator=gen).to(device)  # (s, s)

        def gemm() -> torch.Tensor:
            return a @ b  # (s, s)

        return lambda: time_call(gemm, self.policy, clock=clock, sync=sync)


DEFAULT_CALIBRATION = Calibration()
