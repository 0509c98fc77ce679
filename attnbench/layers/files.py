"""A plugin file run as a module of its own: its text read as its bytes, the files beside it
that it imports taken from beside it (never from an earlier plugin's folder), and an import
that fails told where the file it wanted is."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from attnbench.errors import AttnbenchError, first_line
from attnbench.layers.digests import file_digest, imported, siblings


def read_plugin(path: Path, spec: str) -> str:
    """A plugin file's text, exactly as its bytes (its digest is of these bytes)."""
    if not path.is_file():
        raise AttnbenchError(f"--layers {spec}: there is no file {str(path)!r}")
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AttnbenchError(f"--layers {spec}: cannot read {str(path)!r}: {exc}") from None


def run_file(
    path: Path, spec: str, text: str | None = None, home: Path | None = None
) -> ModuleType:
    """Run a plugin file (or its shipped text) as a module of its own, named by its digest
    (its text and the files beside it that it imports)."""
    if text is None:
        text = read_plugin(path, spec)
    home = home or path.parent  # where the files beside it are (a worker's copy of them)
    name = f"attnbench_plugin_{path.stem}_{file_digest(home / path.name, text)}"
    if name in sys.modules:
        return sys.modules[name]
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    # A file beside it imports, as under `python file.py` (a layer split over two files read
    # ModuleNotFoundError); at the end of the path, so it shadows no installed module.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    try:
        with _own_siblings(path, text, spec, home):
            exec(compile(text, str(path), "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        if isinstance(exc, AttnbenchError):
            raise
        raise AttnbenchError(
            f"--layers {spec}: running {str(path)!r} failed: {first_line(exc)}{_hint(exc, path)}"
        ) from None
    return module


_FOLDERS: set[Path] = set()  # the folders of the plugin files run in this process


@contextlib.contextmanager
def _own_siblings(path: Path, text: str, spec: str, home: Path) -> Iterator[None]:
    """The files beside ``path`` that its text imports are imported from beside it, not taken
    from an earlier plugin's folder: two versions of one layer (old/mine.py, mine.py) that each
    import their own mixhelp.py had both run the first one's, with two digests recorded. A
    module it imports that another plugin's folder gave, where none is beside it, is refused.
    ``home``: where those files are (a worker's copy of the driver's, ``plugins.receive``)."""
    folder, found = home.resolve(), siblings(home / path.name, text)
    mine = {p.relative_to(home).parts[0].removesuffix(".py") for p in found}
    held = {}
    for top in sorted(imported(text) | mine):
        where = _home(sys.modules.get(top))
        if where is None:
            continue
        if top in mine and where != folder:
            for key in [k for k in sys.modules if k == top or k.startswith(f"{top}.")]:
                held[key] = sys.modules.pop(key)
        elif top not in mine and where in _FOLDERS - {folder}:
            raise AttnbenchError(
                f"--layers {spec}: it imports {top}, which is not beside it; the {top} loaded "
                f"is {where}'s, beside another plugin: put the version it should run beside it"
            )
    _FOLDERS.add(folder)
    sys.path.insert(0, str(home))  # its own first, while it runs
    try:
        yield
    finally:
        sys.path.remove(str(home))
        sys.modules.update(held)  # the earlier plugin's, for whoever imports them later


def _home(module: ModuleType | None) -> Path | None:
    """The folder a module was imported from (a package's: the folder holding it); None for
    one not from a file."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not os.path.isabs(file):  # built in, or "<string>"
        return None
    return Path(file).resolve().parents[1 if file.endswith("__init__.py") else 0]


def _hint(exc: Exception, path: Path) -> str:
    """Where a module a plugin file could not import is: in the current directory, not
    beside it (an old version copied into old/ without the helper it imports)."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and Path(f"{missing}.py").is_file() and Path.cwd() != path.parent.resolve():
        return (
            f" ({missing}.py is in the current directory; a file a plugin imports is read "
            f"from beside it, {str(path.parent)!r}: put the version it should run there)"
        )
    return ""
