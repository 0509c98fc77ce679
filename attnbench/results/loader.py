"""Loading a results folder: clear errors for anything that is not one, a torn last line
dropped, and every case's statistics derived from its raw samples over all its rounds.

What the writer appends (``results.store``) is read back here, and only here: a kill in the
middle of an append leaves at most one torn last line, which this drops and
``ResultsWriter.reopen`` repairs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.formats import RawRun, folder_version, migrate_run
from attnbench.measure.record import timing_columns
from attnbench.measure.timing.clocks import median_clock, throttled_share
from attnbench.measure.timing.loop import Stop, TimingStats
from attnbench.priors import priors_of
from attnbench.results.files import (
    CALIBRATION_FILE,
    RESULTS_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    THEORY_FILE,
    check_columns,
    read_csv,
)
from attnbench.results.record import RunRecord, run_status
from attnbench.results.reruns import (
    SweepsFound,
    judging_level,
    read_sweeps,
    run_level,
    typical_reference,
)
from attnbench.results.run import RunResults
from attnbench.results.theories import record_problem
from attnbench.schema import (
    CALIBRATION_COLUMNS,
    RESULT_COLUMNS,
    SAMPLE_COLUMNS,
    STATUSES,
    RunStatus,
    Status,
    columns_of,
)
from attnbench.spec import DEFAULT_PRECISION, spread_group


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise AttnbenchError(f"{str(path)!r} is not a folder")
    run_file = path / RUN_FILE
    missing = [name for name in (RUN_FILE, RESULTS_FILE) if not (path / name).is_file()]
    if missing:
        sides = [path / side for side in ("base", "current")]
        ab = (
            f"; it holds an ab run, whose sides are results folders: {sides[0]} and {sides[1]}"
            if all((side / RUN_FILE).is_file() for side in sides)
            else ""
        )  # a new user's table on an ab folder was told only what it is not
        raise AttnbenchError(
            f"{str(path)!r} is not an attnbench results folder (no {' and no '.join(missing)})" + ab
        )
    try:
        meta = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AttnbenchError(f"{str(run_file)!r} is unreadable or corrupt: {exc}") from None
    if not isinstance(meta, dict) or meta.get("tool", "attnbench") != "attnbench":
        raise AttnbenchError(f"{str(run_file)!r} is not an attnbench run record")
    folder_version(meta, str(path))
    problem = _meta_problem(meta)
    if problem:
        raise AttnbenchError(f"{str(run_file)!r} is malformed: {problem}")
    return meta


_OPTIONAL = type(None)
# What each entry of run.json must be, where it is present (a run killed at its start has
# written only some).
META_TYPES: dict[str, tuple[type, ...]] = {
    "attnbench_version": (str,),
    "config": (dict,),
    "environment": (dict,),
    "start_time": (str, _OPTIONAL),
    "end_time": (str, _OPTIONAL),
    "duration_s": (float, int, _OPTIONAL),
    "status": (str, _OPTIONAL),
    "pid": (int, _OPTIONAL),
    "pid_start": (str, _OPTIONAL),
    "current_case": (str, _OPTIONAL),
    "cases_total": (int, _OPTIONAL),
    "resumes": (list,),
    "cluster": (dict, _OPTIONAL),
    "layers": (dict,),
    "calibration": (dict, _OPTIONAL),
    "ab": (int,),
    "ab_pairs": (list, _OPTIONAL),  # an ab side's: (base case id, current case id), both sides'
    "allocator": (dict,),
    "fault_cost_s": (float, _OPTIONAL),
    "ceilings": (dict, _OPTIONAL),
    "count_cache": (dict, _OPTIONAL),
    "auto": (dict, _OPTIONAL),
    "quiet": (dict, _OPTIONAL),
    "reruns": (dict, _OPTIONAL),
    "reruns_other": (dict, _OPTIONAL),
    "reruns_left": (bool,),
    "round_stops": (dict, _OPTIONAL),
    "unrecorded": (list,),
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
    "processes": (int, _OPTIONAL),
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


def _read_raw(
    path: Path, meta: dict[str, Any], warnings: list[str], resuming: bool = False
) -> RawRun:
    """The folder's files as text, in the format its run.json states; a torn last line of each
    table is dropped. A kill leaves one only in an unfinished run: a finished run's results
    cut short (mid-row, or in the header) are corrupt, except to --resume (``resuming``),
    which measures the lost cases again; a finished run cut short passed a gate, its lost
    cases listed as on one side only."""
    tables: list[pd.DataFrame | None] = []
    for name, what in (
        (RESULTS_FILE, "results file"),
        (SAMPLES_FILE, "samples file"),
        (CALIBRATION_FILE, "calibration file"),
    ):
        if (path / name).exists() and not (path / name).is_file():
            raise AttnbenchError(f"{str(path / name)!r} is not a file")
        if not (path / name).is_file():
            if name != CALIBRATION_FILE:
                raise AttnbenchError(f"{str(path)!r} has no {name}")
            tables.append(None)  # the format's steps say whether that may be
            continue
        table, torn = read_csv(path / name, what)
        if table is None:  # not even a header: a file cut at its creation holds no rows
            table = pd.DataFrame(columns=CALIBRATION_COLUMNS) if name == CALIBRATION_FILE else None
        cut = name == RESULTS_FILE and (torn or table is None)
        if cut and run_status(meta) == RunStatus.COMPLETE and not resuming:
            raise AttnbenchError(
                f"results in {str(path)!r} are corrupt: the {name} of a finished run is cut "
                f"short ({'in its header' if table is None else 'in its last row'})"
            )
        if torn:
            warnings.append(
                f"dropped a torn last line of {name}"
                + (" (an interrupted write)" if name == RESULTS_FILE else "")
            )
        tables.append(table)
    results, samples, calibration = tables
    return RawRun(
        meta=meta,
        results=pd.DataFrame(columns=RESULT_COLUMNS) if results is None else results,
        samples=pd.DataFrame(columns=SAMPLE_COLUMNS) if samples is None else samples,
        calibration=calibration,
        theories=_read_theories(path),
    )


def _typed_tables(path: Path, raw: RawRun) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """results, samples and calibration of a folder in today's format, typed."""
    if raw.calibration is None:
        raise AttnbenchError(f"{str(path)!r} has no {CALIBRATION_FILE}")
    frame, samples, calibration = raw.results, raw.samples.copy(), raw.calibration.copy()
    for table, columns, name in (
        (frame, RESULT_COLUMNS, RESULTS_FILE),
        (samples, SAMPLE_COLUMNS, SAMPLES_FILE),
        (calibration, CALIBRATION_COLUMNS, CALIBRATION_FILE),
    ):
        check_columns(table, columns, path / name)
    for table in (samples, calibration):
        table["sample"] = pd.to_numeric(table["sample"]).astype("int64")
        table["time_s"] = pd.to_numeric(table["time_s"]).astype("float64")
    calibration["point"] = pd.to_numeric(calibration["point"]).astype("int64")
    samples["round"] = pd.to_numeric(samples["round"]).astype("int64")
    samples["process"] = pd.to_numeric(samples["process"]).astype("int64")
    for column in ("load_1m", "page_faults", "sm_clock_mhz", "reference_s", "others_cores"):
        samples[column] = pd.to_numeric(samples[column].where(samples[column] != ""))
    left = samples["blocks_left_out"]  # a count: "2" stays 2 when a resume writes it again
    samples["blocks_left_out"] = pd.to_numeric(left.where(left != "")).astype("Int64")
    return _typed_results(frame), samples[SAMPLE_COLUMNS], calibration


