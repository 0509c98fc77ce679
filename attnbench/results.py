"""Results on disk: a tidy table, the raw samples, and the run record.

A results folder holds
- ``results.csv``: one row per case (``RESULT_COLUMNS``), appended as each case finishes;
- ``samples.csv``: every raw timing sample, long format (case_id, sample, time_s, round); a
  sweep with several timing rounds appends each later round's samples as it goes, and the
  statistics in the loaded table (time_s, time_iqr_s, samples) are derived from all of them;
- ``calibration.csv``: the calibration GEMM's samples, timed before each measured case
  (point, before_case, sample, time_s); what ``compare --normalize`` divides by;
- ``run.json``: schema version, configuration, environment, start and end time.
Rows are appended with one write, flushed and fsynced, so a crash keeps every finished case;
``run.json`` is replaced atomically (temporary file and rename). A kill in the middle of an append
can leave at most one torn last line, which readers drop and ``ResultsWriter.reopen`` repairs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench import __version__
from attnbench.errors import AttnbenchError
from attnbench.measure.flops import flops_agree
from attnbench.measure.timing import TimingStats, iqr
from attnbench.spec import Case

SCHEMA_VERSION = 1
RESULTS_FILE = "results.csv"
SAMPLES_FILE = "samples.csv"
CALIBRATION_FILE = "calibration.csv"
RUN_FILE = "run.json"

CASE_COLUMNS = [
    "case_id",
    "layer",
    "n",
    "d",
    "k",
    "heads",
    "window",
    "batch",
    "dtype",
    "device",
    "mode",
]
METRIC_COLUMNS = [
    "threads",
    "status",  # ok | oom | timeout | skipped | failed (see STATUSES)
    "time_s",  # median seconds per call
    "time_iqr_s",  # interquartile range of the samples, seconds
    "samples",  # number of timing samples
    "calls_per_sample",  # calls per timed block (each sample is a block's mean)
    "time_total_s",  # seconds spent inside timed calls for this case
    "peak_bytes",  # peak bytes allocated above the pre-call baseline, one call
    "flops",  # FLOPs counted from the real call
    "flops_analytic",  # FLOPs from attnbench.theory
    "flops_check",  # ok | mismatch (counted vs analytic beyond 1%)
    "flops_per_s",  # counted FLOPs / median time
    "wall_s",  # wall seconds for the whole case, measurement overheads included
    "error",  # first line of the error, when status is not ok
]
STRUCTURE_COLUMNS = [
    "seq_steps",  # longest chain of dependent ops in one forward call (traced)
    "seq_steps_method",  # how: "traced" (fused RNN kernels disabled)
    "path_len",  # maximum path length in position-mixing steps
    "path_len_method",  # "measured" (Jacobian pattern at n), or "extended: <law>", or "none: ..."
]
PLACEMENT_COLUMNS = [
    "node",  # host name of the machine the case ran on
    "device_id",  # the device there: cuda:<physical index> or cpu
    "device_name",  # its model (GPU name, or CPU model): what charts and compare group by
]
RESULT_COLUMNS = CASE_COLUMNS + METRIC_COLUMNS + STRUCTURE_COLUMNS + PLACEMENT_COLUMNS
# Added after the first release: folders written before them still load, with these empty.
OPTIONAL_COLUMNS = ["window", *STRUCTURE_COLUMNS, *PLACEMENT_COLUMNS]
SAMPLE_COLUMNS = ["case_id", "sample", "time_s", "round"]
CALIBRATION_COLUMNS = ["point", "before_case", "sample", "time_s"]

STATUSES = {
    "ok": "measured",
    "oom": "ran out of memory",
    "timeout": "one call took longer than --max-case-seconds",
    "skipped": "not run: a smaller case of the same layer ran out of memory or time",
    "failed": "raised an error (see the error column)",
}
# What a process killed inside a case leaves behind; ``resume`` records that case with this error.
DIED_ERROR = "the process died while measuring this case (killed, or out of memory?)"
# How a case whose worker died on both tries is recorded (the reason follows).
WORKER_DIED_ERROR = "the worker died while measuring this case, twice"


@dataclass(frozen=True)
class CaseResult:
    """Everything measured for one case; ``timing`` keeps the raw samples."""

    case: Case
    status: str
    threads: int
    timing: TimingStats | None = None
    peak_bytes: int | None = None
    flops: int | None = None
    flops_analytic: float | None = None
    seq_steps: int | None = None
    seq_steps_method: str = ""
    path_len: int | None = None
    path_len_method: str = ""
    wall_s: float | None = None
    error: str = ""
    node: str = ""
    device_id: str = ""
    device_name: str = ""

    @property
    def flops_per_s(self) -> float | None:
        if self.timing is None or self.flops is None or self.timing.median_s <= 0:
            return None
        return self.flops / self.timing.median_s

    @property
    def flops_check(self) -> str:
        if self.flops is None or self.flops_analytic is None:
            return ""
        return "ok" if flops_agree(self.flops, self.flops_analytic) else "mismatch"

    def to_row(self) -> dict[str, Any]:
        c, t = self.case, self.timing
        return {
            "case_id": c.case_id,
            "layer": c.layer,
            "n": c.n,
            "d": c.d,
            "k": c.k,
            "heads": c.heads,
            "window": c.window,
            "batch": c.batch,
            "dtype": c.dtype,
            "device": c.device,
            "mode": c.mode,
            "threads": self.threads,
            "status": self.status,
            "time_s": t.median_s if t else None,
            "time_iqr_s": t.iqr_s if t else None,
            "samples": t.count if t else None,
            "calls_per_sample": t.calls_per_sample if t else None,
            "time_total_s": t.total_s if t else None,
            "peak_bytes": self.peak_bytes,
            "flops": self.flops,
            "flops_analytic": self.flops_analytic,
            "flops_check": self.flops_check,
            "flops_per_s": self.flops_per_s,
            "wall_s": self.wall_s,
            "error": self.error,
            "seq_steps": self.seq_steps,
            "seq_steps_method": self.seq_steps_method,
            "path_len": self.path_len,
            "path_len_method": self.path_len_method,
            "node": self.node,
            "device_id": self.device_id,
            "device_name": self.device_name,
        }


# ----------------------------------------------------------------------------- writing


def now_iso() -> str:
    """Local time with its UTC offset, to the second: how run.json records every time."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` through a synced temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _csv_line(values: Sequence[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(
        ["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]
    )
    return buf.getvalue()


