"""The command line: parse options, call the core, render with Rich, map errors to exit codes.

Human output (progress, tables, messages) goes to stderr; ``--json`` writes to stdout.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import torch
import typer
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

from attnbench import __version__
from attnbench.charts import (
    CHARTS,
    CHARTS_DIR,
    DEFAULT_FORMATS,
    FORMATS,
    existing_charts,
    parse_charts,
    parse_formats,
    pe_figures,
    plot_run,
    save_charts,
    select_layers,
)
from attnbench.ci import append_step_summary, display_table, github_action_benchmark, to_json
from attnbench.ci import to_markdown as comparison_markdown
from attnbench.compare import Comparison, Thresholds, check_gate, compare_runs, parse_fraction
from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.execute import EXECUTORS, Executor, make_executor
from attnbench.fits import analyse
from attnbench.layers import LAYERS
from attnbench.measure.timing import NOISY_REL_IQR, is_noisy
from attnbench.positional import relative_shift_error
from attnbench.report import fit_tables, write_report
from attnbench.results import (
    STATUSES,
    RunResults,
    default_out_dir,
    environment,
    load_results,
    prepare_out_dir,
    write_text_atomic,
)
from attnbench.runner import ProgressEvent, resume_sweep, run_sweep
from attnbench.spec import (
    DEVICE_CHOICES,
    DTYPES,
    MODES,
    build_grid,
    estimate_seconds,
    load_config,
    parse_columns,
    resolve_device,
    size_warning,
)
from attnbench.table import COLUMNS as TABLE_COLUMNS
from attnbench.table import HEADERS as TABLE_HEADERS
from attnbench.table import comparison_table, fit_notes, load_for_table, to_markdown
from attnbench.units import fmt_bytes, fmt_count, fmt_seconds

app = typer.Typer(
    name="attnbench",
    help="Measure the complexity table of self-attention: time, memory, FLOPs, sequential "
    "steps and path length of conv, recurrent and (restricted) self-attention layers over a "
    "grid of sequence lengths n and widths d.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _stderr_console() -> Console:
    """Stderr console; off a terminal (CI logs, pipes) it is wide enough not to wrap tables."""
    console = Console(stderr=True, highlight=False)
    return console if console.is_terminal else Console(stderr=True, highlight=False, width=120)


err = _stderr_console()

# Arguments shared by the commands that read a saved run.
SavedRun = Annotated[
    Path | None,
    typer.Argument(
        help="A results folder. Default: the newest under results/.", show_default=False
    ),
]
RunLayers = Annotated[
    str | None,
    typer.Option(help="Only these layers, comma-separated. Default: all in the run."),
]


# Options shared by `compare` and `sweep --baseline`.
MaxSlowdown = Annotated[
    str,
    typer.Option(
        help="Allowed time growth before a case can regress: a percentage (10%) or fraction.",
    ),
]
Alpha = Annotated[
    float,
    typer.Option(help="Significance level of the one-sided Mann-Whitney U test on the samples."),
]
MinSamples = Annotated[
    int, typer.Option(help="Fewest timing samples a side for a time verdict (else: too few).")
]
MemoryTolerance = Annotated[
    str,
    typer.Option(help="Allowed peak-memory growth (same device only). Default: none at all."),
]
Normalize = Annotated[
    bool,
    typer.Option(
        help="Judge times divided by each run's calibration GEMM, so runs on different "
        "machines compare (both ratios are shown either way).",
    ),
]
FailOn = Annotated[
    str,
    typer.Option(
        help="What fails (exit 1): all; deterministic (FLOPs, steps, path, memory); time; "
        "none (report only). A case that stops measuring fails all but none.",
    ),
]
Markdown = Annotated[
    bool,
    typer.Option(
        "--markdown",
        help="Print the comparison as Markdown on stdout, and append it to "
        "$GITHUB_STEP_SUMMARY when that variable is set.",
    ),
]


def _thresholds(
    max_slowdown: str, alpha: float, min_samples: int, memory_tolerance: str, normalize: bool
) -> Thresholds:
    return Thresholds(
        max_slowdown=parse_fraction(max_slowdown, "--max-slowdown"),
        alpha=alpha,
        min_samples=min_samples,
        memory_tolerance=parse_fraction(memory_tolerance, "--memory-tolerance"),
        normalize=normalize,
    )


def _fail(exc: AttnbenchError) -> typer.Exit:
    if isinstance(exc, SweepInterrupted):
        err.print(f"[bold yellow]interrupted:[/] {escape(exc.message)}", soft_wrap=True)
    else:
        err.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
    return typer.Exit(exc.exit_code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attnbench {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """attnbench: see why attention is quadratic, measured on your own device."""


# ----------------------------------------------------------------------------- progress


class SweepProgress:
    """A live bar in a terminal; one plain line per finished case elsewhere (CI logs)."""

    def __init__(self, console: Console, quiet: bool = False, *, where: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.where = where  # name the worker of each case (cases run on several)
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

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "stopping":
            # Printed even with --quiet: the user pressed Ctrl-C and is waiting for an answer.
            what = (
                event.case.label() if event.running <= 1 else f"the {event.running} running cases"
            )
            self.console.print(
                f"[yellow]stopping after {escape(what)} "
                "(every finished case is kept; press Ctrl-C again to stop at once)[/]",
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
            self.console.print(_case_line(event, where=self.where), soft_wrap=True, markup=False)


def _case_line(event: ProgressEvent, *, where: bool = False) -> str:
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
        f"{fmt_count(result.flops_per_s, 'FLOP/s')}  steps {_int_or_dash(result.seq_steps)}  "
        f"path {_int_or_dash(result.path_len)}"
    )


def _int_or_dash(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else str(int(value))


# ----------------------------------------------------------------------------- summary


def _summary_tables(run: RunResults, console: Console, *, verb: str = "written to") -> None:
    frame = run.frame
    # One table per layer; per layer and device model when the cases ran on several.
    keys = ["layer", "device_name"] if len(run.devices) > 1 else ["layer"]
    for key, group in frame.groupby(keys, sort=False):
        layer, *device = key if isinstance(key, tuple) else (key,)
        title = f"{layer} on {device[0] or 'no device (not run)'}" if device else f"{layer}"
        table = Table(title=escape(title), title_justify="left", title_style="bold")
        for col, justify in [
            ("n", "right"),
            ("d", "right"),
            ("time", "right"),
            ("IQR", "right"),
            ("samples", "right"),
            ("peak mem", "right"),
            ("FLOPs", "right"),
            ("FLOP/s", "right"),
            ("check", "left"),
            ("steps", "right"),
            ("path", "right"),
        ]:
            table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        problems: list[str] = []
        for row in group.sort_values(["d", "n"]).itertuples():
            if row.status != "ok":
                color = "yellow" if row.status == "skipped" else "red"
                table.add_row(str(row.n), str(row.d), f"[{color}]{row.status}[/]", *[""] * 8)
                if row.status != "skipped":  # a skipped case's reason is the case above it
                    problems.append(f"  n={row.n} d={row.d} {row.status}: {row.error}")
                continue
            check = "ok" if row.flops_check == "ok" else f"[yellow]{row.flops_check}[/]"
            spread = fmt_seconds(row.time_iqr_s)
            if is_noisy(row.time_s, row.time_iqr_s):
                spread = f"[yellow]{spread} ![/]"
            table.add_row(
                str(row.n),
                str(row.d),
                fmt_seconds(row.time_s),
                spread,
                str(row.samples),
                fmt_bytes(row.peak_bytes),
                fmt_count(row.flops),
                fmt_count(row.flops_per_s),
                check,
                _int_or_dash(row.seq_steps),
                _int_or_dash(row.path_len)
                + ("*" if str(row.path_len_method).startswith("extended") else ""),
            )
        console.print(table)
        for line in problems:
            console.print(line, soft_wrap=True, markup=False)
    counts = run.counts()
    summary = ", ".join(
        f"{count} {'measured' if status == 'ok' else status}" for status, count in counts.items()
    )
    total = run.meta.get("cases_total") or len(frame)
    console.print(f"{len(frame)} of {total} cases: {summary}")
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
            "[dim]path*: extended from a band law proven at probe lengths (see path_len_method)[/]"
        )
    mismatched = frame[frame["flops_check"] == "mismatch"]
    if len(mismatched):
        console.print(
            f"[yellow]note:[/] counted FLOPs differ from the analytic formula by more than 1% in "
            f"{len(mismatched)} case(s) ({', '.join(sorted(set(mismatched['layer'])))}); "
            "see the flops and flops_analytic columns"
        )
    for warning in run.warnings:
        console.print(f"[yellow]note:[/] {warning}")
    console.print(f"results {verb} [bold]{run.path}[/] (results.csv, samples.csv, run.json)")
    if run.status != "complete":
        console.print(
            f"[yellow]this run is unfinished ({run.status}):[/] finish it with "
            f"attnbench sweep --resume {run.path}",
            soft_wrap=True,
        )


# ----------------------------------------------------------------------------- commands

EXECUTOR_HELP = (
    f"Where cases run: {' or '.join(EXECUTORS)}. serial: one after the other in this process. "
    'ray: on the workers of a Ray cluster (pip install "attnbench[ray]"), one case per GPU, '
    "or per --threads CPUs, at a time."
)


@app.command()
def sweep(
    layers: Annotated[
        str | None,
        typer.Option(help=f"Comma-separated layers: {', '.join(LAYERS)}. Default: all."),
    ] = None,
    n: Annotated[
        str | None,
        typer.Option(
            "--n",
            help="Sequence lengths: a list 64,128 or a doubling range 64..4096. Default: 64..1024.",
        ),
    ] = None,
    d: Annotated[
        str | None,
        typer.Option("--d", help="Widths, as --n. Default: 64,128."),
    ] = None,
    k: Annotated[int | None, typer.Option("--k", help="Conv kernel size. Default: 3.")] = None,
    heads: Annotated[
        int | None, typer.Option(help="Attention heads; d must divide by it. Default: 4.")
    ] = None,
    window: Annotated[
        int | None,
        typer.Option(
            help="attention-local: neighbours r on each side (r <= the smallest n). Default: 16."
        ),
    ] = None,
    batch: Annotated[int | None, typer.Option(help="Batch size. Default: 1.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help=f"{', '.join(DTYPES)}. Default: float32.")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help=f"{DEVICE_CHOICES}. Default: auto.", envvar="ATTNBENCH_DEVICE"),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help=f"{' or '.join(MODES)} (forward + backward). Default: forward."),
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads for torch (recorded). Default: torch's.")
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(help="Seconds of timed calls per case before sampling stops. Default: 0.25."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed for weights and inputs. Default: 0.")
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="Time every case in this many rounds spread over the sweep (sharing "
            "--time-budget), so its samples see the machine at several moments; compare "
            "tests the rounds against each other. 5 or more for CI. Default: 1.",
        ),
    ] = None,
    max_case_seconds: Annotated[
        float | None,
        typer.Option(
            help="A case whose single call takes longer is recorded as timeout and the larger "
            "cases of its layer are skipped. Default: no limit."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Results folder. Default: results/<timestamp>."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="TOML file with the same keys (layers, n, d, ...); options override it."),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Finish an interrupted run in this folder: measure only its missing cases, "
            "with its recorded configuration.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            help="With --resume: go on although options or the environment changed "
            "(the changes are recorded in run.json)."
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Start a very large sweep (over 2000 cases or about an hour)."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON on stdout.")
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress or tables on stderr.")] = False,
    charts: Annotated[
        bool,
        typer.Option(
            "--charts/--no-charts",
            help="Draw the charts into <results>/charts when the sweep completes (PNG, SVG).",
        ),
    ] = True,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="Compare with this earlier run when the sweep completes (as attnbench compare); "
            "exit 1 on a regression.",
            show_default=False,
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            help=EXECUTOR_HELP,
            envvar="ATTNBENCH_EXECUTOR",
        ),
    ] = "serial",
    address: Annotated[
        str | None,
        typer.Option(
            help="With --executor ray: the cluster, as ray.init takes it (auto: the one "
            "`ray start` made here; ray://host:10001). Default: a new local Ray instance, "
            "or $RAY_ADDRESS.",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="With --executor ray: run at most this many cases at once. Default: as many as "
            "the cluster has GPUs (--device cuda) or CPUs / --threads.",
            show_default=False,
        ),
    ] = None,
    max_slowdown: MaxSlowdown = "10%",
    alpha: Alpha = 0.01,
    min_samples: MinSamples = 5,
    memory_tolerance: MemoryTolerance = "0%",
    normalize: Normalize = False,
    fail_on: FailOn = "all",
    markdown: Markdown = False,
) -> None:
    """Measure time, peak memory, FLOPs, sequential steps and path length over the n x d grid.

    Every finished case is written at once. Cases that run out of memory or time are recorded
    (oom, timeout) and the larger cases of their layer skipped. Ctrl-C or SIGTERM stops after
    the current case and exits 130; --resume DIR finishes the run. With --baseline DIR the run
    is compared with DIR when it completes, and the exit code is compare's (0, 1 on regression).
    """
    try:
        thresholds = _thresholds(max_slowdown, alpha, min_samples, memory_tolerance, normalize)
        check_gate(fail_on)
        if markdown and baseline is None:
            raise AttnbenchError("--markdown prints the comparison: it needs --baseline DIR")
        if markdown and as_json:
            raise AttnbenchError("--markdown and --json both print on stdout: choose one")
        # Checked before measuring: a mistyped baseline must not cost a whole sweep.
        base_run = load_results(baseline) if baseline is not None else None
        values: dict[str, Any] = load_config(config) if config is not None else {}
        given = {
            "layers": layers,
            "n": n,
            "d": d,
            "k": k,
            "heads": heads,
            "window": window,
            "batch": batch,
            "dtype": dtype,
            "device": device,
            "mode": mode,
            "threads": threads,
            "time_budget": time_budget,
            "seed": seed,
            "rounds": rounds,
            "max_case_seconds": max_case_seconds,
            "out": str(out) if out is not None else None,
        }
        values.update({key: v for key, v in given.items() if v is not None})
        if force and resume is None:
            raise AttnbenchError("--force applies only with --resume DIR")
        runs_on = make_executor(executor, address=address, workers=workers)
        with (
            contextlib.closing(runs_on),
            # stdout carries --json / --markdown only: what a library prints while the sweep
            # runs (Ray reports dead workers there) goes to stderr with the progress.
            contextlib.redirect_stdout(sys.stderr),
            SweepProgress(err, quiet=quiet, where=not runs_on.in_process) as progress,
        ):
            if resume is not None:
                run = _resume(resume, values, runs_on, force=force, quiet=quiet, progress=progress)
            else:
                run = _new_sweep(values, runs_on, yes=yes, quiet=quiet, progress=progress)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:  # before the first case started: nothing was measured yet
        err.print("[bold yellow]interrupted:[/] before any case was measured")
        raise typer.Exit(130) from None
    if not quiet:
        _summary_tables(run, err)
    drawn = _charts_after_sweep(run, quiet=quiet) if charts else []
    comparison = None
    if base_run is not None:
        try:
            comparison = compare_runs(base_run, run, thresholds)
        except AttnbenchError as exc:
            err.print(f"the results are saved in {run.path}", soft_wrap=True)
            raise _fail(exc) from None
        if not quiet:
            _print_comparison(comparison, fail_on)
        if markdown:
            _emit_markdown(comparison, fail_on)
    if as_json:
        payload: dict[str, Any] = {"path": str(run.path), "results": _records(run), "charts": drawn}
        if comparison is not None:
            payload["comparison"] = to_json(comparison, fail_on)
        typer.echo(json.dumps(payload, indent=2))
    if comparison is not None and comparison.failed(fail_on):
        raise typer.Exit(1)


def _charts_after_sweep(run: RunResults, *, quiet: bool) -> list[str]:
    """Charts of a finished sweep; a failure here is reported, and the results stay saved."""
    if run.measured.empty:
        return []
    try:
        paths = plot_run(run)
    except Exception as exc:
        err.print(
            f"[yellow]warning:[/] charts were not drawn ({exc}); the results are saved, "
            f"try: attnbench plot {run.path}",
            soft_wrap=True,
        )
        return []
    if not quiet:
        err.print(f"charts: {len(paths)} files in {paths[0].parent}", soft_wrap=True)
    return [str(p) for p in paths]


def _records(run: RunResults) -> list[dict[str, Any]]:
    """One JSON object per case (pandas turns NaN and NA into null)."""
    return json.loads(run.frame.to_json(orient="records"))


def _new_sweep(
    values: dict[str, Any], executor: Executor, *, yes: bool, quiet: bool, progress: SweepProgress
) -> RunResults:
    grid = build_grid(values, executor.resolve_device)
    warning = size_warning(grid)
    if warning and not yes:
        raise AttnbenchError(warning)
    out_dir = prepare_out_dir(Path(values["out"]) if values.get("out") else default_out_dir())
    cluster = executor.start(grid)
    if not quiet:
        estimate = estimate_seconds(grid) / max(1, executor.workers)
        err.print(
            f"attnbench {__version__}: {len(grid.cases())} cases on {grid.device} ({grid.dtype}, "
            f"{grid.mode}, batch {grid.batch}){_workers_text(cluster)}, "
            f"{_duration(estimate)} or more -> {out_dir}",
            soft_wrap=True,
        )
        shared = _shared_cpu_nodes(cluster, grid.device)
        if shared:
            err.print(
                f"[yellow]note:[/] {escape(shared)} run several cases at once on their CPUs: "
                "concurrent cases share memory bandwidth and caches, so their times are higher "
                "than alone (1.4x in the median on a 2-core VM); for times to publish, pass "
                "--threads with a node's core count (one case per node)",
                soft_wrap=True,
            )
    return run_sweep(grid, out_dir, progress=progress, executor=executor)


def _shared_cpu_nodes(cluster: dict[str, Any], device: str) -> str:
    """The nodes where several CPU workers measure at once ("" when none does)."""
    if device != "cpu":
        return ""
    per_node: dict[str, int] = {}
    for worker in cluster.get("workers", []):
        per_node[worker["node"]] = per_node.get(worker["node"], 0) + 1
    crowded = [f"{node} ({count} workers)" for node, count in per_node.items() if count > 1]
    return ", ".join(crowded)


def _workers_text(cluster: dict[str, Any]) -> str:
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


def _resume(
    folder: Path,
    values: dict[str, Any],
    executor: Executor,
    *,
    force: bool,
    quiet: bool,
    progress: SweepProgress,
) -> RunResults:
    if "out" in values:
        raise AttnbenchError("--resume continues a run in its own folder; leave out --out")
    before = load_results(folder)
    if not quiet:
        total = before.meta.get("cases_total") or "?"
        err.print(
            f"attnbench {__version__}: resuming {folder} ({before.status}, "
            f"{len(before.frame)} of {total} cases on disk)",
            soft_wrap=True,
        )
        for warning in before.warnings:
            err.print(f"[yellow]note:[/] {warning} (repaired)")
    return resume_sweep(folder, values or None, force=force, progress=progress, executor=executor)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COMPARE_FORMATS = ("table", "markdown", "json", "github-action-benchmark")


def _print_comparison(comparison: Comparison, gate: str) -> None:
    """The comparison on stderr: warnings, the table, and the verdict line."""
    for warning in comparison.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
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
    err.print(grid)
    for label, cases in (
        ("only in the baseline", comparison.only_baseline),
        ("only in the current run", comparison.only_current),
    ):
        for case_id in cases:
            err.print(f"  {label}: {escape(case_id)}", soft_wrap=True)
    found = comparison.regressions(gate)
    if found:
        err.print(f"[bold red]{len(found)} regression(s)[/] (--fail-on {gate}):")
        for line in found:
            err.print(f"  {escape(line)}", soft_wrap=True)
    else:
        err.print(f"[green]no regression[/] (--fail-on {gate})")


def _emit_markdown(comparison: Comparison, gate: str, output: Path | None = None) -> None:
    text = comparison_markdown(comparison, gate)
    _write_or_echo(text, output)
    try:
        written = append_step_summary(text)
    except OSError as exc:
        err.print(f"[yellow]warning:[/] the job summary was not written: {exc}", soft_wrap=True)
        return
    if written is not None:
        err.print(f"appended to the job summary {written}", soft_wrap=True)


def _write_or_echo(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    try:
        if output.parent != Path():
            output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(output, text)
    except OSError as exc:
        raise AttnbenchError(f"cannot write --output {str(output)!r}: {exc}") from None
    err.print(f"wrote {output}", soft_wrap=True)


@app.command()
def compare(
    baseline: Annotated[Path, typer.Argument(help="The earlier results folder (the reference).")],
    current: Annotated[Path, typer.Argument(help="The results folder to judge.")],
    max_slowdown: MaxSlowdown = "10%",
    alpha: Alpha = 0.01,
    min_samples: MinSamples = 5,
    memory_tolerance: MemoryTolerance = "0%",
    normalize: Normalize = False,
    fail_on: FailOn = "all",
    markdown: Markdown = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the verdicts as JSON on stdout.")
    ] = False,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="What to print on stdout: table (nothing: the table goes to stderr), markdown, "
            "json, or github-action-benchmark (its customSmallerIsBetter list).",
        ),
    ] = "table",
    output: Annotated[
        Path | None,
        typer.Option(help="Write the --format output to this file instead of stdout."),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No table on stderr.")] = False,
) -> None:
    """Judge CURRENT against BASELINE: exit 0 when nothing regressed, 1 when something did.

    Time regresses when the median ratio exceeds --max-slowdown and a one-sided Mann-Whitney U
    test over the raw samples gives p < --alpha; FLOPs, sequential steps, path length and peak
    memory (same device) regress on any increase. Cases on one side only are listed.
    """
    try:
        thresholds = _thresholds(max_slowdown, alpha, min_samples, memory_tolerance, normalize)
        check_gate(fail_on)
        chosen = {fmt} - {"table"}
        chosen |= {"markdown"} if markdown else set()
        chosen |= {"json"} if as_json else set()
        if len(chosen) > 1:
            raise AttnbenchError(f"choose one output: {', '.join(sorted(chosen))}")
        out_format = chosen.pop() if chosen else "table"
        if out_format not in COMPARE_FORMATS:
            raise AttnbenchError(f"--format {fmt!r}: accepted: {', '.join(COMPARE_FORMATS)}")
        if output is not None and out_format == "table":
            raise AttnbenchError("--output needs --markdown, --json or --format (not table)")
        comparison = compare_runs(load_results(baseline), load_results(current), thresholds)
        if not quiet:
            _print_comparison(comparison, fail_on)
        if out_format == "markdown":
            _emit_markdown(comparison, fail_on, output)
        elif out_format == "json":
            _write_or_echo(json.dumps(to_json(comparison, fail_on), indent=2) + "\n", output)
        elif out_format == "github-action-benchmark":
            entries = github_action_benchmark(comparison)
            _write_or_echo(json.dumps(entries, indent=2) + "\n", output)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    if comparison.failed(fail_on):
        raise typer.Exit(1)


@app.command()
def show(
    folder: Annotated[Path, typer.Argument(help="A results folder written by attnbench sweep.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON on stdout.")
    ] = False,
) -> None:
    """Print the tables of a saved run (finished or not), with its case counts."""
    try:
        run = load_results(folder)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    if as_json:
        payload = {"path": str(run.path), "status": run.status, "results": _records(run)}
        typer.echo(json.dumps(payload, indent=2))
        return
    _summary_tables(run, err, verb="in")


@app.command()
def table(
    folder: SavedRun = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown table on stdout (for a README).")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the table and exponents as JSON on stdout.")
    ] = False,
) -> None:
    """The chapter's comparison table, theory beside the growth measured in a run.

    Measured growth is a log-log exponent in n (and in d for compute), fitted on ok cases.
    """
    try:
        run = load_for_table(folder)
        rows = comparison_table(run)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(rows.to_json(orient="records", indent=2))
        return
    if markdown:
        typer.echo(to_markdown(rows), nl=False)
        return
    out = Console(highlight=False)
    out = out if out.is_terminal else Console(highlight=False, width=120)
    grid = Table(title=f"comparison table, measured in {run.path}", title_justify="left")
    for header in TABLE_HEADERS:
        grid.add_column(header, no_wrap=True)
    for row in rows[TABLE_COLUMNS].itertuples(index=False):
        grid.add_row(*[str(v) for v in row])
    out.print(grid)
    for note in fit_notes(rows, run):
        out.print(f"  {note}", soft_wrap=True)


@app.command()
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
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the written paths as JSON on stdout.")
    ] = False,
) -> None:
    """Draw a run's comparison charts (log-log, theory dashed) as PNG and SVG files."""
    try:
        names = parse_charts(metric)
        formats = parse_formats(fmt)
        run = load_for_table(folder)
        paths = plot_run(
            run, names=names, layers=select_layers(run, layers), formats=formats, out_dir=out
        )
    except AttnbenchError as exc:
        raise _fail(exc) from None
    drawn = sorted({p.stem for p in paths})
    left = [x for x in names if x not in drawn]
    if as_json:
        typer.echo(json.dumps({"charts": [str(p) for p in paths], "not_drawn": left}, indent=2))
        return
    for path in paths:
        err.print(str(path), soft_wrap=True)
    if left:
        err.print(
            f"[yellow]not drawn:[/] {', '.join(left)} (the run has no data for them: "
            "a line needs two sizes)",
            soft_wrap=True,
        )