def load_results(path: Path | str, *, resuming: bool = False) -> RunResults:
    """Load a results folder written by ``attnbench sweep``; clear errors for anything else.

    A torn last line (a kill in the middle of an append) is dropped with a warning, and so are
    samples whose case has no row: every complete case is kept. A finished run's results cut
    short are corrupt, except to ``--resume`` (``resuming``; ``_read_raw``). Rows removed
    whole (a run filtered by hand) are read as they are.
    """
    path = Path(path)
    warnings: list[str] = []
    try:
        raw = migrate_run(_read_raw(path, _read_meta(path), warnings, resuming), str(path))
        frame, samples, calibration = _typed_tables(path, raw)
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
    for size in ("n", "d", "batch"):  # no sweep measures a size under 1 (a hand edit: n = -7)
        under = frame[frame[size].notna() & frame[size].lt(1)]
        if len(under):
            row = under.iloc[0]
            raise AttnbenchError(
                f"results in {str(path)!r} are corrupt: case {row['case_id']!r} has "
                f"{size} = {row[size]}, not a size of 1 or more"
            )
    keep = samples["case_id"].isin(set(frame["case_id"])).to_numpy()
    if not keep.all():
        warnings.append(f"ignored {int((~keep).sum())} sample(s) of a case that never finished")
        samples = samples[keep].reset_index(drop=True)
    timed = samples["time_s"]  # no clock reads a time under 0, nor an infinite one: a hand edit
    odd = ~(timed.ge(0) & timed.lt(math.inf)).to_numpy()
    if odd.any():
        first = samples.loc[odd, "time_s"].iloc[0]
        warnings.append(
            f"ignored {int(odd.sum())} sample(s) whose time is not a time ({float(first)!r} the "
            "first)"
        )
        samples = samples[~odd].reset_index(drop=True)
    sweeps = SweepsFound()
    if len(samples) and (samples["round"].max() > 1 or frame["time_ci_high_s"].isna().all()):
        frame, sweeps = _with_all_rounds(frame, samples, RunRecord.parse(raw.meta))
    return RunResults(
        path=path,
        frame=frame,
        samples=samples,
        meta=_with_unrecorded(raw.meta, frame),
        warnings=tuple(warnings),
        calibration=calibration,
        theories=_checked_theories(path, raw.theories),
        between=sweeps.between,
        entries=sweeps.entries,
        elsewhere=sweeps.elsewhere,
        moved=sweeps.moved,
    )


