"""The sweep's summary in the terminal: one table per layer with its marks, and the notes that
explain them (unmeasured cases, noisy times, times that break their layer's trend, extended
paths, counts that differ from their formulas, page faults, load)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from attnbench.cli.correctness import compile_notes, correctness_notes, fast_path_notes
from attnbench.cli.imprecise import imprecise_note, interval_text
from attnbench.cli.reach import auto_note, final_readings
from attnbench.cli.reruns import moved_note, sweeps_note
from attnbench.estimators import IMPRECISE_REL_CI, QUIET_FACTOR, rel_ci
from attnbench.fits.outliers import TREND_FACTOR, trend_outliers
from attnbench.measure.timing.contention import busy_cores
from attnbench.measure.timing.faults import FAULT_SHARE
from attnbench.measure.timing.loop import MAX_GREW, SETTLED_FAULTS, is_imprecise
from attnbench.provenance import Provenance, Source, sources
from attnbench.results.run import BUSY_NOTE, LOAD_SLACK, RunResults
from attnbench.schema import (
    STATUSES,
    SUMMARY_COLUMNS,
    Status,
    failed_a_check,
    first_reasons,
    numeric_column,
)
from attnbench.spec import TRAIN_NOTE
from attnbench.units import some_of


def _summary_cell(column: str, row: Any, off_trend: frozenset[str] = frozenset()) -> str:
    """One summary cell: the registry's format, with the marks the table explains below it."""
    spec = next(c for c in SUMMARY_COLUMNS if c.name == column)
    text = spec.fmt(getattr(row, column))
    if column == "time_s" and row.case_id in off_trend:
        return f"[red]{text} ^[/]"
    if column == "spread_between":  # shown where the processes spread more than the samples
        wider = row.spread_between > row.spread_within
        return f"±{row.spread_between:.1%}" if wider and not pd.isna(wider) else ""
    if column == "time_ci_high_s":
        reach = rel_ci(row.time_s, row.time_ci_low_s, row.time_ci_high_s)
        bounds = row.time_s, row.time_ci_low_s, row.time_ci_high_s
        text = "-" if reach == float("inf") else interval_text(*bounds)
        return f"[yellow]{text} ![/]" if reach > IMPRECISE_REL_CI else text
    if column == "flops_check" and text != "ok":
        return f"[yellow]{text}[/]"
    if column == "path_len" and Provenance.parse(row.path_len_method).extended:
        return f"{text}*"
    return text


def _calls(group: pd.DataFrame) -> str:
    """What a layer's calls were, where not a forward call of the eager layer: "(decode: one
    generated token at context n)", "(compiled: default)"."""
    words = []
    if "mode" in group and (group["mode"] == "decode").any():
        words.append("decode: one generated token at context n")
    compiled = group["compiled"].dropna().astype(str) if "compiled" in group else []
    words += [f"compiled: {text}" for text in dict.fromkeys(compiled) if text]
    return f" ({'; '.join(words)})" if words else ""


def print_whole(table: Table, console: Console) -> None:
    """Print ``table`` with no cell cut short off a terminal (a log, a pipe, a file): at the
    width it needs, since a cut cell reads as another value ("1638…" for 16383) or loses its
    mark ("±14.3%…" for "±14.3% !"). A terminal's width is the user's: there Rich cuts what
    does not fit (minimum widths for the marked columns made it overflow the rows instead)."""
    needed = _width(console, table)
    if console.is_terminal or needed <= console.width:
        console.print(table)
        return
    kept, console.width = console.width, needed  # print's own width may only narrow it
    try:
        console.print(table)
    finally:
        console.width = kept


# On a terminal too narrow for every column, the columns kept longest after n, d, the time and
# its interval: the chapter's (steps, path, FLOPs) and memory, then the time's readings; the
# rest (faults, elementwise work) go first.
KEEP_LONGEST = {
    name: rank
    for rank, name in enumerate(
        reversed(["path_len", "seq_steps", "flops", "peak_bytes", "instructions", "state_bytes",
                  "spread_between", "kernel_share", "flops_check", "flops_per_s", "energy_j"])
    )
}  # fmt: skip


