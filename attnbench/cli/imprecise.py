"""The summary's note on the cases marked ``!``: why each one's interval is wide, and what
would narrow it (more processes, a quieter machine, or nothing a sweep gives); and how far an
interval reaches, as the ±95% column shows it."""

from __future__ import annotations

import pandas as pd

from attnbench.cli.reruns import wide_between_sweeps
from attnbench.estimators import IMPRECISE_REL_CI, processes_for, rel_ci
from attnbench.results.run import RunResults
from attnbench.schema import numeric_column
from attnbench.spec import DEFAULT_PROCESSES
from attnbench.units import some_of


def imprecise_note(run: RunResults, imprecise: pd.DataFrame) -> str:
    """The note on ``imprecise``, the cases of ``run`` whose interval is wider than the mark's
    bound: how many, which reason holds for how many, and the advice that would narrow them."""
    busy = imprecise["case_id"].astype(str).isin(run.busy_cases())
    sweeps = wide_between_sweeps(run, imprecise["case_id"].astype(str), IMPRECISE_REL_CI)
    reasons = _reasons(imprecise, busy)
    _, _, apart, few, one = reasons
    narrowed = apart | few | one  # those more processes narrow: not a busy or disturbed machine's
    advice = (
        f"{sweeps} of them {'moves' if sweeps == 1 else 'move'} further than that between "
        "this machine's sweeps alone, "
        "which more processes in one sweep cannot narrow."
        if sweeps
        else _for_those(narrowed, *_more_processes(imprecise[narrowed]))
        if narrowed.any()
        else ""
    )
    why = _why_imprecise(imprecise, reasons, len(run.busy_cases()))
    return (
        f"{len(imprecise)} case(s) marked ! have a 95% interval wider than "
        f"±{IMPRECISE_REL_CI:.0%} (over their processes and this machine's sweeps). "
        f"{why} {advice}".rstrip()
    )


# Beyond this many processes a case, "--max-processes k" is no advice (each is a fork, a first
# call and a warm-up: about 0.1 s on a quiet CPU, more on a busy one, for every case).
MOST_PROCESSES_ADVISED = 30
# A marked case with this many rounds or fewer had the fewest a sweep gives: its interval leans
# on the run's typical spread (``estimators.Prior``) more than on its own.
FEW_ROUNDS = DEFAULT_PROCESSES
# busy, disturbed, apart, few, one
Reasons = tuple[pd.Series, pd.Series, pd.Series, pd.Series, pd.Series]


def _reasons(imprecise: pd.DataFrame, busy: pd.Series) -> Reasons:
    """The marked cases by the one reason that holds for each, in this order: fewer than two
    quiet rounds (``busy``), most of its rounds on a disturbed machine, one process alone,
    its processes far apart, or few rounds (the run's typical spread widening theirs)."""
    rounds = numeric_column(imprecise, "rounds")  # those its time is over, those left out not
    left_out = numeric_column(imprecise, "rounds_disturbed").fillna(0)  # where not busy
    disturbed = ~busy & (left_out > rounds)  # over half of the rounds it ran
    one = ~busy & ~disturbed & rounds.fillna(0).le(1)
    near = numeric_column(imprecise, "spread_between") < IMPRECISE_REL_CI  # not their own spread
    few = ~busy & ~disturbed & ~one & ((rounds <= FEW_ROUNDS) | near)
    apart = ~busy & ~disturbed & ~one & ~few
    return busy, disturbed, apart, few, one


def _why_imprecise(imprecise: pd.DataFrame, reasons: Reasons, busy_in_run: int = 0) -> str:
    """Which of the reasons a case is marked ! holds for how many of them (``_reasons``): a new
    user read the reasons as a list to guess from. ``busy_in_run``: the run's cases with fewer
    than two quiet rounds, marked or not, which another note counts (13 here beside 14 there
    read as a miscount)."""
    busy, disturbed, apart, few, one = reasons
    parts = []
    if busy.any():
        marked = int(busy.sum())
        of = f" of the {busy_in_run} that" if busy_in_run > marked else ""
        parts.append(
            f"{marked}{of} had fewer than two quiet rounds, so {_their(busy)} ±95% "
            "reaches down to what a quiet re-run finds (no more processes narrow that; a "
            "quieter machine does)"
        )
    if apart.any():
        spread = numeric_column(imprecise[apart], "spread_between")
        parts.append(
            f"{int(apart.sum())} had {_their(apart)} processes read far apart"
            + (_span(spread) if spread.notna().any() else "")
        )
    if disturbed.any():
        their = _their(disturbed)
        parts.append(
            f"{int(disturbed.sum())} ran most of {their} rounds on a disturbed machine, left out, "
            f"so {their} interval is mostly the run's typical spread over the rounds kept (alike "
            "for cases that kept as many; a quieter machine narrows it)"
        )
    if one.any():
        parts.append(
            f"{int(one.sum())} {'was' if int(one.sum()) == 1 else 'were'} timed in one process"
        )
    if few.any():
        parts.append(
            f"{int(few.sum())} had {FEW_ROUNDS} rounds or fewer, or processes that read within "
            f"±{IMPRECISE_REL_CI:.0%}, which the run's typical spread widened"
        )
    return f"Of them, {'; '.join(parts)}." if parts else ""