def _with_unrecorded(meta: dict[str, Any], frame: pd.DataFrame) -> dict[str, Any]:
    """run.json with ``unrecorded`` naming only the columns empty in every row: a column the
    loader derives from the samples, or a resumed session wrote, is recorded."""
    if "unrecorded" not in meta:
        return meta
    empty = [
        c
        for c in meta["unrecorded"]
        if c in frame and (frame[c].isna() | frame[c].astype(str).eq("")).all()
    ]
    return {**meta, "unrecorded": empty}


def _read_theories(path: Path) -> dict[str, Any]:
    """theory.json as read, or {} where the run has none."""
    file = path / THEORY_FILE
    if not file.exists():
        return {}
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AttnbenchError(f"{str(file)!r} is unreadable or corrupt: {exc}") from None
    if not isinstance(found, dict):
        raise AttnbenchError(f"{str(file)!r} is malformed: not an object of layers")
    return found


def _checked_theories(path: Path, found: dict[str, Any]) -> dict[str, Any]:
    """theory.json in today's format, checked where it is read."""
    problem = record_problem(found)
    if problem:
        raise AttnbenchError(f"{str(path / THEORY_FILE)!r} is malformed: {problem}")
    return found


# The columns a case's rounds together decide (``measure.record.timing_columns``).
OVER_ROUNDS = (
    "time_s", "time_iqr_s", "samples", "time_ci_low_s", "time_ci_high_s", "time_stop",
    "rounds", "rounds_disturbed", "spread_between", "spread_within",
)  # fmt: skip


