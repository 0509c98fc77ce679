"""The commands that read a saved run (show, table, plot, fit, report), and pe and env.

Each prints its product (a table, or with --json its JSON) on stdout, and its notes (files
written, what was left out) on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import torch
import typer
from rich.markup import escape

from attnbench.beside import beside_notes, beside_table, display_beside, run_label
from attnbench.cli.options import RunLayers, SavedRun, json_flag
from attnbench.cli.render import Streams, frame_table
from attnbench.cli.summary import summary_notes, summary_tables
from attnbench.cli.sweeping import records
from attnbench.devices import DEVICE_CHOICES, resolve_device
from attnbench.errors import AttnbenchError, NothingToPlot
from attnbench.fits import analyse, run_catalog
from attnbench.positional import relative_shift_error
from attnbench.render.blocks import markdown_table
from attnbench.render.charts import (
    CHARTS,
    CHARTS_DIR,
    DEFAULT_FORMATS,
    FORMATS,
    existing_charts,
    not_drawn_reason,
    parse_charts,
    parse_formats,
    plot_run,
    save_charts,
    select_layers,
)
from attnbench.render.pe import parse_columns, pe_figures
from attnbench.render.report import EXPONENT_NOTE, fit_tables, model_notes, write_report
from attnbench.results.environment import environment
from attnbench.results.files import committed_run_note, latest_results
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.table import HEADERS, check_notes, comparison_table, display, fit_notes


def load_saved(folder: Path | None, *, state_notes: bool = True) -> RunResults:
    """A saved run. Its plugin layers are never imported: a results folder is data, and their
    theories are read from the run's own record (``theory.json``). An unfinished run is said
    to be, and a layer whose cases ran two codes (``state_notes``): a new user's table of an
    interrupted sweep read as final."""
    err = Streams.make().err
    if folder is None:
        folder = latest_results()
        if note := committed_run_note(folder):
            err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    run = load_results(folder)
    for note in run_catalog(run).notes:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if state_notes and run.unfinished:
        err.print(
            f"[yellow]note:[/] this run is {escape(run.unfinished)} (these are the cases "
            "measured so far)",
            soft_wrap=True,
        )
    for note in run.mixed_code() if state_notes else []:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    return run


def _echo_json(payload: Any) -> None:
    typer.echo(json.dumps(payload, indent=2, default=str))


def _announce(paths: list[Path], streams: Streams) -> None:
    for path in paths:
        streams.err.print(str(path), soft_wrap=True)


def show(
    folder: SavedRun = None,
    as_json: Annotated[bool, json_flag("the results")] = False,
) -> None:
    """Print the tables of a saved run (finished or not), with its case counts."""
    run = load_saved(folder, state_notes=False)  # said at the end, with the notes
    if as_json:
        _echo_json({"path": str(run.path), "status": run.status, "results": records(run)})
        return
    streams = Streams.make()
    summary_tables(run, streams.out)
    summary_notes(run, streams.err, verb="in")


def table(
    folder: SavedRun = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown table on stdout (for a README).")
    ] = False,
    as_json: Annotated[bool, json_flag("the table and exponents")] = False,
    beside: Annotated[
        Path | None,
        typer.Option(
            help="Another run of the same layers (an eager run beside a --compile one): "
            "for each layer, where each run's calls were overhead-bound, each run's time "
            "exponent in n, how much faster this run read at each length, and its compile "
            "seconds.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """The chapter's comparison table, theory beside the growth measured in a run.

    Measured growth is a log-log exponent in n (and in d for compute), fitted on ok cases. A
    decode run (--mode decode) prints the table for generation: compute per token, the state's
    memory and sequential ops per token, each against the context n. --beside puts two runs
    side by side instead.
    """
    if markdown and as_json:
        raise AttnbenchError("--markdown and --json both print on stdout: choose one")
    run = load_saved(folder)
    if beside is not None:
        _beside(load_saved(beside), run, markdown, as_json)
        return
    rows = comparison_table(run)
    streams = Streams.make(width=140)  # off a terminal: the seven columns on one line each
    if as_json or markdown:  # the product on stdout, its notes on stderr, as in the table's
        typer.echo(
            rows.to_json(orient="records", indent=2) if as_json else markdown_table(display(rows)),
            nl=as_json,
        )
        for note in fit_notes(rows, run):
            streams.err.print(f"  {note}", soft_wrap=True, markup=False)
        return
    shown = display(rows)
    decode = run.mode == "decode"
    what = "comparison table" + (" (train: forward + backward)" if run.mode == "train" else "")
    frame_table(
        shown,
        streams.out,
        title=f"{'generation table (one token at context n)' if decode else what}"
        f", measured in {run.path}",
        headers=list(shown.columns) if decode else HEADERS,
    )
    for note in fit_notes(rows, run):
        streams.err.print(f"  {note}", soft_wrap=True, markup=False)


def _beside(first: RunResults, second: RunResults, markdown: bool, as_json: bool) -> None:
    """``table --beside``: ``first`` (the other run) and ``second`` (this one) side by side."""
    rows = beside_table(first, second)
    names = run_label(first), run_label(second)
    if names[0] == names[1]:
        names = (first.path.name, second.path.name)
    shown = display_beside(rows, *names)
    streams = Streams.make()
    if as_json:  # its notes on stderr all the same
        typer.echo(rows.to_json(orient="records", indent=2))
    elif markdown:
        typer.echo(markdown_table(shown), nl=False)
    else:
        frame_table(
            shown,
            streams.out,
            title=f"{second.path} ({names[1]}) beside {first.path} ({names[0]}); faster: "
            f"the {names[0]} time over the {names[1]} one, at each length both measured",
        )  # a narrow terminal folds the cells rather than cutting columns
    for note in beside_notes(rows, *names):
        streams.err.print(f"note: {note}", soft_wrap=True, markup=False)


def plot(
    folder: SavedRun = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Charts to draw, comma-separated: "
            + "; ".join(f"{name}: {what}" for name, what in CHARTS.items())
            + ". Default: all that the run has data for.",
            show_default=False,
        ),
    ] = None,
    layers: RunLayers = None,
    fmt: Annotated[
        str, typer.Option("--format", help=f"Comma-separated: {', '.join(FORMATS)}.")
    ] = ",".join(DEFAULT_FORMATS),
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for the chart files. Default: <results>/charts."),
    ] = None,
    as_json: Annotated[bool, json_flag("the written paths")] = False,
) -> None:
    """Draw a run's comparison charts as PNG and SVG files: log-log, each layer beside its
    theory or its fitted model."""
    names = parse_charts(metric)
    formats = parse_formats(fmt)
    run = load_saved(folder)
    chosen = select_layers(run, layers)
    paths = plot_run(run, names=names, layers=chosen, formats=formats, out_dir=out)
    drawn = sorted({p.stem for p in paths})
    left = [x for x in names if x not in drawn]
    if metric is None:  # all charts: not those that another mode's run draws
        left = [x for x in left if x not in _OTHER_MODES.get(run.mode, _NOT_FORWARD)]
    if as_json:
        _echo_json({"charts": [str(p) for p in paths], "not_drawn": left})
        return
    streams = Streams.make()
    _announce(paths, streams)
    for name in left:
        why = not_drawn_reason(name, run, chosen)
        streams.err.print(f"[yellow]not drawn:[/] {name}: {escape(why)}", soft_wrap=True)


# Charts a run of a mode has no data for by design (not worth a "not drawn" line when all
# are asked for): the state is a decode run's; a decode step has no path of its own, and the
# machine's ceilings are not applied to it.
_NOT_FORWARD = frozenset({"state"})
_OTHER_MODES = {"decode": frozenset({"path_len", "roofline", "time-split"})}


def fit(
    folder: SavedRun = None,
    layers: RunLayers = None,
    as_json: Annotated[bool, json_flag("the exponents, models and crossovers")] = False,
) -> None:
    """Fit the theory to a run: exponents with 95% intervals, cost models, crossovers."""
    run = load_saved(folder)
    chosen = select_layers(run, layers)
    analysis = analyse(run, chosen)
    if as_json:
        _echo_json(
            {
                "path": str(run.path),
                "exponents": json.loads(analysis.exponents.to_json(orient="records")),
                "models": json.loads(analysis.models.to_json(orient="records")),
                "crossovers": json.loads(analysis.crossovers.to_json(orient="records")),
                "unfitted": analysis.unfitted,
                "machine": json.loads(analysis.machine_table().to_json(orient="records")),
                "effective_ceilings": None
                if analysis.effective is None
                else analysis.effective.to_dict(),
            }
        )
        return
    streams = Streams.make(width=140)
    for title, frame in fit_tables(analysis).items():
        frame_table(frame, streams.out, title=title)
    # an exponent agrees with a formula off by a constant: what the counts say of its size too
    # (a new user's FLOPs declared 2x read "agrees: yes" here and a mismatch only in table)
    table = comparison_table(run, analysis)  # its rows for the layers fitted: their notes
    table = table if chosen is None else table[table["layer"].isin(chosen)]
    read = [EXPONENT_NOTE] if len(analysis.exponents) else []
    for note in [*read, *model_notes(analysis), *check_notes(table)]:
        streams.err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def report(
    folder: SavedRun = None,
    as_html: Annotated[
        bool, typer.Option("--html", help="Also write report.html beside report.md.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="Report file. Default: <results>/report.md."),
    ] = None,
    charts: Annotated[
        bool,
        typer.Option(
            "--charts/--no-charts",
            help="Draw the charts first and embed them; --no-charts embeds those already drawn.",
        ),
    ] = True,
    as_json: Annotated[bool, json_flag("the written paths")] = False,
) -> None:
    """Write a Markdown report of a run: environment, comparison table, fits, crossovers, charts.

    Commit it next to the results: the charts are linked relative to it.
    """
    run = load_saved(folder)
    analysis = analyse(run)
    if charts and not run.measured.empty:
        try:
            paths = plot_run(run, analysis=analysis)
        except NothingToPlot:  # a report without charts: every line at one length
            paths = []
    else:  # embed the charts already drawn, if any
        paths = existing_charts(run.path / CHARTS_DIR)
    try:
        if out is not None and out.parent != Path():
            out.parent.mkdir(parents=True, exist_ok=True)
        written = write_report(run, analysis, paths, out=out, html_too=as_html)
    except OSError as exc:
        raise AttnbenchError(f"cannot write the report: {exc}") from None
    if as_json:
        _echo_json({"files": [str(p) for p in written], "charts": [str(p) for p in paths]})
        return
    _announce(written, Streams.make())


def pe(
    n: Annotated[int, typer.Option("--n", help="Positions (rows of P).")] = 60,
    d: Annotated[int, typer.Option("--d", help="Encoding width (columns of P).")] = 32,
    columns: Annotated[
        str, typer.Option(help="Columns to plot against position, as a range or list.")
    ] = "6..9",
    out: Annotated[Path, typer.Option(help="Folder for the figures.")] = Path("results/pe"),
    fmt: Annotated[
        str, typer.Option("--format", help=f"Comma-separated: {', '.join(FORMATS)}.")
    ] = ",".join(DEFAULT_FORMATS),
    as_json: Annotated[bool, json_flag("the check and the written paths")] = False,
) -> None:
    """The chapter's positional-encoding figures, and a check of its relative-position property.

    For every offset δ = 1..n, a fixed 2x2 rotation maps (p(i, 2j), p(i, 2j+1)) to
    (p(i+δ, 2j), p(i+δ, 2j+1)) for all i and j; the largest error is printed (float rounding).
    """
    if n < 1 or d < 2:
        raise AttnbenchError(f"--n must be at least 1 and --d at least 2 (got {n}, {d})")
    cols = parse_columns(columns)
    if max(cols) >= d:
        raise AttnbenchError(
            f"--columns go up to {max(cols)}, but P has columns 0..{d - 1} at --d {d}: "
            f"choose --columns below {d} or a larger --d"
        )
    formats = parse_formats(fmt)
    errors = {
        "float64": relative_shift_error(n, d, dtype=torch.float64),
        "float32": relative_shift_error(n, d, dtype=torch.float32),
    }
    paths = save_charts(pe_figures(n, d, cols), out, formats)
    if as_json:
        files = [str(p) for p in paths]
        _echo_json({"n": n, "d": d, "relative_shift_error": errors, "files": files})
        return
    streams = Streams.make()
    streams.out.print("binary counting, lowest bit fastest (the columns of P are its smooth form):")
    for i in range(8):
        streams.out.print(f"  {i} in binary is {i:>03b}")
    streams.out.print(
        f"largest |R(δ)·p[i] - p[i+δ]| over i < {n}, j < {d // 2}, δ = 1..{n}: "
        f"{errors['float64']:.1e} in float64, {errors['float32']:.1e} in float32",
        soft_wrap=True,
        markup=False,
    )
    _announce(paths, streams)


def env(
    device: Annotated[
        str, typer.Option(help=f"{DEVICE_CHOICES}.", envvar="ATTNBENCH_DEVICE")
    ] = "auto",
    as_json: Annotated[bool, json_flag("the environment")] = False,
) -> None:
    """Print the environment block that every run records in run.json."""
    info = environment(resolve_device(device))
    if as_json:
        _echo_json(info)
        return
    rows = [(key, "-" if value is None else str(value)) for key, value in info.items()]
    frame_table(pd.DataFrame(rows, columns=["key", "value"]), Streams.make().out)