def summary_tables(run: RunResults, console: Console) -> None:
    """One table per layer (per layer and device model when the cases ran on several), and a
    line counting the cases by status."""
    frame = run.frame
    off_trend = frozenset(trend_outliers(run.measured)["case_id"])
    keys = ["layer", "device_name"] if len(run.devices) > 1 else ["layer"]
    left_out: dict[str, dict[str, None]] = {}  # each column left out: the tables it left
    had: dict[str, int] = {}  # the tables each column would have been in
    for key, group in frame.groupby(keys, sort=False):
        layer, *device = key if isinstance(key, tuple) else (key,)
        title = f"{layer} on {device[0] or 'no device (not run)'}" if device else f"{layer}"
        title += _calls(group)
        # The columns this layer measured (a time run has no instructions, and the reverse).
        ok = group[(group["status"] == Status.OK) | failed_a_check(group)]
        shown = [c.name for c in SUMMARY_COLUMNS if ok[c.name].notna().any()] or ["time_s"]
        for name in shown:
            had[_header(name)] = had.get(_header(name), 0) + 1
        table = _layer_table(title, group, shown, off_trend)
        # A terminal too narrow for them all: columns are left out, not every column squeezed
        # (Rich emptied n and d first, at 80 and 100 columns, and a row read as no case). The
        # first two (the time and its interval; an instructions run's first two) always stay:
        # under about 40 columns Rich squeezes those again.
        while console.is_terminal and len(shown) > 2 and _width(console, table) > console.width:
            dropped = min(shown[2:], key=lambda name: KEEP_LONGEST.get(name, -1))
            left_out.setdefault(_header(dropped), {})[str(layer)] = None
            shown.remove(dropped)
            table = _layer_table(title, group, shown, off_trend)
        if _width(console, table) < cell_len(title):  # narrow (its cases all skipped)
            table.title = None  # Rich would wrap the title to the table's width
            console.print(escape(title), style="bold", soft_wrap=True, highlight=False)
        print_whole(table, console)
        for row in group.sort_values(["d", "n"]).itertuples():
            # a skipped case's reason is the case above
            if row.status not in (Status.OK, Status.SKIPPED):
                line = f"  n={row.n} d={row.d} {row.status}: {row.error}"
                console.print(line, soft_wrap=True, markup=False)
    counts = run.counts()
    summary = ", ".join(
        f"{count} {'measured' if status == 'ok' else status}" for status, count in counts.items()
    )
    short = run.short_of_rounds() if run.unfinished else 0
    begun = f" ({short} of them short of their timing rounds: --resume finishes them)"
    console.print(f"{len(frame)} of {run.cases_total} cases: {summary}{begun if short else ''}")
    if left_out:
        # a column left out of some tables only says which (a new user read "between" as
        # gone from every table where conv's alone had lost it)
        named = left_out_names(left_out, had)
        console.print(
            f"columns left out to fit this terminal's {console.width} columns: "
            f"{', '.join(named)} (a wider terminal shows them; so does attnbench "
            f"show {run.path} | less -S, and results.csv holds them all)",
            markup=False,
            highlight=False,
        )


def left_out_names(left_out: Mapping[str, Iterable[str]], had: Mapping[str, int]) -> list[str]:
    """Each column left out, with the tables that lost it where others kept it."""
    named = {name: list(tables) for name, tables in left_out.items()}
    return [
        name if len(tables) >= had.get(name, 0) else f"{name} (in {some_of(tables)})"
        for name, tables in named.items()
    ]


def _header(column: str) -> str:
    return next(c.summary for c in SUMMARY_COLUMNS if c.name == column)


def _width(console: Console, table: Table) -> int:
    """The width ``table`` takes with nothing cut."""
    return console.measure(table, options=console.options.update_width(10_000)).maximum


