"""The size guard: a rough estimate of a sweep's duration, to warn before an absurd sweep
starts and to tell the user how long to expect, scaled by how busy the machine reads as it
starts (``machine_busy``). Never reported as a measurement."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.devices import device_kind, machine_load, runnable_now, usable_cpus
from attnbench.estimators import is_disturbed
from attnbench.layers.registry import entry
from attnbench.measure.counts import extend
from attnbench.measure.counts.countcache import DEFAULT_COUNTING, Counting
from attnbench.measure.timing.energy import STEP_S
from attnbench.measure.timing.reference import read_reference
from attnbench.regime import REGIME_SIZES
from attnbench.run.rounds import ROUND_WARMUP_S, process_s, round_policy
from attnbench.spec import ENERGY_S, Case, Grid

# Rough throughputs, used only to warn before an absurd sweep starts; never reported as measured.
_ASSUMED_FLOP_PER_S = {"cpu": 2e10, "cuda": 2e13, "mps": 2e12}
MAX_CASES = 2000  # more cases than this need --yes
MAX_ESTIMATED_S = 3600.0  # a longer estimated sweep needs --yes
# What tracing a case's exact counts costs, from benchmarks/overhead.py --phases on the default
# grid (2-core CPU): about 0.04 s a case for the path probes, the traced pass and the memory
# profile (3.6 s for its 110 cases), and 2 ms more per position of a layer whose steps grow
# with n (each position is several ops, each traced by four counters); a case whose counts are
# cached pays 0.05 s.
_TRACE_CASE_S, _TRACE_STEP_S, _CACHED_CASE_S = 0.04, 2e-3, 0.05
# Measuring the machine's ceilings, once per machine (docs/benchmarks.md has the timings).
CEILINGS_S = 1.5
# A compiled case's compile, paid again in every round's process: from a layer whose graph
# breaks before any op (rnn, lstm: 0.04-0.06 s on the 2-core CPU) to a cold compile of an
# attention (1.5-3.8 s there, 2.2-4.3 s on an H200's host). A layer whose loop runs in Python
# compiles in proportion to n and reads far over this (the ssm: 333 s at n = 4096, cold).
COMPILE_S = (0.04, 4.3)


def tracing_seconds(
    case: Case, cached: bool, probes_traced: bool = False, counting: Counting = DEFAULT_COUNTING
) -> float:
    """A rough estimate of the seconds a case spends outside its timing, tracing its counts;
    ``probes_traced``: an earlier case of the sweep traced the probes this one extends from
    (they are kept in the count cache), so it pays for its path length only."""
    if cached:
        return _CACHED_CASE_S
    if extend.applies(case, counting.full_trace):  # traced at the probe lengths, then extended
        if probes_traced:
            return _TRACE_CASE_S
        return _TRACE_CASE_S * len(extend.PROBES) + _TRACE_STEP_S * sum(extend.PROBES)
    theory = entry(case.layer).theory
    steps = theory.sequential_law(case.sizes()) if theory is not None else 1.0
    if case.mode == "decode":  # one step is traced, however long its context
        steps = 1.0
    return _TRACE_CASE_S + _TRACE_STEP_S * (steps if steps > 1 else 0.0)


def in_cache(case: Case, seed: int, counting: Counting = DEFAULT_COUNTING) -> bool:
    """Whether a case's counts would be read from the count cache
    (``measure.counts.countcache``)."""
    return counting.store is not None and counting.store.read(case, seed) is not None


def estimate_bounds(
    grid: Grid,
    cached: Callable[[Case], bool] | None = None,
    counting: Counting = DEFAULT_COUNTING,
    fresh: bool = True,
    slowdown: float = 1.0,
) -> tuple[float, float]:
    """A rough (low, high) estimate of a sweep's duration from the analytic FLOPs of each case.

    Per case: about four untimed calls (first call, FLOP count, memory profile, warm-up), the
    tracing of its counts (``tracing_seconds``: little where ``cached`` says the count cache
    holds them), and the timing, which lasts the time budget or at least eleven calls (high),
    or stops after ``time_call``'s minimum time where its median is precise at once (low: a
    quiet machine); each round is a process of its own, with its fork, its layer, its first
    call and warm-up, and at least that minimum of timing; a sweep may add rounds, up to
    ``Grid.most_rounds`` in all, to a case whose interval is wide (high); a compiled
    case's round compiles it again (``COMPILE_S``); with --energy, the first round's pass.
    ``fresh``: each round in a process of its own (not --executor serial). ``slowdown``: how
    many times slower than quiet the machine reads (``machine_busy``); an auto sweep's budget
    bounds it all the same.
    """
    rate = _ASSUMED_FLOP_PER_S[device_kind(grid.device)]
    low = high = 0.0
    share = round_policy(grid).budget_s  # each round's
    quick = round_policy(grid).min_time_s
    own = process_s(grid.device, fresh)  # a round's process, beyond its calls
    most = grid.most_rounds
    probed: set[str] = set()  # the probe sets a case before traced (one per layer, d, options)
    cases = grid.cases()
    if grid.n_auto is not None:  # each line at least its first lengths, in all the budget
        cases = [c for c in cases if c.n in grid.ns[:REGIME_SIZES]]
    for case in cases:
        call = (case.analytic_flops() or 0.0) / rate
        if grid.max_case_s is not None and call > grid.max_case_s:
            low += grid.max_case_s  # it would stop as a timeout after its first call
            high += grid.max_case_s
            continue
        hit = cached(case) if cached is not None else False
        probes = dataclasses.replace(case, n=extend.PROBES[-1]).case_id
        untimed = tracing_seconds(case, hit, probes in probed, counting) + 4 * call
        if grid.energy:  # the pass: a period of calls first, its span, a step at each end
            untimed += ENERGY_S + 3 * STEP_S
        if extend.applies(case, counting.full_trace) and not hit:
            probed.add(probes)
        fixed = own + 2 * call + ROUND_WARMUP_S  # its process, its calls
        soon, late = COMPILE_S if case.compiled else (0.0, 0.0)  # each round compiles anew
        low += untimed + grid.processes * (fixed + soon + max(quick, 5 * call))
        high += untimed + most * (fixed + late + max(share, 5 * call))
    low, high = low * slowdown, high * slowdown
    if grid.n_auto is not None:  # the budget, or every line's first lengths past it
        budget = grid.auto_budget_s  # (a line reaches run.auto.LEAST_POINTS whatever its share)
        return min(low, budget), max(low, budget)
    return low, high


def estimate_seconds(
    grid: Grid,
    cached: Callable[[Case], bool] | None = None,
    counting: Counting = DEFAULT_COUNTING,
) -> float:
    """The high end of ``estimate_bounds``: every case spends its whole time budget."""
    return estimate_bounds(grid, cached, counting)[1]


def size_warning(grid: Grid) -> str | None:
    """Why this grid is too large to start without confirmation, or None when it is not (an
    auto sweep's budget bounds it)."""
    if grid.n_auto is not None:
        return None
    cases = len(grid.cases())
    seconds = estimate_seconds(grid)
    if cases <= MAX_CASES and seconds <= MAX_ESTIMATED_S:
        return None
    hours = seconds / 3600
    return (
        f"this sweep has {cases} cases and would take at least about {hours:.1f} h on "
        f"{grid.device}; pass --yes to run it anyway, or narrow --n / --d / --layers "
        f"(limits without --yes: {MAX_CASES} cases, {MAX_ESTIMATED_S / 3600:.0f} h)"
    )


@dataclass(frozen=True)
class Busy:
    """How many times slower than quiet the machine reads as a sweep starts (1: quiet), and
    what says so. The estimate's throughputs are a quiet machine's; a neighbour slows every
    round (a new user's sweep said 5-9 s and took 195 s beside one)."""

    slowdown: float = 1.0
    why: str = ""


QUIET = Busy()


# Readings of the reference the start takes at most, while they read the machine disturbed.
START_READINGS = 3


def _steady_reading(read: Callable[[], float], quiet_s: float) -> float:
    """The reference read now, again while it reads disturbed, up to ``START_READINGS``
    times: the quietest. A busy stretch lasts seconds to a minute and reads busy every time;
    one stall of the process does not (a new user's start read "2251.5x its quiet level",
    a reading no round of the sweep came near)."""
    reading = read()
    for _ in range(START_READINGS - 1):
        if not is_disturbed(reading, quiet_s):
            break
        reading = min(reading, read())
    return reading


def machine_busy(
    quiet_s: float | None,
    threads: int,
    read: Callable[[], float] | None = None,
    load: Callable[[], float | None] | None = None,
    runnable: Callable[[], float | None] | None = None,
) -> Busy:
    """How busy the machine reads now, by two tests, the slower they say:
    - where its quiet level is kept (``run.quiet``), the machine reference
      (``measure.timing.reference``, 20 ms) read now against it: the rounds' own test of a
      disturbed machine, which slows with the cases in the stretches a neighbour brings
      (lstm 1.5-2.7x, their logs correlating at 0.95-0.98);
    - the 1-minute load, past the CPUs, and no more than the tasks runnable now (the load
      lags a neighbour that has ended): with ``load`` tasks runnable beside the sweep's
      ``threads``, each gets about cpus / (load + threads) of a CPU, a floor on the slowdown
      (ops on several threads lose far more: lstm 12x, attention 15x beside three loops on one
      thread each, where this reads 2.4x). A load under the CPUs is not taken for a
      neighbour: a sweep's own last minute leaves up to its threads' worth.
      The reference misses this one: beside three processes each looping on small products
      in one thread (2 CPUs), it read 0.56x its quiet time while a fresh process's work took
      2.9x and a sweep 3x (``benchmarks/busy_estimate.py``)."""
    found = [QUIET]
    if quiet_s is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)  # the level is this thread count's (run.quiet)
        try:
            reading = _steady_reading(read or read_reference, quiet_s)
        finally:
            torch.set_num_threads(before)
        if is_disturbed(reading, quiet_s):
            ratio = reading / quiet_s
            found.append(Busy(ratio, f"its reference reads {ratio:.1f}x its quiet level"))
    cpus, now = usable_cpus(), (load or machine_load)()
    if now is not None and now > cpus:
        running = (runnable or runnable_now)()
        now = now if running is None else min(now, running)
    if now is not None and now > cpus:
        slowdown = (now + min(threads, cpus)) / cpus
        found.append(Busy(slowdown, f"its 1-minute load is {now:.1f} on {cpus} CPUs"))
    return max(found, key=lambda busy: busy.slowdown)
