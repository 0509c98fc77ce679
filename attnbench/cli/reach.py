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
from attnbench.table import fixed_at, overhead_lengths
from attnbench.units import some_of


class Reading(enum.StrEnum):
    """How ``attnbench table`` reads a line on its final times."""

    TOP = "top"  # its rate settled at its last lengths
    BELOW = "below"  # settled lower down, on a plateau the rate then fell from
    NONE = "none"  # not settled: marked unsettled
    OVERHEAD = "overhead"  # not settled, every length's kernels under half its time


def final_readings(auto: tuple[AutoLine, ...], measured: pd.DataFrame) -> dict[str, Reading]:
    """Each stopped line's reading on its final times (``measured``: a case's later rounds
    move its time), as ``attnbench table`` reads it, by its label (``_label``). A line the
    table does not read (its layer at another width than the table's) or reads by a fit this
    note does not make (no kernels measured: a flat rate reads overhead-bound there) gets
    none: the note claims nothing of it."""
    frame = measured[numeric_column(measured, "time_s") > 0]
    work = counted_work(frame)
    found = {}
    for line in auto:
        if line.stopped is None:
            continue
        if line.d != fixed_at(measured[measured["layer"] == line.layer], "d", "n"):
            continue  # the table reads the layer at its largest width with two lengths
        rows = frame[(frame["layer"] == line.layer) & (frame["d"] == line.d)]
        if rows.empty:
            continue  # nothing measured: nothing to read
        settled = settled_line(rows, "n", work)
        if settled is None:
            overhead = _overhead(rows, line.d)
            if overhead is not None:
                found[_label(line, auto)] = Reading.OVERHEAD if overhead else Reading.NONE
        else:  # its top: the largest size with a rate to read
            top = settled["n"].max() >= line_rates(rows, "n", work).index.max()
            found[_label(line, auto)] = Reading.TOP if top else Reading.BELOW
    return found


def _overhead(rows: pd.DataFrame, d: int) -> bool | None:
    """Whether every length's kernels ran under half its time, by the table's own rule
    (``table.overhead_lengths``, ``table._time_cell``); None where no kernels were measured."""
    bound = overhead_lengths(rows, d)
    return None if bound is None else set(rows["n"].astype(int)) <= set(bound)


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
    moved = [x for x in regime if read.get(x) in (Reading.NONE, Reading.OVERHEAD)]
    lower = [x for x in regime if read.get(x) is Reading.BELOW]
    if moved:
        reads = "reads" if len(moved) == 1 else "read"
        how = ", ".join(
            f"{x} reads {'overhead-bound' if read[x] is Reading.OVERHEAD else 'unsettled'}"
            for x in moved
        )
        rule += (
            f"; on their final times {len(moved)} of them no longer {reads} settled, within "
            f"{REGIME_BAND:.0%} ({how})"
        )
    if lower:
        their = _they(lower)["their"]
        rule += (
            f"; {', '.join(lower)} settled lower down, on a plateau {their} rate then fell "
            f"from ({their} {_fitted(lower)} there)"
        )
    carried = [x for x in lines if x.settled_n and x.at_n and x.at_n > x.settled_n]
    if carried:  # what its final times read there is the carried lengths' too
        rule += "; carried on past it beside attention, to measure where attention overtakes: "
        rule += ", ".join(f"{_label(x, lines)} from n={x.settled_n} to {x.at_n}" for x in carried)
    return rule


def _final_times(short: list[str], read: Mapping[str, Reading]) -> str | None:
    """How ``attnbench table`` reads the lines stopped short (``short``, their labels) on their
    final times, as a sentence of its own: a line stops on its first rounds, which its later
    ones move, and "stopped before their rate settled" beside "settled at their last lengths"
    read as a contradiction. None where every one reads unsettled (the note's plain wording)."""
    order = (Reading.TOP, Reading.BELOW, Reading.OVERHEAD, Reading.NONE)
    groups = {kind: [x for x in short if read.get(x) is kind] for kind in order}
    if not any(groups[kind] for kind in (Reading.TOP, Reading.BELOW, Reading.OVERHEAD)):
        return None
    parts = []
    for kind, names in groups.items():
        if not names:
            continue
        they = _they(names)
        their, fitted = they["their"], _fitted(names)
        rates = "rate" if len(names) == 1 else "rates"
        parts.append(
            ", ".join(names)
            + {
                Reading.TOP: f" as settled at {their} last lengths ({their} {fitted} there)",
                Reading.BELOW: (
                    f" as settled lower down, on a plateau {their} rate then fell from "
                    f"({their} {fitted} there)"
                ),
                Reading.OVERHEAD: (
                    f" as overhead-bound ({their} kernels under half the time at every length)"
                ),
                Reading.NONE: (
                    f" as unsettled ({their} {rates} did not settle on the lengths "
                    f"{they['they']} reached)"
                ),
            }[kind]
        )
    their = _they([x for x in short if x in read])["their"]  # of the lines read, not all
    return f"On {their} final times (every round), attnbench table reads {'; '.join(parts)}"


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
    reached = [_label(line, lines) for line in lines if line.stopped is Stopped.REGIME]
    which = f"{some_of(reached)}: " if reached else ""  # a new user looked for the one
    head = f"--n auto: {settled} of {len(lines)} lines reached their regime ({which}{rule})"
    if going:
        head += f", {going} had not stopped (the run is unfinished)"
    if not stopped:
        return head
    names = [
        _label(line, lines)
        for line in lines
        if line.stopped is not None and line.stopped is not Stopped.REGIME
    ]
    final = _final_times(names, read)
    if final is None:
        they = {"they": "it", "them": "it"} if stopped == 1 else {"they": "they", "them": "them"}
        return (
            f"{head}; {stopped} stopped short of it, so what {they['they']} measured is read "
            f"below it (a rate still moving reads unsettled): {'; '.join(parts)}"
        )
    their = "its" if stopped == 1 else "their"
    cut = f"{stopped} stopped short of it on {their} first rounds: {'; '.join(parts)}"
    return f"{head}; {cut}. {final}"
