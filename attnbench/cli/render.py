"""Rich rendering for the terminal: sweep progress, the start line, comparison tables, and any
table of the core as a Rich table (the sweep's summary is ``cli.summary``). Every function is
handed the console it writes to; the commands decide which stream that is (``Streams``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from rich.cells import cell_len
from rich.console import Console, OverflowMethod
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from attnbench._version import __version__
from attnbench.cli.imprecise import interval_text
from attnbench.cli.startline import busy_note, cpu_threads, estimate_range
from attnbench.compare import Comparison
from attnbench.compare.verdicts import IMPROVEMENT, REGRESSION
from attnbench.measure.timing.loop import TimingStats
from attnbench.render.verdicts import by_length, display_table, row_marks
from attnbench.results.run import RunResults
from attnbench.run.ab import ABStart, describe_sides
from attnbench.run.estimate import CEILINGS_S
from attnbench.run.events import ProgressEvent, SweepStart
from attnbench.schema import Status, fmt_int
from attnbench.spec import Grid
from attnbench.units import fmt_bytes, fmt_count, fmt_seconds


def console(*, stderr: bool, width: int = 120) -> Console:
    """A console on stdout or stderr; off a terminal (CI logs, pipes) wide enough not to wrap
    tables."""
    # emoji off: a plugin named file.py:boom:... read "file.py💥..." (rich's :boom: code)
    found = Console(stderr=stderr, highlight=False, emoji=False)
    if found.is_terminal:
        return found
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


@dataclass(frozen=True)
class Streams:
    """Where a command writes: ``out`` its product (a table, Markdown, JSON); ``err`` progress
    and what must be said even with --quiet; ``notes`` notes and warnings (stderr, None with
    --quiet); ``human`` the tables people read: stdout when the product leaves it free, else
    stderr (the log), None with --quiet."""

    out: Console
    err: Console
    notes: Console | None
    human: Console | None

    @classmethod
    def make(cls, *, stdout_taken: bool = False, quiet: bool = False, width: int = 120) -> Streams:
        out, err = console(stderr=False, width=width), console(stderr=True, width=width)
        human = None if quiet else (err if stdout_taken else out)
        return cls(out, err, None if quiet else err, human)


# ----------------------------------------------------------------------------- progress


class SweepProgress:
    """A live bar in a terminal; one plain line per finished case elsewhere (CI logs)."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.where = False  # name the worker of each case (cases run on several): set at start
        self.upto = False  # --n auto: the count planned falls as lines settle: "≤ N"
        self.most = 0  # the most rounds a case may get (its first round's line says which)
        self.width = 0  # digits of the count planned at the start: the counter's column holds
        self.live = console.is_terminal and not quiet
        self.bar: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> SweepProgress:
        if self.live:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)

    def measuring_ceilings(self) -> None:
        """Said before the start line, where the ceilings are measured as the workers start."""
        if not self.quiet:
            self.console.print(CEILINGS_LINE, soft_wrap=True)

    def started(self, start: SweepStart) -> None:
        """The start line: what is measured where, how long it should take, and where it goes."""
        self.where = start.cluster.get("executor") not in ("serial", "fork")  # else: here
        self.upto = start.grid.n_auto is not None
        self.most = start.grid.most_rounds
        self.width = len(str(len(start.grid.cases())))
        if self.quiet:
            return
        grid, previous = start.grid, start.previous
        if previous is not None:
            self.console.print(
                f"attnbench {__version__}: resuming {start.out_dir} ({previous.status}, "
                f"{len(previous.frame)} of {previous.cases_total} cases on disk"
                f"{_short_of_rounds(previous)}"
                f"{f', {start.retried} to measure again' if start.retried else ''})",
                soft_wrap=True,
            )
            for warning in previous.warnings:
                self.console.print(f"[yellow]note:[/] {escape(warning)} (repaired)")
        else:
            count = len(grid.cases())
            cases = (
                f"{count} case{'' if count == 1 else 's'}"
                if grid.n_auto is None
                else f"--n {grid.n_auto.text()} ({len(grid.layers)} layer(s) x {len(grid.ds)} "
                f"width(s), n from {grid.ns[0]} until each settles: at most "
                f"{len(grid.cases())} cases)"
            )
            span = estimate_range(start.estimate_low_s, start.estimate_s, start.waits_s)
            self.console.print(
                f"attnbench {__version__}: {cases} on {grid.device} "
                f"({grid.dtype}, {grid.mode}, batch {grid.batch}{threads_text(grid)})"
                f"{workers_text(start.cluster, grid)}, "
                f"{span} -> {start.out_dir}",
                soft_wrap=True,
            )
            first = 0.0 if start.ceilings_cached else CEILINGS_S
            busy = busy_note(
                start.busy,
                start.estimate_low_s,
                start.estimate_s,
                self.upto,
                first,
                cpu_threads(grid),
            )
            if busy:
                self.console.print(f"[yellow]note:[/] {escape(busy)}", soft_wrap=True)
        if not start.ceilings_cached:
            self.console.print(CEILINGS_LINE, soft_wrap=True)
        shared = shared_cpu_nodes(start.cluster, grid.device)
        if shared:
            self.console.print(
                f"[yellow]note:[/] {escape(shared)} run several cases at once on their CPUs: "
                "concurrent cases share memory bandwidth and caches, so their times are higher "
                "than alone (1.4x in the median on a 2-core VM); for times to publish, pass "
                "--threads with a node's core count (one case per node)",
                soft_wrap=True,
            )

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "stopping":
            # Printed even with --quiet: the user pressed Ctrl-C and is waiting for an answer.
            # in rounds, which a sweep interleaves: "stopping after rnn n=128" read as a case's end
            if event.running == 0:
                what = "stopping: no round is timing, and no new one starts"
            elif event.running == 1:
                what = f"stopping after the round of {event.case.label()} now timing"
            else:
                what = f"stopping after the {event.running} rounds now timing"
            self.console.print(
                f"[yellow]{escape(what)} (every finished round is kept; press Ctrl-C again to "
                "stop at once)[/]",
                soft_wrap=True,
            )
            return
        if event.kind == "retry":
            where = f" on {event.where.node} {event.where.device_id}" if event.where else ""
            self.console.print(
                f"[yellow]the worker{escape(where)} died in {escape(event.case.label())} "
                f"({escape(event.error)}); running it once more[/]",
                soft_wrap=True,
            )
            return
        if self.bar is not None:
            # One unit per case and timing round, of the cases the sweep may still measure:
            # under --n auto that shrinks as lines settle (a new user's bar was left at 168 of
            # the 495 its first event planned, at the end of the sweep).
            total = max(event.total * event.rounds, event.units_done)
            if self.task is None:
                self.task = self.bar.add_task("sweep", total=total, completed=event.units_done)
            if event.kind == "start":
                prefix = f"round {event.round} " if event.round > 1 else ""
                if event.running > 1:
                    prefix = f"{event.running} running, latest: {prefix}"
                self.bar.update(self.task, total=total, description=prefix + event.case.label())
            else:
                self.bar.update(self.task, total=total, completed=event.units_done)
        elif event.kind == "done" and not self.quiet:
            line = case_line(
                event, where=self.where, upto=self.upto, most=self.most, width=self.width
            )
            self.console.print(line, soft_wrap=True, markup=False)