def _layer_table(
    title: str, group: pd.DataFrame, shown: list[str], off_trend: frozenset[str]
) -> Table:
    """A layer's cases, a row each (by d, then n), in the ``shown`` summary columns."""
    table = Table(title=escape(title), title_justify="left", title_style="bold")
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("d", justify="right", no_wrap=True)
    for column in (c for c in SUMMARY_COLUMNS if c.name in shown):
        justify: JustifyMethod = "left" if column.kind == "text" else "right"
        table.add_column(column.summary, justify=justify, no_wrap=True)
    checked = failed_a_check(group)  # failed a correctness check: its figures kept, and shown
    for row in group.sort_values(["d", "n"]).itertuples():
        if checked.get(row.Index, False):
            cells = [_summary_cell(name, row, off_trend) for name in shown]
            table.add_row(str(row.n), str(row.d), f"[red]{cells[0]} failed[/]", *cells[1:])
            continue
        if row.status != Status.OK:
            color = "yellow" if row.status == Status.SKIPPED else "red"
            blank = [""] * (len(shown) - 1)
            table.add_row(str(row.n), str(row.d), f"[{color}]{row.status}[/]", *blank)
            continue
        cells = [_summary_cell(name, row, off_trend) for name in shown]
        table.add_row(str(row.n), str(row.d), *cells)
    return table


def busy_while_measuring(run: RunResults) -> str:
    """A note when other processes loaded the machine past its CPUs while cases were timed."""
    busy = run.busy()
    if busy.empty:
        return ""
    cases = busy["case_id"].nunique()
    return (
        f"the machine's 1-minute load average exceeded its {int(busy['cpu_count'].max())} CPUs "
        f"by more than {LOAD_SLACK:g} (what a sweep's own threads leave) in {len(busy)} timing "
        f"round(s) of {cases} case(s) (up to {busy['load_1m'].max():.1f}): "
        "other processes shared it, so those times may be high (load_1m in samples.csv); "
        "attnbench ab measures both sides of a comparison under the same load"
    )


def summary_notes(run: RunResults, console: Console, *, verb: str = "written to") -> None:
    """What a reader of the summary tables should know, and where the results are."""
    _time_notes(run, console)
    if run.record.ceilings_error:
        console.print(
            f"[yellow]note:[/] no machine ceilings, so no predicted times or bounds: "
            f"{escape(run.record.ceilings_error)}; attnbench predict --machine FILE "
            "takes the ceilings of the machine that ran the cases",
            soft_wrap=True,
        )
    _count_notes(run.frame, console)
    for note in [
        *correctness_notes(run.frame),
        *compile_notes(run.frame),
        *fast_path_notes(run.frame),
        *([TRAIN_NOTE] if run.mode == "train" else []),  # which columns are the step's
    ]:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    reach = auto_note(run.record.auto, final_readings(run.record.auto, run.measured))
    if reach:
        console.print(f"[yellow]note:[/] {escape(reach)}", soft_wrap=True)
    for note in fault_notes(run):
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    busy = busy_while_measuring(run)
    if busy:
        console.print(f"[yellow]note:[/] {escape(busy)}", soft_wrap=True)
    for warning in run.warnings:
        console.print(f"[yellow]note:[/] {escape(warning)}", soft_wrap=True)
    took = run.record.duration_s
    after = f", {took:.0f} s of sweeping" if took and verb == "written to" else ""
    console.print(f"results {verb} [bold]{run.path}[/] (results.csv, samples.csv, run.json){after}")
    if run.unfinished:
        console.print(f"[yellow]this run is[/] {escape(run.unfinished)}", soft_wrap=True)


# How many layers' reasons the note on unmeasured cases lists (results.csv has every case's).
REASONS_SHOWN = 5


def _why_unmeasured(frame: pd.DataFrame) -> list[str]:
    """Each layer's reason for its first case without measurements, from the error column (a
    new user's decode sweep said only "skipped": the layer had no decode step)."""
    lines = [f"{row.layer}: {row.error}" for row in first_reasons(frame).itertuples()]
    if len(lines) > REASONS_SHOWN:
        left = len(lines) - REASONS_SHOWN
        lines = [*lines[:REASONS_SHOWN], f"and {left} more layer(s): the error column says why"]
    return lines


