"""The one way attnbench runs git: a command's output in a checkout, or one line saying why not
(the run's commit, a history's ancestry, bisect's worktrees)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from attnbench.errors import AttnbenchError


def run_git(where: Path, *args: str, timeout: float = 120) -> str:
    """A git command's output in the checkout holding ``where``; an ``AttnbenchError`` of one
    line where git is missing, times out or fails (its last line of stderr)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise AttnbenchError(f"git {args[0]} in {str(where)!r} failed: {exc}") from None
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise AttnbenchError(f"git {' '.join(args[:2])} in {str(where)!r}: {why}")
    return done.stdout


def git_output(where: Path, *args: str, timeout: float = 30) -> str | None:
    """``run_git``'s output, or None where git, the checkout or the answer is not there (for
    what a run records when it can, and goes without when it cannot)."""
    try:
        return run_git(where, *args, timeout=timeout)
    except AttnbenchError:
        return None
