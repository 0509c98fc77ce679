"""The exact counts of a case, cached on disk: a second sweep, a ``--resume``, ``ab``'s second
side and the CI gate do not trace again what they traced before.

FLOPs, elementwise work, bytes, sequential steps and path length are functions of the layer's
code, attnbench's counters, torch and the case, not of the machine's state, so each case's are
stored under a key made of all of these (the CPU memory pass, which replays the allocations
one call requests, is stored beside them under a key that adds the CPU's model and the thread
count, which choose oneDNN's kernels):

- the case (its id: layer, n, d, options, batch, dtype, device, mode) and the seed;
- the layer's source: a built-in layer is attnbench's own code, and a plugin its defining
  file's digest and its distribution's version (``LayerSource``); a layer registered from
  Python has no digest to prove it unchanged, so its counts are never cached;
- a digest of attnbench's own source files (every counter and layer), and torch's version.

A changed layer, counter or torch therefore never reads an entry of the code it replaced. The
entries live under ``cache_dir()/counts`` (``$ATTNBENCH_CACHE_DIR``, ...); a sweep's
``Counting`` says whether it reads and writes them (``--no-cache``: it traces every case).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from attnbench.devices import cpu_model
from attnbench.errors import AttnbenchError
from attnbench.layers.registry import entry
from attnbench.measure.machine.ceilings_file import cache_dir
from attnbench.spec import Case
from attnbench.storage import write_text_atomic

COUNTS_VERSION = 1
TRACED, CACHED = "traced", "cache"  # the results' counts_source


@dataclass(frozen=True)
class Counts:
    """What tracing a case gives, as its results columns hold it."""

    flops: int
    uncounted_ops: str
    seq_steps: int | None
    seq_steps_method: str
    path_len: int | None
    path_len_method: str
    elementwise: int | None
    elementwise_method: str
    bytes: int | None
    bytes_method: str
    product_bytes: int | None
    kernels: str


@dataclass(frozen=True)
class Profile:
    """What the memory pass of one call gives: its peak bytes (None where the device keeps no
    statistics), the ops its real path dispatched, the fused paths it took, how, and the
    convolution implementations it ran (``ops.BACKENDS``; none recorded off the CPU)."""

    peak_bytes: int | None
    ops: int | None
    fused: frozenset[str]
    method: str = "measured"
    backends: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Counting:
    """How a sweep takes every case's exact counts, passed to each case and sent to every
    worker: through the count cache (``cache``: the command line's default, off with
    --no-cache), and a long recurrence's from its probes unless every case is traced in full
    (``full_trace``; --full-trace)."""

    cache: bool = False
    full_trace: bool = False

    @property
    def store(self) -> CountCache | None:
        """The count cache the sweep reads and writes; None without one."""
        return CountCache() if self.cache else None


DEFAULT_COUNTING = Counting()  # from Python: every count traced, long recurrences extended


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """sha256 of every attnbench source file, in path order: any change to a counter or a
    built-in layer changes every key."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(case: Case, seed: int, *machine: object) -> str | None:
    """The case's cache key, or None for a layer whose code cannot be told unchanged;
    ``machine`` adds what else the figure depends on (``profile_key``)."""
    source = entry(case.layer).source
    if source.kind != "builtin" and not (source.digest or source.distribution):
        return None
    parts = [
        COUNTS_VERSION,
        package_digest(),
        torch.__version__,
        source.to_dict(),
        case.case_id,
        seed,
        *machine,
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def profile_key(case: Case, seed: int, *role: str) -> str | None:
    """The key of a case's memory pass on the CPU: also the CPU's model and the thread count,
    which choose oneDNN's kernels and their scratch memory. None on other devices, whose
    allocator statistics are read at every call anyway (cheap) and whose figures are theirs."""
    if case.device != "cpu":
        return None
    return key(case, seed, "profile", cpu_model(), torch.get_num_threads(), *role)


def _law_key(parts: list[Any]) -> str:
    found = [COUNTS_VERSION, package_digest(), torch.__version__, "law", *parts]
    return hashlib.sha256(json.dumps(found, sort_keys=True, default=str).encode()).hexdigest()


LAWS = "laws"  # the folder of the probes' findings (``read_law``), beside the cases' counts


def _path(found: str, folder: Path | None, kind: str = "counts") -> Path:
    return (folder or cache_dir()) / kind / found[:2] / f"{found}.json"


PROBE = "probe"  # the role of an entry traced at a probe length (``CountCache.probes``)


@dataclass(frozen=True)
class CountCache:
    """The count cache in ``folder`` (None: ``cache_dir()``'s). A sweep without a cache
    (--no-cache) has none (``Counting.store``), rather than a cache told not to work.
    ``probes()`` is the same cache's entries traced at a probe length for a longer case's law:
    kept apart from the entry of a case of that length (which also holds its path length), and
    shared by every long case of the same layer, d and options."""

    folder: Path | None = None
    role: tuple[str, ...] = ()

    def probes(self) -> CountCache:
        return dataclasses.replace(self, role=(PROBE,))

    def read(self, case: Case, seed: int) -> Counts | None:
        """The case's cached counts (None: none, or an entry that does not read)."""
        data = _load(key(case, seed, *self.role), self.folder)
        try:
            return None if data is None else Counts(**data)
        except TypeError:
            return None

    def write(self, case: Case, seed: int, counts: Counts) -> None:
        """Store the case's counts (atomically; an unwritable cache costs a trace next time)."""
        _store(key(case, seed, *self.role), asdict(counts), self.folder)

    def read_law(self, parts: list[Any]) -> dict[str, Any] | None:
        """A probe's finding stored under ``parts`` (``structure``'s key of a layer's code,
        options, seed, d and probe lengths), keyed also by attnbench's and torch's code."""
        found: dict[str, Any] | None = _load(_law_key(parts), self.folder, LAWS)
        return found

    def write_law(self, parts: list[Any], data: dict[str, Any]) -> None:
        """Store a probe's finding (atomically; an unwritable cache costs a probe next time)."""
        _store(_law_key(parts), data, self.folder, LAWS)

    def read_profile(self, case: Case, seed: int) -> Profile | None:
        """The case's cached memory pass on this CPU and thread count (None: none, or not
        CPU)."""
        data = _load(profile_key(case, seed, *self.role), self.folder)
        try:
            if data is None:
                return None
            sets = {name: frozenset(data.get(name, ())) for name in ("fused", "backends")}
            return Profile(**{**data, **sets})
        except (TypeError, KeyError):
            return None

    def write_profile(self, case: Case, seed: int, profile: Profile) -> None:
        """Store the case's memory pass (CPU only)."""
        sets = {"fused": sorted(profile.fused), "backends": sorted(profile.backends)}
        _store(profile_key(case, seed, *self.role), {**asdict(profile), **sets}, self.folder)


def _load(found: str | None, folder: Path | None, kind: str = "counts") -> Any:
    if found is None:
        return None
    try:
        data = json.loads(_path(found, folder, kind).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _store(
    found: str | None, data: dict[str, Any], folder: Path | None, kind: str = "counts"
) -> None:
    if found is None:
        return
    path = _path(found, folder, kind)
    try:  # a full or read-only cache costs a trace next time, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data))
    except (OSError, AttnbenchError):
        pass
