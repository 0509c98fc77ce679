"""Rich rendering for the terminal: sweep progress, the start line, summary tables and notes,
comparison tables, and any table of the core as a Rich table. Every function is handed the
console it writes to; the commands decide which stream that is (``Streams``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from rich.console import Console
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

from attnbench._version import __version__
from attnbench.compare import Comparison
from attnbench.measure.faults import FAULT_SHARE
from attnbench.measure.timing import NOISY_REL_IQR, is_noisy
from attnbench.render.verdicts import display_table
from attnbench.results.run import RunResults
from attnbench.run.ab import ABStart, describe_sides
from attnbench.run.events import ProgressEvent, SweepStart
from attnbench.schema import STATUSES, SUMMARY_COLUMNS, fmt_int
from attnbench.units import fmt_bytes, fmt_count, fmt_seconds


def console(*, stderr: bool, width: int = 120) -> Console:
    """A console on stdout or stderr; off a terminal (CI logs, pipes) wide enough not to wrap
    tables."""
    found = Console(stderr=stderr, highlight=False)
    return found if found.is_terminal else Console(stderr=stderr, highlight=False, width=width)


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

    def started(self, start: SweepStart) -> None:
        """The start line: what is measured where, how long it should take, and where it goes."""
        self.where = start.cluster.get("executor") != "serial"
        if self.quiet:
            return
        grid, previous = start.grid, start.previous
        if previous is not None:
            self.console.print(
                f"attnbench {__version__}: resuming {start.out_dir} ({previous.status}, "
                f"{len(previous.frame)} of {previous.cases_total} cases on disk)",
                soft_wrap=True,
            )
            for warning in previous.warnings:
                self.console.print(f"[yellow]note:[/] {escape(warning)} (repaired)")
            return
        self.console.print(
            f"attnbench {__version__}: {len(grid.cases())} cases on {grid.device} ({grid.dtype}, "
            f"{grid.mode}, batch {grid.batch}){workers_text(start.cluster)}, "
            f"{duration(start.estimate_s)} or more -> {start.out_dir}",
            soft_wrap=True,
        )
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
            if event.running == 0:
                what = "stopping now: no case is running"
            elif event.running == 1:
                what = f"stopping after {event.case.label()}"
            else:
                what = f"stopping after the {event.running} running cases"
            self.console.print(
                f"[yellow]{escape(what)} (every finished case is kept; press Ctrl-C again to "
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
            if self.task is None:
                total = event.total * event.rounds  # one unit per case and timing round
                self.task = self.bar.add_task("sweep", total=total, completed=event.units_done)
            if event.kind == "start":
                prefix = f"round {event.round}/{event.rounds} " if event.rounds > 1 else ""
                if event.running > 1:
                    prefix = f"{event.running} running, latest: {prefix}"
                self.bar.update(self.task, description=prefix + event.case.label())
            else:
                self.bar.update(self.task, completed=event.units_done)
        elif event.kind == "done" and not self.quiet:
            self.console.print(case_line(event, where=self.where), soft_wrap=True, markup=False)


def case_line(event: ProgressEvent, *, where: bool = False) -> str:
    """One finished case (or timing round) in a line, optionally naming its worker."""
    line = _case_text(event)
    result = event.result
    if where and result is not None and result.node:
        return f"{line}  on {result.node} {result.device_id}"
    if where and event.where is not None:
        return f"{line}  on {event.where.node} {event.where.device_id}"
    return line


def _case_text(event: ProgressEvent) -> str:
    width = len(str(event.total))
    if event.round > 1:  # a later timing round: only times are new
        head = f"[round {event.round}/{event.rounds}] {event.case.label()}"
        t = event.timing
        if t is None:
            return f"{head}  failed this round (left out)"
        return f"{head}  {fmt_seconds(t.median_s)} ± {fmt_seconds(t.iqr_s)} ({t.count} samples)"
    rounds = f"round 1/{event.rounds}, " if event.rounds > 1 else ""
    head = f"[{rounds}{event.completed:>{width}}/{event.total}] {event.case.label()}"
    result = event.result
    if result is None or result.status != "ok" or result.timing is None:
        status = result.status.upper() if result else "FAILED"
        return f"{head}  {status}: {result.error if result else ''}"
    t = result.timing
    return (
        f"{head}  {fmt_seconds(t.median_s)} ± {fmt_seconds(t.iqr_s)} ({t.count} samples)  "
        f"peak {fmt_bytes(result.peak_bytes)}  {fmt_count(result.flops, 'FLOP')}  "
        f"{fmt_count(result.flops_per_s, 'FLOP/s')}  steps {fmt_int(result.seq_steps)}  "
        f"path {fmt_int(result.path_len)}"
    )


def duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def shared_cpu_nodes(cluster: dict[str, Any], device: str) -> str:
    """The nodes where several CPU workers measure at once ("" when none does)."""
    if device != "cpu":
        return ""
    per_node: dict[str, int] = {}
    for worker in cluster.get("workers", []):
        per_node[worker["node"]] = per_node.get(worker["node"], 0) + 1
    crowded = [f"{node} ({count} workers)" for node, count in per_node.items() if count > 1]
    return ", ".join(crowded)


def workers_text(cluster: dict[str, Any]) -> str:
    """ ", through Ray on 4 workers (2 nodes: NVIDIA H100 ...)"; nothing for a serial sweep."""
    if cluster.get("executor") == "serial":
        return ""
    workers = cluster.get("workers", [])
    nodes = sorted({w["node"] for w in workers})
    devices = sorted({w["device_name"] for w in workers})
    failed = len(cluster.get("workers_failed", []))
    return (
        f", through {cluster.get('executor')} on {len(workers)} worker(s) ({len(nodes)} node(s): "
        f"{', '.join(devices)}{f'; {failed} failed to start' if failed else ''})"
    )


# ----------------------------------------------------------------------------- summaries


def _summary_cell(column: str, row: Any) -> str:
    """One summary cell: the registry's format, with the marks the table explains below it."""
    spec = next(c for c in SUMMARY_COLUMNS if c.name == column)
    text = spec.fmt(getattr(row, column))
    if column == "time_iqr_s" and is_noisy(row.time_s, row.time_iqr_s):
        return f"[yellow]{text} ![/]"
    if column == "flops_check" and text != "ok":
        return f"[yellow]{text}[/]"
    if column == "path_len" and str(row.path_len_method).startswith("extended"):
        return f"{text}*"
    return text


