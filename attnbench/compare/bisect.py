"""``attnbench bisect GOOD BAD``: the first commit where a case got slower, found by races.

Each commit is checked out in a git worktree of its own (the user's checkout, its index and
its files are never touched) and raced against GOOD with ``ab``'s gate: both sides in worker
processes whose Python path starts with their worktree, a layer given as a file of the
repository (``layers.py:factory``) read from each side's worktree. BAD is raced first (it must
be slower than GOOD, or there is nothing to find), then the commits between are halved: about
log2 of them races in all, as ``git bisect`` and asv's ``find`` do.

A race has three outcomes, not two: slower (a case's verdict is a regression), as fast (every
case judged unchanged or faster), or undecided (a move past the threshold that could be noise,
too few pairs, a throttled GPU). An undecided race is raced again with twice the pairs; one
still undecided stops the search with the commits it narrowed to, since counting it as fast
named a docs-only commit as the culprit of a 2.3x step on a busy machine.
"""

from __future__ import annotations

import contextlib
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.compare.runs import compare_runs
from attnbench.compare.verdicts import IMPROVEMENT, NOT_COMPARED, REGRESSION, UNCHANGED
from attnbench.errors import AttnbenchError
from attnbench.layers import plugins
from attnbench.run.ab import ABSides, run_ab
from attnbench.run.executors.process import ForkExecutor
from attnbench.thresholds import DEFAULT_THRESHOLDS, Thresholds, rounds_to_reach
from attnbench.vcs import run_git

SLOWER, AS_FAST, UNDECIDED = "slower", "as fast", "undecided"
# An undecided race is raced again this many times, each with twice the pairs of the last.
RETRIES = 1
UNDECIDED_EXIT = 3  # bisect's exit status when a race stays undecided (2 is bad input)


@dataclass(frozen=True)
class Race:
    """One commit raced against GOOD: the slowest case's paired ratio, its one-sided p, the
    race's outcome (``SLOWER``, ``AS_FAST``, ``UNDECIDED``) and the pairs it ran."""

    commit: str
    subject: str
    ratio: float
    p_value: float
    outcome: str
    pairs: int = 0

    @property
    def slower(self) -> bool:
        return self.outcome == SLOWER

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "slower": self.slower}


def outcome_of(verdicts: Sequence[str], broke: bool = False) -> str:
    """A race's outcome from its cases' time verdicts: slower where any regressed, or a case
    broke (``broke``: it measured at GOOD and fails at the commit, a regression under every
    gate, whose time is not compared); as fast
    where every case compared reads unchanged or faster (its interval short of the
    threshold); undecided otherwise."""
    if broke or REGRESSION in verdicts:
        return SLOWER
    compared = [v for v in verdicts if v != NOT_COMPARED]
    if compared and all(v in (UNCHANGED, IMPROVEMENT) for v in compared):
        return AS_FAST
    return UNDECIDED


class Undecided(AttnbenchError):
    """A race that stayed undecided: the search stops with the commits it narrowed to
    (``candidates``, oldest first: the first slower commit is one of them) and the races run
    so far, which ``bisect --json`` still prints."""

    def __init__(
        self,
        message: str,
        candidates: Sequence[str] = (),
        races: Sequence[Race] = (),
    ) -> None:
        super().__init__(message, exit_code=UNDECIDED_EXIT)
        self.candidates = tuple(candidates)
        self.races = tuple(races)


