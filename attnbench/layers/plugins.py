"""Plugin layers: loaded from a module, a file or an installed package, checked, and sent on.

- ``module.path:factory`` imports a module (the current directory is importable);
- ``path/to/file.py:factory`` runs a file as a module of its own;
- an installed package lists its layers in the ``attnbench.layers`` entry-point group, and each
  appears under its entry point's name.
The object named is a ``LayerEntry`` (with its theory) or a factory ``factory(d, **options)``.
Each plugin records where it came from (``LayerSource``: the spec, and the distribution's version
or a hash of the defining file), so results say which implementation was measured, a resumed run
can load it again and tell whether it changed, and a worker in another process can load it too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnbench.errors import AttnbenchError
from attnbench.layers.entry import LayerEntry, LayerSource
from attnbench.layers.registry import REGISTRY, build_layer, register

GROUP = "attnbench.layers"
# Plugins whose output shape is checked before a sweep: those named on the command line or
# installed (a layer registered from Python is the caller's own object).
CHECKED = ("module", "file", "entry point")


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def digest(path: Path) -> str:
    """The first 12 hex digits of a file's sha256: which version of a layer's code ran."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _distribution(module: ModuleType) -> str:
    """"name version" of the installed package that provides ``module`` ("" for none)."""
    top = module.__name__.split(".")[0]
    for name in importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _import(target: str, spec: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the current directory is importable, as for python -m
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise AttnbenchError(
            f"--layers {spec}: cannot import {target!r}: {_first_line(exc)}"
        ) from None


def _run_file(path: Path, spec: str, text: str | None = None) -> ModuleType:
    """Run a plugin file (or its shipped text) as a module of its own, named by its hash."""
    if text is None:
        if not path.is_file():
            raise AttnbenchError(f"--layers {spec}: there is no file {str(path)!r}")
        text = path.read_text(encoding="utf-8")
    name = f"attnbench_plugin_{path.stem}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        raise AttnbenchError(
            f"--layers {spec}: running {str(path)!r} failed: {_first_line(exc)}"
        ) from None
    return module


def load(spec: str) -> LayerEntry:
    """Load and register the layer that ``spec`` names (``module:factory`` or
    ``path/to/file.py:factory``); a one-line error for anything wrong."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise AttnbenchError(
            f"--layers {spec}: write module.path:factory or path/to/file.py:factory"
        )
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target).resolve()
        module = _run_file(path, spec)
        stem, source = path.stem, LayerSource("file", f"{path}:{attr}", digest(path))
    else:
        module = _import(target, spec)
        file = getattr(module, "__file__", None)
        found = digest(Path(file)) if file and Path(file).is_file() else ""
        stem = target
        source = LayerSource("module", spec, found, _distribution(module))
    if not hasattr(module, attr):
        raise AttnbenchError(f"--layers {spec}: {target!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    name = obj.name if isinstance(obj, LayerEntry) and obj.name else f"{stem}:{attr}"
    return register(obj, name, source=source)


def installed() -> dict[str, importlib.metadata.EntryPoint]:
    """The layers installed packages offer (the ``attnbench.layers`` entry points), by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def load_installed(name: str, point: importlib.metadata.EntryPoint | None = None) -> LayerEntry:
    point = point or installed()[name]
    try:
        obj = point.load()
    except Exception as exc:
        raise AttnbenchError(
            f"layer {name} (entry point {point.value}): cannot load it: {_first_line(exc)}"
        ) from None
    dist = point.dist
    found = f"{dist.name} {dist.version}" if dist is not None else ""
    return register(obj, name, source=LayerSource("entry point", point.value, "", found))


def resolve(name: str) -> LayerEntry:
    """The layer ``name`` names: registered, an installed plugin, or a spec to load."""
    if name in REGISTRY:
        return REGISTRY[name]
    points = installed()
    if name in points:
        return load_installed(name, points[name])
    if ":" in name:
        return load(name)
    raise AttnbenchError(
        f"unknown layer {name!r}; accepted: {', '.join([*REGISTRY, *points])}, "
        "module.path:factory or path/to/file.py:factory"
    )


