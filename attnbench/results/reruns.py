"""A case's spread between sweeps on this machine, read from its earlier sweeps' times.

A case's rounds are processes seconds apart, and they share their sweep's moment: on this
project's shared 2-core VM the same grid swept twelve times, ten seconds apart, moved attention
at n = 2048 by 0.88-1.18x from sweep to sweep and conv at n = 512 by up to 11%, while each
sweep's rounds agreed within 2-3% (``benchmarks/coverage.py``). No spread inside one sweep can
show that. So each sweep leaves, per case, its log time, that log time's own variance and
the sweep's typical reference (``Entry``: the machine's state, ``typical_reference``) in the cache
(``run.reruns``); the next sweep records the entries it found in run.json's ``reruns``, and
its loader reads every case's between-sweep variance from those of its state and its own
(``estimators.between_sweeps``, moderated toward the machine's typical). A run records what
it was judged by, so it loads the same everywhere, later and elsewhere.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from attnbench.estimators import (
    QUIET_FACTOR,
    Between,
    Estimate,
    between_sweeps,
    moderated_between,
    quiet_level,
    quieter,
)
from attnbench.priors import Prior, typical_of

# A sweep's log time of a case, that log time's variance within the sweep, and the sweep's
# typical reference (``typical_reference``, seconds; nan: not read): the machine's state it ran in.
Entry = tuple[float, float, float]


@dataclass(frozen=True)
class Elsewhere:
    """What earlier sweeps found in another state of the machine (their typical reference over
    ``QUIET_FACTOR`` from this sweep's): how many, their reference over this sweep's, and each
    case's time there over its time here, by key (the median of their entries)."""

    sweeps: int
    level_ratio: float
    ratios: Mapping[str, float] = field(default_factory=dict)


def round_references(samples: pd.DataFrame) -> list[float]:
    """A run's references, one a round (each of its samples carries its round's), positive and
    finite; none where none was read."""
    if "reference_s" not in samples or samples.empty:
        return []
    rounds = samples.drop_duplicates(["case_id", "round"])["reference_s"].dropna()
    return [float(r) for r in rounds if r > 0 and math.isfinite(r)]


def run_level(samples: pd.DataFrame) -> float:
    """A run's quiet reference, its rounds' fast end (``estimators.quiet_level``), which its
    rounds are judged disturbed against (nan: no reference read)."""
    return quiet_level(round_references(samples))


def typical_reference(samples: pd.DataFrame) -> float:
    """The state of the machine a run ran in: its rounds' typical reference (their median, a
    reading, never between two; nan: none read). Not its fast end (``run_level``): on this
    project's VM one run in a batch of eight read 303 µs in most rounds, the slower state's,
    and 211 µs at its fast end, so the fast end put it in the faster state with the others and
    held its lstm, 2x slower, to their spread (the 22:16 batch in docs/metrics.md)."""
    found = round_references(samples)
    return statistics.median_low(found) if found else math.nan


def judging_level(level: float, machine_quiet: float | None) -> float | None:
    """The quiet level a run's rounds are judged disturbed against: its own (``run_level``;
    nan: none read), or the machine's (``run.quiet``) where that was quieter (None: neither)."""
    return quieter(None if math.isnan(level) else level, machine_quiet)


def same_state(level: float, other: float) -> bool:
    """Whether two sweeps ran in one state of the machine: their states
    (``typical_reference``) within ``QUIET_FACTOR`` of each other (either not read: taken as
    one)."""
    known = all(x > 0 and math.isfinite(x) for x in (level, other))
    return not known or max(level, other) / min(level, other) <= QUIET_FACTOR


def code_of(environment: Mapping[str, Any]) -> str | None:
    """The code a run measured with: the digest of attnbench's measuring source
    (``environment.code_digest``), or, where a run holds none, its commit."""
    digest = environment.get("code_digest")
    if isinstance(digest, str) and digest:
        return f"code={digest}"
    commit = environment.get("git_commit")
    return f"commit={commit}" if isinstance(commit, str) and commit else None


def rerun_key(
    row: Mapping[str, Any], config: Mapping[str, Any], environment: Mapping[str, Any]
) -> str:
    """What makes two sweeps' cases the same: the case (layer, sizes, dtype, device, mode),
    compiled or not, the layer's source (a plugin's file and its sha256: an edited layer is
    another), attnbench's own code (``code_of``: a built-in layer or the timing loop edited,
    committed or not, is another; a commit of docs is not), and the allocator state and timer
    the sweep measured with. The machine, torch's version and the thread count name the cache's
    file (``run.reruns``)."""
    parts = [
        _text(row.get("case_id")),
        f"compiled={_text(row.get('compiled'))}",
        _text(row.get("layer_source")),
        code_of(environment) or "commit=",
        f"allocator={_text(config.get('allocator'))}",
        f"timer={_text(config.get('timer'))}",
    ]
    return "|".join(parts)


def _text(value: Any) -> str:
    return "" if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def sweep_entry(found: Estimate, level: float) -> Entry | None:
    """What a sweep leaves of a case, with the sweep's state ``level``
    (``typical_reference``): over two or more rounds, none of them kept while read disturbed
    (a busy sweep's time is the neighbour's, and it is judged so already)."""
    if found.groups < 2 or found.disturbed > found.left_out:
        return None
    if not (found.center_s > 0 and math.isfinite(found.mean_variance)):
        return None
    return math.log(found.center_s), found.mean_variance, level


def elsewhere(
    own: Mapping[str, Entry | None], past: Mapping[str, Sequence[Entry]], level: float
) -> Elsewhere | None:
    """The earlier sweeps that ran in another state of the machine than this one (``level``),
    and how far they put each case; None where all ran in this one."""
    other = {key: [e for e in past.get(key, ()) if not same_state(level, e[2])] for key in own}
    levels = [e[2] for entries in other.values() for e in entries]
    if not levels:
        return None
    ratios = {
        key: math.exp(statistics.median(e[0] for e in entries) - entry[0])
        for key, entries in other.items()
        if entries and (entry := own[key]) is not None
    }
    sweeps = max(len(entries) for entries in other.values())
    return Elsewhere(sweeps, statistics.median(levels) / level, ratios)


@dataclass(frozen=True)
class Moved:
    """How far this sweep moved its cases together against this machine's earlier sweeps of
    the same code in the same state: the median of its cases' ratios to their earlier mean,
    over how many cases, how many of them moved the way the median did, and how many earlier
    sweeps at the most a case was compared with."""

    ratio: float
    cases: int
    same_way: int
    sweeps: int


def moved(
    own: Mapping[str, Entry | None], past: Mapping[str, Sequence[Entry]], level: float
) -> Moved | None:
    """The sweep's shared move (``Moved``) where one case or more was swept before in its
    state: a neighbour that slows the whole sweep without slowing the machine's reference
    moves every case one way, where the sweeps' own moments scatter them both ways."""
    moves, sweeps = [], 0
    for key, entry in own.items():
        before = [x for x, _, other in past.get(key, ()) if same_state(level, other)]
        if entry is None or not before:
            continue
        moves.append(entry[0] - statistics.fmean(before))
        sweeps = max(sweeps, len(before))
    if not moves:
        return None
    middle = statistics.median(moves)
    same_way = sum(m * middle > 0 for m in moves)
    return Moved(math.exp(middle), len(moves), same_way, sweeps)


def betweens(
    own: Mapping[str, Entry | None],
    past: Mapping[str, Sequence[Entry]],
    level: float,
    other_code: Mapping[str, Sequence[Entry]] | None = None,
) -> dict[str, Between]:
    """Each case's spread between sweeps, by its key: from the earlier sweeps that ran in this
    sweep's state of the machine (``same_state`` with its state ``level``, ``typical_reference``)
    and this sweep's own, shrunk toward the machine's typical (the median of the cases' own, where
    two or more have one, worth as many degrees of freedom as its sweeps give, up to 4); a case no
    earlier sweep measured takes the typical. The typical also reads the cases this machine swept
    that this sweep did not (``past``'s other keys: an edited plugin's, other lengths) and those it
    swept with other attnbench code (``other_code``), each key's sweeps apart: a case's time is the
    code's, but how far a sweep's moment moves it is the machine's, so the first sweep after an edit
    or a pull holds it too. Empty where no case was swept before: a first sweep's intervals hold its
    own processes only.

    A machine that changes state between sweeps for minutes at a time (this project's VM: its
    reference 208 or 310 µs, lstm 0.45x or 1x, conv 0.85x or 1x) puts a case's sweeps in two
    clusters; held to the sweeps of its own state, 91-92% of intervals held a later run in
    that state (at ±8-10%), where over both they held 66-88% at ±22-27% (``elsewhere`` says
    how far the other state puts each case)."""
    found = {
        key: _between(level, [*past.get(key, ()), *([entry] if entry is not None else [])])
        for key, entry in own.items()
    }
    # the machine's other cases: this code's not in this sweep (an edited plugin's old key
    # among them) and other code's
    others = {**(other_code or {}), **{k: v for k, v in past.items() if k not in own}}
    elsewhere_found = [_between(level, entries) for entries in others.values()]
    machine = [b for b in [*found.values(), *elsewhere_found] if b is not None]
    typical = typical_of([b.variance for b in machine])
    sweeps = max((b.sweeps for b in machine), default=0)
    if typical is not None:  # the cases' moments are mostly the sweeps' own, shared: the
        # typical knows no more than its sweeps do (4 degrees of freedom read 77% for 95% at
        # two sweeps, in a simulation of eight cases sharing a 5% moment)
        typical = Prior(typical.variance, min(typical.df, sweeps - 1.0))
    out = {}
    for key, own_between in found.items():
        moderated = moderated_between(own_between, typical)
        if moderated is not None:
            out[key] = moderated
    return out


def _between(level: float, entries: Sequence[Entry]) -> Between | None:
    """A case's spread between its sweeps in the state of the machine ``level`` says."""
    return between_sweeps([(x, w) for x, w, other in entries if same_state(level, other)])


@dataclass(frozen=True)
class SweepsFound:
    """What a run reads of this machine's sweeps: each case's spread between them and how far
    another state of the machine put it, by case id, and what the run leaves of each case for
    the next sweep, by layer and key."""

    between: Mapping[str, Between] = field(default_factory=dict)
    entries: Mapping[str, Mapping[str, Entry]] = field(default_factory=dict)
    elsewhere: Elsewhere | None = None
    moved: Moved | None = None


def read_sweeps(
    cases: Mapping[str, tuple[Mapping[str, Any], Estimate]],
    record: Any,
    level: float,
    fast_end: float = math.nan,
) -> SweepsFound:
    """A run's cases (by case id: their row and their estimate over this run's rounds) read
    against the earlier sweeps its ``record`` (a ``RunRecord``) holds, in the state of the
    machine its typical reference ``level`` (``typical_reference``) says. A run whose fast end
    (``run_level``) reads another state than its typical ran in both: it leaves nothing, as
    its times may blend them (the rounds judged against its state keep those faster than it)."""
    keys = {
        case: rerun_key(row, record.config, record.environment) for case, (row, _) in cases.items()
    }
    both = not same_state(level, fast_end)
    own = {
        keys[case]: None if both else sweep_entry(found, level)
        for case, (_, found) in cases.items()
    }
    spread = betweens(own, record.reruns, level, record.reruns_other)
    other = elsewhere(own, record.reruns, level)
    left: dict[str, dict[str, Entry]] = {}
    for case, (row, _) in cases.items():
        entry = own[keys[case]]
        if entry is not None:
            left.setdefault(str(row.get("layer")), {})[keys[case]] = entry
    if other is not None:  # its ratios by case id, as the rest
        by_key = {key: case for case, key in keys.items()}
        other = replace(other, ratios={by_key[k]: r for k, r in other.ratios.items()})
    between = {case: spread[key] for case, key in keys.items() if key in spread}
    return SweepsFound(between, left, other, moved(own, record.reruns, level))


def entry_json(entry: Entry) -> list[float | None]:
    """An entry as run.json and the cache hold it (a reference not read: null)."""
    x, w, level = entry
    return [x, w, level if math.isfinite(level) else None]


# What an entry may hold: a log time of a call between a picosecond and a day, a variance of
# that log under 1 (a sweep's own rounds e-fold apart), a reference under 10 s. Anything else
# is a hand-edited or corrupt file, not a sweep: one such entry read 800 for a log time and
# ended a sweep in an overflow; a variance of 1e300 made the spread between sweeps 0.
LOG_TIME_RANGE = (math.log(1e-12), math.log(86400.0))
MOST_VARIANCE = 1.0
MOST_REFERENCE_S = 10.0


def _plausible(x: float, w: float, level: float) -> bool:
    low, high = LOG_TIME_RANGE
    reference = math.isnan(level) or 0 < level < MOST_REFERENCE_S
    return low <= x <= high and 0 <= w < MOST_VARIANCE and reference


def parse_entries(raw: Any) -> dict[str, tuple[Entry, ...]]:
    """run.json's ``reruns`` (key: [[log time, variance, the sweep's state], ...]); an entry that
    does not read as two numbers and a reference (a number or null) in their plausible ranges
    is dropped (a hand-edited file loses that entry, not the run)."""
    out: dict[str, tuple[Entry, ...]] = {}
    for key, entries in (raw if isinstance(raw, dict) else {}).items():
        kept = []
        for entry in entries if isinstance(entries, list) else []:
            if not (isinstance(entry, list) and len(entry) == 3):
                continue
            try:
                x, w = float(entry[0]), float(entry[1])
                level = math.nan if entry[2] is None else float(entry[2])
            except (TypeError, ValueError, OverflowError):  # an integer past a float's range
                continue
            if _plausible(x, w, level):
                kept.append((x, w, level))
        if kept:
            out[str(key)] = tuple(kept)
    return out