def case_line(
    event: ProgressEvent, *, where: bool = False, upto: bool = False, most: int = 0, width: int = 0
) -> str:
    """One finished case (or timing round) in a line, optionally naming its worker; ``upto``:
    the total is the most the sweep may still measure (--n auto drops the lengths a settled
    line will not reach), "[12/≤90]"; ``most``: the most rounds a case may get (0: the
    event's own count, as many as it is sure to get); ``width``: the counter's digits at the
    least (the count planned at the start: "[ 72/≤80]" after "[ 71/≤146]", not "[72/≤80]")."""
    line = _case_text(event, upto, most or event.rounds, width)
    result = event.result
    if where and result is not None and result.node:
        return f"{line}  on {result.node} {result.device_id}"
    if where and event.where is not None:
        return f"{line}  on {event.where.node} {event.where.device_id}"
    return line


def _case_text(event: ProgressEvent, upto: bool = False, rounds: int = 1, least: int = 0) -> str:
    width = max(least, len(str(event.total)))
    if event.round > 1:  # a later timing round, in a process of its own: its median is new
        head = f"[round {event.round}] {event.case.label()}"
        t = event.timing
        if t is None:
            return f"{head}  failed this round (left out)"
        return f"{head}  {fmt_seconds(t.median_s)} ({t.count} samples)"
    total = f"≤{event.total}" if upto else str(event.total)
    head = f"[{event.completed:>{width}}/{total}] {event.case.label()}"
    result = event.result
    if result is None or result.status != Status.OK or result.timing is None:
        status = result.status.upper() if result else "FAILED"
        return f"{head}  {status}: {result.error if result else ''}"
    kernels = "" if result.kernel_share is None else f"  kernels {result.kernel_share:.0%}"
    return (
        f"{head}  {_timed(result.timing, rounds)}{kernels}  "
        f"peak {fmt_bytes(result.peak_bytes)}  {fmt_count(result.flops, 'FLOP')}  "
        f"{fmt_count(result.flops_per_s, 'FLOP/s')}  steps {fmt_int(result.seq_steps)}  "
        f"path {fmt_int(result.path_len)}"
    )


