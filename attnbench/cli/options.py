"""Options that several commands share, declared once from the core's own tables.

A Typer command lists its parameters in its signature. The sweep's grid options
(``attnbench.options.OPTIONS``) and the regression gate's options (``compare.GATE_OPTIONS``) are
tables in the core, and more than one command takes them; ``with_options`` adds a table's
options to a command's signature, and the command receives their values in ``**options``. A new
row in either table is then a new flag of every command that takes the group, with its help and
default, and nothing else to edit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from attnbench.errors import AttnbenchError
from attnbench.options import OPTIONS
from attnbench.render.verdicts import FORMATS
from attnbench.thresholds import GATE_OPTIONS

F = TypeVar("F", bound=Callable[..., Any])


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _parameter(
    key: str, kind: type, help_text: str, envvar: str | None = None, hidden: bool = False
) -> inspect.Parameter:
    help_text = help_text.replace("[", "\\[")  # rich read 'attnbench[gpu]' as markup: gone
    if kind is bool:  # a switch: --normalize / --no-normalize, off unless given
        option = typer.Option(help=help_text, hidden=hidden)
        return inspect.Parameter(
            key, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, option]
        )
    option = typer.Option(
        _flag(key), help=help_text, envvar=envvar, show_default=False, hidden=hidden
    )
    return inspect.Parameter(
        key,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[kind | None, option],  # None: not given (the core's default holds)
    )


def _grid(hidden: Iterable[str] = ()) -> tuple[inspect.Parameter, ...]:
    """The grid's options as parameters, those in ``hidden`` taken but out of --help."""
    return tuple(
        _parameter(o.key, o.kind, o.full_help, o.envvar, hidden=o.key in hidden) for o in OPTIONS
    )


GRID = _grid()
# The grid options ab takes but refuses (it times each case in exactly --processes pairs, on
# lengths given): accepted, so that they get ab's own one-line error, and out of its --help,
# where a new user read them as ab's.
AB_GRID = _grid(hidden=("max_processes", "precision", "auto_budget"))
GATE = tuple(_parameter(o.key, o.kind, o.full_help) for o in GATE_OPTIONS)
VERDICT_FORMATS = ("table", *FORMATS)
VERDICT_OUTPUT = (
    _parameter(
        "format",
        str,
        "What the comparison prints on stdout: table, "
        + "; ".join(f"{name}: {f.help}" for name, f in FORMATS.items())
        + ". Default: table.",
    ),
    _parameter("markdown", bool, "Short for --format markdown."),
    _parameter("output", Path, "Write the --format output to this file instead of stdout."),
)


def with_options(
    *, before: Iterable[inspect.Parameter] = (), after: Iterable[inspect.Parameter] = ()
) -> Callable[[F], F]:
    """Add option groups to a command: ``before`` its own parameters, ``after`` them. The
    command's ``**options`` receives their values by key."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)  # Typer reads it as it is
        own = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        keyword = [p.replace(kind=p.KEYWORD_ONLY) for p in own]
        func.__signature__ = signature.replace(  # type: ignore[attr-defined]  # typer reads __signature__, which functions allow
            parameters=[*before, *keyword, *after]
        )
        return func

    return decorate


def pick(options: Mapping[str, Any], group: Iterable[inspect.Parameter]) -> dict[str, Any]:
    """The values of one group's options (those given, for options that default to None)."""
    keys = {p.name for p in group}
    return {key: value for key, value in options.items() if key in keys and value is not None}


def verdict_format(
    options: Mapping[str, Any], as_json: bool = False, *, json_is_verdicts: bool = True
) -> str:
    """The one format a judging command prints: ``--format``, or ``--markdown`` / ``--json``.

    ``as_json`` is the command's own ``--json`` when it means the verdicts (``compare``);
    ``json_is_verdicts`` False where it means something else (``sweep``'s, the run).
    """
    chosen = {options.get("format") or "table"} - {"table"}
    chosen |= {"markdown"} if options.get("markdown") else set()
    chosen |= {"json"} if as_json else set()
    if len(chosen) > 1:
        raise AttnbenchError(f"choose one output: {', '.join(sorted(chosen))}")
    name = chosen.pop() if chosen else "table"
    if name not in VERDICT_FORMATS:
        raise AttnbenchError(
            f"--format {options.get('format')!r}: accepted: {', '.join(VERDICT_FORMATS)}"
        )
    if options.get("output") is not None and name == "table":
        if json_is_verdicts:
            raise AttnbenchError("--output needs --markdown, --json or --format (not table)")
        raise AttnbenchError(  # a maintainer's --json --output on sweep was told to add --json
            "--output writes the verdicts: it needs --markdown or --format (json for them as "
            "JSON; sweep's own --json prints the run, on stdout)"
        )
    return name


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


def json_flag(what: str) -> Any:
    """``--json``: print ``what`` as JSON on stdout instead of the tables."""
    return typer.Option("--json", help=f"Print {what} as JSON on stdout.")


# Flags that `sweep` and `ab` both take, declared once.
NO_CACHE_HELP = (
    "Trace every case's exact counts (FLOPs, elementwise work, bytes, steps, path length) "
    "instead of reading those this code traced before from the count cache "
    "($ATTNBENCH_CACHE_DIR/counts); results.csv's counts_source says which were read."
)
ConfigFile = Annotated[
    Path | None,
    typer.Option(help="TOML file with sweep keys (layers, n, d, ...); options override it."),
]
LargeRun = Annotated[
    bool,
    typer.Option(
        "--yes", "-y", help="Start a very large sweep (over 2000 cases or about an hour)."
    ),
]
Quiet = Annotated[bool, typer.Option(help="No progress, tables or notes.")]
NoCache = Annotated[
    bool, typer.Option("--no-cache", help=NO_CACHE_HELP, envvar="ATTNBENCH_NO_CACHE")
]
