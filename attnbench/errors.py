"""The one domain exception: the core raises it; the CLI maps it to a message and exit code."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AttnbenchError(Exception):
    """A problem the user can fix (bad input, unavailable device, unwritable folder).

    ``exit_code`` follows the usual CLI convention: 2 for usage errors.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class SweepInterrupted(AttnbenchError):
    """A sweep stopped by SIGINT or SIGTERM: every finished case is on disk in ``out_dir``."""

    def __init__(
        self, out_dir: str, done: int, total: int, signal_name: str, short: int = 0,
        upto: bool = False, flags: str = "",
    ) -> None:  # fmt: skip
        # "20 of 20 cases" read as finished where 12 still wanted timing rounds, and so did
        # "(20 of them short of their timing rounds)"; an auto sweep's total is the most it
        # may still measure
        most = "at most " if upto else ""
        begun = f" done and {short} begun, short of their timing rounds," if short else ""
        super().__init__(
            f"{signal_name}: stopped with {done - short} of {most}{total} cases{begun} in "
            f"{out_dir}; finish it with: attnbench sweep --resume {out_dir}{flags}",
            exit_code=signal_exit_code(signal_name),
        )
        self.out_dir, self.done, self.total = out_dir, done, total
        self.signal_name, self.short, self.upto = signal_name, short, upto

    def resumed_with(self, flags: str) -> SweepInterrupted:
        """The same stop, its --resume given the command-line flags a run does not record
        (--no-charts, --baseline): a resume without them drew the charts the first command
        declined, and left out its gate."""
        if not flags:
            return self
        return SweepInterrupted(
            self.out_dir, self.done, self.total, self.signal_name, self.short, self.upto, flags
        )


class SweepFailed(AttnbenchError):
    """A sweep an error stopped mid-run (a full disk, a worker lost): its finished cases are on
    disk in ``out_dir``, and its --resume line repeats what run.json does not record."""

    def __init__(
        self, cause: str, out_dir: str, done: int, exit_code: int, flags: str = ""
    ) -> None:
        super().__init__(
            f"{cause}; the {done} finished case(s) are saved: "
            f"attnbench sweep --resume {out_dir}{flags}",
            exit_code=exit_code,
        )
        self.cause, self.out_dir, self.done = cause, out_dir, done

    def resumed_with(self, flags: str) -> SweepFailed:
        """The same failure, its --resume given the flags a run does not record."""
        if not flags:
            return self
        return SweepFailed(self.cause, self.out_dir, self.done, self.exit_code, flags)


def signal_exit_code(signal_name: str) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended: 130 after
    SIGINT, 143 after SIGTERM (a CI runner's cancel, which read 130 as if typed Ctrl-C)."""
    return 143 if signal_name == "SIGTERM" else 130


class NothingToPlot(AttnbenchError):
    """A run with no chart's data (every line measured at one size): no retry draws one."""


# How alike a mistyped name must be to be offered: difflib's ratio. Click's parser suggests
# from 0.6, where ``--bogus`` read "(Possible options: --out)" and ``--layer`` "--layers, --yes".
SUGGEST_CUTOFF = 0.75


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'attention'?)" for a name close to one of ``choices``, else ""."""
    options = list(choices)
    close = difflib.get_close_matches(name, options, n=1, cutoff=SUGGEST_CUTOFF)
    # an abbreviation ("attn", "ssmscan") is too far by difflib's ratio: the shortest choice
    # that holds its letters in order
    spelled = [c for c in options if len(name) >= 3 and _in_order(name.lower(), c.lower())]
    found = close or sorted(spelled, key=len)[:1]
    return f" (did you mean {found[0]!r}?)" if found else ""


def _in_order(letters: str, word: str) -> bool:
    rest = iter(word)
    return all(char in rest for char in letters)


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
