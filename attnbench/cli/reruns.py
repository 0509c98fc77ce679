"""The summary's note on what a case's interval holds of this machine's sweeps before it
(``results.reruns``): how far they moved the same cases, or that none is on record."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from attnbench.estimators import CONFIDENCE, normal_quantile
from attnbench.results.run import RunResults
from attnbench.schema import numeric_column


def sweeps_note(run: RunResults) -> str | None:
    """Whether the intervals of the cases timed over several processes hold the spread between
    sweeps, read from how many, and how large it was; None where no case has such an
    interval."""
    measured = run.measured
    over_rounds = measured[numeric_column(measured, "rounds").fillna(0) >= 2]
    if over_rounds.empty:
        return None
    cases = [str(c) for c in over_rounds["case_id"]]
    found = {c: run.between[c] for c in cases if c in run.between}
    if not found:
        return (
            "no earlier sweep of these cases on this machine is on record: their ±95% holds "
            "this sweep's processes, seconds apart, not how far a sweep minutes later moves "
            "them (a neighbour, the host, the hour); sweep them again and each interval "
            "holds that too (run.json's reruns)"
        )
    own = [b.sweeps for b in found.values() if b.sweeps >= 2]
    spreads = {c: b.spread for c, b in found.items()}
    widest = max(spreads, key=lambda c: spreads[c])
    counts = f"{min(own)}-{max(own)}" if own and min(own) < max(own) else f"{max(own or [0])}"
    read = f"{len(own)} from {counts} sweeps of their own" if own else ""
    typical = len(found) - len(own)
    if typical:
        read += f"{', ' if read else ''}{typical} from the machine's typical"
    return (
        f"{len(found)} case(s)' ±95% hold how far this machine's sweeps moved them ({read}): "
        f"a spread between sweeps of ±{statistics.median(spreads.values()):.1%} typically, "
        f"±{spreads[widest]:.1%} at most ({widest.split('/b=')[0]}), which more processes in "
        "one sweep cannot narrow"
    )


def wide_between_sweeps(run: RunResults, cases: Iterable[str], bound: float) -> int:
    """How many of ``cases`` move between this machine's sweeps by more than ``bound`` alone
    (the normal's 95% reach of twice their variance): more processes cannot narrow them."""
    z = normal_quantile((1 + CONFIDENCE) / 2)
    return sum(
        z * math.sqrt(2 * run.between[c].variance) > math.log1p(bound)
        for c in cases
        if c in run.between
    )
