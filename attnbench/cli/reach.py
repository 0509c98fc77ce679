"""The summary's note on how far an auto sweep's lines got: which reached their regime, what
stopped the others, and where ``attnbench table`` reads each on its final times."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import pandas as pd

from attnbench.fits.exponents import counted_work, line_rates, settled_line
from attnbench.regime import REGIME_BAND, REGIME_SIZES
from attnbench.results.record import SHORT_OF_REGIME, AutoLine, Stopped
from attnbench.schema import numeric_column


class Reading(enum.StrEnum):
    """How ``attnbench table`` reads a line on its final times."""

    TOP = "top"  # its rate settled at its last lengths
    BELOW = "below"  # settled lower down, on a plateau the rate then fell from
    NONE = "none"  # not settled: marked unsettled


def final_readings(auto: tuple[AutoLine, ...], measured: pd.DataFrame) -> dict[str, Reading]:
    """Each stopped line's reading on its final times (``measured``: a case's later rounds
    move its time), as ``attnbench table`` reads it, by its label (``_label``)."""
    frame = measured[numeric_column(measured, "time_s") > 0]
    work = counted_work(frame)
    found = {}
    for line in auto:
        if line.stopped is None:
            continue
        rows = frame[(frame["layer"] == line.layer) & (frame["d"] == line.d)]
        if rows.empty:
            continue  # nothing measured: nothing to read
        settled = settled_line(rows, "n", work)
        if settled is None:
            found[_label(line, auto)] = Reading.NONE
        else:  # its top: the largest size with a rate to read
            top = settled["n"].max() >= line_rates(rows, "n", work).index.max()
            found[_label(line, auto)] = Reading.TOP if top else Reading.BELOW
    return found


def _label(line: AutoLine, lines: tuple[AutoLine, ...]) -> str:
    """A line's name in the note: its layer, and its width where the sweep had several."""
    return f"{line.layer}{f' d={line.d}' if len({x.d for x in lines}) > 1 else ''}"


def _they(names: list[str]) -> dict[str, str]:
    """The pronouns for ``names``: one line is "it"."""
    one = len(names) == 1
    return {"they": "it" if one else "they", "them": "it" if one else "them",
            "their": "its" if one else "their"}  # fmt: skip


def _fitted(names: list[str]) -> str:
    """ "exponent is fitted" for one line, "exponents are fitted" for several."""
    return "exponent is fitted" if len(names) == 1 else "exponents are fitted"


def _stopped_on_first_rounds(lines: tuple[AutoLine, ...], read: Mapping[str, Reading]) -> str:
    """The rule the lines that reached their regime stopped on, and where their final times
    moved off it (``read``): the table marks them unsettled, or fits them lower down."""
    rule = f"counted work per second settled over {REGIME_SIZES} lengths on their first rounds"
    regime = [_label(line, lines) for line in lines if line.stopped is Stopped.REGIME]
    moved = [x for x in regime if read.get(x) is Reading.NONE]
    lower = [x for x in regime if read.get(x) is Reading.BELOW]
    if moved:
        reads = "reads" if len(moved) == 1 else "read"
        rule += (
            f"; on their final times {len(moved)} of them no longer {reads} settled, within "
            f"{REGIME_BAND:.0%} ({', '.join(moved)}: {_they(moved)['their']} exponent "
            f"{'reads' if len(moved) == 1 else 'read'} unsettled)"
        )
    if lower:
        their = _they(lower)["their"]
        rule += (
            f"; {', '.join(lower)} settled lower down, on a plateau {their} rate then fell "
            f"from ({their} {_fitted(lower)} there)"
        )
    return rule


def _short_tail(short: list[str], read: Mapping[str, Reading]) -> str | None:
    """What the table reads of the lines stopped short (``short``, their labels) on their
    final times; None where every one reads unsettled (the note's plain wording)."""
    lower = [x for x in short if read.get(x) is Reading.BELOW]
    top = [x for x in short if read.get(x) is Reading.TOP]
    if not lower and not top:
        return None
    tail = ""
    if lower:
        they = _they(lower)
        tail += (
            f"; {', '.join(lower)} settled lower down, on a plateau {they['their']} rate then "
            f"fell from ({they['their']} {_fitted(lower)} there)"
        )
    if top:
        they = _they(top)
        tail += (
            f"; {', '.join(top)} settled at {they['their']} last lengths on {they['their']} "
            f"final times ({they['their']} {_fitted(top)} there)"
        )
    rest = [x for x in short if read.get(x) is Reading.NONE]  # a line never measured: no read
    if len(rest) == 1:
        tail += (
            f"; {rest[0]}'s rate did not settle on the lengths it reached (its exponent, fitted "
            "there, reads unsettled)"
        )
    elif rest:
        tail += (
            f"; {', '.join(rest)}: their rates did not settle on the lengths they reached "
            "(their exponents, fitted there, read unsettled)"
        )
    return tail


def auto_note(lines: tuple[AutoLine, ...], read: Mapping[str, Reading] | None = None) -> str:
    """How far an auto sweep's lines got: how many reached their regime, and what stopped the
    others before it, by name; "" for a fixed grid. A line stopped short reads its exponent
    below the regime, which the chapter's table is about: the reader must know which. A line
    is stopped on its cases' first rounds, and ``read`` (``final_readings``) says how the
    table reads each on its final times: those that moved are named."""
    if not lines:
        return ""
    read = read or {}
    settled = sum(line.stopped is Stopped.REGIME for line in lines)
    rule = _stopped_on_first_rounds(lines, read)
    if settled == len(lines):
        return f"--n auto: all {len(lines)} lines reached their regime ({rule})"
    parts = []
    for stop, (how, further) in SHORT_OF_REGIME.items():
        short = [line for line in lines if line.stopped is stop]
        if not short:
            continue
        named = ", ".join(
            f"{_label(line, lines)} "
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
    names = [
        _label(line, lines)
        for line in lines
        if line.stopped is not None and line.stopped is not Stopped.REGIME
    ]
    tail = _short_tail(names, read)
    if tail is None:
        they = {"they": "it", "them": "it"} if stopped == 1 else {"they": "they", "them": "them"}
        return (
            f"{head}; {stopped} stopped short of it, so what {they['they']} measured is read "
            f"below it (a rate still moving reads unsettled): {'; '.join(parts)}"
        )
    return (
        f"{head}; {stopped} stopped before their rate settled at their last lengths: "
        f"{'; '.join(parts)}{tail}"
    )
