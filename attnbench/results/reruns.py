"""A case's spread between sweeps on this machine, read from its earlier sweeps' times.

A case's rounds are processes seconds apart, and they share their sweep's moment: on this
project's shared 2-core VM the same grid swept twelve times, ten seconds apart, moved attention
at n = 2048 by 0.88-1.18x from sweep to sweep and conv at n = 512 by up to 11%, while each
sweep's rounds agreed within 2-3% (``benchmarks/coverage.py``). No spread inside one sweep can
show that. So each sweep leaves, per case, its log time and that log time's own variance
(``Entry``) in the cache (``run.reruns``); the next sweep records the entries it found in
run.json's ``reruns``, and its loader reads every case's between-sweep variance from them
and from its own (``estimators.between_sweeps``, moderated toward the machine's typical).
A run records what it was judged by, so it loads the same everywhere, later and elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from attnbench.estimators import (
    Between,
    Estimate,
    Prior,
    between_sweeps,
    moderated_between,
    prior_of,
)

Entry = tuple[float, float]  # a sweep's log time of a case, and its variance within the sweep


def rerun_key(
    row: Mapping[str, Any], config: Mapping[str, Any], environment: Mapping[str, Any]
) -> str:
    """What makes two sweeps' cases the same: the case (layer, sizes, dtype, device, mode),
    compiled or not, the layer's source (a plugin's file and its sha256: an edited layer is
    another), attnbench's commit where it runs from a checkout (a built-in layer changed by a
    commit is another), and the allocator state and timer the sweep measured with. The
    machine, torch's version and the thread count name the cache's file (``run.reruns``)."""
    parts = [
        _text(row.get("case_id")),
        f"compiled={_text(row.get('compiled'))}",
        _text(row.get("layer_source")),
        f"commit={_text(environment.get('git_commit'))}",
        f"allocator={_text(config.get('allocator'))}",
        f"timer={_text(config.get('timer'))}",
    ]
    return "|".join(parts)


def _text(value: Any) -> str:
    return "" if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def sweep_entry(found: Estimate) -> Entry | None:
    """What a sweep leaves of a case: over two or more rounds, none of them kept while read
    disturbed (a busy sweep's time is the neighbour's, and it is judged so already)."""
    if found.groups < 2 or found.disturbed > found.left_out:
        return None
    if not (found.center_s > 0 and math.isfinite(found.mean_variance)):
        return None
    return math.log(found.center_s), found.mean_variance


def betweens(
    own: Mapping[str, Entry | None], past: Mapping[str, Sequence[Entry]]
) -> dict[str, Between]:
    """Each case's spread between sweeps, by its key: from the earlier sweeps' entries and this
    sweep's own, shrunk toward the machine's typical (the median of the cases' own, where two or
    more have one, worth as many degrees of freedom as its sweeps give, up to 4); a case no
    earlier sweep measured takes the typical. Empty where no case was swept before: a first
    sweep's intervals hold its own processes only."""
    found = {
        key: between_sweeps([*past.get(key, ()), *([entry] if entry is not None else [])])
        for key, entry in own.items()
    }
    typical = prior_of([b.variance if b is not None else None for b in found.values()])
    sweeps = max((b.sweeps for b in found.values() if b is not None), default=0)
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


def parse_entries(raw: Any) -> dict[str, tuple[Entry, ...]]:
    """run.json's ``reruns`` (key: [[log time, variance], ...]); an entry that does not read as
    two finite numbers is dropped (a hand-edited file loses that entry, not the run)."""
    out: dict[str, tuple[Entry, ...]] = {}
    for key, entries in (raw if isinstance(raw, dict) else {}).items():
        kept = []
        for entry in entries if isinstance(entries, list) else []:
            try:
                x, w = float(entry[0]), float(entry[1])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            if math.isfinite(x) and math.isfinite(w) and w >= 0:
                kept.append((x, w))
        if kept:
            out[str(key)] = tuple(kept)
    return out
