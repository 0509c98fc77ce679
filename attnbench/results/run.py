"""A loaded results folder: the tidy table, the raw samples, the calibration and the run record."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.estimators import QUIET_FACTOR, Between, kept_of, quiet_level, round_marks
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.machine.ceilings_file import ceilings_from
from attnbench.measure.record import died_in
from attnbench.measure.timing.contention import is_busy
from attnbench.results.record import RunRecord
from attnbench.results.reruns import Elsewhere, Entry, Moved, judging_level, run_level
from attnbench.schema import CALIBRATION_COLUMNS, STATUSES, RunStatus, Status, numeric_column

# What every note on ``RunResults.busy_cases`` says of them.
BUSY_NOTE = "had fewer than two quiet rounds: their times are a busy machine's"


# The load a sweep's own processes leave past its timing threads (the sweep's driver, a fork,
# the 1-minute average's lag): a new user's quiet sweep read 1.78-2.02 on 2 CPUs and was told
# other processes shared the machine. Past the CPUs by more than this, another process did.
LOAD_SLACK = 0.5


@dataclass(frozen=True)
class RunResults:
    """A loaded results folder."""

    path: Path
    frame: pd.DataFrame  # one row per case, RESULT_COLUMNS
    samples: pd.DataFrame  # raw samples, SAMPLE_COLUMNS
    meta: dict[str, Any]  # run.json as written; code reads ``record``
    warnings: tuple[str, ...] = ()  # what was repaired on reading (a torn line, orphan samples)
    # The calibration GEMM's samples, CALIBRATION_COLUMNS (empty where none were taken).
    calibration: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=CALIBRATION_COLUMNS)
    )
    # theory.json: the plugin layers' families, options and evaluated theories ({} for runs
    # without it).
    theories: dict[str, Any] = field(default_factory=dict)
    # Each case's spread between this machine's sweeps, by case id, as its interval holds it;
    # and what this run leaves of each case for the next sweep (``results.reruns``).
    between: Mapping[str, Between] = field(default_factory=dict)
    entries: Mapping[str, Mapping[str, Entry]] = field(default_factory=dict)  # layer -> key
    elsewhere: Elsewhere | None = None  # what sweeps in another state of the machine found
    moved: Moved | None = None  # how far it moved its cases together against earlier sweeps

    @functools.cached_property
    def died_cases(self) -> frozenset[str]:
        """The cases a process died in, read once from their rows' errors."""
        errors = self.frame["error"] if "error" in self.frame else pd.Series(dtype=object)
        return frozenset(self.frame.loc[errors.map(died_in).astype(bool), "case_id"].astype(str))

    @functools.cached_property
    def record(self) -> RunRecord:
        """run.json, read once into typed fields."""
        return RunRecord.parse(self.meta)

    @property
    def mode(self) -> str:
        """What its cases timed: forward, train or decode (``spec.MODES``); a sweep has one."""
        return mode_of(self.frame)

    @property
    def calibration_s(self) -> float | None:
        """Median seconds of one calibration GEMM over the run's quiet points (those whose
        median is within ``QUIET_FACTOR`` of their quiet level, ``quiet_level``, as a round's
        reference is judged); None without samples.

        The case times leave out the rounds a disturbed machine slowed, so the kernel that
        normalises them leaves out its disturbed points: a median over every point took in a
        neighbour's bursts (5.66 ms against 2.84 quiet), and ``--normalize`` read two real
        slowdowns as significant improvements."""
        if self.calibration.empty:
            return None
        points = self.calibration.groupby("point")["time_s"].median()
        level = quiet_level(points.tolist())  # as the rounds' references are judged
        if level != level:  # no finite time at all
            return None
        quiet = points.index[points <= QUIET_FACTOR * level]
        return float(self.calibration.loc[self.calibration["point"].isin(quiet), "time_s"].median())

    def rounds_of(self, case_id: str) -> dict[int, list[float]]:
        """A case's samples by timing round number (a round that failed is absent)."""
        mine = self.samples[self.samples["case_id"] == case_id]
        return {int(r): group["time_s"].tolist() for r, group in mine.groupby("round", sort=True)}

    @functools.cached_property
    def _judging_level(self) -> float | None:
        return judging_level(run_level(self.samples), self.record.machine_quiet_s)

    def disturbed_of(self, case_id: str) -> dict[int, bool]:
        """Whether each of a case's rounds, by number, read disturbed: its reference slow
        against the run's judging level, or its threads kept waiting by a busy neighbour."""
        rounds = self.samples[self.samples["case_id"] == case_id].drop_duplicates("round")
        references = [None if pd.isna(r) else float(r) for r in rounds["reference_s"]]
        busy = [is_busy(None if pd.isna(o) else float(o)) for o in rounds["others_cores"]]
        every = self.rounds_of(case_id)
        groups = [every[int(r)] for r in rounds["round"]]
        marks = round_marks(references, self._judging_level, busy, groups)
        return dict(zip((int(r) for r in rounds["round"]), marks, strict=True))

    def kept_rounds_of(self, case_id: str) -> dict[int, list[float]]:
        """The rounds its time is over: those not read disturbed while two or more remain
        (``estimators.kept_of``), as the loader keeps them."""
        every, marks = self.rounds_of(case_id), self.disturbed_of(case_id)
        rounds = list(every)
        return {rounds[i]: every[rounds[i]] for i in kept_of([marks[r] for r in rounds])}

    @property
    def rounds(self) -> int:
        """How many timing rounds the run's cases have (1 for a run without rounds)."""
        return int(self.samples["round"].max()) if len(self.samples) else 1

    @property
    def allocator(self) -> str:
        """The allocator's state the run measured in: pinned, system, mixed, or "unrecorded"
        (glibc's defaults, unnamed)."""
        return str(self.record.allocator.get("state", "unrecorded"))

    def fault_shares(self) -> pd.Series:
        """Per measured case, the share of its median time its page faults cost, at the run's
        measured cost of one fault, shared by the case's threads (torch's threads fill a
        fresh tensor together, and fault in parallel); empty where either is missing."""
        cost = self.record.fault_cost_s
        measured = self.measured
        if cost is None or "page_faults" not in measured:
            return pd.Series(dtype="float64")
        faults = numeric_column(measured, "page_faults")
        threads = numeric_column(measured, "threads").fillna(1).clip(lower=1)
        shares = faults * cost / threads / numeric_column(measured, "time_s")
        return shares.dropna()

    @property
    def ceilings(self) -> Ceilings | None:
        """The ceilings of the machine the run measured on (``attnbench machine``), recorded at
        its start; None where they were not, or could not be, measured."""
        found = self.record.ceilings
        if found is None:
            return None
        try:
            return ceilings_from(found, f"{self.path}/run.json ceilings")
        except AttnbenchError:
            return None

    @property
    def measured(self) -> pd.DataFrame:
        """The rows with measurements (status ``ok``): what charts, fits and comparisons use."""
        return self.frame[self.frame["status"] == Status.OK]

    @property
    def codes_ran(self) -> dict[str, list[str]]:
        """Each layer's code as its measured cases ran it (results.csv's ``layer_source``, in
        the order first run): a --resume --force after an edit can leave two. A skipped row,
        or one a process died in, written by a later session, names that session's code."""
        measured = self.measured
        if "layer_source" not in measured:
            return {}
        ran = measured[measured["layer_source"].fillna("").astype(str) != ""]
        return {
            str(layer): list(dict.fromkeys(group["layer_source"].astype(str)))
            for layer, group in ran.groupby("layer", sort=False)
        }

    def mixed_code(self) -> list[str]:
        """One line per layer whose cases ran more than one code (``codes_ran``)."""
        return [
            f"layer {name}'s cases ran {len(codes)} codes ({'; '.join(codes)}): a --resume "
            "--force went on after an edit; each case's rounds are one code's, but the layer's "
            "growth in table and fit is fitted over both (sweep it into a new folder for one's)"
            for name, codes in self.codes_ran.items()
            if len(codes) > 1
        ]

    def short_of_rounds(self) -> int:
        """Measured cases with fewer timing rounds than every case gets (--processes): those a
        stopped run began, which --resume finishes ("4 measured" beside "0 of 6 cases done
        and 4 begun" read as a contradiction)."""
        least = int((self.meta.get("config") or {}).get("processes") or 1)
        return int((self.rounds_ran() < least).sum())

    def rounds_ran(self) -> pd.Series:
        """Every round each measured case ran, aligned with ``measured`` (``rounds`` counts
        those its time is over, the ones left out not; a row without samples: its ``rounds``)."""
        measured = self.measured
        if "case_id" not in self.samples:
            return numeric_column(measured, "rounds").fillna(0)
        ran = measured["case_id"].map(self.samples.groupby("case_id")["round"].nunique())
        return ran.fillna(numeric_column(measured, "rounds")).fillna(0)

    def busy_cases(self) -> list[str]:
        """The measured cases whose time is a busy machine's (``BUSY_NOTE``): a round read
        disturbed and fewer than two quiet ones, so the time is over every round
        (``estimators.kept_of``)."""
        measured = self.measured
        disturbed = numeric_column(measured, "rounds_disturbed").fillna(0)
        if not disturbed.gt(0).any():
            return []
        busy = (disturbed > 0) & (self.rounds_ran() - disturbed < 2)
        return [str(c) for c in measured[busy]["case_id"]]

    @property
    def devices(self) -> list[str]:
        """The device models the measured cases ran on, in order of appearance (none where rows
        do not name theirs)."""
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

    def without(self, case_ids: set[str]) -> RunResults:
        """This run less the cases ``case_ids`` and their samples (the calibration points stay:
        they time the machine, not a case): what ``sweep --resume --retry`` starts from."""
        keep = ~self.frame["case_id"].isin(case_ids)
        return replace(
            self,
            frame=self.frame[keep].reset_index(drop=True),
            samples=self.samples[~self.samples["case_id"].isin(case_ids)].reset_index(drop=True),
        )

    @property
    def status(self) -> RunStatus:
        """``complete``, ``interrupted``, or ``running`` (also what a killed run leaves)."""
        return self.record.status

    @property
    def unfinished(self) -> str:
        """ "" for a complete run; else what it is and how to finish it, the words every
        command that refuses or reads such a run says ("unfinished (interrupted): finish it
        with attnbench sweep --resume DIR")."""
        if self.status == RunStatus.COMPLETE:
            return ""
        return f"unfinished ({self._state()}): finish it with attnbench sweep --resume {self.path}"

    def _state(self) -> str:
        """The status, and for a run that reads running on this machine whether its process
        is: a sweep killed by a CI job's time limit read "running" as if still going."""
        pid = self.record.pid
        if self.status != RunStatus.RUNNING or not self.record.on_this_host():
            return str(self.status)
        if pid != os.getpid() and self.record.live_pid() is None:
            return f"its process {pid} is gone: killed or crashed"
        return f"running: its process {pid} is still sweeping it"

    @property
    def cases_total(self) -> int:
        """Cases the run's grid holds (those on disk, for a record that does not say)."""
        return self.record.cases_total or len(self.frame)

    def busy(self) -> pd.DataFrame:
        """The rounds measured while the machine's 1-minute load average exceeded its CPU count
        by more than ``LOAD_SLACK``: one row per (case, round) with its load and CPUs (empty
        where loads were not recorded)."""
        loads = self.samples.dropna(subset=["load_1m"]).drop_duplicates(["case_id", "round"])
        cpus = self.frame.set_index("case_id")["cpu_count"]
        loads = loads.assign(cpu_count=loads["case_id"].map(cpus)).dropna(subset=["cpu_count"])
        over = loads["load_1m"] > loads["cpu_count"] + LOAD_SLACK
        return loads.loc[over, ["case_id", "round", "load_1m", "cpu_count"]]

    def counts(self) -> dict[str, int]:
        """Cases per status, every status named (zeros included), in ``STATUSES`` order."""
        found = self.frame["status"].value_counts().to_dict()
        return {status: int(found.get(status, 0)) for status in STATUSES}


def mode_of(frame: pd.DataFrame) -> str:
    """The mode of a run's rows (a sweep has one): forward where they do not say."""
    if "mode" not in frame or not frame["mode"].notna().any():
        return "forward"
    return str(frame["mode"].dropna().iloc[0])
