"""The layer registry: every layer attnbench can measure, by name.

Built-in layers are found, not listed: every module of this package that declares ``ENTRIES``
adds its layers, ordered by their family's rank, so a new built-in layer is one new module.
Plugin layers join through ``register`` (from Python), ``--layers module:factory`` or
``--layers path/to/file.py:factory``, and the ``attnbench.layers`` entry-point group
(``attnbench.layers.plugins``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnbench._version import __version__
from attnbench.errors import AttnbenchError, did_you_mean
from attnbench.layers.entry import CUSTOM, Family, LayerEntry, LayerOption, LayerSource
from attnbench.theory import LayerTheory, order_problem, sizes, theory_problem

# The package's modules that hold the machinery rather than layers.
_MACHINERY = {"entry", "registry", "plugins", "checks", "decoding"}


def _builtin_entries() -> list[LayerEntry]:
    """The ``ENTRIES`` of every module of this package, by family rank then as declared."""
    found = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name in _MACHINERY:
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        for position, entry in enumerate(getattr(module, "ENTRIES", ())):
            version = f"attnbench {__version__}"
            source = LayerSource("builtin", module.__name__, distribution=version)
            found.append(((entry.family.rank, info.name, position), replace(entry, source=source)))
    return [entry for _, entry in sorted(found, key=lambda item: item[0])]


REGISTRY: dict[str, LayerEntry] = {entry.name: entry for entry in _builtin_entries()}
BUILTIN: tuple[str, ...] = tuple(REGISTRY)


def known_options() -> dict[str, LayerOption]:
    """Every option some registered layer declares, by name (the first declaration)."""
    options: dict[str, LayerOption] = {}
    for entry in REGISTRY.values():
        for option in entry.options:
            options.setdefault(option.name, option)
    return options


def as_entry(obj: Any, name: str, source: LayerSource) -> LayerEntry:
    """A ``LayerEntry`` for ``obj``: an entry (renamed to ``name``) or a factory
    ``factory(d, **options)``, whose keyword parameters with integer defaults are its options
    (one named like a built-in option keeps that option's checks and tag); a factory with a
    parameter ``n`` builds its layer for one length (Linformer's projections, a learned
    positional table) and is given each case's n."""
    if isinstance(obj, LayerEntry):
        return replace(obj, name=name, source=source)
    if isinstance(obj, nn.Module) or not callable(obj):
        raise AttnbenchError(
            f"layer {name}: {type(obj).__name__} is neither a factory factory(d, **options) "
            "nor a LayerEntry"
        )
    shared = known_options()
    options = []
    try:
        parameters = list(inspect.signature(obj).parameters.values())[1:]
    except (TypeError, ValueError):  # a builtin or C callable: no options to read
        parameters = []
    needs_length = any(p.name == "n" for p in parameters)
    for p in parameters:
        if p.name == "n":
            continue
        if isinstance(p.default, int) and not isinstance(p.default, bool):
            own = LayerOption(p.name, p.default, p.name, f"{name}: {p.name}.")
            base = shared.get(p.name) or own
            options.append(replace(base, default=p.default))
    doc = (inspect.getdoc(obj) or "").split("\n")[0]
    return LayerEntry(
        name, obj, CUSTOM, doc, tuple(options), source=source, needs_length=needs_length
    )


PROBE_N = 64  # n and d at which a plugin's theory is tried once, as it is registered


def register(
    obj: LayerEntry | Callable[..., nn.Module],
    name: str | None = None,
    *,
    source: LayerSource | None = None,
) -> LayerEntry:
    """Add a layer to this process's registry: an entry, or a factory ``factory(d, **options)``
    returning an ``nn.Module`` that maps (batch, n, d) to (batch, n, d). Returns its entry.

    A name a built-in layer has, or another plugin's, is refused; registering the same layer
    from the same source again is allowed.
    """
    if source is None:
        module = inspect.getmodule(obj.build if isinstance(obj, LayerEntry) else obj)
        spec = f"{getattr(module, '__name__', '?')}:{getattr(obj, '__qualname__', name or '')}"
        source = LayerSource("python", spec)
    name = name or (obj.name if isinstance(obj, LayerEntry) else getattr(obj, "__name__", ""))
    if not name or "/" in name or "," in name:
        raise AttnbenchError(f"layer name {name!r}: give a name without '/' or ','")
    entry = as_entry(obj, name, source)
    if name in BUILTIN:
        raise AttnbenchError(
            f"layer name {name!r} ({source.spec}) clashes with a built-in layer; name it otherwise"
        )
    if entry.theory is not None:
        at = sizes(1, PROBE_N, PROBE_N, entry.resolve({}))
        problem = theory_problem(entry.theory, at) or order_problem(entry.theory, at)
        if problem is not None:
            raise AttnbenchError(f"layer {name!r} ({source.spec}): {problem}")
    old = REGISTRY.get(name)
    if old is not None and old.source != entry.source:
        hint = (
            f"give it a name of its own: --layers {name.partition(':')[0]}-2={source.spec}"
            if source.kind in ("file", "module")
            else "register it under a name of its own"
        )
        raise AttnbenchError(
            f"layer name {name!r} is taken by {old.source.describe()}; "
            f"{source.describe()} must be named otherwise ({hint}; a factory's layer is named "
            "after its file and factory)"
        )
    REGISTRY[name] = old or entry
    return REGISTRY[name]


def theory_of(name: str) -> LayerTheory | None:
    """The theory of a registered layer (None without one, or for a layer not registered)."""
    found = REGISTRY.get(name)
    return found.theory if found is not None else None


def entry(name: str) -> LayerEntry:
    """The registered layer called ``name`` (``plugins.resolve`` also loads plugins)."""
    found = REGISTRY.get(name)
    if found is None:
        raise AttnbenchError(
            f"unknown layer {name!r}{did_you_mean(name, REGISTRY)}; accepted: "
            f"{', '.join(REGISTRY)}, an installed plugin's "
            "name, module.path:factory or path/to/file.py:factory"
        )
    return found


def layer_names() -> tuple[str, ...]:
    """The registered layers, built-in ones first."""
    return tuple(REGISTRY)


def build_layer(name: str, d: int, *, seed: int = 0, **options: int) -> nn.Module:
    """Build layer ``name`` of width ``d`` in eval mode with weights drawn from ``seed``.

    ``options`` are the layer's own (``k`` for conv, ``heads`` and ``window`` for attention,
    ``n`` for a layer built for a length); options that the layer does not take are ignored, so
    one grid can drive every layer, and those it takes but are not given take their defaults.
    The global RNG is left untouched.
    """
    found = entry(name)
    if d < 1:
        raise AttnbenchError(f"d must be >= 1, got {d}")
    if found.needs_length and "n" not in options:
        raise AttnbenchError(f"layer {name!r} is built for a length: pass n")
    kwargs: dict[str, int] = found.resolve(options)
    for option in found.options:
        option.check(kwargs[option.name], name, (), (d,))
    if found.needs_length:
        kwargs["n"] = options["n"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = found.build(d, **kwargs)
    if not isinstance(layer, nn.Module):
        raise AttnbenchError(
            f"layer {name}: its factory returned {type(layer).__name__}, not an nn.Module"
        )
    return layer.eval()


__all__ = [
    "BUILTIN",
    "CUSTOM",
    "REGISTRY",
    "Family",
    "LayerEntry",
    "LayerOption",
    "LayerSource",
    "build_layer",
    "entry",
    "known_options",
    "layer_names",
    "register",
    "theory_of",
]
