"""The summary's note on how far an auto sweep's lines got: which reached their regime, what
stopped the others, and where ``attnbench table`` reads each on its final times."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from attnbench.fits.exponents import counted_work, settled_line
from attnbench.regime import REGIME_BAND, REGIME_SIZES
from attnbench.results.record import AutoLine, Stopped
from attnbench.schema import numeric_column

# What stopped an auto sweep's line short of its regime, and what takes it further: each
# with "them" for the lines so stopped ("it" where one was).
_SHORT: dict[Stopped, tuple[str, str]] = {
    Stopped.BUDGET: ("on {their} share of the budget", "a larger --auto-budget takes {them} on"),
    Stopped.TIME: ("on the per-call limit", "a larger --max-case-seconds takes {them} on"),
    Stopped.MEMORY: ("on the free memory", ""),
    Stopped.LONGEST: ("at the ladder's last length", "a longer --n auto ladder takes {them} on"),
    Stopped.FAILED: ("on a failed case", ""),
}


def moved_off_regime(auto: tuple[AutoLine, ...], measured: pd.DataFrame) -> list[str]:
    """The auto lines that stopped on reaching their regime, read on their cases' first
    rounds, whose rate no longer reads settled on their final times (``measured``: a case's
    later rounds move its time): what ``attnbench table`` marks unsettled."""
    return _read_settled(auto, measured, {Stopped.REGIME}, settled=False)


def settled_below(auto: tuple[AutoLine, ...], measured: pd.DataFrame) -> list[str]:
    """The auto lines stopped short of their regime at the top (the budget, a limit) whose
    final times settled lower down, on a plateau their rate fell from as they grew: what
    ``attnbench table`` fits them on."""
    short: set[Stopped] = {stop for stop in Stopped if stop is not Stopped.REGIME}
    return _read_settled(auto, measured, short, settled=True)


def _read_settled(
    auto: tuple[AutoLine, ...], measured: pd.DataFrame, stops: set[Stopped], *, settled: bool
) -> list[str]:
    """The lines stopped by one of ``stops`` whose final times read settled (or not), as
    ``attnbench table`` reads them."""
    lines = [line for line in auto if line.stopped in stops]
    if not lines:
        return []
    widths = len({line.d for line in auto}) > 1
    frame = measured[numeric_column(measured, "time_s") > 0]
    work = counted_work(frame)
    found = []
    for line in lines:
        rows = frame[(frame["layer"] == line.layer) & (frame["d"] == line.d)]
        if (settled_line(rows, "n", work) is not None) is settled:  # the table's own reading
            found.append(f"{line.layer}{f' d={line.d}' if widths else ''}")
    return found


def auto_note(
    lines: tuple[AutoLine, ...], moved: Sequence[str] = (), below: Sequence[str] = ()
) -> str:
    """How far an auto sweep's lines got: how many reached their regime, and what stopped the
    others before it, by name; "" for a fixed grid. A line stopped short reads its exponent
    below the regime, which the chapter's table is about: the reader must know which. A line
    is stopped on its cases' first rounds: those ``moved`` off their regime on their final
    times are named, and so are the short ones whose final times settled ``below`` where they
    stopped (a plateau their rate fell from)."""
    if not lines:
        return ""
    widths = len({line.d for line in lines}) > 1
    settled = sum(line.stopped is Stopped.REGIME for line in lines)
    rule = f"counted work per second settled over {REGIME_SIZES} lengths on their first rounds"
    if moved:
        rule += (
            f"; on their final times {len(moved)} of them no longer read settled, within "
            f"{REGIME_BAND:.0%} ({', '.join(moved)}: attnbench table marks them unsettled)"
        )
    if settled == len(lines):
        return f"--n auto: all {len(lines)} lines reached their regime ({rule})"
    parts = []
    for stop, (how, further) in _SHORT.items():
        short = [line for line in lines if line.stopped is stop]
        if not short:
            continue
        named = ", ".join(
            f"{line.layer}{f' d={line.d}' if widths else ''} "
            + (f"at n={line.at_n}" if line.at_n is not None else "before its first length")
            for line in short
        )
        words = {"their": "its", "them": "it"} if len(short) == 1 else {}
        words = {"their": "their", "them": "them", **words}
        part = f"{named} {how.format(**words)}"
        parts.append(part + (f" ({further.format(**words)})" if further else ""))
    going = sum(line.stopped is None for line in lines)
    stopped = len(lines) - settled - going
    head = f"--n auto: {settled} of {len(lines)} lines reached their regime ({rule})"
    if going:
        head += f", {going} had not stopped (the run is unfinished)"
    if not stopped:
        return head
    if not below:
        return (
            f"{head}; {stopped} stopped short of it, so what they measured is read below it "
            f"(attnbench table marks a rate still moving unsettled): {'; '.join(parts)}"
        )
    one = len(below) == 1
    tail = (
        f"; {', '.join(below)} settled lower down, on a plateau {'its' if one else 'their'} "
        f"rate then fell from (attnbench table fits {'it' if one else 'them'} there)"
    )
    rest = stopped - len(below)
    if rest == 1:
        tail += "; the other reads below its regime (attnbench table marks it unsettled)"
    elif rest:
        tail += "; the others read below their regime (attnbench table marks them unsettled)"
    return f"{head}; {stopped} stopped short of it at the top: {'; '.join(parts)}{tail}"
