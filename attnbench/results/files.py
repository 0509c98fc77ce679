"""The files of a results folder, written so that a crash never leaves half of one.

A results folder holds
- ``results.csv``: one row per case (``schema.RESULT_COLUMNS``), appended as each case finishes;
- ``samples.csv``: every raw timing sample, long format (case_id, sample, time_s, round);
- ``calibration.csv``: the calibration GEMM's samples, timed between the measured cases;
- ``run.json``: schema version, configuration, environment, start and end time;
- ``theory.json``: what the analysis reads of each plugin layer (``results.theories``), so that
  reading a run never runs its plugins' code.
Rows are appended with one write, flushed and fsynced; ``run.json`` and any rewritten file are
replaced atomically (a synced temporary file and a rename).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.results.record import run_status
from attnbench.schema import BROKEN, RunStatus
from attnbench.storage import write_text_atomic
from attnbench.vcs import git_output

RESULTS_FILE = "results.csv"
SAMPLES_FILE = "samples.csv"
CALIBRATION_FILE = "calibration.csv"
RUN_FILE = "run.json"
THEORY_FILE = "theory.json"  # the plugin layers' theories, as data (results.theories)


def now_iso() -> str:
    """Local time with its UTC offset, to the second: how run.json records every time."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def csv_line(values: Sequence[Any]) -> str:
    """One CSV record; None, NaN and NA are written as empty fields."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(["" if _missing(v) else v for v in values])
    return buf.getvalue()


def rewrite_csv(path: Path, header: Sequence[str], rows: Sequence[str]) -> None:
    """Replace ``path`` by ``header`` + ``rows`` (complete CSV lines) through a rename."""
    text = csv_line(header) + "".join(rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text_atomic(path, text)


def complete_lines(path: Path) -> tuple[str, list[str], bool]:
    """Header and complete data lines of an appended CSV; True when a torn last line was cut."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    torn = bool(lines) and not lines[-1].endswith("\n")
    if torn:
        lines = lines[:-1]
    if not lines:
        return "", [], torn
    return lines[0], lines[1:], torn


def read_csv(path: Path, what: str) -> tuple[pd.DataFrame | None, bool]:
    """The complete records of an appended CSV, as text (None: not even a header), and whether
    a torn line was cut."""
    header, rows, torn = complete_lines(path)
    if not header:
        return None, torn
    frame = pd.read_csv(io.StringIO(header + "".join(rows)), dtype=str, keep_default_na=False)
    if len(frame) != len(rows):
        raise AttnbenchError(
            f"{what} {str(path)!r} is corrupt: {len(rows)} lines but {len(frame)} records"
        )
    return frame, torn


def check_columns(frame: pd.DataFrame, columns: Sequence[str], path: Path) -> None:
    """One clear error where a table lacks a column its format has."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AttnbenchError(
            f"{str(path)!r} lacks column(s) {', '.join(missing)}; is it truncated or from "
            f"another tool?"
        )


# ----------------------------------------------------------------------------- folders


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run (results are never overwritten)."""
    return (folder / RESULTS_FILE).exists() or (folder / RUN_FILE).exists()


def _complete(folder: Path) -> bool:
    """Whether the run in ``folder`` is complete, as its run.json records it."""
    try:
        meta = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
        return run_status(meta) is RunStatus.COMPLETE
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _broken(folder: Path) -> int:
    """How many of the run's cases ended failed, oom or timeout (0 where unreadable)."""
    try:
        with (folder / RESULTS_FILE).open(newline="", encoding="utf-8") as f:
            return sum(row.get("status") in BROKEN for row in csv.DictReader(f))
    except (OSError, ValueError, csv.Error):
        return 0


