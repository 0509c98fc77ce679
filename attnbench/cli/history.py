"""``attnbench history``: runs filed across commits, their change points and a static site;
``attnbench bisect``: the first commit where a case got slower."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.markup import escape

from attnbench.cli.options import json_flag
from attnbench.cli.render import Streams, frame_table
from attnbench.compare.bisect import Race, Undecided, bisect
from attnbench.compare.changes import EXACT, confirm_note, history_steps
from attnbench.errors import AttnbenchError
from attnbench.render.dashboard import github_commit_url, publish
from attnbench.results.history import add_run, load_history
from attnbench.results.loader import load_results
from attnbench.thresholds import Thresholds, parse_fraction
from attnbench.vcs import git_output

# What a history's change points are found in: the time, and the counts the same on any device.
HISTORY_METRICS = ("time_s", *EXACT)

DEFAULT_HISTORY = Path("attnbench-history")
HistoryOption = Annotated[
    Path,
    typer.Option(
        "--history",
        help="The history folder (cache or commit it in CI).",
        envvar="ATTNBENCH_HISTORY",
    ),
]

RepoOption = Annotated[Path, typer.Option(help="The git repository of the commits.")]


def show(
    ctx: typer.Context,
    history: HistoryOption = DEFAULT_HISTORY,
    metric: Annotated[str, typer.Option(help=f"{', '.join(HISTORY_METRICS)} or all.")] = "all",
    as_json: Annotated[bool, json_flag("the change points")] = False,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown",
            help="Print the change points as a Markdown table "
            "(for a pull request's comment or a job summary).",
        ),
    ] = False,
    last: Annotated[
        int | None,
        typer.Option(
            help="Only the change points among the last N commits of each series.",
            show_default=False,
            min=1,
        ),
    ] = None,
    repo: RepoOption = Path("."),
) -> None:
    """The change points of every series in a history: where each case's time (or an exact
    count) stepped, between which commits, by how much and how surely.

    Times are searched with PELT (the ruptures library) on their logs and each step is
    confirmed by a Mann-Whitney test on the commits either side; an exact count steps at any
    change. Runs of different machines, devices, dtypes or allocator states are different
    series. Commits are taken in the order of the repository's ancestry (--repo), by commit
    date only where a commit is not in it (a warning says so).
    """
    if ctx.invoked_subcommand is not None:  # history add / publish: not this
        return
    streams = Streams.make(stdout_taken=as_json or markdown)
    loaded = load_history(history, repo=repo)
    warn(loaded.warnings, streams)
    frame = loaded.frame
    steps = _chosen(history_steps(frame), metric, last)
    if markdown:
        typer.echo(markdown_table(steps, int(frame["file"].nunique()), confirm_note(frame)))
        return
    if as_json:
        typer.echo(json.dumps(_history_json(history, frame, steps), indent=1, default=str))
        return
    out = streams.out
    out.print(
        f"{frame['file'].nunique()} run(s) of {frame['commit'].nunique()} commit(s), "
        f"{frame['machine'].nunique()} machine(s): {len(steps)} change point(s)"
    )
    if streams.notes is not None:
        streams.notes.print(f"[yellow]note:[/] {escape(confirm_note(frame))}", soft_wrap=True)
    if not steps.empty:
        frame_table(_steps_display(steps), out)


def _chosen(steps: pd.DataFrame, metric: str, last: int | None) -> pd.DataFrame:
    """The change points of ``--metric`` among ``--last`` commits of each series."""
    if metric != "all":
        if metric not in set(steps["metric"]) | set(HISTORY_METRICS):
            raise AttnbenchError(f"unknown --metric {metric!r}")
        steps = steps[steps["metric"] == metric]
    if last is not None:
        steps = steps[steps["points"] - steps["index"] <= last]
    return steps


def _history_json(history: Path, frame: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """``history --json``: the history, its runs, and each change point (NaN as null)."""
    records = steps.to_dict(orient="records")
    for r in records:
        r.update({k: None for k, v in r.items() if isinstance(v, float) and math.isnan(v)})
    return {
        "history": str(history),
        "runs": int(frame["file"].nunique()),
        "change_points": records,
        "note": confirm_note(frame),  # what the history's length lets it show
    }


def _steps_display(steps: pd.DataFrame) -> pd.DataFrame:
    """The change points for people: the ratio, p, the commits shortened."""
    return pd.DataFrame(
        {
            "layer": steps["layer"],
            "n": steps["n"],
            "d": steps["d"],
            "metric": steps["metric"],
            "change": [f"x{r:.3f}" for r in steps["ratio"]],
            "p": [f"{p:.2g}" for p in steps["p_value"]],
            "before": [c[:10] for c in steps["before"]],
            "after": [c[:10] for c in steps["after"]],
            "subject": steps["subject"],
            "machine": steps["machine"],
        }
    )


def warn(warnings: tuple[str, ...], streams: Streams) -> None:
    """Each of a core's warnings as one line on stderr."""
    if streams.notes is not None:
        for warning in warnings:
            streams.notes.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def markdown_table(steps: pd.DataFrame, runs: int, note: str = "") -> str:
    """The change points as Markdown: one row a step, slower ones first; ``note`` (what the
    history's length lets it show) under the head."""
    head = f"**attnbench history**: {len(steps)} change point(s) over {runs} run(s)\n"
    head += f"\n_{note}_\n" if note else ""
    if steps.empty:
        return head
    lines = [
        head,
        "| layer | n | d | metric | change | p | last before | first after | subject |",
        "|---|---:|---:|---|---:|---:|---|---|---|",
    ]
    for s in steps.sort_values("ratio", ascending=False).to_dict(orient="records"):
        lines.append(
            f"| {s['layer']} | {s['n']} | {s['d']} | {s['metric']} | x{s['ratio']:.3f} | "
            f"{s['p_value']:.2g} | {s['before'][:10]} | {s['after'][:10]} | "
            f"{str(s['subject']).replace('|', '/')[:60]} |"
        )
    return "\n".join(lines) + "\n"


