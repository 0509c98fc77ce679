"""A timing round: how it samples, what it costs (a process of its own, its calls), and how many
a case gets (``Replication``).

Read by the job queue (how many rounds a case gets), the auto plan (what the next case of a line
will cost) and the size guard (how long a sweep should take).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnbench.devices import device_kind
from attnbench.estimators import estimate, round_marks
from attnbench.measure.timing.loop import DEFAULT_POLICY, Stop, TimingPolicy, TimingStats
from attnbench.priors import Prior
from attnbench.spec import DEFAULT_PRECISION, ENERGY_S, MORE_PROCESSES, Grid

# What a round's process times before its first sample, past the layer's first call: a fresh
# process's first blocks run slow (its pages fault in, its caches fill).
ROUND_WARMUP_S = 0.005
# A round of several stops once its own median is known to ``ROUND_TARGET`` after this many
# seconds of samples: the interval is the rounds', whose medians spread by more than that
# (2-3% between processes here), so a round's median needs a few blocks, not the 50 ms and
# ±2% one alone takes (``TimingPolicy``).
ROUND_MIN_S = 0.02
ROUND_TARGET = 0.05


def round_policy(grid: Grid) -> TimingPolicy:
    """How one timing round samples: its share of ``--time-budget`` (as many shares as rounds
    a case may get); with several rounds, fewer samples at the least and a looser target for
    its own median, since the interval is taken over the rounds, not the samples (one round
    keeps the ten samples and ±2% its own order-statistic interval needs)."""
    share = grid.time_budget_s / (MORE_PROCESSES * grid.processes)
    return TimingPolicy(
        budget_s=share,
        warmup_calls=1,
        warmup_s=ROUND_WARMUP_S,
        min_samples=DEFAULT_POLICY.min_samples if grid.processes == 1 else 3,
        min_time_s=min(DEFAULT_POLICY.min_time_s, ROUND_MIN_S, share),
        target_rel_ci=DEFAULT_POLICY.target_rel_ci if grid.processes == 1 else ROUND_TARGET,
        timer=grid.timer,
        energy_s=ENERGY_S if grid.energy else 0.0,
    )


# A round's own process, beyond its calls: the fork and exit, the layer made, its machine
# reference, the driver's share (about 60 ms here, measured around the jobs of a sweep).
ROUND_PROCESS_S = 0.06
# On a CUDA GPU a fresh process also makes its CUDA context and loads cuBLAS, cuDNN and the
# attention kernels at their first use: 0.62-0.64 s a process on an H200, the context 0.25 s
# of it (benchmarks/cuda_process_cost.py, 4 forks of a server that imported torch).
PROCESS_S = {"cuda": 0.64}


def process_s(device: str, fresh: bool = True) -> float:
    """A round's own process on ``device``, beyond its calls (``ROUND_PROCESS_S``); a round
    run in the sweep's own process (``fresh=False``: --executor serial) makes no context."""
    return PROCESS_S.get(device_kind(device), ROUND_PROCESS_S) if fresh else ROUND_PROCESS_S


def cost_of(timed_s: float, call_s: float, device: str = "cpu", fresh: bool = True) -> float:
    """A round's cost on ``device`` from its timed seconds and one call's."""
    return timed_s + process_s(device, fresh) + ROUND_WARMUP_S + 2 * call_s


def budget_spent(timing: TimingStats) -> float:
    """What a round spends of ``--time-budget``: its timed calls, the share ``round_policy``
    gives each round to sample (its process and set-up are the wall's, not the budget's)."""
    return timing.total_s


@dataclass(frozen=True)
class Replication:
    """How many timing rounds a case gets: ``least``, then more, up to ``most``, while the
    interval over its rounds reaches further than ``target_rel_ci`` of its time."""

    least: int
    most: int
    target_rel_ci: float = DEFAULT_PRECISION
    budget_s: float = math.inf  # seconds a case's rounds may time; none past least beyond it

    @classmethod
    def of(cls, grid: Grid) -> Replication:
        """A sweep's: ``--processes`` at the least, ``--max-processes`` at the most (by
        default ``MORE_PROCESSES`` times the least, or one where the least is one), while the
        interval is wider than ``--precision``."""
        return cls(grid.processes, grid.most_rounds, grid.precision, grid.time_budget_s)

    def stop_of(
        self,
        rounds: list[list[float]],
        done: int,
        references: list[float | None] | None = None,
        quiet: float | None = None,
        prior: Prior | None = None,
        spent_s: float = 0.0,
        busy: list[bool] | None = None,
    ) -> Stop | None:
        """What ends a case's rounds now, or None where it gets another. ``done`` rounds
        finished (``rounds``: the samples of those that measured, ``references`` their machine
        references against the sweep's ``quiet`` level so far, ``busy`` whether each ran beside
        a busy neighbour, ``spent_s`` seconds its rounds timed, ``budget_spent``). A round
        whose reference read disturbed does not count toward ``least`` (a neighbour's CPU
        beside a round does: a machine busy throughout would give every case its most, and the
        interval leaves it out only while two others remain); past it a round must fit the
        budget (``Stop.BUDGET`` where it does not), and is wanted while the interval is wider
        than the target (``Stop.PRECISE`` once it is not; ``Stop.MAX_ROUNDS`` at ``most``, or
        where fewer than two rounds measured)."""
        if done >= self.most:
            return Stop.MAX_ROUNDS
        refs = list(references or ())  # read as the estimate reads them (round_marks)
        whole = len(rounds) == len(refs) and all(len(g) for g in rounds)
        disturbed = sum(round_marks(refs, quiet, [False] * len(refs), rounds if whole else None))
        if done - disturbed < self.least:
            return None
        if len(rounds) < 2:
            return Stop.MAX_ROUNDS
        found = estimate(rounds, references, quiet, prior, busy=busy)
        if found.rounds_rel_ci <= self.target_rel_ci:  # what more rounds could narrow
            return Stop.PRECISE
        return Stop.BUDGET if spent_s >= self.budget_s else None