def search(
    path: Sequence[str],
    race: Callable[[str, int], Race],
    good: str,
    retries: int = RETRIES,
) -> str:
    """The first commit of ``path`` (oldest first, BAD last) whose race reads slower, every
    commit before it as fast: BAD first, then halving. ``race(commit, attempt)`` races one
    commit, attempt 0 first; an undecided one is raced again up to ``retries`` times."""

    def decided(commit: str) -> Race:
        for attempt in range(retries + 1):
            found = race(commit, attempt)
            if found.outcome != UNDECIDED:
                return found
        return found

    first = decided(path[-1])
    if first.outcome == AS_FAST:
        raise AttnbenchError(
            f"{path[-1][:10]} is not slower than {good[:10]} (x{first.ratio:.3f}, "
            f"p = {first.p_value:.2g}): nothing to bisect"
        )
    if first.outcome == UNDECIDED:
        raise Undecided(
            f"{path[-1][:10]} against {good[:10]} stayed undecided over {first.pairs} pairs "
            f"(x{first.ratio:.3f}, p = {first.p_value:.2g}): give more --processes, on a "
            "quieter machine, or a larger step",
            candidates=path,
        )
    low, high = -1, len(path) - 1  # path[low] is as fast as GOOD (-1: GOOD), path[high] slower
    while high - low > 1:
        middle = (low + high) // 2
        found = decided(path[middle])
        if found.outcome == UNDECIDED:
            after = good if low < 0 else path[low]
            raise Undecided(
                f"{path[middle][:10]} stayed undecided over {found.pairs} pairs "
                f"(x{found.ratio:.3f}, p = {found.p_value:.2g}): the first slower commit is "
                f"one of the {high - low} after {after[:10]} up to {path[high][:10]}; bisect "
                f"those with more --processes, or on a quieter machine",
                candidates=path[low + 1 : high + 1],
            )
        if found.slower:
            high = middle
        else:
            low = middle
    return path[high]


@dataclass(frozen=True)
class Bisected:
    """The first slower commit, every race run, and how many commits lay between."""

    first_bad: str
    subject: str
    races: tuple[Race, ...]
    commits: int  # in GOOD..BAD (BAD included)


def commits_between(repo: Path, good: str, bad: str) -> tuple[str, list[str]]:
    """GOOD's full hash and the commits after it up to BAD (oldest first, BAD last)."""
    if run_git(repo, "status", "--porcelain", "--untracked-files=no").strip():
        raise AttnbenchError(
            f"the checkout at {str(repo)!r} has uncommitted changes: commit or stash them "
            "(bisect races commits, each in a worktree of its own, and leaves yours untouched)"
        )
    full = []
    for given in (good, bad):
        try:
            full.append(run_git(repo, "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}"))
        except AttnbenchError:
            raise AttnbenchError(f"{given!r} is no commit of {str(repo)!r}") from None
    full = [f.strip() for f in full]
    path = run_git(
        repo, "rev-list", "--ancestry-path", "--reverse", f"{full[0]}..{full[1]}"
    ).split()
    if not path:
        raise AttnbenchError(f"{bad} does not come after {good}: give GOOD, then a later BAD")
    return full[0], path


@contextlib.contextmanager
def worktrees(repo: Path) -> Iterator[Callable[[str], Path]]:
    """Worktrees of ``repo`` made on demand, one a commit, all removed at the end."""
    made: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="attnbench-bisect-") as root:

        def tree(commit: str) -> Path:
            if commit not in made:
                path = Path(root) / commit[:12]
                run_git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
                made[commit] = path
            return made[commit]

        try:
            yield tree
        finally:
            for path in made.values():
                with contextlib.suppress(AttnbenchError):
                    run_git(repo, "worktree", "remove", "--force", str(path))
            with contextlib.suppress(AttnbenchError):
                run_git(repo, "worktree", "prune")