def prepare_out_dir(out_dir: Path) -> Path:
    """Create ``out_dir`` (and parents) and check it can take a new run without losing one."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise AttnbenchError(f"--out {str(out_dir)!r} is a file, not a folder")
    if holds_run(out_dir):  # never overwrite
        missing = [name for name in (RUN_FILE, RESULTS_FILE) if not (out_dir / name).exists()]
        if missing:  # --resume needs both: a new user followed its advice into an error
            held = RESULTS_FILE if missing == [RUN_FILE] else RUN_FILE
            raise AttnbenchError(
                f"--out {str(out_dir)!r} already holds a {held} but no {missing[0]}, so no run "
                "--resume can finish; choose a new folder (results are never overwritten)"
            )
        if _complete(out_dir):  # nothing for --resume to finish, but maybe to retry
            broken = _broken(out_dir)
            retry = (
                f", or measure its {broken} broken case(s) again with --resume "
                f"{str(out_dir)!r} --retry"
                if broken
                else ""
            )
            raise AttnbenchError(
                f"--out {str(out_dir)!r} already holds a complete run; choose a new folder "
                f"(without --out, a new results/<timestamp>){retry}: results are never "
                "overwritten"
            )
        raise AttnbenchError(
            f"--out {str(out_dir)!r} already holds a run; choose a new folder, or finish that "
            f"run with --resume {str(out_dir)!r} (results are never overwritten)"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise AttnbenchError(
            f"--out {str(out_dir)!r} is not writable: {exc.strerror or exc}"
        ) from None
    return out_dir


@contextlib.contextmanager
def new_out_dir(out_dir: Path) -> Iterator[Path]:
    """``prepare_out_dir(out_dir)`` for a block that starts a run: where the block raises (the
    workers refused to start) and nothing was written, the folders made here (its parents
    too) are removed again, so a refused start leaves no empty run behind."""
    made = [p for p in (Path(out_dir), *Path(out_dir).parents) if not p.exists()]
    folder = prepare_out_dir(out_dir)
    try:
        yield folder
    except BaseException:
        for path in made:  # the folder, then each parent made for it, while empty
            if not path.is_dir() or any(path.iterdir()):
                break
            path.rmdir()
        raise


def default_out_dir(root: Path = Path("results"), prefix: str = "") -> Path:
    """A new folder under ``results/`` named from the local time (suffixed if taken)."""
    stamp = prefix + datetime.now().strftime("%Y%m%d-%H%M%S")
    candidate = root / stamp
    i = 1
    while candidate.exists():
        candidate = root / f"{stamp}-{i}"
        i += 1
    return candidate


def latest_results(root: Path = Path("results")) -> Path:
    """The most recently started results folder under ``root``."""
    candidates = [p.parent for p in root.glob(f"*/{RUN_FILE}")] if root.is_dir() else []
    if not candidates:
        raise AttnbenchError(
            f"no results folder under {str(root)!r}; run attnbench sweep first, or name a "
            "results folder"
        )
    return max(candidates, key=_started)


def committed_run_note(folder: Path) -> str:
    """A line where ``folder``, read because it is the newest run, is committed to the checkout
    it sits in: a fresh clone's results/ holds the runs the manual shows, and before a first
    sweep ``table`` read one of them as though it were the user's (empty where it is not, or
    where git or a checkout is missing)."""
    if git_output(folder, "ls-files", "--error-unmatch", "--", RUN_FILE) is None:
        return ""
    return (
        f"{folder}, the newest run under {folder.parent}, is one committed to this repository "
        "(in a fresh clone, a run the manual shows, not yours): name a results folder to read "
        "another, or attnbench sweep makes one"
    )


def _started(folder: Path) -> float:
    """When a run started, as its run.json records it: a file's time is when it was written
    last, or, in a fresh clone, checked out (``table`` there showed a committed GPU run); the
    file's time where the record has none."""
    try:
        stamp = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))["start_time"]
        return datetime.fromisoformat(stamp).timestamp()
    except (OSError, ValueError, KeyError, TypeError):
        return (folder / RUN_FILE).stat().st_mtime
