"""Writing a results folder case by case, and loading it back.

``ResultsWriter`` appends each finished case at once (its calibration point, its samples, then
its row: a row always has its samples) and keeps ``run.json`` current. ``load_results`` reads a
folder with clear errors for anything that is not one; a kill in the middle of an append leaves
at most one torn last line, which it drops and ``ResultsWriter.reopen`` repairs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd

from attnbench._version import __version__
from attnbench.errors import AttnbenchError
from attnbench.measure.clocks import median_clock, throttled_share
from attnbench.measure.record import CaseResult
from attnbench.measure.timing import TimingStats
from attnbench.results.files import (
    CALIBRATION_FILE,
    RESULTS_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    SCHEMA_VERSION,
    THEORY_FILE,
    csv_line,
    now_iso,
    read_csv,
    rewrite_csv,
    write_json_atomic,
)
from attnbench.results.run import RunResults
from attnbench.results.theories import record_problem
from attnbench.schema import (
    CALIBRATION_COLUMNS,
    OPTIONAL_COLUMNS,
    RESULT_COLUMNS,
    SAMPLE_COLUMNS,
    STATUSES,
    RunStatus,
    Status,
    columns_of,
)
from attnbench.spec import Case
from attnbench.storage import append_synced, create_synced, write_text_atomic


class ResultsWriter:
    """Creates (or reopens) a results folder and appends each finished case to it at once.

    ``run.json`` says whether the run is ``running``, ``complete`` or ``interrupted``, and which
    case was being measured, so that a resumed run knows a case the process died in.
    """

    def __init__(
        self,
        out_dir: Path,
        meta: dict[str, Any],
        points: int = 0,
        columns: Sequence[str] = tuple(RESULT_COLUMNS),
    ) -> None:
        self.out_dir = out_dir
        self.meta = meta
        self.points = points  # calibration points written so far
        self.columns = list(columns)  # results.csv's header: the registry's, then layer options
        self.opened = time.monotonic()  # this session's start: duration_s adds it up at the end

    @classmethod
    def create(
        cls,
        out_dir: Path,
        config: Mapping[str, Any],
        environment: Mapping[str, Any],
        option_columns: Sequence[str] = (),
    ) -> ResultsWriter:
        """A new run in ``out_dir`` (made if missing; the runner checks it first with
        ``prepare_out_dir``). The files are created exclusively: a run already in the folder is
        never written over. ``option_columns``: the layer options without a column of their own
        in the registry (a plugin's), written after the registry's columns.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        header = _header(option_columns)
        try:
            for name, columns in (
                (RESULTS_FILE, header),
                (SAMPLES_FILE, SAMPLE_COLUMNS),
                (CALIBRATION_FILE, CALIBRATION_COLUMNS),
            ):
                create_synced(out_dir / name, csv_line(columns))
        except FileExistsError:
            raise AttnbenchError(
                f"--out {str(out_dir)!r} already holds a run; results are never overwritten"
            ) from None
        meta: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "tool": "attnbench",
            "attnbench_version": __version__,
            "config": dict(config),
            "environment": dict(environment),
            "start_time": now_iso(),
            "end_time": None,
            "status": RunStatus.RUNNING,
            "pid": os.getpid(),
            "current_case": None,
            "cases_total": None,
            "resumes": [],
        }
        writer = cls(out_dir, meta, columns=header)
        writer._save_meta()
        return writer

    @classmethod
    def reopen(
        cls, run: RunResults, resume: Mapping[str, Any], option_columns: Sequence[str] = ()
    ) -> ResultsWriter:
        """Reopen a loaded run to add its missing cases; ``resume`` (time, changes) goes into
        run.json.

        Every file is rewritten from its typed table, atomically: a torn last line and samples
        of a case without a row (both dropped by the loader) are gone, and a folder from before
        a column (or the calibration file) was added gains it, with one header for all rows.
        """
        header = _header([*run.frame.columns[len(RESULT_COLUMNS) :], *option_columns])
        frame = run.frame.reindex(columns=header)
        for name, table, columns in (
            (RESULTS_FILE, frame, header),
            (SAMPLES_FILE, run.samples, SAMPLE_COLUMNS),
            (CALIBRATION_FILE, run.calibration, CALIBRATION_COLUMNS),
        ):
            rows = [csv_line(list(row)) for row in table[columns].itertuples(index=False)]
            rewrite_csv(run.path / name, columns, rows)
        meta = dict(run.meta)
        meta["resumes"] = [*meta.get("resumes", []), dict(resume)]
        meta.update(status=RunStatus.RUNNING, pid=os.getpid(), end_time=None)
        points = int(run.calibration["point"].max()) + 1 if len(run.calibration) else 0
        writer = cls(Path(run.path), meta, points, header)
        writer._save_meta()
        return writer

    def _save_meta(self) -> None:
        write_json_atomic(self.out_dir / RUN_FILE, self.meta)

    def _append(self, name: str, text: str) -> None:
        append_synced(self.out_dir / name, text)

    def record_theories(self, record: Mapping[str, Any]) -> None:
        """Write theory.json: what reading the run needs of its plugin layers (no code)."""
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
        write_text_atomic(self.out_dir / THEORY_FILE, text + "\n")

    def update(self, **entries: Any) -> None:
        """Set entries of run.json (the case total, the cluster, the calibration kernel)."""
        self.meta.update(entries)
        self._save_meta()

    def begin(self, case: Case | None) -> None:
        """Record the case about to be measured (what a resumed run learns if we die in it);
        None once only later timing rounds are left (those add no row)."""
        self.update(current_case=case.case_id if case is not None else None)

    def append(self, result: CaseResult, calibration: TimingStats | None = None) -> None:
        """Persist one case: the calibration point taken before it, its samples, then its row
        (a row always has its samples)."""
        row = result.to_row()
        self._append_calibration(row["case_id"], calibration)
        if result.timing is not None:
            self._append_samples(row["case_id"], 1, 0, result.timing, result.load_1m)
        self._append(RESULTS_FILE, csv_line([row.get(column) for column in self.columns]))

    def append_round(
        self,
        case_id: str,
        round_: int,
        first_sample: int,
        timing: TimingStats,
        calibration: TimingStats | None = None,
        load_1m: float | None = None,
    ) -> None:
        """Persist a later timing round of a case already on disk: its calibration point and
        its samples, numbered on from ``first_sample``."""
        self._append_calibration(case_id, calibration)
        self._append_samples(case_id, round_, first_sample, timing, load_1m)

    def _append_calibration(self, case_id: str, calibration: TimingStats | None) -> None:
        if calibration is None:
            return
        lines = [
            csv_line([self.points, case_id, i, s]) for i, s in enumerate(calibration.samples_s)
        ]
        self._append(CALIBRATION_FILE, "".join(lines))
        self.points += 1

    def _append_samples(
        self, case_id: str, round_: int, first: int, timing: TimingStats, load: float | None
    ) -> None:
        faults = timing.faults or (None,) * timing.count
        clocks = timing.clocks_mhz or (None,) * timing.count
        lines = [
            csv_line([case_id, first + i, s, round_, load, f, c])
            for i, (s, f, c) in enumerate(zip(timing.samples_s, faults, clocks, strict=True))
        ]
        self._append(SAMPLES_FILE, "".join(lines))

    def finish(self, status: RunStatus = RunStatus.COMPLETE) -> None:
        """Close the run as ``complete`` or ``interrupted``, adding this session's seconds,
        from opening the run to its last result written, to ``duration_s`` (the seconds the
        sweep has run over every session: a resume adds its own; end_time - start_time would
        count the pause between, to the whole second)."""
        before = self.meta.get("duration_s") or 0.0
        duration = round(before + time.monotonic() - self.opened, 3)
        self.update(status=status, end_time=now_iso(), current_case=None, duration_s=duration)