def python_at(tree: Path, folder: Path) -> str:
    """An interpreter (this one) whose Python path starts with ``tree``: a script in
    ``folder``, so a worker of ``ab`` imports that commit's modules."""
    script = folder / f"python-{tree.name}"
    path = f'PYTHONPATH="{tree}${{PYTHONPATH:+:$PYTHONPATH}}"'
    script.write_text(f'#!/bin/sh\n{path} exec "{sys.executable}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def layers_at(layers: Sequence[str], repo: Path, tree: Path, commit: str) -> list[str]:
    """The layers as a side at ``tree`` names them. A file of the repository
    (``path.py:factory``, relative to it or inside it) is read from the worktree, through a
    copy beside it named for the commit (``path__<commit>.py``): two sides' files of one name
    would be one layer name in the driver."""
    out = []
    for named in layers:
        spec = plugins.split_alias(named)[1]
        path, colon, factory = spec.rpartition(":")
        if colon and path.endswith(".py"):
            file = Path(path)
            inside = file if not file.is_absolute() else file.resolve().relative_to(repo.resolve())
            source = tree / inside
            if not source.is_file():
                raise AttnbenchError(f"{inside} is not in the repository at {commit[:10]}")
            copy = source.with_name(f"{source.stem}__{commit[:10]}.py")
            copy.write_bytes(source.read_bytes())
            out.append(f"{copy}:{factory}")  # a NAME= dropped: each side's copy names its own
        else:
            out.append(named)
    return out


def bisect(
    good: str,
    bad: str,
    options: Mapping[str, Any],
    *,
    repo: Path = Path("."),
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    on_race: Callable[[Race], None] | None = None,
) -> Bisected:
    """The first commit after GOOD up to BAD whose cases ``ab`` calls a regression against
    GOOD. ``options`` are the races' grid options (layers, n, d, device, time budget...)."""
    try:
        repo = Path(run_git(Path(repo), "rev-parse", "--show-toplevel").strip())
    except AttnbenchError:
        raise AttnbenchError(f"{str(repo)!r} is not in a git repository (--repo)") from None
    layers = [t.strip() for t in str(options.get("layers") or "").split(",") if t.strip()]
    if not layers:
        raise AttnbenchError("give the layer(s) to race: --layers NAME or --layers file.py:factory")
    good_full, path = commits_between(repo, good, bad)
    races: list[Race] = []
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(worktrees(repo))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnbench-races-")))
        base = tree(good_full)
        base_python = python_at(base, folder)
        # GOOD's fork servers serve every race: their import is paid once, not once a race.
        # Each job is still a fresh fork; what the races share is the servers' layout, whose
        # speed (2-3% between servers here) is then the same on GOOD's side of every race.
        kept = ForkExecutor(base_python, label=f"the base side ({base_python})")
        stack.callback(kept.close)

        processes = int(options.get("processes") or rounds_to_reach(thresholds.alpha))

        def race(commit: str, attempt: int) -> Race:
            here = tree(commit)
            pairs = processes * 2**attempt
            current = {
                **options,
                "layers": ",".join(layers_at(layers, repo, here, commit)),
                "processes": pairs,
            }
            sides = ABSides(
                base_layers=layers_at(layers, repo, base, good_full),
                base_python=base_python,
                current_python=python_at(here, folder),
            )
            run = run_ab(
                current,
                folder / f"ab-{len(races)}",
                sides=sides,
                alpha=thresholds.alpha,
                started={"base": kept},
            )
            judged = compare_runs(run.base, run.current, thresholds, pairs=run.pairs, paired=True)
            worst = judged.times.sort_values("ratio_judged", ascending=False).iloc[0]
            subject = run_git(repo, "show", "-s", "--format=%s", commit).strip()
            found = Race(
                commit,
                subject,
                float(worst["ratio_judged"]),
                float(worst["p_value"]),
                outcome_of(
                    list(judged.times["verdict"]),
                    broke=bool((judged.times["status_verdict"] == REGRESSION).any()),
                ),
                pairs,
            )
            races.append(found)
            if on_race is not None:
                on_race(found)
            return found

        try:
            first = search(path, race, good_full)
        except Undecided as stopped:
            raise Undecided(str(stopped), stopped.candidates, races) from None
    subject = next(r.subject for r in races if r.commit == first)
    return Bisected(first, subject, tuple(races), len(path))


__all__ = [
    "AS_FAST", "SLOWER", "UNDECIDED", "Bisected", "Race", "Undecided", "bisect",
    "commits_between", "layers_at", "outcome_of", "search",
]  # fmt: skip
