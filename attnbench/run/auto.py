"""``--n auto``: each layer and width doubles n until its time grows as its work.

A line (a layer at one width) goes on to its next length only while the case before it
finished: it stops once its rate has settled (``attnbench.regime``), or where the next case
would not fit: its call predicted over the per-case limit, its peak predicted over the free
memory, its wall time over the line's share of the budget, or no length left. Predictions
read the last cases of the line: the rate they ran at, the growth of their peak, the part of
their wall time outside the timed calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.layers import registry
from attnbench.measure.record import CaseResult
from attnbench.regime import (
    AUTO_BAND,
    AUTO_TREND,
    PAST_SIZES,
    REGIME_BAND,
    REGIME_SIZES,
    settled_sizes,
)
from attnbench.results.record import Stopped
from attnbench.run.lines import Line, Point, case_work, finite, free_memory, held_bytes, line_key
from attnbench.run.rounds import cost_of
from attnbench.schema import Status
from attnbench.spec import Case, Grid

# A case whose single call is predicted longer than this (seconds) is not started, unless
# --max-case-seconds says otherwise: its timing alone takes ten calls.
MAX_CALL_S = 1.0
# The next case's peak may take at most this share of the free memory.
MEMORY_SHARE = 0.8
MIN_SAMPLES = 4  # calls a round times of a long call (``rounds.round_policy``: 3 and a probe)
UNTIMED_CALLS = 6  # calls a case makes outside its timed blocks, about
# Lengths a line reaches before its share of the budget may stop it (a call's time and the
# memory still may): the fewest a chart draws a slope through and a fit reads. On a loaded
# machine a line's first case (cold: its first call, the counts traced, the memory pass)
# took its whole share, and attention's line was one point.
LEAST_POINTS = 3


class AutoPlan:
    """The lines of an auto grid, what each measured, and whether its next case may run."""

    def __init__(
        self, grid: Grid, memory: Callable[[str], int | None] = free_memory, fresh: bool = True
    ) -> None:
        self.grid, self.memory = grid, memory
        self.fresh = fresh  # each round in a fresh process (its cost: ``rounds.process_s``)
        self.lines: dict[tuple[Any, ...], Line] = {}
        self.keys: dict[str, tuple[Any, ...]] = {}  # case_id -> its line
        for case in grid.cases():
            self.lines.setdefault(line_key(case), Line())
            self.keys[case.case_id] = line_key(case)
        self.max_call_s = grid.max_case_s if grid.max_case_s is not None else MAX_CALL_S

    def _round(self, timed_s: float, call_s: float) -> float:
        return cost_of(timed_s, call_s, self.grid.device, self.fresh)

    def line(self, case: Case) -> Line:
        return self.lines[line_key(case)]

    def started(self, case: Case) -> None:
        self.line(case).running = True

    def record(self, result: CaseResult) -> None:
        """A finished case of a line: a point, or the reason the line stops."""
        line = self.line(result.case)
        line.running = False
        if result.status != Status.OK or result.timing is None:
            # skipped: a smaller case's failure stopped the line already, or the layer has
            # no decode step, which no longer n will give it
            if line.stopped is None:
                line.stopped, line.why = Stopped.FAILED, f"n={result.case.n} {result.status}"
            return
        self.add(
            result.case.n,
            {
                "time_s": result.timing.median_s,
                "flops": result.flops,
                "elementwise": result.elementwise,
                "peak_bytes": held_bytes(result),
                "wall_s": result.wall_s,
                "time_total_s": result.timing.total_s,
            },
            line,
        )

    def add(self, n: int, row: Any, line: Line) -> None:
        """A measured case (a results row or its values): a point; the line stops where its
        rate has settled."""
        elements = finite(row["elementwise"])
        seconds, timed = finite(row["time_s"]), finite(row["time_total_s"])
        later = (self.grid.most_rounds - 1) * self._round(timed, seconds)
        point = Point(
            n,
            seconds,
            finite(row["flops"]) + (elements if math.isfinite(elements) else 0.0),
            finite(row["peak_bytes"]),
            finite(row["wall_s"]),
            timed,
            later if math.isfinite(later) else 0.0,
        )
        line.points = sorted([*line.points, point], key=lambda p: p.n)
        line.at_n = line.points[-1].n
        rates = [p.rate for p in line.points]  # first rounds': AUTO_BAND leaves them room
        sizes = [p.n for p in line.points]
        if line.settled:  # settled, and carried past it: its points only extend the line
            return
        settled = settled_sizes(sizes, rates, AUTO_BAND, AUTO_TREND)
        if settled and settled[-1] == line.at_n:
            line.settled = (
                f"rate within {AUTO_BAND:.0%}, with no trend, over n={settled[0]}..{settled[-1]} "
                f"({len(settled)} lengths)"
            )
            line.settled_n = settled[-1]
            return  # it stops at its next case's ``decide``, unless it is carried on
        # a plateau the rate fell from, read as attnbench table reads one (``PAST_SIZES``)
        lower = settled_sizes(sizes, rates, REGIME_BAND)
        read = [n for n, r in zip(sizes, rates, strict=True) if math.isfinite(r) and r > 0]
        past = [n for n in read if lower and n > lower[-1]]  # a rate not read is not a fall
        if len(past) >= PAST_SIZES:
            line.stopped = Stopped.REGIME
            line.why = (
                f"rate within {REGIME_BAND:.0%}, with no trend, over n={lower[0]}..{lower[-1]} "
                f"({len(lower)} lengths), then under it at the {len(past)} lengths past it, to "
                f"n={past[-1]}"
            )

    def restore(
        self, frame: Any, recorded: Any = None, recorded_budget_s: float | None = None
    ) -> None:
        """The lines of a resumed run, from its rows (in length order), and what stopped each
        as its run.json ``auto`` recorded (``recorded``: its lines; the run's --auto-budget,
        ``recorded_budget_s``), so a resumed run measures what one straight through would: a
        line the budget stopped stays stopped (its spend counted as a finished line's) unless
        the budget grew, and one whose rate settled on its first rounds is not read again on
        its final times. A failed line is its rows' to say (``--retry`` measures it again)."""
        for raw in recorded or ():  # settled on its first rounds: its final times only extend it
            found = self._recorded_line(raw)
            if found is not None and raw.get("settled_n"):
                found.settled_n = int(raw["settled_n"])
                found.settled = f"rate settled at n={found.settled_n} on its first rounds"
        for row in frame.sort_values("n").to_dict("records"):
            key = self.keys.get(str(row["case_id"]))
            if key is None:
                continue
            line = self.lines[key]
            if row["status"] == Status.OK:
                self.add(int(row["n"]), row, line)
            elif row["status"] != Status.SKIPPED and line.stopped is None:
                line.stopped, line.why = Stopped.FAILED, f"n={row['n']} {row['status']}"
        for raw in recorded or ():
            found = self._recorded_line(raw)
            stop = raw.get("stopped")
            if found is None or not stop or Stopped(stop) is Stopped.FAILED:
                continue
            budget = recorded_budget_s if recorded_budget_s is not None else math.inf
            if Stopped(stop) is Stopped.BUDGET and self.grid.auto_budget_s > budget:
                continue  # a larger --auto-budget takes it on
            found.stopped, found.why = Stopped(stop), str(raw.get("why") or "")
            # a run that did not record it never reopened a line: its resume does not either
            found.reopened = bool(raw.get("reopened", True))

    def _recorded_line(self, raw: Any) -> Line | None:
        """The line a run.json ``auto`` entry names (its layer, width and options)."""
        fixed = {"layer", "d", "stopped", "at_n", "why", "wall_s", "allowance_s", "reopened",
                 "settled_n"}  # fmt: skip
        options = {k: v for k, v in raw.items() if k not in fixed}
        for (layer, d, line_options), line in self.lines.items():
            if layer == raw.get("layer") and d == raw.get("d") and dict(line_options) == options:
                return line
        return None

    def decide(self, case: Case) -> tuple[bool, str]:
        """Whether the line's next case, ``case``, may run now: (True, "") to run it, (False,
        "") to wait for the line's running case, (False, why) where the line stops."""
        line = self.line(case)
        if line.stopped is not None:
            return False, line.why
        if line.running:
            return False, ""
        # an equal share of what the finished lines left: a line that settled early leaves
        # its share to every line still going, the ones ahead of it included
        line.allowance_s = self._share()
        if not line.points:
            return True, ""
        if line.settled and not self._carried(line, case.n):
            line.stopped, line.why = Stopped.REGIME, self._carry_why(line)
            return False, line.why
        stop = self._would_not_fit(case, line)
        if stop is not None:
            line.stopped, line.why = stop
            if line.settled:  # it had settled: the carry ended, not the line short of it
                line.stopped, line.why = Stopped.REGIME, self._carry_why(line, stop[1])
            return False, line.why
        return True, ""

    def _carried(self, line: Line, n: int) -> bool:
        """Whether a settled line goes on to ``n``: a rival of attention while a pairwise line
        of its width goes on (or reached ``n``) and was not yet slower than it at their longest
        shared length. Stopped where it settled, rnn ended at n = 512 while attention went to
        1024, and the chapter's chart did not show attention overtake it. It never waits for
        attention (a rival that did stranded its case in the queue when attention's was dropped
        in the same pass), so it goes at most one length past where attention stops."""
        key = self._key(line)
        if not _family(key[0], "rival"):
            return False
        for other, found in self.lines.items():
            if other == key or other[1] != key[1] or not _family(other[0], "pairwise"):
                continue
            if found.settled and _family(other[0], "rival"):
                continue  # carried itself: it carries no other
            if found.stopped is not None and (found.at_n or 0) < n:
                continue  # it goes no further than the rival has
            if not _overtaken(line, found):
                return True
        return False

    def _key(self, line: Line) -> tuple[Any, ...]:
        return next(k for k, v in self.lines.items() if v is line)

    @staticmethod
    def _carry_why(line: Line, ended: str = "") -> str:
        """A carried line's stop: where it settled, and how far it went past that."""
        if not line.points or line.points[-1].n <= line.settled_n:
            return line.settled if not ended else f"{line.settled}; {ended}"
        went = (
            f"{line.settled}; carried on to n={line.at_n} beside attention's lines, to "
            "measure where attention overtakes it"
        )
        return f"{went} ({ended})" if ended else went

    def reopen(self, dropped: list[Case]) -> list[Case]:
        """Once every line has stopped, the lines the budget stopped go on with what the budget
        has left, once each: of ``dropped`` (the cases no line was to reach), those of the lines
        reopened, shortest first ([] while a line is going or nothing is left). A line's share
        is set while the others still go: explicit attention stopped at n = 2048 on its share
        of 60 s while the lines that settled after it left 8 s unspent."""
        if any(line.stopped is None for line in self.lines.values()):
            return []
        reopened = self._reopening()
        for key in reopened:  # their chance, taken or not: run.json says so, for a resume
            self.lines[key].reopened |= self.lines[key].stopped is Stopped.BUDGET
        if not self._budget_left():
            return []
        # only a line with a length left goes on (a carried rnn at the ladder's end stays)
        reopened &= {line_key(c) for c in dropped}
        for key in reopened:
            self.lines[key].stopped, self.lines[key].why = None, ""
        return sorted((c for c in dropped if line_key(c) in reopened), key=lambda c: c.n)

    def may_return(self, case_ids: Iterable[str]) -> int:
        """How many of the cases no line was to reach may yet be measured: their line is one
        that ``reopen`` would take on, and the budget has some left (the progress's "at most";
        read at every event: the lines' spend and the lines reopening are read once)."""
        if not self._budget_left():
            return 0
        back = self._reopening()
        return sum(self.keys[case_id] in back for case_id in case_ids)

    def _budget_left(self) -> bool:
        return sum(line.wall_s for line in self.lines.values()) < self.grid.auto_budget_s

    def _reopening(self) -> set[tuple[Any, ...]]:
        """The lines ``reopen`` takes on: those the budget stopped, not reopened before, and
        the rivals carried beside such an attention line (or one still going, which the budget
        may yet stop), which go on with it (or stop at once, its time past theirs): carried rnn
        had stayed at n = 512 while attention went to 2048."""
        keys = {k for k, v in self.lines.items() if v.stopped is Stopped.BUDGET and not v.reopened}
        going = {k for k, v in self.lines.items() if v.stopped is None}  # none, as reopen reads
        widths = {key[1] for key in keys | going if _family(key[0], "pairwise")}
        return keys | {
            key
            for key, line in self.lines.items()
            if line.settled
            and line.stopped is Stopped.REGIME
            and key[1] in widths
            and _family(key[0], "rival")
        }

    def exhausted(self, case: Case) -> None:
        """The ladder has no length after ``case``'s: its line stops there unless it did."""
        line = self.line(case)
        if line.stopped is None and not line.running:
            line.stopped, line.why = Stopped.LONGEST, f"n={case.n} is the ladder's last"
            if line.settled:
                line.stopped, line.why = Stopped.REGIME, self._carry_why(line)

    def _would_not_fit(self, case: Case, line: Line) -> tuple[Stopped, str] | None:
        last = line.points[-1]
        growth = self._growth(case, line)
        call = last.time_s * growth
        if call > self.max_call_s:
            return Stopped.TIME, (
                f"n={case.n} would take about {call:.2g} s a call (over {self.max_call_s:g} s)"
            )
        peak = self._peak(line)
        free = self.memory(case.device)
        if peak is not None and free is not None and peak > MEMORY_SHARE * free:
            return Stopped.MEMORY, (
                f"n={case.n} would need about {peak / 2**30:.3g} GiB at its peak "
                f"({free / 2**30:.3g} GiB free)"
            )
        # outside its timed calls a case pays a fixed part and a few calls (the first, the
        # traced ones, the memory pass, the warm-up, the profiled ones): those grow
        untimed = max(0.0, last.wall_s - last.timed_s - UNTIMED_CALLS * last.time_s)
        untimed += UNTIMED_CALLS * call
        timed = max(last.timed_s * growth, MIN_SAMPLES * call)
        wall = untimed + timed + (self.grid.most_rounds - 1) * self._round(timed, call)
        left = line.allowance_s - line.wall_s
        if wall > left and len(line.points) >= LEAST_POINTS:
            return Stopped.BUDGET, (
                f"n={case.n} would take about {wall:.2g} s, over the {max(left, 0):.3g} s "
                f"left of this layer's {line.allowance_s:.3g} s of --auto-budget "
                f"{self.grid.auto_budget_s:g} s"
            )
        return None

    def _growth(self, case: Case, line: Line) -> float:
        """How much longer the next call is than the last: the theory's work ratio, or the
        last doubling's measured one (2 where neither is known)."""
        last = line.points[-1]
        ahead = case_work(case)
        before = case_work(_with_n(case, last.n))
        if ahead and before:
            return ahead / before
        if len(line.points) >= 2 and line.points[-2].work > 0:
            measured = last.work / line.points[-2].work
            if math.isfinite(measured) and measured > 0:
                return measured
        return 2.0

    @staticmethod
    def _peak(line: Line) -> float | None:
        """The next case's peak: the last one, grown as it grew over the last doubling."""
        peaks = [p.peak_bytes for p in line.points if math.isfinite(p.peak_bytes)]
        if not peaks:
            return None
        growth = peaks[-1] / peaks[-2] if len(peaks) >= 2 and peaks[-2] > 0 else 2.0
        return peaks[-1] * max(1.0, growth)

    def _share(self) -> float:
        """What a line still going may spend in all: the budget less what the finished lines
        spent, over the lines still going. Read at each of its lengths: set once as a line
        started, the share of a line that settled early went only to the lines that started
        after it (on 2026-11-30 ssm-scan, the last, was left 12 s of a 50 s budget and settled
        in 2.3 s, while conv, the first, stopped short of its regime on its 4.5 s). An equal
        share of what is left, not of what no line has spent yet: there a line running ahead
        of the others took most of the budget (attention-local 13 s of 60, and ssm-scan, the
        last line, was left 3.7 s). The queue runs the lines' first rounds by length, every
        line's n before any line's 2n, so the lines that settle at short lengths finish first
        and leave their share to the rest; line by line, the first lines had only their equal
        share (5.5 s of 60) while the last was left 16 s it did not need."""
        lines = self.lines.values()
        # a settled line is done with its own share, carried or not: its spend is counted as
        # spent, and it takes no share of what is left (a carried rnn had kept one, and
        # attention, whose crossover it went on for, stopped at n = 1024, not 4096)
        done = [line.stopped is not None or bool(line.settled) for line in lines]
        finished = sum(line.wall_s for line, over in zip(lines, done, strict=True) if over)
        going = done.count(False)
        return max(0.0, self.grid.auto_budget_s - finished) / max(1, going)

    def describe(self) -> dict[str, Any]:
        """run.json's ``auto``: the rule, and what stopped each line."""
        lines = []
        for (layer, d, options), line in self.lines.items():
            lines.append(
                {
                    "layer": layer,
                    "d": d,
                    **dict(options),
                    "stopped": None if line.stopped is None else line.stopped.value,
                    "at_n": line.at_n,
                    "why": line.why,
                    "wall_s": round(line.wall_s, 3),
                    "allowance_s": round(line.allowance_s, 3)
                    if math.isfinite(line.allowance_s)
                    else None,
                    "reopened": line.reopened,
                    "settled_n": line.settled_n or None,  # where it settled (carried past it)
                }
            )
        return {
            "rule": (
                f"n doubles from {self.grid.ns[0]} until the rate (counted work per second) "
                f"stays within {AUTO_BAND:.0%}, its slope within {AUTO_TREND:g} of 0, over "
                f"{REGIME_SIZES} lengths (its first rounds'), or settles as the table reads it "
                f"and falls under that at the {PAST_SIZES} lengths past, or the "
                f"next case would take over {self.max_call_s:g} s a call, need over "
                f"{MEMORY_SHARE:.0%} of the free memory, or overrun its share of "
                f"{self.grid.auto_budget_s:g} s; a settled rival of attention goes on while "
                "an attention line of its width goes on and is not yet slower than it"
            ),
            "lines": lines,
        }


def _overtaken(rival: Line, attention: Line) -> bool:
    """Whether ``attention`` was slower than ``rival`` at the longest length both measured
    (their crossover measured: the rival need go no further for it)."""
    theirs = {p.n: p.time_s for p in attention.points}
    shared = [p for p in rival.points if p.n in theirs]
    return bool(shared) and theirs[shared[-1].n] >= shared[-1].time_s


def _family(layer: str, flag: str) -> bool:
    """Whether ``layer``'s family is marked ``flag`` ("rival", "pairwise"); False for a name
    the registry does not hold (a resumed run's plugin not loaded)."""
    try:
        return bool(getattr(registry.entry(layer).family, flag))
    except AttnbenchError:
        return False


def _with_n(case: Case, n: int) -> Case:
    return replace(case, n=n)
