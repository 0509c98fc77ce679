"""Plugin layers: loaded from a module, a file or an installed package, checked, and sent on.

- ``module.path:factory`` imports a module (the current directory is importable);
- ``path/to/file.py:factory`` runs a file as a module of its own;
- ``NAME=`` before either names the layer (two versions of one file, side by side);
- an installed package lists its layers in the ``attnbench.layers`` entry-point group, and each
  appears under its entry point's name.
The object named is a ``LayerEntry`` (with its theory) or a factory ``factory(d, **options)``.
Each plugin records where it came from (``LayerSource``: the spec, and the distribution's version
or a hash of the defining file), so results say which implementation was measured, a resumed run
can load it again and tell whether it changed, and a worker in another process can load it too.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from attnbench.errors import AttnbenchError, did_you_mean, first_line
from attnbench.layers.digests import (
    beside_files,
    digest,
    file_digest,
    siblings,
    texts_digest,
)
from attnbench.layers.entry import LayerEntry, LayerSource
from attnbench.layers.files import read_plugin, run_file
from attnbench.layers.registry import REGISTRY, register

GROUP = "attnbench.layers"
# Plugins whose output shape is checked before a sweep: those named on the command line or
# installed (a layer registered from Python is the caller's own object).
CHECKED = ("module", "file", "entry point")


def _distribution_of(top: str) -> str:
    """ "name version" of the installed package that provides top-level module ``top``."""
    for name in importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _distribution(module: ModuleType) -> str:
    """ "name version" of the installed package that provides ``module`` ("" for none)."""
    return _distribution_of(module.__name__.split(".")[0])


def _importable_here() -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the current directory is importable, as for python -m


def locate_module(target: str) -> Path | None:
    """The file that importing ``target`` would run, found without running anything (not even
    its parent packages' ``__init__``); None for a module with no file of its own."""
    loaded = sys.modules.get(target)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        return Path(file) if file else None
    _importable_here()
    search: list[str] | None = None
    found = None
    parts = target.split(".")
    for i in range(len(parts)):
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    origin = getattr(found, "origin", None)
    return Path(origin) if origin and Path(origin).is_file() else None


def _import(target: str, spec: str) -> ModuleType:
    _importable_here()
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise AttnbenchError(
            f"--layers {spec}: cannot import {target!r}: {first_line(exc)}"
        ) from None


def load(spec: str, name: str | None = None) -> LayerEntry:
    """Load and register the layer that ``spec`` names (``module:factory`` or
    ``path/to/file.py:factory``), as ``name`` where given; a one-line error for anything wrong."""
    obj, own, source = _loaded(spec)
    return register(obj, name or own, source=source)


# The mark of an ``ab`` base side's version of a plugin the current side holds the name of
BASE_VERSION = "@base"


def side_named(spec: str) -> str:
    """``spec`` as an ``ab`` base side names it: a plugin whose own name a layer of other code
    holds (the current side's: old/mine.py against mine.py) as ``NAME@base=spec``."""
    if split_alias(spec)[0] is not None or ":" not in spec or spec in REGISTRY:
        return spec
    _, own, source = _loaded(spec)
    held = REGISTRY.get(own)
    return spec if held is None or held.source == source else f"{own}{BASE_VERSION}={spec}"


def unversioned(name: str) -> str:
    """The layer a base side's ``NAME@base`` is a version of (any other name: itself)."""
    return name.removesuffix(BASE_VERSION)


def _loaded(spec: str) -> tuple[Any, str, LayerSource]:
    """The object ``spec`` names, the name it gives itself, and where it came from."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise AttnbenchError(
            f"--layers {spec}: write module.path:factory or path/to/file.py:factory (NAME= "
            "before it names the layer)"
        )
    if _is_file(target):
        path = Path(target).resolve()
        text = read_plugin(path, spec)
        module = run_file(path, spec, text)
        stem = path.stem
        source = LayerSource("file", f"{path}:{attr}", file_digest(path, text))
    else:
        module = _import(target, spec)
        file = getattr(module, "__file__", None)
        found = digest(Path(file)) if file and Path(file).is_file() else ""
        stem = target
        source = LayerSource("module", spec, found, _distribution(module))
    if not hasattr(module, attr):
        raise AttnbenchError(f"--layers {spec}: {target!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    return obj, obj.name if isinstance(obj, LayerEntry) and obj.name else f"{stem}:{attr}", source


def _is_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def installed() -> dict[str, importlib.metadata.EntryPoint]:
    """The layers installed packages offer (the ``attnbench.layers`` entry points), by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def load_installed(name: str, point: importlib.metadata.EntryPoint | None = None) -> LayerEntry:
    point = point or installed()[name]
    try:
        obj = point.load()
    except Exception as exc:
        raise AttnbenchError(
            f"layer {name} (entry point {point.value}): cannot load it: {first_line(exc)}"
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
    alias, spec = split_alias(name)
    if alias is not None:  # two versions of one file (old/mine.py, mine.py) side by side
        if not alias or ":" not in spec:
            raise AttnbenchError(
                f"--layers {name}: NAME= names a plugin given by its file or module, as "
                f"{alias or 'mine'}=path/to/file.py:factory or {alias or 'mine'}="
                "module.path:factory; a built-in or installed layer keeps its own name"
            )
        return load(spec, alias)
    if ":" in name:
        return load(name)
    if name.endswith(".py"):  # a plugin file named without its factory
        raise AttnbenchError(
            f"unknown layer {name!r}: a plugin file is named with the function that makes the "
            f"layer, as {name}:make (path/to/file.py:factory)"
        )
    known = [*REGISTRY, *points]
    raise AttnbenchError(
        f"unknown layer {name!r}{did_you_mean(name, known)}; accepted: {', '.join(known)}, "
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


# ----------------------------------------------------------------------------- other processes


def shipment(names: Iterable[str], portable: bool = False) -> list[dict[str, Any]]:
    """What another process (a Ray worker, possibly on another machine) needs to register the
    plugin layers among ``names``: a file's text, a module's import path, or the entry.

    ``portable``: for a process reached in JSON (``attnbench ab``'s sides, the instruction
    counter), which cannot take a layer registered from Python as an object. A file that
    changed since it was loaded is refused: the workers would run other code than the record
    names.
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
            item["text"] = read_plugin(path, entry.source.spec)
            beside = beside_files(path, item["text"])
            _same_code(name, entry.source, texts_digest(item["text"], beside), "its file")
            # the files it imports beside it travel too: a worker on another machine has none
            # (it read the file as "changed" and ran nothing), and JSON takes text, not bytes
            item["beside"] = {k: v.decode("utf-8", "surrogateescape") for k, v in beside.items()}
        elif kind == "module":
            item["sys_path"] = [os.getcwd()]  # importable as here; the rest is the worker's own
        elif kind == "python":
            item["entry"] = entry  # pickled by the transport (Ray's cloudpickle)
        out.append(item)
    return out


def _same_code(name: str, recorded: LayerSource, found: str, where: str) -> None:
    if recorded.digest and found != recorded.digest:
        raise AttnbenchError(
            f"layer {name}: {where} changed since it was loaded (sha256 {recorded.digest} -> "
            f"{found}); its code was not run"
        )


def receive(items: Iterable[Mapping[str, Any]], verify_modules: bool = True) -> None:
    """Register in this process the plugin layers another process shipped (``shipment``).

    Each is checked against the driver's record before it runs: a shipped file's text must
    have the recorded digest and, with ``verify_modules``, a module found here must be the
    file the driver loaded (an ``ab`` side in another interpreter runs its own copy).
    """
    for item in items:
        if item["name"] in REGISTRY:
            continue
        source = LayerSource(**item["source"])
        name = item["name"]
        if "entry" in item:
            register(item["entry"], name, source=source)
        elif source.kind == "file":
            target, _, attr = source.spec.rpartition(":")
            beside = {
                k: v.encode("utf-8", "surrogateescape") for k, v in item.get("beside", {}).items()
            }
            shipped = (
                texts_digest(item["text"], beside)
                if "beside" in item
                else file_digest(Path(target), item["text"])
            )
            _same_code(name, source, shipped, "the shipped file")
            home = _place_beside(Path(target).parent, beside)
            module = run_file(Path(target), source.spec, item["text"], home)
            register(getattr(module, attr), name, source=source)
        elif source.kind == "module":
            for path in item.get("sys_path", []):
                if path not in sys.path:
                    sys.path.append(path)  # after this interpreter's own packages
            target, _, attr = source.spec.rpartition(":")
            if verify_modules:
                found = locate_module(target)
                _same_code(name, source, digest(found) if found else "", f"module {target}")
            module = _import(target, source.spec)
            if not verify_modules:  # its own copy: recorded as such, and cached as such
                source = _own_copy(source, module, target)
            register(getattr(module, attr), name, source=source)
        else:
            load_installed(name)


def _place_beside(folder: Path, beside: Mapping[str, bytes]) -> Path:
    """Where the shipped files beside a plugin are not here as shipped (a worker on another
    machine), they are written to a folder of their own, put on the import path before the
    plugin's folder, so its imports find the driver's code. Where they are: ``folder`` or the
    copy."""
    if all(_holds(folder / rel, data) for rel, data in beside.items()):
        return folder
    copy = Path(tempfile.mkdtemp(prefix="attnbench-beside-"))
    for rel, data in beside.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)
    here = str(folder)
    sys.path.insert(sys.path.index(here) if here in sys.path else len(sys.path), str(copy))
    return copy


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def _own_copy(source: LayerSource, module: ModuleType, target: str) -> LayerSource:
    """The record of the module this interpreter imported for a shipped name (an ``ab`` side in
    another interpreter): its own file's digest and distribution, and no digest where it has no
    file to read (the driver's would key the count cache to the other side's code)."""
    path = getattr(module, "__file__", None)
    found = digest(Path(path)) if path else ""
    return replace(source, digest=found, distribution=_distribution_of(target.split(".")[0]))


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _now(name: str, recorded: LayerSource) -> tuple[LayerSource, Path | None]:
    """Where a recorded plugin's code is now, and the file that would run, found without
    running any of it."""
    target = recorded.spec.rpartition(":")[0]
    if recorded.kind == "file":
        path = Path(target)
        text = read_plugin(path, recorded.spec)
        return replace(recorded, digest=file_digest(path, text)), path
    if recorded.kind == "module":
        found = locate_module(target)
        if found is None:
            raise AttnbenchError(
                f"layer {name}: module {target!r} ({recorded.spec}) is not importable here"
            )
        top = target.split(".")[0]
        return replace(recorded, digest=digest(found), distribution=_distribution_of(top)), found
    if recorded.kind == "entry point":
        point = installed().get(name)
        if point is None:
            raise AttnbenchError(
                f"layer {name}: no installed package offers it now (entry point "
                f"{recorded.spec}, {recorded.distribution or 'no version recorded'})"
            )
        dist = point.dist
        version = f"{dist.name} {dist.version}" if dist is not None else ""
        return LayerSource("entry point", point.value, "", version), None
    raise AttnbenchError(
        f"layer {name} was registered from Python ({recorded.spec}); register it "
        "again (attnbench.register_layer) before resuming"
    )


def named_files(specs: Iterable[str]) -> set[Path]:
    """The plugin files a user named on the command line (``--layers``), resolved."""
    targets = [split_alias(spec)[1].rpartition(":")[0] for spec in specs]
    return {Path(target).resolve() for target in targets if target and _is_file(target)}


def split_alias(text: str) -> tuple[str | None, str]:
    """``NAME=spec`` as (NAME, spec), a spec as (None, spec): a path that holds '=' (a Hydra
    run's outputs/lr=0.1/mine.py:make) names a file, not a layer, as a name holds no '/'."""
    alias, eq, spec = text.partition("=")
    if not eq or "/" in alias or os.sep in alias or Path(text.rpartition(":")[0]).is_file():
        return None, text
    return alias.strip(), spec.strip()


def restore(
    records: Mapping[str, Mapping[str, str]],
    *,
    force: bool = False,
    results: Path | None = None,
    named: Iterable[Path] = (),
) -> dict[str, list[str]]:
    """Register the plugin layers a run recorded (run.json's ``layers``), from where they came;
    ``{name: [recorded, now]}`` for each whose code changed since.

    Every check comes before any of a plugin's code runs: a file or module whose digest (or
    package version) differs from the record is refused unless ``force``, and code that lies
    inside the ``results`` folder itself is refused unless the user ``named`` that file: a
    results folder is data, and what it carries does not run by being resumed.
    """
    changed: dict[str, list[str]] = {}
    trusted = {Path(p).resolve() for p in named}
    for name, record in records.items():
        recorded = LayerSource(**record)
        if recorded.kind == "builtin":
            continue
        if name in REGISTRY:  # loaded already: by --layers, or from Python
            now = REGISTRY[name].source
        else:
            now, file = _now(name, recorded)
            shipped = results is not None and file is not None and _inside(file, results)
            if shipped and file is not None and file.resolve() not in trusted:
                raise AttnbenchError(
                    f"layer {name}: its code is {str(file)!r}, inside the results folder; "
                    "a results folder is data, so its code is not run: name the file with "
                    "--layers if you trust it"
                )
            same = (now.digest, now.distribution) == (recorded.digest, recorded.distribution)
            if not same and not force:
                raise AttnbenchError(
                    f"layer {name}: its code{_beside_too(recorded, file)} changed since the run "
                    f"({recorded.describe()} -> {now.describe()}); it was not run: pass --force "
                    "to resume with "
                    "the new code (the change is recorded in run.json)"
                )
            _register_recorded(name, recorded)
            now = REGISTRY[name].source
        if (now.digest, now.distribution) != (recorded.digest, recorded.distribution):
            changed[name] = [recorded.describe(), now.describe()]
    return changed


def _beside_too(recorded: LayerSource, file: Path | None) -> str:
    """Where a file plugin's digest also reads the files beside it that it imports: an edit to
    one of those alone read as an edit to the file named."""
    if (
        recorded.kind != "file"
        or file is None
        or not siblings(file, read_plugin(file, recorded.spec))
    ):
        return ""
    return " (its file, or a file beside it that it imports)"


def _register_recorded(name: str, recorded: LayerSource) -> None:
    target, _, attr = recorded.spec.rpartition(":")
    if recorded.kind == "file":
        path = Path(target)
        text = read_plugin(path, recorded.spec)
        module = run_file(path, recorded.spec, text)
        if not hasattr(module, attr):
            raise AttnbenchError(f"layer {name}: {target!r} has no attribute {attr!r}")
        source = LayerSource("file", recorded.spec, file_digest(path, text))
        register(getattr(module, attr), name, source=source)
    elif recorded.kind == "module":
        load(recorded.spec, name)
    else:
        load_installed(name)
