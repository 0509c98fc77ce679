"""Files written so that a crash never leaves half of one: a row appended whole and synced, a
file replaced through a synced temporary file and a rename. Results folders and the caches
(counts, ceilings) all write through here."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from attnbench.errors import AttnbenchError


def _file_mode() -> int:
    """The mode ``open`` gives a new file under this process's umask (read once, at import,
    before any thread could create a file in the moment the mask is read)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# mkstemp makes its file 0600: a run.json renamed from it could not be read by the other users
# of a shared results folder (a CI artifact, a published chart's data), as results.csv can.
FILE_MODE = _file_mode()


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A file that cannot be written (a full disk, a folder made read-only mid-run) is one
    line, ``AttnbenchError``, not a traceback; the writers below leave what was there whole.
    ``FileExistsError`` passes as it is: ``create_synced``'s callers read it."""
    try:
        yield
    except FileExistsError:
        raise
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_all(fd: int, text: str) -> None:
    """``text`` written whole to ``fd`` (a write may take part of it), then synced."""
    view = memoryview(text.encode("utf-8"))
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def _write_new(fd: int, path: Path, text: str) -> None:
    """``text`` into the new file ``path`` open as ``fd`` (closed here); no file where it
    cannot be written whole."""
    try:
        try:
            _write_all(fd, text)
        finally:
            os.close(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` through a synced temporary file and a rename."""
    with _writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        _write_new(fd, Path(tmp), text)
        try:
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def append_synced(path: Path, text: str) -> None:
    """Append ``text`` whole, synced before returning; where it cannot be (a full disk), the
    file is cut back to where it ended, so no row is left written in part."""
    with _writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                _write_all(fd, text)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


def create_synced(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``, synced; FileExistsError if it exists, and no file
    where the text cannot be written whole."""
    with _writing(path):
        _write_new(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), path, text)