@app.command()
def fit(
    folder: SavedRun = None,
    layers: RunLayers = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print exponents, models and crossovers as JSON.")
    ] = False,
) -> None:
    """Fit the theory to a run: exponents with 95% intervals, cost models, crossovers."""
    try:
        run = load_for_table(folder)
        analysis = analyse(run, select_layers(run, layers))
    except AttnbenchError as exc:
        raise _fail(exc) from None
    if as_json:
        payload = {
            "path": str(run.path),
            "exponents": json.loads(analysis.exponents.to_json(orient="records")),
            "models": json.loads(analysis.models.to_json(orient="records")),
            "crossovers": json.loads(analysis.crossovers.to_json(orient="records")),
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    out = Console(highlight=False)
    out = out if out.is_terminal else Console(highlight=False, width=140)
    for title, frame in fit_tables(analysis).items():
        grid = Table(title=escape(title), title_justify="left")
        for column in frame.columns:
            grid.add_column(escape(column))
        for row in frame.itertuples(index=False):
            grid.add_row(*[escape(str(v)) for v in row])
        out.print(grid)


@app.command()
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
) -> None:
    """Write a Markdown report of a run: environment, comparison table, fits, crossovers, charts.

    Commit it next to the results: the charts are linked relative to it.
    """
    try:
        run = load_for_table(folder)
        analysis = analyse(run)
        if charts and not run.measured.empty:
            paths = plot_run(run, analysis=analysis)
        else:  # embed the charts already drawn, if any
            paths = existing_charts(run.path / CHARTS_DIR)
        if out is not None and out.parent != Path():
            out.parent.mkdir(parents=True, exist_ok=True)
        written = write_report(run, analysis, paths, out=out, html_too=as_html)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise _fail(AttnbenchError(f"cannot write the report: {exc}")) from None
    for path in written:
        err.print(str(path), soft_wrap=True)