class ResultsWriter:
    """Creates (or reopens) a results folder and appends each finished case to it at once.

    ``run.json`` says whether the run is ``running``, ``complete`` or ``interrupted``, and which
    case was being measured, so that a resumed run knows a case the process died in.
    """

    def __init__(self, out_dir: Path, meta: dict[str, Any], points: int = 0) -> None:
        self.out_dir = out_dir
        self.meta = meta
        self.points = points  # calibration points written so far

    @classmethod
    def create(
        cls, out_dir: Path, config: Mapping[str, Any], environment: Mapping[str, Any]
    ) -> ResultsWriter:
        out_dir = prepare_out_dir(out_dir)
        meta: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "tool": "attnbench",
            "attnbench_version": __version__,
            "config": dict(config),
            "environment": dict(environment),
            "start_time": now_iso(),
            "end_time": None,
            "status": "running",
            "pid": os.getpid(),
            "current_case": None,
            "cases_total": None,
            "resumes": [],
        }
        writer = cls(out_dir, meta)
        writer._save_meta()
        writer._append(RESULTS_FILE, _csv_line(RESULT_COLUMNS))
        writer._append(SAMPLES_FILE, _csv_line(SAMPLE_COLUMNS))
        writer._append(CALIBRATION_FILE, _csv_line(CALIBRATION_COLUMNS))
        return writer

    @classmethod
    def reopen(cls, out_dir: Path, resume: Mapping[str, Any]) -> ResultsWriter:
        """Reopen a run to add its missing cases; ``resume`` (time, changes) goes into run.json.

        Repairs first: a torn last line is cut and samples of a case without a row (the process
        died between the two appends) are dropped, each file replaced atomically.
        """
        run = load_results(out_dir)  # refuses what is not a results folder
        # Every file is rewritten from its typed table, so a folder from before a column (or the
        # calibration file) was added gains it and keeps one header for old and new rows.
        for name, table, columns in (
            (RESULTS_FILE, run.frame, RESULT_COLUMNS),
            (SAMPLES_FILE, run.samples, SAMPLE_COLUMNS),
            (CALIBRATION_FILE, run.calibration, CALIBRATION_COLUMNS),
        ):
            rows = [
                _csv_line([None if pd.isna(v) else v for v in row])
                for row in table[columns].itertuples(index=False)
            ]
            _rewrite_csv(out_dir / name, columns, rows)
        meta = dict(run.meta)
        meta["resumes"] = [*meta.get("resumes", []), dict(resume)]
        meta.update(status="running", pid=os.getpid(), end_time=None)
        points = int(run.calibration["point"].max()) + 1 if len(run.calibration) else 0
        writer = cls(Path(out_dir), meta, points)
        writer._save_meta()
        return writer

    def _save_meta(self) -> None:
        write_json_atomic(self.out_dir / RUN_FILE, self.meta)

    def _append(self, name: str, text: str) -> None:
        with open(self.out_dir / name, "a", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def set_total(self, total: int) -> None:
        self.meta["cases_total"] = total
        self._save_meta()

    def begin(self, case: Case | None) -> None:
        """Record the case about to be measured (what a resumed run learns if we die in it);
        None once only later timing rounds are left (those add no row)."""
        self.meta["current_case"] = case.case_id if case is not None else None
        self._save_meta()

    def set_cluster(self, cluster: Mapping[str, Any]) -> None:
        """Record the executor, nodes and workers that run the cases."""
        self.meta["cluster"] = dict(cluster)
        self._save_meta()

    def set_calibration(self, description: Mapping[str, Any]) -> None:
        """Record which calibration kernel the run times (compared before normalising)."""
        self.meta["calibration"] = dict(description)
        self._save_meta()

    def append(self, result: CaseResult, calibration: TimingStats | None = None) -> None:
        """Persist one case: the calibration point taken before it, its samples, then its row
        (a row always has its samples)."""
        row = result.to_row()
        self._append_calibration(row["case_id"], calibration)
        if result.timing is not None:
            self._append_samples(row["case_id"], 1, 0, result.timing)
        self._append(RESULTS_FILE, _csv_line([row[c] for c in RESULT_COLUMNS]))

    def append_round(
        self,
        case_id: str,
        round_: int,
        first_sample: int,
        timing: TimingStats,
        calibration: TimingStats | None = None,
    ) -> None:
        """Persist a later timing round of a case already on disk: its calibration point and
        its samples, numbered on from ``first_sample``."""
        self._append_calibration(case_id, calibration)
        self._append_samples(case_id, round_, first_sample, timing)

    def _append_calibration(self, case_id: str, calibration: TimingStats | None) -> None:
        if calibration is None:
            return
        lines = [
            _csv_line([self.points, case_id, i, s]) for i, s in enumerate(calibration.samples_s)
        ]
        self._append(CALIBRATION_FILE, "".join(lines))
        self.points += 1

    def _append_samples(self, case_id: str, round_: int, first: int, timing: TimingStats) -> None:
        lines = [_csv_line([case_id, first + i, s, round_]) for i, s in enumerate(timing.samples_s)]
        self._append(SAMPLES_FILE, "".join(lines))

    def finish(self, status: str = "complete") -> None:
        """Close the run as ``complete`` or ``interrupted``."""
        self.meta.update(status=status, end_time=now_iso(), current_case=None)
        self._save_meta()


def _rewrite_csv(path: Path, header: Sequence[str], rows: Sequence[str]) -> None:
    """Replace ``path`` by ``header`` + ``rows`` (complete CSV lines) through a rename."""
    text = _csv_line(header) + "".join(rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text_atomic(path, text)


def prepare_out_dir(out_dir: Path) -> Path:
    """Create ``out_dir`` (and parents) and check it can take a new run without losing one."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise AttnbenchError(f"--out {str(out_dir)!r} is a file, not a folder")
    if (out_dir / RESULTS_FILE).exists() or (out_dir / RUN_FILE).exists():  # never overwrite
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


def default_out_dir(root: Path = Path("results")) -> Path:
    """A new folder under ``results/`` named from the local time (suffixed if taken)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    candidate = root / stamp
    i = 1
    while candidate.exists():
        candidate = root / f"{stamp}-{i}"
        i += 1
    return candidate


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class RunResults:
    """A loaded results folder."""

    path: Path
    frame: pd.DataFrame  # one row per case, RESULT_COLUMNS
    samples: pd.DataFrame  # raw samples, SAMPLE_COLUMNS
    meta: dict[str, Any]  # run.json
    warnings: tuple[str, ...] = ()  # what was repaired on reading (a torn line, orphan samples)
    # The calibration GEMM's samples, CALIBRATION_COLUMNS (empty for runs made before it).
    calibration: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=CALIBRATION_COLUMNS)
    )

    @property
    def calibration_s(self) -> float | None:
        """Median seconds of one calibration GEMM over the whole run; None without samples."""
        if self.calibration.empty:
            return None
        return float(self.calibration["time_s"].median())

    def samples_for(self, case_id: str) -> list[float]:
        """Every timing sample of a case, all rounds, in seconds per call."""
        return self.samples.loc[self.samples["case_id"] == case_id, "time_s"].tolist()

    def rounds_for(self, case_id: str) -> list[list[float]]:
        """A case's samples grouped by timing round, first round first."""
        mine = self.samples[self.samples["case_id"] == case_id]
        return [group["time_s"].tolist() for _, group in mine.groupby("round", sort=True)]

    @property
    def rounds(self) -> int:
        """How many timing rounds the run's cases have (1 for a run without rounds)."""
        return int(self.samples["round"].max()) if len(self.samples) else 1

    @property
    def measured(self) -> pd.DataFrame:
        """The rows with measurements (status ``ok``): what charts, fits and comparisons use."""
        return self.frame[self.frame["status"] == "ok"]

    @property
    def devices(self) -> list[str]:
        """The device models the measured cases ran on, in order of appearance (none for runs
        made before rows named their device)."""
        names = self.measured["device_name"]
        return list(dict.fromkeys(names[names != ""]))

    def for_device(self, name: str) -> RunResults:
        """This run restricted to the cases measured on device model ``name`` (with their
        samples and calibration points): what a chart or a fit of one device reads."""
        frame = self.frame[self.frame["device_name"] == name].reset_index(drop=True)
        ids = set(frame["case_id"])
        return replace(
            self,
            frame=frame,
            samples=self.samples[self.samples["case_id"].isin(ids)].reset_index(drop=True),
            calibration=self.calibration[self.calibration["before_case"].isin(ids)].reset_index(
                drop=True
            ),
        )

    @property
    def status(self) -> str:
        """``complete``, ``interrupted``, or ``running`` (also what a killed run leaves)."""
        status = self.meta.get("status")
        if status in ("complete", "interrupted", "running"):
            return str(status)
        return "complete" if self.meta.get("end_time") else "running"

    def counts(self) -> dict[str, int]:
        """Cases per status, every status named (zeros included), in ``STATUSES`` order."""
        found = self.frame["status"].value_counts().to_dict()
        return {status: int(found.get(status, 0)) for status in STATUSES}