def _with_all_rounds(
    frame: pd.DataFrame, samples: pd.DataFrame, record: RunRecord
) -> tuple[pd.DataFrame, SweepsFound]:
    """A row is written after a case's first round; its timing columns (and FLOP/s and the
    kernels' time) over every round come from ``TimingStats``, the one place timing statistics
    are derived. Rows that hold no interval get it here. A round is judged disturbed against
    the run's quiet level, or the machine's (``run.quiet``) where that was quieter; the interval
    holds the case's spread between this machine's sweeps where earlier ones were recorded
    (``results.reruns``)."""
    machine_quiet = record.machine_quiet_s
    frame = frame.copy()
    by_case = samples.groupby("case_id")["time_s"]
    ok = frame.index[frame["status"].eq(Status.OK) & frame["case_id"].isin(by_case.groups)]
    level = run_level(samples)  # the run's own fast end
    quiet = judging_level(level, machine_quiet)
    state = typical_reference(samples)  # the machine's state it ran in
    stats = {}
    by_id = {str(key): rows for key, rows in samples.groupby("case_id", sort=False)}
    for i in ok:
        row = frame.loc[i]
        own = by_id[str(row["case_id"])]
        stats[i] = TimingStats(
            tuple(own["time_s"]),
            int(row["calls_per_sample"]),
            float(row["time_total_s"]),
            rounds=tuple(int(r) for r in own["round"]),
            references_s=tuple(None if pd.isna(r) else float(r) for r in own["reference_s"]),
            others_cores=tuple(None if pd.isna(o) else float(o) for o in own["others_cores"]),
            quiet_s=quiet,
            rounds_stop=_recorded_stop(record.round_stops.get(str(row["case_id"]))),
            precision=float(record.config.get("precision", DEFAULT_PRECISION)),
        )
    group = {i: spread_group(str(frame.loc[i, "case_id"])) for i in stats}  # a layer's cases
    priors = priors_of((group[i], *timing.kept_variance()) for i, timing in stats.items())
    # A case of one round takes its layer's spread between processes where the sweep gave
    # each case several (``estimators.estimate``), not under --processes 1, whose cases of more
    # than one had a disturbed round to replace and read that spread in theirs.
    several = record.processes > 1
    prior = {i: priors.of(group[i]) if several or _rounds(stats[i]) > 1 else None for i in stats}
    own_level = None if math.isnan(state) else state  # a sweep in a slower state is not busy
    cases = {  # for what the sweep leaves: its rounds judged against its own state's level
        str(frame.loc[i, "case_id"]): (
            frame.loc[i].to_dict(),
            replace(stats[i], prior=prior[i], quiet_s=own_level).estimate,
        )
        for i in ok
    }
    found = read_sweeps(cases, record, state, level)
    filled: dict[str, dict[Any, Any]] = {}  # column -> {row: value}, set once a column
    for i in ok:
        row = frame.loc[i]
        own = by_id[str(row["case_id"])]
        every = replace(stats[i], prior=prior[i], between=found.between.get(str(row["case_id"])))
        flops = row["flops"]
        columns = timing_columns(every)
        cells = {name: columns[name] for name in OVER_ROUNDS}
        cells["flops_per_s"] = float(flops) / every.median_s if pd.notna(flops) else None
        share = row["kernel_share"]
        cells["kernel_time_s"] = float(share) * every.median_s if pd.notna(share) else None
        faults = own["page_faults"].dropna()
        if len(faults):  # the median sample's, as time_s (TimingStats.page_faults)
            cells["page_faults"] = float(faults.median())
        clocks = own["sm_clock_mhz"].dropna().tolist()
        if clocks:  # over every round, as time_s
            cells["sm_clock_mhz"] = median_clock(clocks)
            top = row["sm_clock_max_mhz"]
            cells["throttled_share"] = throttled_share(clocks, None if pd.isna(top) else float(top))
        for name, value in cells.items():
            filled.setdefault(name, {})[i] = value
    for name, values in filled.items():  # a column at a time: 14 scalar writes a row cost 1 s
        frame.loc[list(values), name] = pd.Series(values, dtype=frame[name].dtype)
    return frame, found


def _recorded_stop(value: str | None) -> Stop | None:
    """What run.json says ended a case's rounds (None: nothing, or a rule this version does
    not know)."""
    return next((stop for stop in Stop if stop.value == value), None)


def _numbers(frame: pd.DataFrame, col: str) -> pd.Series:
    """A column of text as numbers ("" is missing); a value that is none names its column and
    its case ("Unable to parse string 'abc' at position 2" named neither)."""
    text = frame[col].where(frame[col] != "")
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & text.notna() & ~text.astype(str).str.strip().str.lower().eq("nan")
    if bad.any():
        first = bad.idxmax()
        raise ValueError(
            f"column {col!r} holds {text[first]!r}, not a number "
            f"(case {frame.loc[first, 'case_id']!r})"
        )
    return values


def _typed_results(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed columns from the all-text read: nullable integers, floats and plain strings; the
    columns after the registry's are layer options (integers)."""
    frame = frame.copy()
    options = [c for c in frame.columns if c not in RESULT_COLUMNS]
    frame = frame[[*RESULT_COLUMNS, *options]]
    for col in [*columns_of("int"), *options]:
        values = _numbers(frame, col)
        if not values.dropna().eq(values.dropna().round()).all():
            raise ValueError(f"column {col!r} holds a non-integer")
        frame[col] = values.astype("Int64")
    for col in columns_of("float"):
        frame[col] = _numbers(frame, col).astype("float64")
    for col in columns_of("text"):
        frame[col] = frame[col].astype(str)
    return frame


def _rounds(timing: TimingStats) -> int:
    """The rounds a case's samples came in."""
    return len(set(timing.rounds)) if timing.rounds else 1
