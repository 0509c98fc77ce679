"""Writing a results folder case by case.

``ResultsWriter`` appends each finished case at once (its calibration point, its samples, then
its row: a row always has its samples) and keeps ``run.json`` current; ``results.loader`` reads
the folder back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnbench._version import __version__
from attnbench.errors import AttnbenchError
from attnbench.formats import FORMAT_VERSION
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingStats
from attnbench.results.files import (
    CALIBRATION_FILE,
    RESULTS_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    THEORY_FILE,
    csv_line,
    now_iso,
    rewrite_csv,
    write_json_atomic,
)
from attnbench.results.loader import load_results
from attnbench.results.record import process_start
from attnbench.results.run import RunResults
from attnbench.schema import (
    CALIBRATION_COLUMNS,
    RESULT_COLUMNS,
    SAMPLE_COLUMNS,
    RunStatus,
    Status,
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
        self.processes: dict[str, int] = {}  # a worker process's name -> its number here
        self.first_process = 0  # numbers go on from an earlier session's (a resume)
        # A layer's code (run.json's ``layers``) and theory (theory.json's) that the run names
        # once this session runs the layer (``_runs``): a --resume --force after an edit,
        # until then, names the code its cases ran
        self.code_to_come: dict[str, tuple[dict[str, str], Any]] = {}
        self.theories: dict[str, Any] = {}  # theory.json as written

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
            "schema_version": FORMAT_VERSION,
            "tool": "attnbench",
            "attnbench_version": __version__,
            "config": dict(config),
            "environment": dict(environment),
            "start_time": now_iso(),
            "end_time": None,
            "status": RunStatus.RUNNING,
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
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
        of a case without a row (both dropped by the loader) are gone, and the folder is
        written in today's format (the loader migrated it), with one header for all rows.
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
        meta.update(
            status=RunStatus.RUNNING,
            pid=os.getpid(),
            pid_start=process_start(os.getpid()),
            end_time=None,
        )
        points = int(run.calibration["point"].max()) + 1 if len(run.calibration) else 0
        writer = cls(Path(run.path), meta, points, header)
        writer.first_process = int(run.samples["process"].max()) + 1 if len(run.samples) else 0
        writer._save_meta()
        return writer

    def _save_meta(self) -> None:
        write_json_atomic(self.out_dir / RUN_FILE, self.meta)

    def _append(self, name: str, text: str) -> None:
        append_synced(self.out_dir / name, text)

    def record_theories(self, record: Mapping[str, Any]) -> None:
        """Write theory.json: what reading the run needs of its plugin layers (no code)."""
        self.theories = dict(record)
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

    def append(
        self, result: CaseResult, calibration: TimingStats | None = None, process: str = ""
    ) -> None:
        """Persist one case: the calibration point taken before it, its samples (taken by
        ``process``, a worker's name), then its row (a row always has its samples)."""
        row = result.to_row()
        self._append_calibration(row["case_id"], calibration)
        if result.timing is not None:
            self._append_samples(row["case_id"], 1, 0, result.timing, result.load_1m, process)
        self._append(RESULTS_FILE, csv_line([row.get(column) for column in self.columns]))
        if result.status != Status.SKIPPED and not result.died:  # a row this session ran
            self._runs(str(row["layer"]))

    def append_round(
        self,
        case_id: str,
        round_: int,
        first_sample: int,
        timing: TimingStats,
        calibration: TimingStats | None = None,
        load_1m: float | None = None,
        process: str = "",
    ) -> None:
        """Persist a later timing round of a case already on disk: its calibration point and
        its samples, numbered on from ``first_sample``."""
        self._append_calibration(case_id, calibration)
        self._append_samples(case_id, round_, first_sample, timing, load_1m, process)
        self._runs(case_id.split("/")[0])  # a case id begins with its layer's name

    def _runs(self, layer: str) -> None:
        """``layer`` is run by this session: run.json names the code it runs now. A forced
        resume of a finished run after an edit had named the new code, nothing measured by it,
        and compare then saw no difference from a baseline of the new code."""
        if layer not in self.code_to_come:
            return
        source, theory = self.code_to_come.pop(layer)
        self.update(layers={**self.meta.get("layers", {}), layer: source})
        if theory is not None:
            layers = {**self.theories.get("layers", {}), layer: theory}
            self.record_theories({**self.theories, "layers": layers})

    def _append_calibration(self, case_id: str, calibration: TimingStats | None) -> None:
        if calibration is None:
            return
        lines = [
            csv_line([self.points, case_id, i, s]) for i, s in enumerate(calibration.samples_s)
        ]
        self._append(CALIBRATION_FILE, "".join(lines))
        self.points += 1

    def _append_samples(
        self,
        case_id: str,
        round_: int,
        first: int,
        timing: TimingStats,
        load: float | None,
        process: str,
    ) -> None:
        faults = timing.faults or (None,) * timing.count
        clocks = timing.clocks_mhz or (None,) * timing.count
        refs = timing.references_s or (None,) * timing.count
        others = timing.others_cores or (None,) * timing.count
        number = self.processes.setdefault(process, self.first_process + len(self.processes))
        left = timing.left_out
        lines = [
            csv_line([case_id, first + i, s, round_, load, f, c, number, r, o, left])
            for i, (s, f, c, r, o) in enumerate(
                zip(timing.samples_s, faults, clocks, refs, others, strict=True)
            )
        ]
        self._append(SAMPLES_FILE, "".join(lines))

    def finish(self, status: RunStatus = RunStatus.COMPLETE) -> None:
        """Close the run as ``complete`` or ``interrupted``, adding this session's seconds,
        from opening the run to its last result written, to ``duration_s`` (the seconds the
        sweep has run over every session: a resume adds its own; end_time - start_time would
        count the pause between, to the whole second)."""
        before = self.meta.get("duration_s") or 0.0
        duration = round(before + time.monotonic() - self.opened, 3)
        self._settle_rows()
        self.update(status=status, end_time=now_iso(), current_case=None, duration_s=duration)

    def _settle_rows(self) -> None:
        """A row is written after its case's first round; once the later rounds are in,
        results.csv is rewritten (through a rename) with every case's statistics over all of
        them, as the loader derives them, so a reader of the file alone reads those too."""
        try:
            frame = load_results(self.out_dir).frame.reindex(columns=self.columns)
            rows = [csv_line(list(row)) for row in frame.itertuples(index=False)]
            rewrite_csv(self.out_dir / RESULTS_FILE, self.columns, rows)
        except (AttnbenchError, OSError):
            return  # the rows as appended: the loader derives the same statistics from them


def _header(option_columns: Sequence[str]) -> list[str]:
    extra = [c for c in dict.fromkeys(option_columns) if c not in RESULT_COLUMNS]
    return [*RESULT_COLUMNS, *extra]