_INT_COLUMNS = [
    "n",
    "d",
    "k",
    "heads",
    "window",
    "batch",
    "threads",
    "samples",
    "calls_per_sample",
    "peak_bytes",
    "flops",
    "seq_steps",
    "path_len",
]
_FLOAT_COLUMNS = [
    "time_s",
    "time_iqr_s",
    "time_total_s",
    "flops_analytic",
    "flops_per_s",
    "wall_s",
]
_TEXT_COLUMNS = [
    "case_id",
    "layer",
    "dtype",
    "device",
    "mode",
    "status",
    "error",
    "flops_check",
    "seq_steps_method",
    "path_len_method",
    *PLACEMENT_COLUMNS,
]


def _complete_lines(path: Path) -> tuple[str, list[str], bool]:
    """Header and complete data lines of an appended CSV; True when a torn last line was cut."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    torn = bool(lines) and not lines[-1].endswith("\n")
    if torn:
        lines = lines[:-1]
    if not lines:
        return "", [], torn
    return lines[0], lines[1:], torn


def _read_csv(path: Path, columns: Sequence[str], what: str) -> tuple[pd.DataFrame, bool]:
    """The complete records of an appended CSV, as text, and whether a torn line was cut."""
    header, rows, torn = _complete_lines(path)
    if not header:
        return pd.DataFrame(columns=list(columns)), torn
    found = next(csv.reader([header]))
    missing = [c for c in columns if c not in found]
    if missing:
        raise AttnbenchError(
            f"{str(path)!r} lacks column(s) {', '.join(missing)}; is it truncated or from "
            f"another tool?"
        )
    frame = pd.read_csv(io.StringIO(header + "".join(rows)), dtype=str, keep_default_na=False)
    if len(frame) != len(rows):
        raise AttnbenchError(
            f"{what} {str(path)!r} is corrupt: {len(rows)} lines but {len(frame)} records"
        )
    return frame, torn


def load_results(path: Path | str) -> RunResults:
    """Load a results folder written by ``attnbench sweep``; clear errors for anything else.

    A torn last line (a kill in the middle of an append) is dropped with a warning, and so are
    samples whose case has no row: every complete case is kept.
    """
    path = Path(path)
    if not path.is_dir():
        raise AttnbenchError(f"{str(path)!r} is not a folder")
    run_file = path / RUN_FILE
    if not run_file.is_file() or not (path / RESULTS_FILE).is_file():
        raise AttnbenchError(
            f"{str(path)!r} is not an attnbench results folder (no {RUN_FILE} / {RESULTS_FILE})"
        )
    try:
        meta = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AttnbenchError(f"{str(run_file)!r} is unreadable or corrupt: {exc}") from None
    if not isinstance(meta, dict) or meta.get("tool", "attnbench") != "attnbench":
        raise AttnbenchError(f"{str(run_file)!r} is not an attnbench run record")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise AttnbenchError(
            f"{str(path)!r} has results schema version {version!r}; this attnbench reads "
            f"version {SCHEMA_VERSION}"
        )
    warnings: list[str] = []
    try:
        required = [c for c in RESULT_COLUMNS if c not in OPTIONAL_COLUMNS]
        frame, torn = _read_csv(path / RESULTS_FILE, required, "results file")
        if torn:
            warnings.append(f"dropped a torn last line of {RESULTS_FILE} (an interrupted write)")
        samples_path = path / SAMPLES_FILE
        if samples_path.is_file():
            samples, torn = _read_csv(samples_path, SAMPLE_COLUMNS[:3], "samples file")
            if torn:
                warnings.append(f"dropped a torn last line of {SAMPLES_FILE}")
            if "round" not in samples.columns:  # written before timing rounds existed
                samples["round"] = "1"
        else:
            samples = pd.DataFrame(columns=SAMPLE_COLUMNS)
        calibration_path = path / CALIBRATION_FILE
        if calibration_path.is_file():
            calibration, torn = _read_csv(calibration_path, CALIBRATION_COLUMNS, "calibration file")
            if torn:
                warnings.append(f"dropped a torn last line of {CALIBRATION_FILE}")
        else:
            calibration = pd.DataFrame(columns=CALIBRATION_COLUMNS)
        frame = _typed_results(frame)
        for table in (samples, calibration):
            table["sample"] = pd.to_numeric(table["sample"]).astype("int64")
            table["time_s"] = pd.to_numeric(table["time_s"]).astype("float64")
        calibration["point"] = pd.to_numeric(calibration["point"]).astype("int64")
        samples["round"] = pd.to_numeric(samples["round"]).astype("int64")
        samples = samples[SAMPLE_COLUMNS]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, pd.errors.ParserError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AttnbenchError(f"results in {str(path)!r} are corrupt: {message}") from None
    unknown = sorted(set(frame["status"]) - set(STATUSES))
    if unknown:
        raise AttnbenchError(
            f"results in {str(path)!r} are corrupt: unknown status {unknown[0]!r} "
            f"(accepted: {', '.join(STATUSES)})"
        )
    if frame["case_id"].duplicated().any():
        dup = frame.loc[frame["case_id"].duplicated(), "case_id"].iloc[0]
        raise AttnbenchError(f"results in {str(path)!r} are corrupt: case {dup!r} appears twice")
    keep = samples["case_id"].isin(set(frame["case_id"])).to_numpy()
    if not keep.all():
        warnings.append(f"ignored {int((~keep).sum())} sample(s) of a case that never finished")
        samples = samples[keep].reset_index(drop=True)
    if len(samples) and samples["round"].max() > 1:
        frame = _with_round_statistics(frame, samples)
    return RunResults(
        path=path,
        frame=frame,
        samples=samples,
        meta=meta,
        warnings=tuple(warnings),
        calibration=calibration,
    )


def _with_round_statistics(frame: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Median, IQR and count over every round's samples (a row was written after round 1)."""
    stats = samples.groupby("case_id")["time_s"].agg(median="median", iqr=iqr, count="size")
    frame = frame.copy()
    has = frame["case_id"].isin(stats.index) & (frame["status"] == "ok")
    ids = frame.loc[has, "case_id"]
    frame.loc[has, "time_s"] = stats.loc[ids, "median"].to_numpy()
    frame.loc[has, "time_iqr_s"] = stats.loc[ids, "iqr"].to_numpy()
    frame.loc[has, "samples"] = stats.loc[ids, "count"].to_numpy()
    frame.loc[has, "flops_per_s"] = (
        frame.loc[has, "flops"].astype("float64") / frame.loc[has, "time_s"]
    ).to_numpy()
    return frame


