"""``attnbench ab``: a base side and the current side, measured in turn in one run, and judged."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from attnbench.cli.judge import show_verdicts
from attnbench.cli.options import (
    AB_GRID,
    GATE,
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
from attnbench.cli.render import ABProgress, Streams
from attnbench.compare import compare_runs
from attnbench.errors import AttnbenchError
from attnbench.layers.plugins import unversioned
from attnbench.measure.counts.countcache import Counting
from attnbench.options import load_config
from attnbench.render.verdicts import to_json, to_markdown
from attnbench.results.files import default_out_dir
from attnbench.run.ab import AB_MEASURING, ABListeners, ABSides, run_ab
from attnbench.storage import write_text_atomic
from attnbench.thresholds import cases_to_judge, gate_from, rounds_to_reach

BasePython = Annotated[
    str | None,
    typer.Option(
        help="The Python interpreter of the base side, e.g. a venv with your main branch "
        "installed (../base/.venv/bin/python). Default: this one.",
        show_default=False,
    ),
]
BaseLayers = Annotated[
    str | None,
    typer.Option(
        help="The base side's layers, one for each of --layers, in the same order (race "
        "attention-sdpa against attention with --base-layers attention --layers "
        "attention-sdpa). Two layers' exact counts (FLOPs, steps, path length) differ by "
        "design, so with them --fail-on defaults to time. Default: the same layers.",
        show_default=False,
    ),
]
BaseCompile = Annotated[
    str | None,
    typer.Option(
        help="The base side's --compile: none races an eager base against a compiled current "
        "side (--base-compile none --compile default), the same layer on both. Default: the "
        "current side's.",
        show_default=False,
    ),
]
AbOut = Annotated[
    Path | None,
    typer.Option(
        help="Folder for base/ and current/ (two ordinary results folders) and the "
        "verdicts. Default: results/ab-<timestamp>."
    ),
]


def _can_fail(gate: str, values: dict[str, Any], alpha: float, base_layers: str | None) -> None:
    """Refuse a gate that judges time when the pairs are too few for any time verdict: its
    time half could never fail (a maintainer's --processes 3 passed a 2x step, a note its only
    word). ``all`` judges time too, and so does the default gate when the sides run different
    layers (it becomes time); only ``deterministic`` and ``none`` judge no time."""
    pairs = values.get("processes")
    if pairs is None or values.get("metric") == "instructions":
        return
    if gate not in ("all", "time") or int(pairs) >= (least := cases_to_judge(alpha)):
        return
    given = values.get("fail_on")
    which = f"--fail-on {given}" if given is not None else "the default gate"
    if (
        given is None
        and base_layers is not None
        and _names(base_layers) != _names(values.get("layers"))
    ):
        which += " (time: the sides run different layers)"
    raise AttnbenchError(
        f"--processes {pairs} with {which}: the paired test cannot reach alpha {alpha:g} with "
        f"fewer than {least} pairs, so no time could ever fail; give --processes {least} or "
        f"more ({rounds_to_reach(alpha)} by default), or --fail-on deterministic to gate the "
        "exact counts alone"
    )


def _names(layers: object) -> list[str]:
    return [t.strip() for t in str(layers or "").split(",") if t.strip()]


# Where the sides run different layers and --fail-on was not given: the gate is time.
RACED_NOTE = (
    "the sides run different layers, whose exact counts differ by design: only time fails "
    "here (--fail-on all gates the counts and memory too)"
)


@with_options(before=AB_GRID, after=(*GATE, *VERDICT_OUTPUT))
def ab(
    base_python: BasePython = None,
    base_layers: BaseLayers = None,
    base_compile: BaseCompile = None,
    out: AbOut = None,
    config: ConfigFile = None,
    yes: LargeRun = False,
    no_cache: NoCache = False,
    as_json: Annotated[bool, json_flag("the verdicts")] = False,
    quiet: Quiet = False,
    **options: Any,
) -> None:
    """Race the current side against a base side, measured in turn: exit 1 on a regression.

    Every job of either side runs in a fresh process of its side; cases are measured in ABBA
    order, pair after pair, so a busy moment of the machine slows both halves of a pair alike,
    and a process's own speed weighs on one pair only. Time regresses
    when the median of the paired per-round ratios (current / base) exceeds --max-slowdown and
    a one-sided Wilcoxon signed-rank test on them gives p < --alpha (every pair; a note counts
    those with a half read disturbed); --processes (the pairs)
    defaults to enough for that test (10 at alpha 0.01). FLOPs, steps, path length, memory and, with
    --metric instructions, Callgrind's instruction counts are compared as compare does.
    """
    thresholds, gate = gate_from(options)
    fmt = verdict_format(options, as_json)
    output = options.get("output")
    values: dict[str, Any] = load_config(config) if config is not None else {}
    values.update(pick(options, AB_GRID))
    _can_fail(gate, {**values, "fail_on": options.get("fail_on")}, thresholds.alpha, base_layers)
    values.pop("out", None)
    folder = out or default_out_dir(prefix="ab-")
    layers = [t.strip() for t in base_layers.split(",")] if base_layers else None
    streams = Streams.make(stdout_taken=fmt != "table" and output is None, quiet=quiet)
    with (
        contextlib.redirect_stdout(sys.stderr),  # stdout carries the verdicts only
        ABProgress(streams.err, quiet=quiet) as progress,
    ):
        run = run_ab(
            values,
            folder,
            sides=ABSides(base_layers=layers, base_python=base_python, base_compile=base_compile),
            alpha=thresholds.alpha,
            measuring=replace(AB_MEASURING, counting=Counting(cache=not no_cache)),
            listeners=ABListeners(progress, progress.started),
            allow_large=yes,
        )
    comparison = compare_runs(run.base, run.current, thresholds, pairs=run.pairs, paired=True)
    # two versions of one plugin (old/mine.py, mine.py: mine:make@base) are one layer
    runs = (run.base, run.current)
    sides = [[unversioned(str(n)) for n in r.record.config.get("layers", [])] for r in runs]
    if options.get("fail_on") is None and sides[0] != sides[1]:
        gate = "time"  # two layers: their counts differ by design, shown and not gated
        comparison = replace(comparison, warnings=(*comparison.warnings, RACED_NOTE))
    write_text_atomic(run.out_dir / "verdicts.json", json.dumps(to_json(comparison, gate)) + "\n")
    write_text_atomic(run.out_dir / "verdicts.md", to_markdown(comparison, gate))
    show_verdicts(comparison, gate, fmt, output, streams)
    if streams.notes is not None:
        streams.notes.print(
            f"results in {run.out_dir}/base and {run.out_dir}/current (show, plot, report and "
            f"compare read them); verdicts in {run.out_dir}/verdicts.json and verdicts.md",
            soft_wrap=True,
        )
    if comparison.failed(gate):
        raise typer.Exit(1)