def _timed(t: TimingStats, rounds: int = 1) -> str:
    """A first round's median, with its samples; where it is the case's only round, how far its
    own 95% interval reaches. Of several rounds, the first is one of them: its median is named
    so, and its own interval is not shown beside the case's (the summary's, over its rounds),
    which a new user read as the case's ("72.5 µs ±3.8%" here, "43.1 µs ±14.3%" there)."""
    if rounds > 1:
        return f"round 1: {fmt_seconds(t.median_s)} ({t.count} samples)"
    precision = "" if t.rel_ci == float("inf") else f" {interval_text(t.median_s, *t.ci_s)}"
    return f"{fmt_seconds(t.median_s)}{precision} ({t.count} samples)"


CEILINGS_LINE = (
    "measuring this machine's ceilings first (once per machine and thread count, a few seconds "
    "on a quiet machine, longer on a busy one; attnbench machine shows them)"
)


def _short_of_rounds(run: RunResults) -> str:
    """How many of a stopped run's measured cases have fewer timing rounds than every case
    gets (--processes): "20 of 20 cases on disk" read finished where 12 had."""
    short = run.short_of_rounds()
    return f", {short} short of their timing rounds" if short else ""


def shared_cpu_nodes(cluster: dict[str, Any], device: str) -> str:
    """The nodes where several CPU workers measure at once ("" when none does)."""
    if device != "cpu":
        return ""
    per_node: dict[str, int] = {}
    for worker in cluster.get("workers", []):
        per_node[worker["node"]] = per_node.get(worker["node"], 0) + 1
    crowded = [f"{node} ({count} workers)" for node, count in per_node.items() if count > 1]
    return ", ".join(crowded)


def threads_text(grid: Grid) -> str:
    """ ", 1 thread" where the sweep sets torch's threads (on the CPU, one unless --threads
    says otherwise); nothing where it keeps torch's own count."""
    if grid.threads is None:
        return ""
    return f", {grid.threads} thread{'s' * (grid.threads > 1)}"


