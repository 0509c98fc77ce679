"""What a path length's probes found, kept in the count cache across processes.

Each first round of the fork executor is a process of its own, which probed again what the case
of its line before it had (its route, band and the paths at the probe lengths: 80-100 ms a case
here), since ``structure``'s own cache lives in one process. While a case's counts are traced
(``probes_on_disk``), a probe's finding is read from and written to the count cache
(``countcache.CountCache.read_law``), under a key of the layer's code, options, seed, d and probe
lengths, with attnbench's and torch's code; a layer whose code cannot be told unchanged (one
registered from Python) is probed in every process. Dependency patterns (arrays) stay in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from dataclasses import asdict
from typing import Any, TypeVar, cast

from attnbench.layers.entry import LayerSource
from attnbench.measure.counts.countcache import CountCache
from attnbench.measure.counts.patterns import BlockBand
from attnbench.measure.counts.routes import Route

T = TypeVar("T")
_DISK: list[CountCache] = []  # the store a trace in progress reads and writes (innermost last)

# How each kind of finding is written as JSON and read back.
_ENCODE: dict[str, Callable[[Any], dict[str, Any]]] = {
    "route": lambda route: {"route": asdict(route)},
    "band": lambda found: {
        "shape": None if found[0] is None else asdict(found[0]),
        "paths": sorted(found[1].items()),
    },
    "path": lambda value: {"value": value},
    "stages": lambda value: {"value": value},
}
_DECODE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "route": lambda data: Route(**data["route"]),
    "band": lambda data: (
        None if data["shape"] is None else BlockBand(**data["shape"]),
        {int(p): None if v is None else int(v) for p, v in data["paths"]},
    ),
    "path": lambda data: None if data["value"] is None else int(data["value"]),
    "stages": lambda data: int(data["value"]),
}


@contextlib.contextmanager
def probes_on_disk(store: CountCache | None) -> Iterator[None]:
    """Within it, probes read and write their findings in ``store`` (None: memory alone)."""
    if store is None:
        yield
        return
    _DISK.append(store)
    try:
        yield
    finally:
        _DISK.pop()


def on_disk(
    kind: str, key: Hashable, d: int, probes: tuple[Any, ...], compute: Callable[[], T]
) -> T:
    """``compute()``, or what the count cache holds of it (``key``: a ``LayerBuilder``'s, its
    layer, source, options and seed)."""
    parts = _parts(kind, key, d, probes)
    if not _DISK or parts is None:
        return compute()
    found = _DISK[-1].read_law(parts)
    if found is not None:
        try:
            return cast("T", _DECODE[kind](found))
        except (KeyError, TypeError, ValueError):
            pass  # an entry that does not read: probed again
    value = compute()
    _DISK[-1].write_law(parts, _ENCODE[kind](value))
    return value


def _parts(kind: str, key: Hashable, d: int, probes: tuple[Any, ...]) -> list[Any] | None:
    """The finding's key as JSON holds it; None where it is not kept on disk: a kind without a
    codec, or a layer whose code cannot be told unchanged (``countcache.key``)."""
    if kind not in _ENCODE or not isinstance(key, tuple) or len(key) != 4:
        return None
    layer, source, options, seed = key
    if not isinstance(source, LayerSource):  # a key of a builder made by hand
        return None
    if not (source.kind == "builtin" or source.digest or source.distribution):
        return None
    # a path's and a band's probes carry their route; a route's, the steps it was given
    lengths = [asdict(p) if isinstance(p, Route) else p for p in probes]
    return [kind, layer, source.to_dict(), options, seed, d, lengths]