def discover() -> list[str]:
    """Load every installed plugin; one line per plugin that could not be loaded."""
    problems = []
    for name, point in installed().items():
        try:
            load_installed(name, point)
        except AttnbenchError as exc:
            problems.append(exc.message)
    return problems


def check_output(entry: LayerEntry, d: int, n: int, options: Mapping[str, int]) -> None:
    """Refuse a plugin that does not build, or does not map (batch, n, d) to (batch, n, d),
    on a tiny input, before anything is measured."""
    shape = (2, n, d)
    try:
        layer = build_layer(entry.name, d, **options, n=n)
        with torch.no_grad():
            out = layer(torch.randn(*shape))
    except AttnbenchError:
        raise
    except Exception as exc:
        raise AttnbenchError(
            f"layer {entry.name}: calling it on a {shape} input failed: {_first_line(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise AttnbenchError(
            f"layer {entry.name} maps a {shape} input to {got}; a layer must map "
            "(batch, n, d) to (batch, n, d)"
        )


# ----------------------------------------------------------------------------- other processes


def shipment(names: Iterable[str], portable: bool = False) -> list[dict[str, Any]]:
    """What another process (a Ray worker, possibly on another machine) needs to register the
    plugin layers among ``names``: a file's text, a module's import path, or the entry.

    ``portable``: for a process reached in JSON (``attnbench ab``'s sides, the instruction
    counter), which cannot take a layer registered from Python as an object.
    """
    out = []
    for name in names:
        entry = REGISTRY[name]
        kind = entry.source.kind
        if kind == "builtin":
            continue
        if kind == "python" and portable:
            raise AttnbenchError(
                f"layer {name} was registered from Python and cannot be sent to a worker "
                "process; give it as --layers module.path:factory or path/to/file.py:factory"
            )
        item: dict[str, Any] = {"name": name, "source": entry.source.to_dict()}
        if kind == "file":
            path = Path(entry.source.spec.rpartition(":")[0])
            item["text"] = path.read_text(encoding="utf-8")
        elif kind == "module":
            item["sys_path"] = [os.getcwd()]  # importable as here; the rest is the worker's own
        elif kind == "python":
            item["entry"] = entry  # pickled by the transport (Ray's cloudpickle)
        out.append(item)
    return out


def receive(items: Iterable[Mapping[str, Any]]) -> None:
    """Register in this process the plugin layers another process shipped (``shipment``)."""
    for item in items:
        if item["name"] in REGISTRY:
            continue
        source = LayerSource(**item["source"])
        if "entry" in item:
            register(item["entry"], item["name"], source=source)
        elif source.kind == "file":
            target, _, attr = source.spec.rpartition(":")
            module = _run_file(Path(target), source.spec, item["text"])
            register(getattr(module, attr), item["name"], source=source)
        elif source.kind == "module":
            for path in item.get("sys_path", []):
                if path not in sys.path:
                    sys.path.append(path)  # after this interpreter's own packages
            target, _, attr = source.spec.rpartition(":")
            register(getattr(_import(target, source.spec), attr), item["name"], source=source)
        else:
            load_installed(item["name"])


def restore(records: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """Register the plugin layers a run recorded (run.json's ``layers``), from where they came;
    ``{name: [recorded, now]}`` for each whose code changed since."""
    changed: dict[str, list[str]] = {}
    for name, record in records.items():
        recorded = LayerSource(**record)
        if recorded.kind == "builtin":
            continue
        if name not in REGISTRY:
            if recorded.kind == "file":
                target, _, attr = recorded.spec.rpartition(":")
                module = _run_file(Path(target), recorded.spec)
                source = LayerSource("file", recorded.spec, digest(Path(target)))
                register(getattr(module, attr), name, source=source)
            elif recorded.kind == "module":
                load(recorded.spec)
            elif recorded.kind == "entry point":
                load_installed(name)
            else:
                raise AttnbenchError(
                    f"layer {name} was registered from Python ({recorded.spec}); register it "
                    "again (attnbench.register_layer) before resuming"
                )
        now = REGISTRY[name].source
        if (now.digest, now.distribution) != (recorded.digest, recorded.distribution):
            changed[name] = [recorded.describe(), now.describe()]
    return changed