def add(
    run: Annotated[Path, typer.Argument(help="A results folder (attnbench sweep --out).")],
    history: HistoryOption = DEFAULT_HISTORY,
    commit: Annotated[
        str | None,
        typer.Option(
            help="The commit the run measured. Default: the one its run.json records.",
            show_default=False,
        ),
    ] = None,
    machine: Annotated[
        str | None,
        typer.Option(
            help="The machine's name in the history (runs of one name form a series). "
            "Default: its CPU model, core count and device.",
            show_default=False,
        ),
    ] = None,
    repo: RepoOption = Path("."),
) -> None:
    """File a run in the history under its commit and machine (one JSON file)."""
    filed = add_run(load_results(run), history, commit=commit, machine=machine, repo=repo)
    typer.echo(f"filed {run} as {filed.commit[:10]} on {filed.machine!r}: {filed.path}")
    if filed.dirty:
        Streams.make().err.print(
            f"[yellow]note:[/] the run was measured on a checkout with uncommitted changes: "
            f"its times may not be {filed.commit[:10]}'s (--commit names the commit it measured)",
            soft_wrap=True,
        )


def publish_site(
    out: Annotated[Path, typer.Argument(help="The folder to write the site into.")],
    history: HistoryOption = DEFAULT_HISTORY,
    commit_url: Annotated[
        str | None,
        typer.Option(
            help="Link to a commit, {commit} replaced by its hash. Default: the "
            "GitHub page of the repository's origin, if it is on GitHub.",
            show_default=False,
        ),
    ] = None,
    repo: RepoOption = Path("."),
) -> None:
    """Write the history as a static site: index.html with every change point, and a page
    per layer plotting each series over its commits with its steps marked. It opens from
    disk: no server, no script."""
    loaded = load_history(history, repo=repo)
    warn(loaded.warnings, Streams.make())
    url = commit_url or _origin_url(repo)
    pages = publish(loaded.frame, history_steps(loaded.frame), out, commit_url=url)
    typer.echo(f"{len(pages)} page(s) in {out}: open {out / 'index.html'}")