def _header(option_columns: Sequence[str]) -> list[str]:
    extra = [c for c in dict.fromkeys(option_columns) if c not in RESULT_COLUMNS]
    return [*RESULT_COLUMNS, *extra]


# ----------------------------------------------------------------------------- reading


def _read_meta(path: Path) -> dict[str, Any]:
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
    problem = _meta_problem(meta)
    if problem:
        raise AttnbenchError(f"{str(run_file)!r} is malformed: {problem}")
    return meta


_OPTIONAL = type(None)
# What each entry of run.json must be, where it is present (older runs lack some).
META_TYPES: dict[str, tuple[type, ...]] = {
    "attnbench_version": (str,),
    "config": (dict,),
    "environment": (dict,),
    "start_time": (str, _OPTIONAL),
    "end_time": (str, _OPTIONAL),
    "duration_s": (float, int, _OPTIONAL),
    "status": (str, _OPTIONAL),
    "pid": (int, _OPTIONAL),
    "current_case": (str, _OPTIONAL),
    "cases_total": (int, _OPTIONAL),
    "resumes": (list,),
    "cluster": (dict, _OPTIONAL),
    "layers": (dict,),
    "calibration": (dict, _OPTIONAL),
    "ab": (int,),
    "allocator": (dict,),
    "fault_cost_s": (float, _OPTIONAL),
    "ceilings": (dict, _OPTIONAL),
    "count_cache": (dict, _OPTIONAL),
    "auto": (dict, _OPTIONAL),
}
# The configuration entries that the reading commands use, by the types they must have.
CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "layers": (list,),
    "ns": (list, str),  # a string: --n auto (spec.AutoN.text)
    "ds": (list,),
    "batch": (int, _OPTIONAL),
    "dtype": (str,),
    "device": (str,),
    "mode": (str,),
    "rounds": (int,),
    "metric": (str,),
}
SOURCE_KEYS = ("kind", "spec", "digest", "distribution")