def summary_tables(run: RunResults, console: Console) -> None:
    """One table per layer (per layer and device model when the cases ran on several), and a
    line counting the cases by status."""
    frame = run.frame
    keys = ["layer", "device_name"] if len(run.devices) > 1 else ["layer"]
    for key, group in frame.groupby(keys, sort=False):
        layer, *device = key if isinstance(key, tuple) else (key,)
        title = f"{layer} on {device[0] or 'no device (not run)'}" if device else f"{layer}"
        table = Table(title=escape(title), title_justify="left", title_style="bold")
        table.add_column("n", justify="right", no_wrap=True)
        table.add_column("d", justify="right", no_wrap=True)
        # The columns this layer measured (a time run has no instructions, and the reverse).
        ok = group[group["status"] == "ok"]
        shown = [c for c in SUMMARY_COLUMNS if ok[c.name].notna().any()] or SUMMARY_COLUMNS[:1]
        for column in shown:
            justify = "left" if column.kind == "text" else "right"
            table.add_column(column.summary, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for row in group.sort_values(["d", "n"]).itertuples():
            if row.status != "ok":
                color = "yellow" if row.status == "skipped" else "red"
                blank = [""] * (len(shown) - 1)
                table.add_row(str(row.n), str(row.d), f"[{color}]{row.status}[/]", *blank)
                continue
            cells = [_summary_cell(column.name, row) for column in shown]
            table.add_row(str(row.n), str(row.d), *cells)
        console.print(table)
        for row in group.sort_values(["d", "n"]).itertuples():
            if row.status not in ("ok", "skipped"):  # a skipped case's reason is the case above
                line = f"  n={row.n} d={row.d} {row.status}: {row.error}"
                console.print(line, soft_wrap=True, markup=False)
    counts = run.counts()
    summary = ", ".join(
        f"{count} {'measured' if status == 'ok' else status}" for status, count in counts.items()
    )
    console.print(f"{len(frame)} of {run.cases_total} cases: {summary}")


def busy_while_measuring(run: RunResults) -> str:
    """A note when other processes loaded the machine past its CPUs while cases were timed."""
    busy = run.busy()
    if busy.empty:
        return ""
    cases = busy["case_id"].nunique()
    return (
        f"the machine's 1-minute load average exceeded its {int(busy['cpu_count'].max())} CPUs "
        f"in {len(busy)} timing round(s) of {cases} case(s) (up to {busy['load_1m'].max():.1f}): "
        "other processes shared it, so those times may be high (load_1m in samples.csv); "
        "attnbench ab measures both sides of a comparison under the same load"
    )


def summary_notes(run: RunResults, console: Console, *, verb: str = "written to") -> None:
    """What a reader of the summary tables should know, and where the results are."""
    frame = run.frame
    counts = run.counts()
    unmeasured = len(frame) - counts["ok"]
    if unmeasured:
        console.print(
            f"[yellow]note:[/] {unmeasured} case(s) have no measurements "
            f"({', '.join(f'{s}: {STATUSES[s]}' for s in STATUSES if s != 'ok' and counts[s])}); "
            "tables of figures, fits and charts leave them out"
        )
    noisy = frame[is_noisy(frame["time_s"], frame["time_iqr_s"])]
    if len(noisy):
        console.print(
            f"[yellow]note:[/] {len(noisy)} case(s) marked ! have IQR/median above "
            f"{NOISY_REL_IQR:.0%}: the machine was busy or the budget short; "
            "a larger --time-budget gives more samples"
        )
    if frame["path_len_method"].str.startswith("extended").any():
        console.print(
            "[dim]path*: extended from a band or block law proven at probe lengths "
            "(see path_len_method)[/]"
        )
    for what, column in (("FLOPs differ", "flops"), ("elementwise work differs", "elementwise")):
        mismatched = frame[frame[f"{column}_check"] == "mismatch"]
        if len(mismatched):
            console.print(
                f"[yellow]note:[/] counted {what} from the analytic formula by more "
                f"than 1% in {len(mismatched)} case(s) "
                f"({', '.join(sorted(set(mismatched['layer'])))}); "
                f"see the {column} and {column}_analytic columns"
            )
    incomplete = frame[frame["flops_check"] == "incomplete"]
    if len(incomplete):
        texts = incomplete.get("uncounted_ops", [])
        ops = sorted({op.split(" x")[0] for text in texts for op in str(text).split("; ") if op})
        console.print(
            f"[yellow]note:[/] {len(incomplete)} case(s) "
            f"({', '.join(sorted(set(incomplete['layer'])))}) ran ops with no FLOP formula "
            f"({', '.join(ops)}): their FLOPs are a lower bound; see the uncounted_ops column",
            soft_wrap=True,
        )
    for note in fault_notes(run):
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    busy = busy_while_measuring(run)
    if busy:
        console.print(f"[yellow]note:[/] {escape(busy)}", soft_wrap=True)
    for warning in run.warnings:
        console.print(f"[yellow]note:[/] {escape(warning)}")
    console.print(f"results {verb} [bold]{run.path}[/] (results.csv, samples.csv, run.json)")
    if run.status != "complete":
        console.print(
            f"[yellow]this run is unfinished ({run.status}):[/] finish it with "
            f"attnbench sweep --resume {run.path}",
            soft_wrap=True,
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
    grid = Table(
        title=f"{escape(str(comparison.baseline.path))} -> {escape(str(comparison.current.path))}"
        f" ({comparison.judged_on} times)",
        title_justify="left",
    )
    for column in frame.columns:
        justify = "left" if column in ("layer", "time", "exact") else "right"
        grid.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in frame.itertuples(index=False):
        cells = [escape(str(v)) for v in row]
        verdict = str(row.time)
        if verdict.startswith("REGRESSION"):
            cells[-2] = f"[bold red]{cells[-2]}[/]"
        elif verdict == "improvement":
            cells[-2] = f"[green]{cells[-2]}[/]"
        if "!" in str(row.exact):
            cells[-1] = f"[bold red]{cells[-1]}[/]"
        grid.add_row(*cells)
    console.print(grid)
    for label, cases in (
        ("only in the baseline", comparison.only_baseline),
        ("only in the current run", comparison.only_current),
    ):
        for case_id in cases:
            console.print(f"  {label}: {escape(case_id)}", soft_wrap=True)
    found = comparison.regressions(gate)
    if found:
        console.print(f"[bold red]{len(found)} regression(s)[/] (--fail-on {gate}):")
        for line in found:
            console.print(f"  {escape(line)}", soft_wrap=True)
    else:
        console.print(f"[green]no regression[/] (--fail-on {gate})")


# ----------------------------------------------------------------------------- any table


def frame_table(
    frame: pd.DataFrame, console: Console, *, title: str = "", headers: Iterable[str] = ()
) -> None:
    """A DataFrame as a Rich table (every cell as text). A narrow terminal folds a long cell
    onto more lines, never cuts it: a plugin's name or path is read whole."""
    table = Table(title=escape(title) if title else None, title_justify="left")
    for header in list(headers) or list(frame.columns):
        table.add_column(escape(str(header)), no_wrap=bool(headers), overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*[escape(str(v)) for v in row])
    console.print(table)


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
        self.console.print(
            f"attnbench {__version__} ab: {len(grid.cases())} cases a side x {grid.rounds} "
            f"round(s), measured in turn (ABBA) on {grid.device} ({grid.dtype}, {grid.mode}, "
            f"batch {grid.batch}), {duration(start.estimate_s)} or more -> {start.out_dir}",
            soft_wrap=True,
        )
        for line in describe_sides(start):
            self.console.print(f"  {escape(line)}", soft_wrap=True)
        for note in start.notes:
            self.console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)

    def __call__(self, side: str, event: ProgressEvent) -> None:
        self.units[side] = event.units_done
        if event.kind in ("stopping", "retry") or self.sides.bar is not None:
            both = replace(event, total=2 * event.total, units_done=sum(self.units.values()))
            self.sides(both)
            return
        if event.kind == "done" and not self.quiet:
            self.console.print(f"{side:>7} {case_line(event)}", soft_wrap=True, markup=False)


def fault_notes(run: RunResults) -> list[str]:
    """Cases whose page faults cost a large share of their time, and devices where faults
    are not counted."""
    notes = []
    shares = run.fault_shares()
    heavy = shares[shares > FAULT_SHARE]
    if len(heavy):
        layers = ", ".join(dict.fromkeys(run.measured.loc[heavy.index, "layer"]))
        cost = run.meta["fault_cost_s"]
        advice = (
            "--allocator pinned (the default) keeps freed memory mapped"
            if run.allocator != "pinned"
            else "the layer touches memory it never touched before in every call"
        )
        notes.append(
            f"{len(heavy)} case(s) spent over {FAULT_SHARE:.0%} of their time in page faults "
            f"(up to {heavy.max():.0%}, at {cost * 1e6:.2g} µs a fault; {layers}) with the "
            f"allocator {run.allocator}: {advice}; see the page_faults column"
        )
    measured = run.measured
    if "page_faults" in measured:
        uncounted = measured.loc[measured["page_faults"].isna(), "device"].dropna()
        devices = sorted({str(d) for d in uncounted if str(d).startswith(("cuda", "mps"))})
        if devices:
            notes.append(
                f"page faults are not counted on {', '.join(devices)}: its tensors live in "
                "device memory"
            )
    return notes
