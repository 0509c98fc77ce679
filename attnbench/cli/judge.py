"""``attnbench compare``, and how every command that judges runs prints its verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnbench.cli.options import GATE, VERDICT_OUTPUT, json_flag, verdict_format, with_options
from attnbench.cli.render import Streams, comparison_table, comparison_warnings
from attnbench.compare import Comparison, compare_runs
from attnbench.errors import AttnbenchError
from attnbench.render.verdicts import FORMATS, append_step_summary
from attnbench.results.loader import load_results
from attnbench.storage import write_text_atomic
from attnbench.thresholds import gate_from


def show_verdicts(
    comparison: Comparison, gate: str, fmt: str, output: Path | None, streams: Streams
) -> None:
    """The comparison for people (``streams.human``) and in the chosen format (stdout, or
    ``output``); Markdown also goes to GitHub's job summary when there is one."""
    comparison_warnings(comparison, streams.notes)
    if streams.human is not None:
        comparison_table(comparison, gate, streams.human)
    if fmt == "table":
        return
    chosen = FORMATS[fmt]
    text = chosen.render(comparison, gate)
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
    else:
        try:
            if output.parent != Path():
                output.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(output, text)
        except OSError as exc:
            raise AttnbenchError(f"cannot write --output {str(output)!r}: {exc}") from None
        if streams.notes is not None:
            streams.notes.print(f"wrote {output}", soft_wrap=True)
    if chosen.step_summary:
        try:
            written = append_step_summary(text)
        except OSError as exc:
            streams.err.print(f"[yellow]warning:[/] the job summary was not written: {exc}")
            return
        if written is not None and streams.notes is not None:
            streams.notes.print(f"appended to the job summary {written}", soft_wrap=True)


@with_options(after=(*GATE, *VERDICT_OUTPUT))
def compare(
    baseline: Annotated[Path, typer.Argument(help="The earlier results folder (the reference).")],
    current: Annotated[Path, typer.Argument(help="The results folder to judge.")],
    as_json: Annotated[bool, json_flag("the verdicts")] = False,
    quiet: Annotated[bool, typer.Option(help="No table and no warnings.")] = False,
    **options: Any,
) -> None:
    """Judge CURRENT against BASELINE: exit 0 when nothing regressed, 1 when something did.

    Time regresses when the ratio of the two times exceeds --max-slowdown and a one-sided test
    gives p < --alpha: Welch's t-test on the logs of the rounds' medians (each round a process;
    the case's spread between this machine's sweeps added), or Mann-Whitney U on the raw
    samples where a run timed the case in one round. FLOPs, sequential steps, path length and
    peak memory (same device) regress on any increase. Cases on one side only are listed.
    """
    thresholds, gate = gate_from(options)
    fmt = verdict_format(options, as_json)
    output = options.get("output")
    comparison = compare_runs(load_results(baseline), load_results(current), thresholds)
    streams = Streams.make(stdout_taken=fmt != "table" and output is None, quiet=quiet)
    show_verdicts(comparison, gate, fmt, output, streams)
    if comparison.failed(gate):
        raise typer.Exit(1)
