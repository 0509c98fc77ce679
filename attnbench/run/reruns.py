"""This machine's earlier sweeps of each case, kept in the cache (``results.reruns``).

A sweep reads them once at its start and records, in run.json's ``reruns``, those of its
layers' cases: what its intervals' spread between sweeps is read from. When it completes, it
leaves its own entry of each case here. One file per host, device, torch version and thread
count (``cache_key``); the latest ``KEEP`` sweeps of each case and the ``MOST_CASES`` cases
swept last are kept. A cache that is missing, unreadable or cannot be written is a sweep
without history, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.measure.machine.ceilings_file import cache_dir, cache_key
from attnbench.results.reruns import Entry, parse_entries
from attnbench.storage import write_text_atomic

KEEP = 10  # sweeps of a case whose entries are kept
MOST_CASES = 500  # cases of a layer kept, the ones swept last

Kept = dict[str, dict[str, tuple[Entry, ...]]]  # layer -> case key -> entries


def reruns_file(device: str, dtype: str, threads: int, folder: Path | None = None) -> Path:
    """Where this machine's entries are kept."""
    return (folder or cache_dir()) / "reruns" / f"{cache_key(device, dtype, threads)}.json"


def read_reruns(path: Path) -> Kept:
    """The entries kept at ``path``, by layer and case key (none where the file is missing or
    unreadable: a cache may be cleared or half-written)."""
    try:
        layers = json.loads(path.read_text())["layers"]
        return {str(layer): parse_entries(cases) for layer, cases in layers.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def of_layers(found: Kept, layers: Iterable[str]) -> dict[str, list[list[float]]]:
    """The entries of these layers' cases, as run.json's ``reruns`` holds them."""
    return {
        key: [list(entry) for entry in entries]
        for layer in layers
        for key, entries in found.get(layer, {}).items()
    }


def after(found: Kept, entries: Mapping[str, Mapping[str, Entry]]) -> Kept:
    """The kept entries with a sweep's own (by layer and case key) added: the latest ``KEEP``
    of each case, a layer's cases swept last moved to its end and its last ``MOST_CASES``
    kept."""
    out = {layer: dict(cases) for layer, cases in found.items()}
    for layer, own in entries.items():
        cases = out.setdefault(layer, {})
        for key, entry in own.items():
            cases[key] = (*cases.pop(key, ()), entry)[-KEEP:]
        out[layer] = dict(list(cases.items())[-MOST_CASES:])
    return out


def write_reruns(path: Path, entries: Mapping[str, Mapping[str, Entry]]) -> None:
    """Add a sweep's entries (by layer and case key) to the file at ``path``, read again now:
    another sweep may have written since this one began. A cache that cannot be written is
    skipped."""
    if not any(entries.values()):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = after(read_reruns(path), entries)
        layers = {
            layer: {key: [list(e) for e in found] for key, found in cases.items()}
            for layer, cases in kept.items()
        }
        write_text_atomic(path, json.dumps({"layers": layers}) + "\n")
    except (OSError, AttnbenchError):
        return