def _their(cases: pd.Series) -> str:
    """ "its" for one case, "their" for several ("1 had their processes" read wrong)."""
    return "its" if int(cases.sum()) == 1 else "their"


def _span(spread: pd.Series) -> str:
    low, high = spread.min(), spread.max()
    return f" (±{low:.1%})" if f"{low:.1%}" == f"{high:.1%}" else f" (±{low:.1%} to ±{high:.1%})"


def _for_those(narrowed: pd.Series, advice: str, narrows: bool = True) -> str:
    """The advice for the marked cases more processes narrow (``narrowed``), named "For the 19
    that more processes would narrow: at the median spread ..." where others were marked too
    ("the other 17" counted those a disturbed machine widened, which more processes do not);
    not where no number of processes to give narrows them (``narrows`` false)."""
    if narrowed.all() or not narrows:
        return advice
    return (
        f"For the {int(narrowed.sum())} that more processes would narrow: "
        f"{advice[:1].lower()}{advice[1:]}"
    )


def _more_processes(imprecise: pd.DataFrame) -> tuple[str, bool]:
    """How many processes would narrow a typical marked case to the mark's bound here: from
    the median spread between their processes (``estimators.processes_for``); and which of
    them --time-budget stopped first, where more processes alone would not reach them."""
    spread = numeric_column(imprecise, "spread_between").median()
    rounds = numeric_column(imprecise, "rounds").max()
    needed = processes_for(float(spread), IMPRECISE_REL_CI) if pd.notna(spread) else None
    first = ""  # those whose rounds --time-budget ended (one round's own budget is its samples')
    if "time_stop" in imprecise:
        budget = imprecise["time_stop"].eq("budget") & numeric_column(imprecise, "rounds").ge(2)
        spent = imprecise[budget]
        if len(spent):
            named = some_of([f"{r.layer} n={r.n}" for r in spent.itertuples()])
            first = (
                f". {len(spent)} of them ({named}) ran out of --time-budget first: raise it as well"
            )
    if needed is None or not pd.notna(rounds) or needed <= rounds:
        return f"More --processes narrow them, a quieter machine more{first}.", True
    if needed > MOST_PROCESSES_ADVISED:  # a new user's busy machine read "about 758"
        # no "raise --time-budget as well": a budget buys processes, called too many to give
        return (
            "A quieter machine narrows them: at the median spread between their processes, "
            f"{spread:.1%}, a case would need about {needed} processes to reach "
            f"±{IMPRECISE_REL_CI:.0%}, too many to give, as an interval narrows only as the "
            "square root of the processes. Processes read that far apart on a busy machine, or "
            "where a round or two ran slow.",
            False,
        )
    return (
        f"At the median spread between their processes, {spread:.1%}, a case needs about "
        f"{needed} processes to reach ±{IMPRECISE_REL_CI:.0%} on this machine as it was: "
        f"--max-processes {needed} gives them to the cases whose interval is wide (an auto "
        f"sweep charges each case that many, so give it a larger --auto-budget too); a "
        f"quieter machine needs fewer{first}.",
        True,
    )


# A wide interval (past the mark's ±5%) whose one end reaches this many times as far as the
# other is shown by both ends, "-45.2/+8.1%": a busy machine's reaches down to a quiet re-run,
# and "±45.2%" read as though a re-run might be 45% slower (a new user's conv n=128:
# -54.5%/+34.0%). So is a wide log interval's own lean: "±99.0%" read as "could be almost
# zero" to a student, where the interval was -50.8/+99.0% (narrow ones, -9.1/+10.0%, read as
# one ±, the farther end).
LOPSIDED = 1.25


def interval_text(time: float, low: float, high: float) -> str:
    """An interval as the tables show it: ``reach_text``, or where it reaches 100% or more of
    the time, the factor it spans ("×/÷8.78": a progress line read "365 µs ±777.7%" where the
    table beside it read the factor)."""
    if rel_ci(time, low, high) >= 1 and low > 0:
        return f"×/÷{max(high / time, time / low):.3g}"
    return reach_text(time, low, high)


def reach_text(time: float, low: float, high: float) -> str:
    """How far an interval reaches from its time: "±3.3%", or "-45.2/+8.1%" where lopsided."""
    down, up = (time - low) / time, (high - time) / time
    wide = max(down, up) > IMPRECISE_REL_CI
    if wide and high >= time >= low and max(down, up) > LOPSIDED * min(down, up):
        return f"-{down:.1%}".removesuffix("%") + f"/+{up:.1%}"
    return f"±{max(down, up):.1%}"