@app.command()
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
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the check and the written paths as JSON.")
    ] = False,
) -> None:
    """The chapter's positional-encoding figures, and a check of its relative-position property.

    For every offset δ = 1..n, a fixed 2x2 rotation maps (p[i,2j], p[i,2j+1]) to
    (p[i+δ,2j], p[i+δ,2j+1]) for all i and j; the largest error is printed (float rounding).
    """
    try:
        if n < 1 or d < 2:
            raise AttnbenchError(f"--n must be at least 1 and --d at least 2 (got {n}, {d})")
        cols = parse_columns(columns)
        if max(cols) >= d:
            raise AttnbenchError(f"--columns go up to {max(cols)}, but P has columns 0..{d - 1}")
        formats = parse_formats(fmt)
        errors = {
            "float64": relative_shift_error(n, d, dtype=torch.float64),
            "float32": relative_shift_error(n, d, dtype=torch.float32),
        }
        paths = save_charts(pe_figures(n, d, cols), out, formats)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    check = (
        f"largest |R(δ)·p[i] - p[i+δ]| over i < {n}, j < {d // 2}, δ = 1..{n}: "
        f"{errors['float64']:.1e} in float64, {errors['float32']:.1e} in float32"
    )
    if as_json:
        payload = {"n": n, "d": d, "relative_shift_error": errors, "files": [str(p) for p in paths]}
        typer.echo(json.dumps(payload, indent=2))
        return
    out_console = Console(highlight=False)
    out_console.print("binary counting, lowest bit fastest (the columns of P are its smooth form):")
    for i in range(8):
        out_console.print(f"  {i} in binary is {i:>03b}")
    out_console.print(check, soft_wrap=True, markup=False)
    for path in paths:
        err.print(str(path), soft_wrap=True)


@app.command()
def env(
    device: Annotated[
        str, typer.Option(help=f"{DEVICE_CHOICES}.", envvar="ATTNBENCH_DEVICE")
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON on stdout.")] = False,
) -> None:
    """Print the environment block that every run records in run.json."""
    try:
        info = environment(resolve_device(device))
    except AttnbenchError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    table = Table(show_header=False, box=None)
    for key, value in info.items():
        table.add_row(key, "-" if value is None else str(value))
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
