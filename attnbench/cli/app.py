"""The Typer app: its commands, and the mapping of the core's one exception to exit codes.

Every command parses its options, calls one core function and renders what comes back (the
renderers are in ``cli.render``). The core raises ``AttnbenchError``; ``handles_errors`` turns
it into one line on stderr and its exit code, never a traceback.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.markup import escape

from attnbench._version import __version__
from attnbench.cli import ab, analysis, catalog, history, judge, machine, sweeping
from attnbench.cli.render import console
from attnbench.errors import SUGGEST_CUTOFF, AttnbenchError, SweepInterrupted, first_line

# What a command raises to end with its own exit code or a usage error: passed on untouched.
# Typer from 0.29 stands without Click; before it, its exits are Click's.
PASS_THROUGH: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort)
PASS_THROUGH += tuple(e for e in (getattr(typer, "TyperException", None),) if e is not None)
# A usage error (a misspelt option, a missing value) and an abort, as the installed Typer
# raises them (its own from 0.29, Click's before): ``Group.main`` writes them in one line.
USAGE_ERRORS: tuple[type[Exception], ...] = ()
ABORTS: tuple[type[BaseException], ...] = (typer.Abort,)
try:
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:  # a Typer before 0.29: its errors are Click's
    pass
else:
    USAGE_ERRORS += (_TyperClickException,)
try:
    import click
except ImportError:  # typer 0.29 and later, installed alone
    pass
else:
    PASS_THROUGH += (click.exceptions.Exit, click.ClickException)
    USAGE_ERRORS += (click.ClickException,)
    ABORTS += (click.Abort,)

F = TypeVar("F", bound=Callable[..., Any])


def _untyped_flags(params: list[Any]) -> list[Any]:
    """On/off flags with no type in --help: typer 0.29 writes "<bool>" beside every flag,
    --help's own included, and a new user read ``--causal <bool>`` as a flag that takes a
    value. Typer prints a parameter's metavar where one is set."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(typer.core.TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # Click's parser consumes the list
        ctx.meta["attnbench.given"] = given  # as typed: a stopped sweep's --resume repeats some
        rest = super().parse_args(ctx, args)
        _warn_repeated(ctx, self.get_params(ctx), given)
        return rest


def _warn_repeated(ctx: Any, params: list[Any], args: list[str], stop: Any = ()) -> None:
    """The warnings of ``repeated_options``, once the arguments parsed: none beside a usage
    error (one line, as ``Group.main`` writes it), --help, or a shell's completion."""
    if getattr(ctx, "resilient_parsing", False):
        return
    for line in repeated_options(params, args, stop):
        console(stderr=True).print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)


def repeated_options(params: list[Any], args: list[str], stop: Any = ()) -> list[str]:
    """What to say of each option that takes one value and was given more than once, up to
    the first token in ``stop`` (a group's subcommands): Click keeps the last, as most command
    lines do, and dropped the others without a word (a new user's ``--layers mine.py:make ...
    --layers attention`` never swept their layer). Long options only (a short one may be
    clustered). Its --help says whether it takes several values, comma-separated."""
    names: dict[str, Any] = {}
    for param in params:
        one_value = getattr(param, "nargs", 1) == 1 and not getattr(param, "count", False)
        if getattr(param, "multiple", False) or getattr(param, "is_flag", False) or not one_value:
            continue
        for opt in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())):
            if opt.startswith("--"):
                names[opt] = param
    given: dict[str, list[tuple[str, str]]] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--" or token in stop:
            break
        opt, equals, value = token.partition("=")
        if opt not in names:
            continue
        if not equals:
            value = next(tokens, "")  # its value, never read as an option ("--out --n")
        given.setdefault(names[opt].name, []).append((opt, value))
    found = []
    for uses in given.values():
        if len(uses) < 2:
            continue
        (opt, value), dropped = uses[-1], ", ".join(f"{o} {v}" for o, v in uses[:-1])
        found.append(
            f"{opt} is given {len(uses)} times; the last is used ({opt} {value}), not {dropped}"
        )
    return found


