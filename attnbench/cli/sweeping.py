"""``attnbench sweep``: measure a grid (or finish one), draw its charts, judge it if asked."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import pandas as pd
import typer
from rich.markup import escape

from attnbench.cli.judge import show_verdicts
from attnbench.cli.options import (
    GATE,
    GRID,
    VERDICT_OUTPUT,
    ConfigFile,
    LargeRun,
    NoCache,
    Quiet,
    json_flag,
    pick,
    verdict_format,
    with_options,
)
from attnbench.cli.render import Streams, SweepProgress
from attnbench.cli.summary import summary_notes, summary_tables
from attnbench.compare import Comparison, compare_runs
from attnbench.compare.caveats import check_finished
from attnbench.errors import AttnbenchError, NothingToPlot, SweepFailed, SweepInterrupted
from attnbench.fits import Analysis, analyse
from attnbench.measure.counts import extend
from attnbench.measure.counts.countcache import Counting
from attnbench.options import load_config
from attnbench.render.charts import plot_run
from attnbench.render.verdicts import to_json
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.events import Listeners
from attnbench.run.executors import EXECUTORS, default_executor, make_executor
from attnbench.run.queue import Measuring
from attnbench.run.sweep import resume_sweep, run_sweep
from attnbench.schema import BROKEN, Status
from attnbench.table import comparison_table
from attnbench.thresholds import Thresholds, gate_from
from attnbench.units import fmt_exponent, some_of

FULL_TRACE_HELP = (
    "Trace every case's counts at its own n. By default a case of a recurrent layer longer "
    f"than n = {extend.PROBES[-1]} (a plugin's: longer than {4 * extend.PROBES[-1]}, with more "
    f"than {extend.EXTEND_ABOVE_STEPS} sequential steps) is traced at "
    f"n = {', '.join(map(str, extend.PROBES))} and its counts extended by the law those traces "
    "prove (the *_method columns say extended)."
)
# Rich reads [ray] as markup in help texts: escaped.
EXECUTOR_HELP = (
    "Where cases run: "
    + "; ".join(f"{name}: {entry.help}".replace("[", "\\[") for name, entry in EXECUTORS.items())
    + "."
)


# The command's own options, each a type: its signature reads as a list of names.
Out = Annotated[Path | None, typer.Option(help="Results folder. Default: results/<timestamp>.")]
Resume = Annotated[
    Path | None,
    typer.Option(
        help="Finish an interrupted run in this folder: measure only its missing cases, "
        "with its recorded configuration.",
        show_default=False,
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        help="With --resume: go on although options or the environment changed "
        "(the changes are recorded in run.json)."
    ),
]
Retry = Annotated[
    bool,
    typer.Option(
        help="With --resume: measure again the cases recorded failed, oom, timeout or "
        "skipped, and the one a killed process was in (a kill or a power cut that was "
        "blamed on a case, or a failure since mended)."
    ),
]
Charts = Annotated[
    bool,
    typer.Option(
        "--charts/--no-charts",
        help="Draw the charts into <results>/charts when the sweep completes (PNG, SVG).",
    ),
]
Baseline = Annotated[
    Path | None,
    typer.Option(
        help="Compare with this earlier run when the sweep completes (as attnbench compare); "
        "exit 1 on a regression.",
        show_default=False,
    ),
]
ExecutorName = Annotated[
    str | None,
    typer.Option(
        help=EXECUTOR_HELP + " Default: fork (serial for --metric instructions, or where "
        "this system cannot fork).",
        envvar="ATTNBENCH_EXECUTOR",
        show_default=False,
    ),
]
Address = Annotated[
    str | None,
    typer.Option(
        help="With --executor ray: the cluster, as ray.init takes it (auto: the one "
        "`ray start` made here; ray://host:10001). Default: a new local Ray instance, "
        "or $RAY_ADDRESS.",
        show_default=False,
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(
        help="With --executor ray: run at most this many cases at once. Default: as many as "
        "the cluster has GPUs (--device cuda) or CPUs / --threads.",
        show_default=False,
    ),
]
FullTrace = Annotated[
    bool, typer.Option("--full-trace", help=FULL_TRACE_HELP, envvar="ATTNBENCH_FULL_TRACE")
]
Strict = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Exit 1 when any case ended failed, oom or timeout (as asv run --strict), so a "
        "CI job fails on a layer that broke; without it a sweep that measured anything exits "
        "0 and its notes name the broken cases.",
    ),
]


@with_options(before=GRID, after=(*GATE, *VERDICT_OUTPUT))
def sweep(
    ctx: typer.Context,
    out: Out = None,
    config: ConfigFile = None,
    resume: Resume = None,
    force: Force = False,
    retry: Retry = False,
    yes: LargeRun = False,
    as_json: Annotated[bool, json_flag("the results")] = False,
    quiet: Quiet = False,
    charts: Charts = True,
    baseline: Baseline = None,
    executor: ExecutorName = None,
    address: Address = None,
    workers: Workers = None,
    no_cache: NoCache = False,
    full_trace: FullTrace = False,
    strict: Strict = False,
    **options: Any,
) -> None:
    """Measure time, memory, FLOPs, elementwise work, bytes, steps and path length over n x d.

    Every finished case is written at once. Cases that run out of memory or time are recorded
    (oom, timeout) and the larger cases of their layer skipped. Ctrl-C or SIGTERM stops after
    the rounds now timing and exits 130 (143 after SIGTERM); --resume DIR finishes the run. With
    --baseline DIR the run is compared with DIR when it completes, and the exit code is
    compare's (0, 1 on regression);
    with --strict a case that ended failed, oom or timeout exits 1 too.
    """
    thresholds, gate = gate_from(options)
    fmt = verdict_format(options, json_is_verdicts=False)
    output = options.get("output")
    _check_flags(fmt, output, baseline=baseline, as_json=as_json)
    # Checked before measuring: a mistyped or unfinished baseline must not cost a whole sweep.
    base_run = load_results(baseline) if baseline is not None else None
    if base_run is not None:
        check_finished(base_run)
    values: dict[str, Any] = load_config(config) if config is not None else {}
    values.update(pick(options, GRID))
    if out is not None:
        values["out"] = str(out)
    _check_resume(resume, values, force=force, retry=retry)
    streams = Streams.make(stdout_taken=as_json or (fmt != "table" and output is None), quiet=quiet)
    runs_on = make_executor(
        executor or default_executor(str(values.get("metric") or "")),
        address=address,
        workers=workers,
    )
    try:
        with (
            contextlib.closing(runs_on),
            # stdout carries the command's product only: what a library prints while the sweep
            # runs (Ray reports dead workers there) goes to stderr with the progress.
            contextlib.redirect_stdout(sys.stderr),
            SweepProgress(streams.err, quiet=quiet) as progress,
        ):
            measuring = Measuring(counting=Counting(cache=not no_cache, full_trace=full_trace))
            listeners = Listeners(progress, progress.started, progress.measuring_ceilings)
            if resume is not None:
                run = resume_sweep(
                    resume,
                    values or None,
                    force=force,
                    retry=retry,
                    executor=runs_on,
                    measuring=measuring,
                    listeners=listeners,
                )
            else:
                run = run_sweep(
                    values,
                    values.get("out"),
                    executor=runs_on,
                    measuring=measuring,
                    listeners=listeners,
                    allow_large=yes,
                )
    except (SweepInterrupted, SweepFailed) as exc:  # what run.json does not hold: its --resume
        raise exc.resumed_with(unrecorded_flags(ctx)) from None
    except KeyboardInterrupt:  # before the first case started: nothing was measured yet
        streams.err.print("[bold yellow]interrupted:[/] before any case was measured")
        raise typer.Exit(130) from None
    judging = _Judging(base_run, thresholds, gate, fmt, cast("Path | None", output))
    try:
        _finished(run, streams, judging, charts=charts, as_json=as_json, strict=strict)
    except KeyboardInterrupt:  # the run is complete on disk: say so, and how to see it
        streams.err.print(
            f"[bold yellow]interrupted:[/] while showing the results; the run is complete, saved "
            f"in {run.path}: attnbench show {run.path} prints its tables, attnbench plot "
            f"{run.path} draws its charts",
            soft_wrap=True,
        )
        raise typer.Exit(130) from None


def _finished(
    run: RunResults,
    streams: Streams,
    judging: _Judging,
    *,
    charts: bool,
    as_json: bool,
    strict: bool = False,
) -> None:
    """What a finished sweep shows: its tables and notes, its charts, the baseline's verdicts
    and, with --json, all of them as data; exit 1 where the baseline's gate failed, or with
    --strict where a case broke."""
    if streams.human is not None:
        summary_tables(run, streams.human)
    if streams.notes is not None:
        summary_notes(run, streams.notes)
    drawn, analysis = _charts_after_sweep(run, streams) if charts else ([], None)
    _headline(run, analysis, streams)
    comparison = judging.judge(run, streams)
    if as_json:
        payload: dict[str, Any] = {"path": str(run.path), "results": records(run), "charts": drawn}
        if comparison is not None:
            payload["comparison"] = to_json(comparison, judging.gate)
        typer.echo(json.dumps(payload, indent=2))
    if comparison is not None and comparison.failed(judging.gate):
        raise typer.Exit(1)
    counts = run.counts()
    # a sweep that measured nothing because its cases broke failed (against a baseline, the
    # exit code is compare's); one whose every case was a stated skip (a layer without a
    # decode step) did what it was asked, and its notes say why
    broke = any(counts.get(s) for s in BROKEN)
    if comparison is None and broke and not counts.get(Status.OK):
        ended = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        again = (  # out of memory again at the same sizes (the larger ones skipped after it)
            "smaller --n, --d or --batch, or a larger --max-case-memory, may fit"
            if counts.get(Status.OOM)
            and not (counts.get(Status.FAILED) or counts.get(Status.TIMEOUT))
            else f"attnbench sweep --resume {run.path} --retry measures them again"
        )
        raise AttnbenchError(
            f"no case measured ({ended}): each one's reason is in its row's error "
            f"(attnbench show {run.path}; {again})"
        )
    if strict and broke:
        ended = ", ".join(f"{counts[s]} {s}" for s in BROKEN if counts.get(s))
        raise AttnbenchError(
            f"--strict: {ended} (each one's reason is in its row's error: attnbench show "
            f"{run.path}); the cases measured are saved there",
            exit_code=1,
        )


@dataclass(frozen=True)
class _Judging:
    """--baseline and how its verdicts are shown: what a finished sweep is judged against."""

    baseline: RunResults | None
    thresholds: Thresholds
    gate: str
    fmt: str
    output: Path | None

    def judge(self, run: RunResults, streams: Streams) -> Comparison | None:
        """The run against the baseline, its verdicts shown (None without a baseline)."""
        if self.baseline is None:
            return None
        try:
            comparison = compare_runs(self.baseline, run, self.thresholds)
        except AttnbenchError:
            streams.err.print(f"the results are saved in {run.path}", soft_wrap=True)
            raise
        show_verdicts(comparison, self.gate, self.fmt, self.output, streams)
        return comparison


def _check_flags(fmt: str, output: object, *, baseline: Path | None, as_json: bool) -> None:
    """One line where the flags that print a comparison have nothing to compare, or where two
    of them would print on stdout."""
    if baseline is None and (fmt != "table" or output is not None):
        flag = "--markdown" if fmt == "markdown" else f"--format {fmt}"
        raise AttnbenchError(f"{flag} prints the comparison: it needs --baseline DIR")
    if as_json and fmt != "table" and output is None:
        raise AttnbenchError(f"--json and --format {fmt} both print on stdout: choose one")


# What run.json records (the grid, from the command line or --config, and its folder), and the
# flags of a resume itself: none of them is repeated in a stopped sweep's --resume.
RECORDED = {p.name for p in GRID} | {"out", "config", "resume", "force", "retry", "yes"}


def unrecorded_flags(ctx: typer.Context) -> str:
    """The flags of this command line that run.json does not hold (--no-charts, --baseline and
    the gate's, --strict, --json, --executor, ...), as typed, for a stopped sweep's --resume:
    a CI job resumed as its stop said had lost its --baseline gate, and exited 0."""
    found: dict[str, Any] = {}
    for param in ctx.command.get_params(ctx):
        found |= dict.fromkeys((*param.opts, *getattr(param, "secondary_opts", ())), param)
    tokens, kept = iter(ctx.meta.get("attnbench.given", ())), []
    for token in tokens:
        option, equals, _ = token.partition("=")
        given = found.get(option)
        if given is None:
            continue
        words = [token] if equals or getattr(given, "is_flag", False) else [token, next(tokens, "")]
        kept += [] if given.name in RECORDED else words
    return "".join(f" {shlex.quote(word)}" for word in kept)


def _check_resume(resume: Path | None, values: dict[str, Any], *, force: bool, retry: bool) -> None:
    """One line where a flag of --resume comes without it, or --out with it."""
    if force and resume is None:
        raise AttnbenchError("--force applies only with --resume DIR")
    if retry and resume is None:
        raise AttnbenchError("--retry applies only with --resume DIR")
    if resume is not None and "out" in values:
        raise AttnbenchError("--resume continues a run in its own folder; leave out --out")


def _analysis(run: RunResults) -> Analysis | None:
    """The fits of a finished sweep, for its charts and its headline; None where there is
    nothing to fit, the cases ran on several device models (each model's charts are fitted
    apart), or fitting failed (the charts then say why, and the results stay saved)."""
    if run.measured.empty or len(run.devices) > 1:
        return None
    try:
        return analyse(run)
    except Exception:
        return None


def chapter_line(run: RunResults, analysis: Analysis) -> str | None:
    """What a newcomer asks of the first sweep, in a line: how many time exponents in n agree
    with their formula's slope over the lengths measured, as ``table`` reads them (its
    ``time_agrees_n``; an overhead-bound layer, which the table shows no exponent for, and one
    not judged are counted apart; where none is judged, why). A new user could not tell from
    the notes whether it worked."""
    rows = comparison_table(run, analysis)
    if rows.empty:
        return None
    bound = rows["time_overhead_bound_n"].astype(bool)
    agrees = rows["time_agrees_n"]
    judged = [bool(a) for a in agrees[~bound] if pd.notna(a)]
    # which ones, by name: "9 of 10 agree" sent a new user looking for the one that did not
    wrong = rows[~bound & agrees.notna() & ~agrees.fillna(True).astype(bool)]
    unjudged = rows[~bound & agrees.isna()]
    orders = rows.get("compute (theory)", pd.Series("", index=rows.index)).astype(str)
    theory = ~orders[unjudged.index].isin(["?", ""])
    fitted = pd.to_numeric(unjudged["time_exponent_n"], errors="coerce").notna()
    law = pd.to_numeric(unjudged["time_theory_exponent_n"], errors="coerce").notna()
    idle = set(run.frame["layer"]) - set(run.measured["layer"])  # a decode run skips a layer
    ran = ~unjudged["layer"].isin(idle)
    said = [
        f"{row.layer} n^{fmt_exponent(row.time_exponent_n)} against n^"
        f"{fmt_exponent(row.time_theory_exponent_n)}"
        for row in wrong.itertuples()
    ]
    apart = "".join(
        f", {len(which)} {what} ({some_of(list(which['layer']))})"
        for which, what in (
            (rows[bound], "overhead-bound"),
            (unjudged[~ran], "not judged: no case measured"),
            (unjudged[ran & theory & fitted & law], "not judged: an interval too wide to tell"),
            (unjudged[ran & theory & ~fitted], "not judged: no exponent fitted (too few lengths)"),
            (unjudged[ran & (~theory | (fitted & ~law))], "not judged: no theory"),
        )
        if len(which)
    )
    if not judged:  # the README promises the line: a sweep that ended without it read cut off
        why_not = apart.removeprefix(", ").replace("not judged: ", "")
        more = "; more lengths, or --n auto, give them" if theory.any() or bound.any() else ""
        return (
            f"the chapter's table: no time exponent in n judged: {why_not} (attnbench table "
            f"{run.path}: each one and why{more})"
        )
    against = f" (not: {some_of(said)})" if said else ""
    # where a quadratic layer was judged in a forward run: its lower term is why it reads
    # under n² (a student took attention's n^1.66 beside O(n^2 d) for a typo)
    quadratic = orders.str.contains("n^2", regex=False)
    why = (
        " (attention's n²·d + n·d² under n² until n is well past d)"
        if (quadratic & ~bound & agrees.notna()).any() and run.record.config.get("mode") != "decode"
        else ""
    )
    return (
        f"the chapter's table: {sum(judged)} of {len(judged)} time exponents in n agree with "
        "their complexity formula's slope over the lengths measured, lower terms included"
        f"{why}{against}{apart} (attnbench table {run.path}: each one, which are unsettled, "
        "and why)"
    )


def _headline(run: RunResults, analysis: Analysis | None, streams: Streams) -> None:
    """The sweep's last line (``chapter_line``), where there is one; a failure here costs
    the line, never the results or the --json payload after it."""
    if analysis is None or streams.notes is None:
        return
    try:
        line = chapter_line(run, analysis)
    except Exception:
        return
    if line:
        streams.notes.print(line, soft_wrap=True, markup=False)  # a path may hold [brackets]


def _charts_after_sweep(run: RunResults, streams: Streams) -> tuple[list[str], Analysis | None]:
    """Charts of a finished sweep, and the analysis they were drawn from (for the headline);
    a failure here is reported, and the results stay saved."""
    if run.measured.empty:
        return [], None
    # A few seconds to ten or more after the tables (the default run: 22 files): said in a
    # terminal while it lasts, where a silent prompt would look hung; a log gets the line after.
    notes = streams.notes
    drawing = (
        notes.status("drawing the charts (--no-charts skips them)")
        if notes is not None and notes.is_terminal
        else contextlib.nullcontext()
    )
    analysis = None
    try:
        with drawing:  # the fits too, under the status: 1-2 s on a default run
            analysis = _analysis(run)
            paths = plot_run(run, analysis=analysis)
    except NothingToPlot as exc:  # no retry draws one: no "try attnbench plot"
        if notes is not None:
            notes.print(f"note: no charts: {exc}", soft_wrap=True, markup=False)
        return [], analysis
    except Exception as exc:
        streams.err.print(
            f"[yellow]warning:[/] charts were not drawn ({escape(str(exc))}); the results are "
            f"saved, try: attnbench plot {escape(str(run.path))}",
            soft_wrap=True,
        )
        return [], None
    if streams.notes is not None:
        streams.notes.print(
            f"charts: {len(paths)} files in {paths[0].parent}", soft_wrap=True, markup=False
        )
    return [str(p) for p in paths], analysis


def records(run: RunResults) -> list[dict[str, Any]]:
    """One JSON object per case (pandas turns NaN and NA into null)."""
    return cast("list[dict[str, Any]]", json.loads(run.frame.to_json(orient="records")))
