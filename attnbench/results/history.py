"""A history of runs across commits: one JSON file a run, filed under its machine.

``attnbench history add RUN`` files a results folder in a history folder that a CI job can
cache or commit (a results branch): ``<history>/<machine>/<commit>-<run start>.json``, each
holding the run's commit, the series it belongs to (machine, device, dtype, allocator state,
mode, batch) and every case's time with its interval and exact counts. Reading a history reads
its JSON and asks git for the commits' ancestry (their order); it runs no code. Runs of
different machines or series are never mixed in one series.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.metrics import EXACT_METRICS
from attnbench.results.run import RunResults
from attnbench.schema import Status
from attnbench.storage import write_text_atomic
from attnbench.vcs import git_output

SCHEMA = "attnbench-history/1"
# Each case's figures a history keeps: the time with its interval, and the exact counts.
CASE_FIELDS = ("time_s", "time_ci_low_s", "time_ci_high_s")
EXACT_FIELDS = tuple(m.column for m in EXACT_METRICS)
# What a series is, beside its machine: a run of another device, dtype, allocator state, mode,
# batch or thread count is another series (the CPU's default went from torch's threads to one
# on 2026-11-30: a history across that commit would otherwise read a step in every case).
SERIES_KEYS = ("device_name", "dtype", "allocator", "mode", "batch", "threads")
# A commit's full name, SHA-1 or SHA-256: a shorter name is not looked up (it may be ambiguous).
FULL_HASH = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


def _threads(recorded: Any) -> int | str | None:
    """A run's thread count as a series key: an int, the counts of a mixed Ray cluster's
    workers as text ("2,4"), None where the run names none."""
    if isinstance(recorded, list):
        return ",".join(str(t) for t in recorded)
    return int(recorded) if isinstance(recorded, int | float) else None


@dataclass(frozen=True)
class Filed:
    """Where ``add_run`` filed a run, and under what."""

    path: Path
    machine: str
    commit: str
    dirty: bool = False  # measured on a checkout with changes not committed


@dataclass(frozen=True)
class LoadedHistory:
    """A history's runs, one row a case a run, oldest commit first (column ``order``); and,
    where the order fell back to commit dates, why."""

    frame: pd.DataFrame
    warnings: tuple[str, ...]


def machine_name(environment: Mapping[str, Any]) -> str:
    """A machine's name from a run's environment: its CPU model, core count and device."""
    cpu = str(environment.get("cpu_model") or "cpu")
    cores = environment.get("cpu_count")
    device = str(environment.get("device_name") or environment.get("device") or "")
    parts = [cpu, f"{cores} cores" if cores else "", device if device != cpu else ""]
    return " / ".join(p for p in parts if p)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "machine"


def git_commit_info(commit: str, repo: Path) -> tuple[str, str, str] | None:
    """(full hash, committer date ISO 8601, subject) of ``commit`` in ``repo``; None where git
    or the commit is not there."""
    found = git_output(repo, "show", "-s", "--format=%H%n%cI%n%s", commit)
    lines = (found or "").splitlines()
    if len(lines) < 2:
        return None
    return lines[0], lines[1], lines[2] if len(lines) > 2 else ""


def entry_of(
    run: RunResults, *, commit: str | None = None, machine: str | None = None, repo: Path
) -> dict[str, Any]:
    """The history entry of a run: its commit (``commit``, else the one run.json records),
    its machine (``machine``, else named from its environment) and its cases."""
    if run.unfinished:  # its missing cases would read as gone at this commit
        raise AttnbenchError(f"{str(run.path)!r} is {run.unfinished}, then file it")
    record = run.record
    env = record.environment
    given = commit or env.get("git_commit")
    if not given:
        raise AttnbenchError(
            f"{str(run.path)!r} records no git commit: give the commit it measured (--commit)"
        )
    found = git_commit_info(str(given), repo)
    if found is None and git_output(repo, "rev-parse", "--git-dir", timeout=10) is not None:
        # a run filed under a commit its repository lacks reads as one point of its own (a
        # series of them as one commit), with no date to order it by
        whose = "given" if commit else "that its run.json records"
        raise AttnbenchError(
            f"commit {str(given)!r} ({whose}) is not in the git repository {str(repo)!r}: "
            "give the commit the run measured (--commit) and its repository (--repo)"
        )
    full, when, subject = found if found else (str(given), str(run.meta.get("start_time")), "")
    config = record.config
    series = {
        "device_name": env.get("device_name") or "",
        "dtype": config.get("dtype"),
        "allocator": run.allocator,
        "mode": config.get("mode"),
        "batch": config.get("batch"),
        "threads": _threads(env.get("torch_threads")),  # the count it ran on
    }
    cases = []
    for row in run.frame[run.frame["status"] == Status.OK].itertuples(index=False):
        values = row._asdict()
        case = {
            "case_id": values["case_id"],
            "layer": values["layer"],
            "n": int(values["n"]),
            "d": int(values["d"]),
        }
        for name in (*CASE_FIELDS, *EXACT_FIELDS):
            value = values.get(name)
            case[name] = None if value is None or pd.isna(value) else float(value)
        cases.append(case)
    if not cases:
        raise AttnbenchError(f"{str(run.path)!r} has no case measured ok: nothing to file")
    return {
        "schema": SCHEMA,
        "commit": full,
        "commit_time": when,
        "subject": subject,
        "dirty": bool(env.get("git_dirty")) and not commit,
        "machine": machine or machine_name(env),
        "series": series,
        "run": {
            "start_time": run.meta.get("start_time"),
            "attnbench_version": env.get("attnbench_version"),
            "torch_version": env.get("torch_version"),
        },
        "cases": cases,
    }


def add_run(
    run: RunResults,
    history: Path,
    *,
    commit: str | None = None,
    machine: str | None = None,
    repo: Path = Path("."),
) -> Filed:
    """File ``run`` in the ``history`` folder (made if missing); the same run filed twice
    replaces its own file."""
    entry = entry_of(run, commit=commit, machine=machine, repo=repo)
    stamp = re.sub(r"[^0-9]", "", str(entry["run"]["start_time"] or ""))[:14] or "0"
    folder = Path(history) / slug(entry["machine"])
    path = folder / f"{entry['commit'][:12]}-{stamp}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(entry, indent=1) + "\n")
    except OSError as exc:
        raise AttnbenchError(f"cannot write to the history {str(history)!r}: {exc}") from None
    return Filed(path, entry["machine"], entry["commit"], bool(entry["dirty"]))


def _problem(entry: Any) -> str | None:
    """What is wrong with a history entry (None: nothing)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    if entry.get("schema") != SCHEMA:
        return f"schema {entry.get('schema')!r}, not {SCHEMA!r}"
    for key, kind in (
        ("commit", str),
        ("commit_time", str),
        ("machine", str),
        ("series", dict),
        ("cases", list),
    ):
        if not isinstance(entry.get(key), kind):
            return f"its {key!r} is missing or not a {kind.__name__}"
    for case in entry["cases"]:
        if not isinstance(case, dict) or not isinstance(case.get("case_id"), str):
            return "a case without a case_id"
        for name in (*CASE_FIELDS, *EXACT_FIELDS):
            value = case.get(name)
            if value is not None and not isinstance(value, int | float):
                return f"case {case['case_id']!r}: {name} is not a number"
    return None