class Group(typer.core.TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """As Click's, and the group's own options given twice warned of (``history --last 3
        --last 5``), up to its subcommand, whose options are its own."""
        given = list(args)
        rest = super().parse_args(ctx, args)
        _warn_repeated(ctx, self.get_params(ctx), given, stop=set(self.commands))
        return rest

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """As Typer's, but a usage error (an option misspelt, a value missing) is one line on
        stderr, as the core's errors are, not the usage, a hint and a framed panel (a new
        user's ``--layrs``: five lines)."""
        given = (args, prog_name, complete_var)
        if not standalone_mode:
            return super().main(*given, False, windows_expand_args, **extra)
        try:
            code = super().main(*given, False, windows_expand_args, **extra)
        except USAGE_ERRORS as exc:
            formats = getattr(exc, "format_message", None)
            message = _closer(exc) or str(formats() if callable(formats) else exc)
            if message:  # none where the error was the help itself (no command given)
                err = console(stderr=True)
                err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
            sys.exit(int(getattr(exc, "exit_code", 2)))
        except ABORTS:
            console(stderr=True).print("[red]Aborted.[/]")  # as Typer writes it
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _closer(exc: Exception) -> str | None:
    """An unknown option's message with only the options that read like it (None: not an
    unknown option, or Click's own message stands)."""
    name, possible = getattr(exc, "option_name", None), getattr(exc, "possibilities", None)
    message = getattr(exc, "message", None)
    if not (isinstance(name, str) and isinstance(message, str) and possible is not None):
        return None
    close = difflib.get_close_matches(name, list(possible), cutoff=SUGGEST_CUTOFF)
    return f"{message} (did you mean {' or '.join(close)}?)" if close else message


app = typer.Typer(
    name="attnbench",
    help="Measure the complexity table of self-attention: time, memory, FLOPs, elementwise "
    "work, bytes moved, sequential steps and path length of conv, recurrent, self-attention "
    "(full, restricted, linear) and state-space layers over a grid of sequence lengths n and "
    "widths d, and explain the times with the machine's own ceilings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def fail(exc: AttnbenchError) -> typer.Exit:
    """Print the error in one line on stderr; the exit that carries its code."""
    err = console(stderr=True)
    if isinstance(exc, SweepInterrupted):
        err.print(f"[bold yellow]interrupted:[/] {escape(exc.message)}", soft_wrap=True)
    else:
        err.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
    return typer.Exit(exc.exit_code)


def handles_errors(command: F, reads_runs: bool = False) -> F:
    """The command, with ``AttnbenchError`` mapped to a message and an exit code.

    A command that only reads results (``reads_runs``) also answers anything else its input
    makes it raise in one line: a results folder comes from anywhere, and one mangled past what
    the loader checks must not end in a traceback (``ATTNBENCH_DEBUG=1`` shows it).
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AttnbenchError as exc:
            raise fail(exc) from None
        except PASS_THROUGH:
            raise  # the command's own exit code, or a usage error
        except Exception as exc:
            if not reads_runs or os.environ.get("ATTNBENCH_DEBUG"):
                raise
            raise fail(
                AttnbenchError(
                    f"cannot read these results ({first_line(exc)[:200]}); a file of the "
                    "results folder is malformed (ATTNBENCH_DEBUG=1 shows where it broke)"
                )
            ) from None

    return wrapper  # type: ignore[return-value]  # the wrapper keeps the command signature typer reads


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


def help_text(doc: str | None) -> str:
    """A command's docstring as its ``--help`` shows it: each paragraph's lines joined, so the
    terminal wraps it at its own width (Typer keeps a docstring's line breaks, and a line
    wrapped at 96 columns in the source breaks again at 80 in the terminal); a paragraph
    whose lines start with a list's dash or an indent stays as written."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    kept = [
        p
        if any(line.startswith(("- ", " ")) for line in p.splitlines()[1:])
        else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    ]
    return "\n\n".join(kept)


# The commands that read saved runs: they never run code, and answer any input in one line.
READERS = (
    judge.compare,
    analysis.show,
    analysis.table,
    analysis.plot,
    analysis.fit,
    analysis.report,
    machine.predict,
)
for command in (
    sweeping.sweep,
    judge.compare,
    ab.ab,
    analysis.show,
    analysis.table,
    analysis.plot,
    analysis.fit,
    analysis.report,
    analysis.pe,
    analysis.env,
    catalog.layers,
    machine.machine,
    machine.predict,
):
    app.command(cls=Command, help=help_text(command.__doc__))(
        handles_errors(command, reads_runs=command in READERS)
    )


history_app = typer.Typer(
    help="Runs across commits: file a run (add), find the change points of every series (the "
    "command alone), publish them as a static site (publish).",
    add_completion=False,
    pretty_exceptions_enable=False,
    invoke_without_command=True,
    cls=Group,
)
history_app.callback(invoke_without_command=True, help=help_text(history.show.__doc__))(
    handles_errors(history.show, reads_runs=True)
)
history_app.command("add", cls=Command, help=help_text(history.add.__doc__))(
    handles_errors(history.add, reads_runs=True)
)
history_app.command("publish", cls=Command, help=help_text(history.publish_site.__doc__))(
    handles_errors(history.publish_site, reads_runs=True)
)
app.add_typer(history_app, name="history")
app.command("bisect", cls=Command, help=help_text(history.bisect_command.__doc__))(
    handles_errors(history.bisect_command)
)


# --help off a terminal (piped into a pager or a file) is told no width, and rich takes 80
# columns: the options' help column then cut long words ("path/to/file.py:fact…"; 8 cuts in
# sweep's help, 10 in ab's). At this width every command's help is whole.
OFF_TERMINAL_WIDTH = 120


def main() -> NoReturn:
    # Kineto, the profiler's tracer, logs two lines a profiling session to stderr, through the
    # progress lines; set here, before any session, so every worker process inherits it.
    os.environ.setdefault("KINETO_LOG_LEVEL", "10")
    helping = "--help" in sys.argv or "-h" in sys.argv  # the width sizes error panels too
    if helping and not os.environ.get("COLUMNS") and not sys.stdout.isatty():
        import typer.rich_utils

        if typer.rich_utils.MAX_WIDTH is None:  # TERMINAL_WIDTH says otherwise
            typer.rich_utils.MAX_WIDTH = OFF_TERMINAL_WIDTH
    try:
        app()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


def running_threads() -> int:
    """Threads other than this one that the interpreter would wait for (not daemons)."""
    me = threading.current_thread()
    return sum(t is not me and not t.daemon and t.is_alive() for t in threading.enumerate())


def exit_now(
    code: object,
    *,
    finish: Callable[[], None] = atexit._run_exitfuncs,
    end: Callable[[int], NoReturn] = os._exit,
    running: Callable[[], int] = running_threads,
) -> NoReturn:
    """End the command with ``code`` (``SystemExit``'s: None, a number or a message) once
    its atexit handlers have run and its output is flushed, without the interpreter's
    teardown of every module: after torch and matplotlib that took 0.4-0.5 s of every command
    on this project's 2-core CPU (2026-12-01), with nothing left to write (every results file
    is written and closed in a ``with``; what a C library holds in its own buffers is not
    flushed). Where a thread that is not a daemon still runs, the interpreter ends as usual,
    since it waits for it."""
    if running():
        raise SystemExit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # a message, as sys.exit("...") gives: printed, status 1
        print(code, file=sys.stderr)
        status = 1
    finish()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): 120 as Python's own exit,
            status = status or 120  # unless the command had failed already
    end(status)
