"""This machine's earlier sweeps of each case, kept in the cache (``results.reruns``).

A sweep reads them once at its start and records, in run.json's ``reruns``, those of its
layers' cases: what its intervals' spread between sweeps is read from. When it completes, it
leaves its own entry of each case here, once (a completed run resumed does not again). One
file per host, device, torch version, thread count (``cache_key``) and attnbench commit (a
time measured by other code is another case's; ``KEEP_FILES`` of them, the latest written);
the latest ``KEEP`` sweeps of each case and the ``MOST_CASES`` cases of a layer swept last
are kept. Two sweeps that finish together take turns (a lock beside the file). A cache that
is missing, unreadable or cannot be written is a sweep without history, never an error.

A sweep also records the entries that the latest ``OTHER_FILES`` files of this machine's other
code hold of its layers (``other_code``, run.json's ``reruns_other``): the machine's typical
spread between sweeps reads them too, so the first sweep after an edit or a pull holds it.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.measure.machine.ceilings_file import cache_dir, cache_key
from attnbench.results.reruns import Entry, entry_json, parse_entries
from attnbench.storage import write_text_atomic

KEEP = 10  # sweeps of a case whose entries are kept
MOST_CASES = 200  # cases of a layer kept, the ones swept last
KEEP_FILES = 20  # files (each attnbench code's) kept, the latest written
OTHER_FILES = 3  # files of other code a sweep reads for the machine's typical, the latest

Kept = dict[str, dict[str, tuple[Entry, ...]]]  # layer -> case key -> entries


def reruns_file(
    device: str, dtype: str, threads: int, code: str | None, folder: Path | None = None
) -> Path:
    """Where this machine's entries of this attnbench's code are kept (``code`` as
    ``results.reruns.code_of`` names it; ``None``: not known)."""
    tag = (code or "release").split("=")[-1][:12] or "release"
    name = f"{cache_key(device, dtype, threads)}-{tag}.json"
    return (folder or cache_dir()) / "reruns" / name


def other_code(path: Path) -> Kept:
    """The entries kept beside ``path`` for this machine (its device, dtype, torch and
    threads: the part of the name before the code's tag) by other attnbench code: the latest
    ``OTHER_FILES`` written, and of each only the cases swept twice or more (a spread needs
    two)."""
    machine = path.stem.rsplit("-", 1)[0]
    try:
        found = [f for f in path.parent.glob("*.json") if f.stem.rsplit("-", 1)[0] == machine]
        found.sort(key=lambda f: f.stat().st_mtime, reverse=True)
    except OSError:
        return {}
    out: Kept = {}
    for other in [f for f in found if f != path][:OTHER_FILES]:
        for layer, cases in read_reruns(other).items():
            twice = {key: entries for key, entries in cases.items() if len(entries) >= 2}
            out.setdefault(layer, {}).update(twice)
    return out


def read_reruns(path: Path) -> Kept:
    """The entries kept at ``path``, by layer and case key (none where the file is missing or
    unreadable: a cache may be cleared or half-written)."""
    try:
        layers = json.loads(path.read_text())["layers"]
        return {str(layer): parse_entries(cases) for layer, cases in layers.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def of_layers(found: Kept, layers: Iterable[str]) -> dict[str, list[list[float | None]]]:
    """The entries of these layers' cases, as run.json's ``reruns`` holds them."""
    return {
        key: [entry_json(entry) for entry in entries]
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
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
            kept = after(read_reruns(path), entries)
            layers = {
                layer: {key: [entry_json(e) for e in found] for key, found in cases.items()}
                for layer, cases in kept.items()
            }
            write_text_atomic(path, json.dumps({"layers": layers}) + "\n")
        _prune(path.parent)
    except (OSError, AttnbenchError):
        return


def _prune(folder: Path) -> None:
    """Keep the ``KEEP_FILES`` files written last of each machine (each a code's), and their
    locks: an edit swept again writes a file, and must not push out another setup's."""
    files = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime, reverse=True)
    kept: dict[str, int] = {}
    for old in files:
        machine = old.stem.rsplit("-", 1)[0]
        kept[machine] = kept.get(machine, 0) + 1
        if kept[machine] > KEEP_FILES:
            old.unlink(missing_ok=True)
            old.with_suffix(".lock").unlink(missing_ok=True)