def _typed_results(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed columns from the all-text read: nullable integers, floats and plain strings."""
    frame = frame.copy()
    for col in OPTIONAL_COLUMNS:
        if col not in frame.columns:
            frame[col] = ""
    frame = frame[RESULT_COLUMNS]
    for col in _INT_COLUMNS:
        values = pd.to_numeric(frame[col].where(frame[col] != ""))
        if not values.dropna().eq(values.dropna().round()).all():
            raise ValueError(f"column {col!r} holds a non-integer")
        frame[col] = values.astype("Int64")
    for col in _FLOAT_COLUMNS:
        frame[col] = pd.to_numeric(frame[col].where(frame[col] != "")).astype("float64")
    for col in _TEXT_COLUMNS:
        frame[col] = frame[col].astype(str)
    return frame


# ----------------------------------------------------------------------------- environment


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_info(where: Path) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout holding ``where`` (None outside one)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit.strip(), "git_dirty": bool(status and status.strip())}


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if device == "mps":
        return f"Apple MPS ({platform.machine()})"
    return _cpu_model()


def environment(device: str = "cpu") -> dict[str, Any]:
    """What a reader needs to trust or reproduce a run: versions, hardware, threads, commit.

    The git commit is that of the checkout attnbench runs from (the layers measured live there).
    """
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "attnbench_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": device_name(device),
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn,
        "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        **_git_info(Path(__file__).resolve().parent),
    }