def workers_text(cluster: dict[str, Any], grid: Grid | None = None) -> str:
    """ ", through Ray on 4 workers (2 nodes: NVIDIA H100 ...)", ", each case in 3-6 fresh
    processes (to ±2%; 2 fork servers)": more rounds past 3 while the interval is wider than
    --precision; nothing for a serial sweep."""
    if cluster.get("executor") == "serial":
        return ""
    if cluster.get("executor") == "fork":
        if grid is None:
            return ", each round in a fresh process"
        most, servers = grid.most_rounds, cluster.get("servers", 1)
        if most == 1:
            return f", each case in a fresh process ({servers} fork server{'s' * (servers > 1)})"
        if most <= grid.processes:
            return f", each case in {grid.processes} fresh processes ({servers} fork servers)"
        return (
            f", each case in {grid.processes}-{most} fresh processes (to ±{grid.precision:.0%}; "
            f"{servers} fork servers)"
        )
    workers = cluster.get("workers", [])
    nodes = sorted({w["node"] for w in workers})
    devices = sorted({w["device_name"] for w in workers})
    failed = len(cluster.get("workers_failed", []))
    return (
        f", through {cluster.get('executor')} on {len(workers)} worker(s) ({len(nodes)} node(s): "
        f"{', '.join(devices)}{f'; {failed} failed to start' if failed else ''})"
    )


# ----------------------------------------------------------------------------- comparisons


def comparison_warnings(comparison: Comparison, console: Console | None) -> None:
    if console is None:
        return
    for warning in comparison.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def comparison_table(comparison: Comparison, gate: str, console: Console) -> None:
    """The comparison's table, the cases found on one side only, and the verdict."""
    frame = display_table(comparison)
    paths = f"{escape(str(comparison.baseline.path))} -> {escape(str(comparison.current.path))}"
    grid = Table(title=f"{paths} ({comparison.judged_on} times)", title_justify="left")
    for column in frame.columns:  # text folded, read whole; a number cut
        text = column in ("layer", "device", "time", "exact")
        fold: OverflowMethod = "fold" if text else "ellipsis"
        grid.add_column(column, justify="left" if text else "right", overflow=fold)
    for row, mark in zip(frame.itertuples(index=False), row_marks(comparison), strict=True):
        cells = [escape(str(v)) for v in row]
        if mark.time == REGRESSION:
            cells[-2] = f"[bold red]{cells[-2]}[/]"
        elif mark.time == IMPROVEMENT:
            cells[-2] = f"[green]{cells[-2]}[/]"
        if mark.exact_regressed:
            cells[-1] = f"[bold red]{cells[-1]}[/]"
        grid.add_row(*cells)
    console.print(grid)
    for label, cases in (
        ("only in the baseline", comparison.only_baseline),
        ("only in the current run", comparison.only_current),
    ):
        for line in by_length(cases):
            console.print(f"  {label}: {escape(line)}", soft_wrap=True)
    if found := comparison.regressions(gate):  # under --fail-on none shown, failing nothing
        gating = ("bold red", "") if comparison.failed(gate) else ("yellow", ", not gating")
        console.print(f"[{gating[0]}]{len(found)} regression(s){gating[1]}[/] (--fail-on {gate}):")
        for line in found:
            console.print(f"  {escape(line)}", soft_wrap=True)
    elif undecided := comparison.undecided(gate):
        console.print(f"[yellow]no regression shown[/] (--fail-on {gate}): {escape(undecided)}")
    else:
        console.print(f"[green]no regression[/] (--fail-on {gate})")


# ----------------------------------------------------------------------------- any table


def frame_table(
    frame: pd.DataFrame, console: Console, *, title: str = "", headers: Iterable[str] = ()
) -> None:
    """A DataFrame as a Rich table (every cell as text). A table wider than the console
    folds a long cell onto more lines, never cuts it: a plugin's name or path is read whole,
    and the chapter's table read "attention-linea" and "d^-1.0" (for d^-1.07) at 120 columns.
    The title is a line of its own, as wide as the console: inside a narrow table (the
    generation table's) a long run path folded it onto three lines."""
    if title:
        console.print(Text(title, style="table.title"))
    names = [str(h) for h in (list(headers) or list(frame.columns))]
    cells = [[name, *map(str, frame.iloc[:, i])] for i, name in enumerate(names)]
    words = [_longest_word(column) for column in cells]
    frame_w = 1 + 3 * len(names)  # a border, and each column's padding and border
    if console.is_terminal and frame_w + sum(words) > console.width:
        _stacked(frame, names, console)  # a student's 80 columns read "complexi ty", "(exac t)"
        return
    room = max(console.width, frame_w + sum(words)) - frame_w  # a pipe's: no word cut either
    table = Table()
    for name, width in zip(names, _widths(cells, words, room), strict=True):
        table.add_column(escape(name), overflow="fold", width=width)
    for row in frame.itertuples(index=False):
        table.add_row(*[escape(str(v)) for v in row])
    kept, console.width = console.width, frame_w + room
    try:
        console.print(table)
    finally:
        console.width = kept