def _time_notes(run: RunResults, console: Console) -> None:
    """What to know of the times: cases not measured, imprecise, spread over processes, off
    their trend, or measured on a second worker."""
    frame = run.frame
    counts = run.counts()
    # failed a correctness check (decode_check, compile_check), its measurements kept
    kept = int(failed_a_check(frame).sum())
    unmeasured = len(frame) - counts[Status.OK] - kept
    if unmeasured:
        console.print(
            f"[yellow]note:[/] {unmeasured} case(s) have no measurements "
            f"({', '.join(f'{s}: {STATUSES[s]}' for s in STATUSES if s != 'ok' and counts[s])}); "
            "tables of figures, fits and charts leave them out",
            soft_wrap=True,
        )
        for line in _why_unmeasured(frame):
            console.print(f"  {escape(line)}", soft_wrap=True)
    if kept:
        console.print(
            f"[yellow]note:[/] {kept} case(s) failed a correctness check (their error says "
            "which: decoded tokens, or a compiled output, not the layer's) and keep their "
            "measurements in results.csv (the tables show them marked failed); fits and "
            "charts leave them out",
            soft_wrap=True,
        )
    measured = run.measured
    timed = measured[numeric_column(measured, "time_s").notna()]  # not counted in instructions
    low, high = timed["time_ci_low_s"], timed["time_ci_high_s"]
    imprecise = timed[is_imprecise(timed["time_s"], low, high)]
    if len(imprecise):
        console.print(f"[yellow]note:[/] {escape(imprecise_note(run, imprecise))}", soft_wrap=True)
    for note in [*replication_notes(run), sweeps_note(run), moved_note(run), *run.mixed_code()]:
        if note:
            console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    outliers = trend_outliers(run.measured)
    if len(outliers):
        worst = outliers.loc[outliers["ratio"].idxmax()]
        console.print(
            f"[yellow]note:[/] {len(outliers)} case(s) marked ^ are over {TREND_FACTOR:g}x "
            "slower than their layer's trend (slower than its next two larger cases, or growing "
            f"faster than cubic; worst {worst['layer']} n={worst['n']} d={worst['d']}, "
            f"{worst['ratio']:.0f}x): a burst of load, likely. More --processes time every "
            "case at more moments of the sweep, so one burst does not decide its time",
            soft_wrap=True,
        )
    rerun = frame[frame["attempts"].fillna(1) > 1] if "attempts" in frame else frame.iloc[:0]
    if len(rerun):
        names = ", ".join(f"{r.layer} n={r.n} d={r.d}" for r in rerun.itertuples())
        console.print(
            f"[yellow]note:[/] {len(rerun)} case(s) ran on a second worker after the first died "
            f"in them (attempts = 2): {names}",
            soft_wrap=True,
        )


def _count_notes(frame: pd.DataFrame, console: Console) -> None:
    """What to know of the counts: path lengths extended, and counts that differ from their
    formula or missed ops."""
    if (sources(frame["path_len_method"]) == Source.EXTENDED).any():
        console.print(
            "[dim]path*: extended from a band or block law proven at probe lengths "
            "(see path_len_method)[/]"
        )
    for what, column in (
        ("FLOPs differ", "flops"),
        ("elementwise work differs", "elementwise"),
        ("bytes moved differ", "bytes"),
    ):
        if f"{column}_check" not in frame:
            continue
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


