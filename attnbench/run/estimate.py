"""The size guard: a rough lower estimate of a sweep's duration, to warn before an absurd sweep
starts and to tell the user how long to expect. Never reported as a measurement."""

from __future__ import annotations

from attnbench.spec import Grid

# Rough throughputs, used only to warn before an absurd sweep starts; never reported as measured.
_ASSUMED_FLOP_PER_S = {"cpu": 2e10, "cuda": 2e13, "mps": 2e12}
MAX_CASES = 2000  # more cases than this need --yes
MAX_ESTIMATED_S = 3600.0  # a longer estimated sweep needs --yes


def estimate_seconds(grid: Grid) -> float:
    """A rough lower estimate of a sweep's duration from the analytic FLOPs of each case.

    Per case: about four untimed calls (first call, FLOP count, memory profile, warm-up) plus
    the timing, which lasts the time budget or at least eleven calls; each further round adds a
    rebuild, two untimed calls and at least 0.1 s of timing.
    """
    rate = _ASSUMED_FLOP_PER_S[grid.device.split(":")[0]]
    total = 0.0
    for case in grid.cases():
        call = (case.analytic_flops() or 0.0) / rate
        if grid.max_case_s is not None and call > grid.max_case_s:
            total += grid.max_case_s  # it would stop as a timeout after its first call
            continue
        total += 0.05 + 4 * call + max(grid.time_budget_s, 11 * call)
        total += (grid.rounds - 1) * (0.02 + 2 * call + max(0.1, 11 * call))
    return total


def size_warning(grid: Grid) -> str | None:
    """Why this grid is too large to start without confirmation, or None when it is not."""
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