def load_history(history: Path, *, repo: Path = Path(".")) -> LoadedHistory:
    """Every case of every run filed in ``history``, one row each (tidy): the run's commit,
    commit time, subject, machine and series columns, the case's columns; in the order of the
    commits in ``repo`` (``commit_order``). A file that is not a history entry is a one-line
    error naming it."""
    history = Path(history)
    if not history.is_dir():
        raise AttnbenchError(f"history {str(history)!r} is not a folder (attnbench history add)")
    if not Path(repo).exists():  # a mistyped --repo ordered the runs by date, and wrongly
        raise AttnbenchError(f"--repo {str(repo)!r} does not exist: name the git repository")
    rows: list[dict[str, Any]] = []
    for path in sorted(history.glob("*/*.json")):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise AttnbenchError(f"history file {str(path)!r} is unreadable: {first}") from None
        problem = _problem(entry)
        if problem:
            raise AttnbenchError(f"history file {str(path)!r} is malformed: {problem}")
        base = {
            "commit": entry["commit"],
            "commit_time": entry["commit_time"],
            "subject": entry.get("subject", ""),
            "machine": entry["machine"],
            "file": str(path),
            "run_start": _run_start(entry),
            **{key: entry["series"].get(key) for key in SERIES_KEYS},
        }
        # every metric a column, empty where a case holds none (a forward run's state)
        rows += [{**base, **dict.fromkeys(EXACT_FIELDS), **case} for case in entry["cases"]]
    if not rows:
        raise AttnbenchError(f"history {str(history)!r} holds no runs (attnbench history add)")
    frame = pd.DataFrame(rows)
    frame["when"] = pd.to_datetime(frame["commit_time"], utc=True, errors="coerce")
    frame["run_start"] = pd.to_datetime(frame["run_start"], utc=True, errors="coerce")
    # commits of one second (a scripted series) by when their runs started, where no ancestry
    # orders them
    by_date = frame.sort_values(["when", "run_start", "file"], kind="stable")
    by_date = by_date.drop_duplicates("commit")
    dated = [
        (str(commit), math.inf if pd.isna(when) else float(when.timestamp()))
        for commit, when in zip(by_date["commit"], by_date["when"], strict=True)
    ]
    order, warning = commit_order(dated, repo)
    frame["order"] = frame["commit"].map({commit: i for i, commit in enumerate(order)})
    frame = frame.sort_values(["order", "file"], kind="stable").reset_index(drop=True)
    return LoadedHistory(frame, () if warning is None else (warning,))