def replication_notes(run: RunResults) -> list[str]:
    """What the rounds say of the machine: rounds left out because it was disturbed, cases
    whose processes spread more than their samples did, and a run whose rounds shared one
    process (no process's own speed is inside its intervals)."""
    measured, notes = run.measured, []
    disturbed = numeric_column(measured, "rounds_disturbed").fillna(0)
    waited = run.record.waited_s
    if disturbed.sum():
        notes.append(
            f"{int(disturbed.sum())} round(s) of {int((disturbed > 0).sum())} case(s) ran while "
            "the machine was disturbed (their reference read over "
            f"{QUIET_FACTOR:g}x its quiet level"
            + (
                f", or their threads waited for a CPU over {busy_cores():g} core's worth"
                if math.isfinite(busy_cores())
                else ""
            )
            + "): left out of their times where two quiet rounds remained (rounds_disturbed)"
        )
    busy = run.busy_cases()
    if busy:
        notes.append(
            f"{len(busy)} case(s) {BUSY_NOTE}, slower than a quiet re-run would find, and "
            "their ±95% reaches down as far as the machine's reference read slow, to hold a "
            "quiet re-run too (sweep them again when it is quiet, or give --wait-quiet more)"
        )
    if waited:
        notes.append(
            f"the rounds waited {f'{waited:.0f} s' if waited >= 1 else 'under a second'} in "
            "all for the machine to read quiet before they timed "
            f"(--wait-quiet {run.record.config.get('wait_quiet_s', 0):g})"
            + (
                "; a round that read quiet then can be disturbed while it times, and is "
                "judged by its reading after too"
                if disturbed.sum()
                else ""
            )
        )
    alone = measured[(run.rounds_ran() == 1) & numeric_column(measured, "time_s").notna()]
    several = numeric_column(measured, "spread_between").gt(0).sum() >= 2  # a prior was read
    if len(alone) and several and run.record.processes > 1:
        notes.append(  # the prior gave theirs (``estimators.estimate``, the loader)
            f"{len(alone)} case(s) were timed in one process (one round): their ±95% is the "
            "spread between processes typical of their layer's other cases (or the run's), "
            "which one process's samples cannot show"
        )
    elif len(alone):
        asked = run.record.processes
        remedy = (
            "; --processes 3 or more gives an interval that holds a re-run"
            if asked <= 1
            else f"; attnbench sweep --resume {run.path} gives them the {asked} processes asked"
            if run.unfinished
            else ""
        )  # a new user's interrupted sweep was told to ask for the 3 it had asked for
        notes.append(
            f"{len(alone)} case(s) were timed in one process (one round): their ±95% holds that "
            "process's samples only, and a re-run in another process lands outside it more "
            f"often than not (a process has a speed of its own){remedy}"
        )
    between = numeric_column(measured, "spread_between")
    wider = measured[between > numeric_column(measured, "spread_within")]
    if len(wider):
        notes.append(
            f"{len(wider)} case(s) read further apart between their processes than within one "
            "(the between column, blank for a case timed in a single process or whose processes "
            "read no further apart): a process has a speed of its own, which their intervals hold"
        )
    if "process" not in run.samples:
        return notes
    rounds = run.samples.groupby("case_id")["round"].nunique()
    processes = run.samples.groupby("case_id")["process"].nunique()
    shared = rounds[(rounds > 1) & (processes < rounds)]
    if len(shared):
        notes.append(
            f"{len(shared)} case(s) were timed in rounds that shared a process (--executor "
            f"{run.meta.get('cluster', {}).get('executor', 'serial')}): their intervals hold "
            "the moments of the sweep, not a process's own speed"
        )
    return notes


def fault_notes(run: RunResults) -> list[str]:
    """Cases whose page faults cost a large share of their time, and devices where faults
    are not counted."""
    notes = []
    shares = run.fault_shares()
    heavy = shares[shares > FAULT_SHARE]
    if len(heavy):
        layers = ", ".join(dict.fromkeys(run.measured.loc[heavy.index, "layer"]))
        cost = run.record.fault_cost_s or 0.0  # heavy cases exist only where it was measured
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
    left = _left_out(run.samples)
    if left:
        notes.append(left)
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


def _left_out(samples: pd.DataFrame) -> str:
    """How many timed blocks the rounds left out of their samples as warm-up, their settled
    heap grown again in them (``measure.timing.loop._kept``): a time that drops blocks says
    so ("" where none did, or none was recorded)."""
    rounds = samples.drop_duplicates(["case_id", "round"])
    blocks = numeric_column(rounds, "blocks_left_out").fillna(0)
    if not blocks.gt(0).any():
        return ""
    cases = rounds.loc[blocks.gt(0), "case_id"].nunique()
    return (
        f"{int(blocks.sum())} timed block(s) in {int(blocks.gt(0).sum())} round(s) of {cases} "
        f"case(s) were left out of their samples as warm-up: the process's heap, settled, grew "
        f"again in them (over {SETTLED_FAULTS} page faults a call), which times the allocator, "
        f"not the layer; a round in which it grew more than {MAX_GREW} times keeps them all, as "
        "its heap grows with the layer (samples.csv's blocks_left_out)"
    )
