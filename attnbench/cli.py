"""The command line: parse options, call the core, render with Rich, map errors to exit codes.

Human output (progress, tables, messages) goes to stderr; ``--json`` writes to stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
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
from attnbench.errors import AttnbenchError
from attnbench.layers import LAYERS
from attnbench.measure.timing import NOISY_REL_IQR, is_noisy
from attnbench.results import RunResults, default_out_dir, environment, prepare_out_dir
from attnbench.runner import ProgressEvent, run_sweep
from attnbench.spec import DEVICE_CHOICES, DTYPES, MODES, build_grid, load_config, resolve_device
from attnbench.units import fmt_bytes, fmt_count, fmt_seconds

app = typer.Typer(
    name="attnbench",
    help="Measure the complexity table of self-attention: time, memory and FLOPs of conv, "
    "RNN and self-attention layers over a grid of sequence lengths n and widths d.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _stderr_console() -> Console:
    """Stderr console; off a terminal (CI logs, pipes) it is wide enough not to wrap tables."""
    console = Console(stderr=True, highlight=False)
    return console if console.is_terminal else Console(stderr=True, highlight=False, width=120)


err = _stderr_console()


def _fail(exc: AttnbenchError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc.message}", soft_wrap=True)
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

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
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
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task("sweep", total=event.total)
            if event.kind == "start":
                self.bar.update(self.task, description=event.case.label())
            else:
                self.bar.update(self.task, completed=event.index + 1)
        elif event.kind == "done" and not self.quiet:
            self.console.print(_case_line(event), soft_wrap=True)


def _case_line(event: ProgressEvent) -> str:
    width = len(str(event.total))
    head = f"[{event.index + 1:>{width}}/{event.total}] {event.case.label()}"
    result = event.result
    if result is None or result.status != "ok" or result.timing is None:
        status = result.status.upper() if result else "FAILED"
        return f"{head}  {status}: {result.error if result else ''}"
    t = result.timing
    return (
        f"{head}  {fmt_seconds(t.median_s)} ± {fmt_seconds(t.iqr_s)} ({t.count} samples)  "
        f"peak {fmt_bytes(result.peak_bytes)}  {fmt_count(result.flops, 'FLOP')}  "
        f"{fmt_count(result.flops_per_s, 'FLOP/s')}"
    )


# ----------------------------------------------------------------------------- summary


def _summary_tables(run: RunResults, console: Console) -> None:
    frame = run.frame
    for layer, group in frame.groupby("layer", sort=False):
        table = Table(title=f"{layer}", title_justify="left", title_style="bold")
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
        ]:
            table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for row in group.sort_values(["d", "n"]).itertuples():
            if row.status != "ok":
                table.add_row(str(row.n), str(row.d), f"[red]{row.status}[/]", *[""] * 6)
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
            )
        console.print(table)
    counts = frame["status"].value_counts().to_dict()
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    console.print(f"{len(frame)} cases: {summary}")
    noisy = frame[is_noisy(frame["time_s"], frame["time_iqr_s"])]
    if len(noisy):
        console.print(
            f"[yellow]note:[/] {len(noisy)} case(s) marked ! have IQR/median above "
            f"{NOISY_REL_IQR:.0%}: the machine was busy or the budget short; "
            "a larger --time-budget gives more samples"
        )
    mismatched = frame[frame["flops_check"] == "mismatch"]
    if len(mismatched):
        console.print(
            f"[yellow]note:[/] counted FLOPs differ from the analytic formula by more than 1% in "
            f"{len(mismatched)} case(s) ({', '.join(sorted(set(mismatched['layer'])))}); "
            "see the flops and flops_analytic columns"
        )
    console.print(f"results written to [bold]{run.path}[/] (results.csv, samples.csv, run.json)")


# ----------------------------------------------------------------------------- commands


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
            help="Sequence lengths: a list 64,128 or a doubling range 64..4096. "
            "[default: 64..1024]",
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
    out: Annotated[
        Path | None,
        typer.Option(help="Results folder. Default: results/<timestamp>."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="TOML file with the same keys (layers, n, d, ...); options override it."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON on stdout.")
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress or tables on stderr.")] = False,
) -> None:
    """Measure time, peak memory and FLOPs of each layer over the n x d grid."""
    out_dir: Path | None = None
    try:
        values: dict[str, Any] = load_config(config) if config is not None else {}
        given = {
            "layers": layers,
            "n": n,
            "d": d,
            "k": k,
            "heads": heads,
            "batch": batch,
            "dtype": dtype,
            "device": device,
            "mode": mode,
            "threads": threads,
            "time_budget": time_budget,
            "seed": seed,
            "out": str(out) if out is not None else None,
        }
        values.update({key: v for key, v in given.items() if v is not None})
        grid = build_grid(values)
        out_dir = prepare_out_dir(Path(values["out"]) if values.get("out") else default_out_dir())
        total = len(grid.cases())
        if not quiet:
            err.print(
                f"attnbench {__version__}: {total} cases on {grid.device} ({grid.dtype}, "
                f"{grid.mode}, batch {grid.batch}) -> {out_dir}"
            )
        with SweepProgress(err, quiet=quiet) as progress:
            run = run_sweep(grid, out_dir, progress=progress)
    except AttnbenchError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        err.print(f"[bold red]interrupted:[/] every finished case is in {out_dir}")
        raise typer.Exit(130) from None
    if not quiet:
        _summary_tables(run, err)
    if as_json:
        records = json.loads(run.frame.to_json(orient="records"))
        typer.echo(json.dumps({"path": str(run.path), "results": records}, indent=2))


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