def _origin_url(repo: Path) -> str | None:
    remote = git_output(repo, "remote", "get-url", "origin", timeout=10)
    return None if remote is None else github_commit_url(remote.strip())


def bisect_command(
    good: Annotated[str, typer.Argument(help="A commit the case was fast at.")],
    bad: Annotated[str, typer.Argument(help="A later commit it was slower at.")],
    layers: Annotated[
        str,
        typer.Option(
            help="The layer(s): a name, or a file of the repository "
            "(layers.py:factory), read from each commit's worktree."
        ),
    ],
    n: Annotated[str, typer.Option(help="Sequence length(s), as sweep takes them.")],
    d: Annotated[str, typer.Option(help="Width(s).")],
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N, mps, auto.")] = "auto",
    time_budget: Annotated[
        float, typer.Option(help="Seconds of timed calls a case, a race.")
    ] = 0.5,
    max_slowdown: Annotated[
        str, typer.Option(help="The slowdown that makes a commit slower (as ab's gate).")
    ] = "10%",
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Pairs of processes a race (ab's default: enough for its test at alpha "
            "0.01); an undecided race is raced once more with twice as many.",
        ),
    ] = None,
    repo: RepoOption = Path("."),
    as_json: Annotated[bool, json_flag("the races and the first slower commit")] = False,
) -> None:
    """Find the first commit after GOOD, up to BAD, where a case got slower.

    Each commit is checked out in a worktree of its own (your checkout is not touched; it must
    have no uncommitted changes) and raced against GOOD with ab's gate: BAD first, then the
    commits between halved, about log2 of them races in all. A race reads slower, as fast or
    undecided (a move the pairs cannot tell from noise); an undecided race is raced again with
    twice the pairs, and one still undecided stops the search with the commits it narrowed to.

    Exit status: 0 with the first slower commit, 3 when a race stayed undecided, 2 on bad
    input or when BAD is not slower than GOOD.
    """
    slowdown = parse_fraction(max_slowdown, "--max-slowdown")
    streams = Streams.make(stdout_taken=as_json)

    def heard(race: Race) -> None:
        if streams.notes is not None:
            streams.notes.print(
                f"raced {race.commit[:10]} ({race.subject[:60]}) in {race.pairs} pairs: "
                f"x{race.ratio:.3f} (p = {race.p_value:.2g}), {race.outcome}",
                soft_wrap=True,
            )

    options: dict[str, Any] = {
        "layers": layers,
        "n": n,
        "d": d,
        "device": device,
        "time_budget": time_budget,
        "processes": processes,
    }
    try:
        found = bisect(
            good,
            bad,
            options,
            repo=repo,
            thresholds=Thresholds(max_slowdown=slowdown),
            on_race=heard,
        )
    except Undecided as stopped:
        if as_json:  # a script reading stdout gets the races run and where the search stopped
            typer.echo(json.dumps(_undecided_json(stopped), indent=1))
        raise
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "outcome": "found",
                    "first_bad": found.first_bad,
                    "subject": found.subject,
                    "commits": found.commits,
                    "candidates": [found.first_bad],
                    "races": [r.to_dict() for r in found.races],
                },
                indent=1,
            )
        )
        return
    typer.echo(
        f"first slower commit: {found.first_bad} {found.subject} "
        f"({len(found.races)} races over {found.commits} commits)"
    )


def _undecided_json(stopped: Undecided) -> dict[str, Any]:
    """``bisect --json`` when a race stayed undecided (exit 3): no first slower commit, the
    commits it is among, and every race run."""
    return {
        "outcome": "undecided",
        "first_bad": None,
        "message": stopped.message,
        "candidates": list(stopped.candidates),
        "races": [r.to_dict() for r in stopped.races],
    }


__all__ = ["add", "bisect_command", "publish_site", "show"]