def _run_start(entry: Mapping[str, Any]) -> str | None:
    """When an entry's run started, as it recorded it (None: not recorded)."""
    run = entry.get("run")
    return str(run.get("start_time")) if isinstance(run, dict) and run.get("start_time") else None


def ancestry(commits: Iterable[str], repo: Path) -> list[str] | None:
    """Every commit of ``repo`` that ``commits`` descend from, themselves included, oldest
    first: no commit before its parents, otherwise by commit date (``git rev-list
    --date-order``, as asv numbers its revisions). Names that are not full hashes of commits
    there are left out; None where ``repo`` is not a git repository."""
    names = sorted({c for c in commits if FULL_HASH.fullmatch(c)})
    if not names:
        return None if git_output(repo, "rev-parse", "--git-dir", timeout=10) is None else []
    found = git_output(repo, "rev-list", "--date-order", "--reverse", "--ignore-missing", *names)
    return None if found is None else found.split()


def commit_order(dated: Sequence[tuple[str, float]], repo: Path) -> tuple[list[str], str | None]:
    """A history's commits, oldest first, and a warning where the order falls back to dates.

    ``dated`` is each commit with its commit time (seconds since the epoch, inf if unknown), in
    date order. Commits in ``repo`` keep its ancestry's order (dates cannot order commits made
    in one second: a scripted series, a rebase); the others are merged in by their dates."""
    lineage = ancestry((commit for commit, _ in dated), repo)
    if lineage is None:
        return [commit for commit, _ in dated], (
            f"{str(repo)!r} is not a git repository: runs are ordered by commit date, which "
            "cannot order commits made in the same second (--repo names the repository)"
        )
    rank = {commit: i for i, commit in enumerate(lineage)}
    placed = sorted((item for item in dated if item[0] in rank), key=lambda item: rank[item[0]])
    unplaced = [item for item in dated if item[0] not in rank]
    merged = heapq.merge(placed, unplaced, key=lambda item: item[1])
    order = [commit for commit, _ in merged]
    if not unplaced:
        return order, None
    names = ", ".join(commit[:10] for commit, _ in unplaced[:3])
    more = ", ..." if len(unplaced) > 3 else ""
    return order, (
        f"{len(unplaced)} of {len(dated)} commit(s) are not in the git repository "
        f"{str(repo)!r} ({names}{more}): their runs are ordered by commit date (a shallow "
        "clone? fetch the whole history, or name the repository with --repo)"
    )