def _wrong(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return True  # JSON's true is no count
    return not isinstance(value, types)


def _kinds(types: tuple[type, ...]) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer"}
    return " or ".join(names.get(t, "null") for t in types)


def _meta_problem(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with a run record's types, in words; None when it reads as a run."""
    for key, types in META_TYPES.items():
        if key in meta and _wrong(meta[key], types):
            return f"{key!r} should be {_kinds(types)}, not {json.dumps(meta[key])[:40]}"
    config = meta.get("config", {})
    for key, types in CONFIG_TYPES.items():
        if key in config and _wrong(config[key], types):
            return f"config {key!r} should be {_kinds(types)}, not {json.dumps(config[key])[:40]}"
    for key in ("layers", "ns", "ds"):
        kind = str if key == "layers" else int
        if isinstance(config.get(key), str):
            continue
        if any(_wrong(item, (kind,)) for item in config.get(key, [])):
            return f"config {key!r} holds a value that is not {_kinds((kind,))}"
    for name, source in meta.get("layers", {}).items():
        if not isinstance(source, dict) or set(source) != set(SOURCE_KEYS):
            return f"layer {name!r}'s source should name {', '.join(SOURCE_KEYS)}"
        if any(not isinstance(v, str) for v in source.values()):
            return f"layer {name!r}'s source holds a value that is not a string"
    return None


def _read_tables(path: Path, warnings: list[str]) -> tuple[pd.DataFrame, ...]:
    """results, samples and calibration, typed; a torn last line of each is dropped."""
    required = [c for c in RESULT_COLUMNS if c not in OPTIONAL_COLUMNS]
    tables = []
    for name, columns, what in (
        (RESULTS_FILE, required, "results file"),
        (SAMPLES_FILE, SAMPLE_COLUMNS[:3], "samples file"),  # round: added later
        (CALIBRATION_FILE, CALIBRATION_COLUMNS, "calibration file"),
    ):
        if (path / name).exists() and not (path / name).is_file():
            raise AttnbenchError(f"{str(path / name)!r} is not a file")
        if not (path / name).is_file():
            if name != CALIBRATION_FILE:  # written since the first version: its rows' samples
                raise AttnbenchError(f"{str(path)!r} has no {name}")
            tables.append(pd.DataFrame(columns=columns))  # written before the file existed
            continue
        table, torn = read_csv(path / name, columns, what)
        if torn:
            warnings.append(
                f"dropped a torn last line of {name}"
                + (" (an interrupted write)" if name == RESULTS_FILE else "")
            )
        tables.append(table)
    frame, samples, calibration = tables
    if "round" not in samples.columns:  # written before timing rounds existed
        samples["round"] = "1"
    for later in ("load_1m", "page_faults", "sm_clock_mhz"):  # written before these were
        if later not in samples.columns:  # recorded
            samples[later] = ""
    for table in (samples, calibration):
        table["sample"] = pd.to_numeric(table["sample"]).astype("int64")
        table["time_s"] = pd.to_numeric(table["time_s"]).astype("float64")
    calibration["point"] = pd.to_numeric(calibration["point"]).astype("int64")
    samples["round"] = pd.to_numeric(samples["round"]).astype("int64")
    for column in ("load_1m", "page_faults", "sm_clock_mhz"):
        samples[column] = pd.to_numeric(samples[column].where(samples[column] != ""))
    return _typed_results(frame), samples[SAMPLE_COLUMNS], calibration


def load_results(path: Path | str) -> RunResults:
    """Load a results folder written by ``attnbench sweep``; clear errors for anything else.

    A torn last line (a kill in the middle of an append) is dropped with a warning, and so are
    samples whose case has no row: every complete case is kept.
    """
    path = Path(path)
    meta = _read_meta(path)
    warnings: list[str] = []
    try:
        frame, samples, calibration = _read_tables(path, warnings)
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
    if len(samples) and (samples["round"].max() > 1 or frame["time_ci_high_s"].isna().all()):
        frame = _with_all_rounds(frame, samples)
    return RunResults(
        path=path,
        frame=frame,
        samples=samples,
        meta=meta,
        warnings=tuple(warnings),
        calibration=calibration,
        theories=_read_theories(path),
    )


def _read_theories(path: Path) -> dict[str, Any]:
    """theory.json, or {} where the run has none; its content is checked where it is read."""
    file = path / THEORY_FILE
    if not file.exists():
        return {}
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AttnbenchError(f"{str(file)!r} is unreadable or corrupt: {exc}") from None
    problem = record_problem(found)
    if problem:
        raise AttnbenchError(f"{str(file)!r} is malformed: {problem}")
    return cast("dict[str, Any]", found)


def _with_all_rounds(frame: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """A row is written after a case's first round; its timing columns (and FLOP/s and the
    kernels' time) over every round come from ``TimingStats``, the one place timing statistics
    are derived. A run from before the median's confidence interval was written gets it here."""
    frame = frame.copy()
    by_case = samples.groupby("case_id")["time_s"]
    ok = frame.index[frame["status"].eq(Status.OK) & frame["case_id"].isin(by_case.groups)]
    for i in ok:
        row = frame.loc[i]
        every = TimingStats(
            tuple(by_case.get_group(row["case_id"])),
            int(row["calls_per_sample"]),
            float(row["time_total_s"]),
        )
        flops = row["flops"]
        low, high = every.ci_s
        frame.loc[i, ["time_s", "time_iqr_s", "samples", "time_ci_low_s", "time_ci_high_s"]] = [
            every.median_s,
            every.iqr_s,
            every.count,
            low,
            high,
        ]
        frame.loc[i, "flops_per_s"] = float(flops) / every.median_s if pd.notna(flops) else None
        share = row["kernel_share"]
        frame.loc[i, "kernel_time_s"] = float(share) * every.median_s if pd.notna(share) else None
        own = samples.loc[samples["case_id"] == row["case_id"]]
        faults = own["page_faults"].dropna()
        if len(faults):  # the median sample's, as time_s (TimingStats.page_faults)
            frame.loc[i, "page_faults"] = float(faults.median())
        clocks = own["sm_clock_mhz"].dropna().tolist()
        if clocks:  # over every round, as time_s
            frame.loc[i, "sm_clock_mhz"] = median_clock(clocks)
            top = row["sm_clock_max_mhz"]
            frame.loc[i, "throttled_share"] = throttled_share(
                clocks, None if pd.isna(top) else float(top)
            )
    return frame


def _typed_results(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed columns from the all-text read: nullable integers, floats and plain strings; the
    columns after the registry's are layer options (integers)."""
    frame = frame.copy()
    for col in OPTIONAL_COLUMNS:
        if col not in frame.columns:
            frame[col] = ""
    options = [c for c in frame.columns if c not in RESULT_COLUMNS]
    frame = frame[[*RESULT_COLUMNS, *options]]
    for col in [*columns_of("int"), *options]:
        values = pd.to_numeric(frame[col].where(frame[col] != ""))
        if not values.dropna().eq(values.dropna().round()).all():
            raise ValueError(f"column {col!r} holds a non-integer")
        frame[col] = values.astype("Int64")
    for col in columns_of("float"):
        frame[col] = pd.to_numeric(frame[col].where(frame[col] != "")).astype("float64")
    for col in columns_of("text"):
        frame[col] = frame[col].astype(str)
    return frame
