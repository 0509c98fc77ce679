"""Which version of a plugin's code ran: digests of a plugin file's text and of the files
beside it that it imports, found by parsing, never by running (``plugins`` records them, a
resume and a worker check them)."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping
from pathlib import Path


def digest(path: Path) -> str:
    """The first 12 hex digits of a file's sha256: which version of a layer's code ran."""
    return text_digest(path.read_bytes())


def text_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def file_digest(path: Path, text: str) -> str:
    """The digest of a plugin file's text and of the files beside it that it imports (read,
    not run: ``siblings``), so that --resume sees an edit to either: the file's text alone was
    digested, and a resumed run mixed rounds of its imported module's old and new code. A
    file that imports none beside it keeps the digest of its text alone."""
    return texts_digest(text, beside_files(path, text))


def beside_files(path: Path, text: str) -> dict[str, bytes]:
    """The files beside ``path`` that its text imports (``siblings``), by their path relative
    to its folder, in the order the digest reads them."""
    return {str(p.relative_to(path.parent)): p.read_bytes() for p in siblings(path, text)}


def texts_digest(text: str, beside: Mapping[str, bytes]) -> str:
    """``file_digest`` of a file's text and the texts beside it, wherever they are read."""
    if not beside:
        return text_digest(text.encode())
    parts = [text.encode(), *(f"\0{rel}\0".encode() + data for rel, data in beside.items())]
    return text_digest(b"".join(parts))


def siblings(path: Path, text: str) -> list[Path]:
    """The files beside ``path`` (a module ``name.py``, or every file of a package ``name/``)
    that its text imports, and those they import in turn, found by parsing, not running."""
    folder, found = path.parent, dict[Path, None]()
    todo = [text]
    while todo:
        for top in imported(todo.pop()):
            package = folder / top
            files = sorted(package.rglob("*.py")) if (package / "__init__.py").is_file() else []
            files += [folder / f"{top}.py"]
            for file in files:
                if file.is_file() and file.resolve() != path.resolve() and file not in found:
                    found[file] = None
                    todo.append(file.read_bytes().decode("utf-8", "replace"))
    return sorted(found)


def imported(source: str) -> set[str]:
    """The top-level names a module's absolute imports name (``import a.b``, ``from a import
    b``: "a"); none where it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names