# A word longer than this (a path, a formula) may be folded: no column is held wider for it.
LONGEST_WORD = 24


def _longest_word(cells: Iterable[str]) -> int:
    return min(LONGEST_WORD, max((cell_len(w) for c in cells for w in c.split()), default=1))


def _widths(cells: list[list[str]], words: list[int], room: int) -> list[int]:
    """Each column's width in ``room`` characters: its widest line where all fit, else its
    longest word and a share of what is left by how much more it would take. Rich narrows the
    widest columns first, whatever their words, and split "complexity" where the table had
    room to keep every word whole."""
    natural = [
        max(max(cell_len(c) for c in column), w) for column, w in zip(cells, words, strict=True)
    ]
    if sum(natural) <= room:
        return natural
    spare, wants = room - sum(words), [n - w for n, w in zip(natural, words, strict=True)]
    return [w + spare * want // max(1, sum(wants)) for w, want in zip(words, wants, strict=True)]


def _stacked(frame: pd.DataFrame, names: list[str], console: Console) -> None:
    """A table too wide for the terminal, a row at a time: its first cell as a heading, then
    each other cell under its column's name (a one-column table: its name, then its cells)."""
    if len(names) == 1 or frame.empty:
        console.print(Text(names[0] if len(names) == 1 else ", ".join(names), style="bold"))
        for row in frame.itertuples(index=False):
            console.print(Text(f"  {', '.join(str(v) for v in row)}"))
        return
    # a header that repeats ("measured" after each column of the chapter's table) is said
    # with the one before it: "sequential ops, measured"
    labels = [
        f"{names[i - 1]}, {name}" if names.count(name) > 1 and i > 0 else name
        for i, name in enumerate(names)
    ]
    for row in frame.itertuples(index=False):
        first, *rest = (str(v) for v in row)
        console.print(Text(first, style="bold"))
        for name, value in zip(labels[1:], rest, strict=True):
            if value:
                console.print(Text(f"  {name}: {value}"), soft_wrap=False)


class ABProgress:
    """Progress of an interleaved run: one bar for both sides in a terminal, and elsewhere one
    line per finished job, named by its side."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.sides = SweepProgress(console, quiet)  # stop and retry messages, the live bar
        self.units: dict[str, int] = {}

    def __enter__(self) -> ABProgress:
        self.sides.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sides.__exit__(*exc)

    def started(self, start: ABStart) -> None:
        if self.quiet:
            return
        grid = start.grids["current"]
        span = estimate_range(start.estimate_low_s, start.estimate_s, start.waits_s)
        self.console.print(
            f"attnbench {__version__} ab: {len(grid.cases())} cases a side x {grid.processes} "
            f"round(s), measured in turn (ABBA) on {grid.device} ({grid.dtype}, {grid.mode}, "
            f"batch {grid.batch}{threads_text(grid)}), {span} -> {start.out_dir}",
            soft_wrap=True,
        )
        for line in describe_sides(start):
            self.console.print(f"  {escape(line)}", soft_wrap=True)
        busy = busy_note(
            start.busy,
            start.estimate_low_s,
            start.estimate_s,
            auto=False,
            threads=cpu_threads(grid),
        )
        for note in (busy, *start.notes) if busy else start.notes:
            self.console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)

    def __call__(self, side: str, event: ProgressEvent) -> None:
        self.units[side] = event.units_done
        if event.kind in ("stopping", "retry") or self.sides.bar is not None:
            both = replace(event, total=2 * event.total, units_done=sum(self.units.values()))
            self.sides(both)
            return
        if event.kind == "done" and not self.quiet:
            self.console.print(f"{side:>7} {case_line(event)}", soft_wrap=True, markup=False)
