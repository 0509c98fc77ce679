"""The summary's note on what a case's interval holds of this machine's sweeps before it
(``results.reruns``): how far they moved the same cases, or that none is on record."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

from attnbench.estimators import CONFIDENCE, QUIET_FACTOR, Between, normal_quantile
from attnbench.results.run import RunResults
from attnbench.schema import numeric_column


def sweeps_note(run: RunResults) -> str | None:
    """Whether the intervals of the cases timed over several processes hold the spread between
    sweeps, read from how many, and how large it was, and what sweeps in another state of the
    machine found; None where no case has such an interval."""
    measured = run.measured
    over_rounds = measured[numeric_column(measured, "rounds").fillna(0) >= 2]
    if over_rounds.empty:
        return None
    cases = [str(c) for c in over_rounds["case_id"]]
    found = {c: run.between[c] for c in cases if c in run.between}
    if not found:
        state = " in this state" if run.elsewhere is not None else ""
        return (
            f"no earlier sweep of these cases on this machine{state} is on record: their ±95% "
            "holds this sweep's processes, seconds apart, not how far a sweep minutes later "
            "moves them (a neighbour, the host, the hour); sweep them again and each interval "
            f"holds that too (run.json's reruns){_elsewhere(run, cases, 'a re-run in that state')}"
        )
    own = [b.sweeps for b in found.values() if b.sweeps >= 2]
    spreads = {c: b.spread for c, b in found.items()}
    typical = len(found) - len(own)
    adds = (
        "the ±95% adds that move for this sweep and for a re-run's, and more processes in one "
        f"sweep cannot narrow it{_few_sweeps(found)}{_elsewhere(run, cases)}"
    )
    if all(b.spread < 0.0005 for b in found.values()):  # no move at all: nothing to widen
        adds = f"the ±95% holds their processes' spread alone{_elsewhere(run, cases)}"
    if not own:  # no case of its own history: the machine's typical, borrowed
        spread = statistics.median(spreads.values())
        borrowed = (
            "no earlier sweep of these cases on this machine is on record; their ±95% hold "
            "the machine's typical move between sweeps instead, read from its sweeps of other "
            "cases or other attnbench code (run.json's reruns and reruns_other)"
        )
        if spread < 0.0005:  # nothing to add: the processes' spread is all they hold
            return (
                f"{borrowed}: none past their processes' spread (those sweeps read their cases "
                "no further apart than their processes did), so it adds nothing yet"
            )
        return f"{borrowed}: a standard deviation of {spread:.1%}; {adds}"
    widest = max((c for c in found if found[c].sweeps >= 2), key=lambda c: spreads[c])
    counts = f"{min(own)}-{max(own)}" if min(own) < max(own) else f"{max(own)}"
    read = f"{len(own)} from {counts} sweeps of their own"
    if typical:
        read += f", {typical} from the machine's typical"
    # over the cases with sweeps of their own, as "at most" is: over every case, the borrowed
    # typical's, it read 1.1% typically beside 1.0% at most
    typical_spread = statistics.median(spreads[c] for c in found if found[c].sweeps >= 2)
    most = f"{spreads[widest]:.1%}"
    moves = (  # the spread past what each sweep's own processes put in its time
        f"a case's time moves between sweeps, past its own processes' spread, by a standard "
        f"deviation of {typical_spread:.1%} typically, {most} at most ({_name(widest)}), "
        "among the cases with sweeps of their own"
        if typical_spread >= 0.0005
        else "their sweeps read most cases no further apart than their own processes did"
        + (f" (the most past it: {most}, {_name(widest)})" if spreads[widest] >= 0.0005 else "")
    )
    return (
        f"{len(found)} case(s)' ±95% hold how far this machine's sweeps moved them ({read}): "
        f"{moves}; {adds}"
    )


# Below this many degrees of freedom, the move between sweeps is itself known so loosely that it
# widens the ±95% the most (a new user's second sweep read ×/÷2.1 on every case, 1 degree of
# freedom; the third ±7-11%): the note says so, and that each sweep more narrows it.
FEW_DF = 3.0


def _few_sweeps(found: Mapping[str, Between]) -> str:
    fewest = min(b.df for b in found.values())
    if fewest >= FEW_DF:
        return ""
    return (
        f"; read from so few sweeps ({fewest:.0f} degree(s) of freedom), that move is itself "
        "uncertain and widens the ±95% most; each sweep more narrows it"
    )


# A sweep whose cases moved together by this much against their earlier sweeps, most of them
# one way, is named: its whole moment, not a case's, moved.
MOVED_NOTE = 0.05
MOVED_CASES = 3  # cases compared, at the least
MOVED_SHARE = 0.8  # of them moved the median's way, at the least


def moved_note(run: RunResults) -> str | None:
    """What the summary says of a sweep that moved its cases together against this machine's
    earlier sweeps of them in its state (``results.reruns.moved``); None where it did not, or
    too few cases tell."""
    found = run.moved
    if found is None or found.cases < MOVED_CASES or found.same_way < MOVED_SHARE * found.cases:
        return None
    if abs(found.ratio - 1.0) < MOVED_NOTE:
        return None
    slower = found.ratio > 1.0
    way = "slower" if slower else "faster"
    return (
        f"this sweep ran its cases {found.ratio:.2f}x their time in this machine's earlier "
        f"sweeps of them in this state (the median of {found.cases} cases' ratios, "
        f"{found.same_way} of them {way}; up to {found.sweeps} earlier sweep(s) each): the "
        f"machine ran {way} throughout this sweep than through those, though its reference "
        f"read it within {QUIET_FACTOR:g}x of theirs; the ±95% holds the spread between these "
        "sweeps, this one included, and a re-run may land nearer the earlier times"
    )


def _elsewhere(
    run: RunResults,
    cases: list[str],
    lands: str = "the intervals hold a re-run in this state, and one in that state",
) -> str:
    """The clause on sweeps that ran in another state of the machine ("" where none did)."""
    other = run.elsewhere
    if other is None:
        return ""
    clause = (
        f"; {other.sweeps} earlier sweep(s) read this machine in another state (its reference "
        f"{other.level_ratio:.2f}x this sweep's)"
    )
    ratios = {c: other.ratios[c] for c in cases if c in other.ratios}
    if not ratios:
        return clause
    low = min(ratios, key=lambda c: ratios[c])
    high = max(ratios, key=lambda c: ratios[c])
    return (
        f"{clause}, where these cases ran {ratios[low]:.2f}x ({_name(low)}) to "
        f"{ratios[high]:.2f}x ({_name(high)}) these times: {lands} lands there"
    )


def _name(case: str) -> str:
    """A case's id without the parts every case of a sweep shares (batch, dtype, device)."""
    return case.split("/b=")[0]


def wide_between_sweeps(run: RunResults, cases: Iterable[str], bound: float) -> int:
    """How many of ``cases`` move between this machine's sweeps by more than ``bound`` alone
    (the normal's 95% reach of twice their variance): more processes cannot narrow them."""
    z = normal_quantile((1 + CONFIDENCE) / 2)
    return sum(
        z * math.sqrt(2 * run.between[c].variance) > math.log1p(bound)
        for c in cases
        if c in run.between
    )
