"""The calibration GEMM: timed between the measured cases, kept on disk, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from attnbench.errors import AttnbenchError
from attnbench.estimators import QUIET_FACTOR, quiet_level
from attnbench.measure.timing.calibration import CALIBRATION_POLICY, Calibration
from attnbench.measure.timing.loop import TimingPolicy, time_call
from attnbench.options import build_grid
from attnbench.results.files import CALIBRATION_FILE
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.queue import UNCALIBRATED, Measuring
from attnbench.run.sweep import resume_sweep, run_sweep


class StepClock:
    """A clock that moves only when the calibration kernel runs (``step`` seconds per call)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_calibration_kernel_is_timed_with_the_injected_clock() -> None:
    clock = StepClock()
    calibration = Calibration(size=8)
    timer = calibration.timer("cpu", lambda: None, clock)
    # The clock never moves: the block stops growing at max_block_calls instead of forever.
    stats = timer()
    assert stats.calls_per_sample == CALIBRATION_POLICY.max_block_calls
    assert stats.count == CALIBRATION_POLICY.max_samples  # a zero time never looks stable
    assert set(stats.samples_s) == {0.0}


def test_a_block_never_exceeds_max_block_calls() -> None:
    calls = []
    stats = time_call(
        lambda: calls.append(1),
        TimingPolicy(warmup_calls=0, min_samples=3, max_samples=5, max_block_calls=16),
        clock=lambda: 0.0,
    )
    assert stats.calls_per_sample == 16
    assert len(calls) == 1 + 16 + 4 * 16  # a first probe, a capped one (sample 1), 4 more


def test_calibration_is_described_for_comparisons() -> None:
    assert Calibration(size=256).describe() == {
        "kernel": "matmul",
        "m": 256,
        "n": 256,
        "k": 256,
        "dtype": "float32",
        "flops": 2 * 256**3,
    }


def test_a_worker_times_a_point_once_every_half_second_of_its_clock() -> None:
    """A point before a case when ``every_s`` or more has passed since the last one began:
    the machine is sampled at one rate whatever the cases' length (0: before every case)."""
    from attnbench.run.executors.worker import Worker

    clock = StepClock()
    worker = Worker("cpu", None, clock=clock)
    every = Calibration(size=8)
    assert every.every_s == 0.5
    taken = []
    for now in (0.0, 0.2, 0.49, 0.5, 0.9, 1.3, 3.0):
        clock.now = now
        taken.append(worker._calibration_point(every) is not None)
    assert taken == [True, False, False, True, False, True, True]
    always = Calibration(size=8, every_s=0.0)
    assert all(worker._calibration_point(always) is not None for _ in range(3))


def test_a_sweep_times_the_calibration_between_its_measured_cases(tiny_run: RunResults) -> None:
    cal = tiny_run.calibration
    measured = list(tiny_run.frame.loc[tiny_run.frame["status"] == "ok", "case_id"])
    points = list(cal.groupby("point")["before_case"].first())
    assert points[0] == measured[0]  # the first case always has one
    assert set(points) <= set(measured)  # each before one of the measured cases' rounds
    assert (cal.groupby("point").size() >= CALIBRATION_POLICY.min_samples).all()
    assert (cal["time_s"] > 0).all()
    medians = cal.groupby("point")["time_s"].median()  # quiet: as a round's reference is read
    quiet = medians.index[medians <= QUIET_FACTOR * quiet_level(medians.tolist())]
    assert tiny_run.calibration_s == pytest.approx(cal[cal["point"].isin(quiet)]["time_s"].median())
    assert tiny_run.meta["calibration"]["kernel"] == "matmul"


def test_the_calibration_level_leaves_out_its_disturbed_points(tiny_run: RunResults) -> None:
    """The case times leave out a disturbed machine's rounds, and so the kernel that divides
    them leaves out its disturbed points: a median over all took in a neighbour's bursts
    (5.66 ms against 2.84 quiet) and --normalize read two real slowdowns as improvements."""
    import dataclasses

    import pandas as pd

    times = {0: [2.8, 2.9, 2.85], 1: [5.5, 5.7, 5.6], 2: [5.9, 5.6, 5.8], 3: [3.0, 3.1, 2.9]}
    cal = pd.DataFrame(
        [{"point": p, "before_case": "x", "sample": i, "time_s": t * 1e-3}
         for p, ts in times.items() for i, t in enumerate(ts)]
    )  # fmt: skip
    run = dataclasses.replace(tiny_run, calibration=cal)
    assert run.calibration_s == pytest.approx(2.9e-3)  # points 0 and 3; over all twelve, 4.3
    bursty = dataclasses.replace(tiny_run, calibration=cal[cal["point"] != 3])
    assert bursty.calibration_s == pytest.approx(2.85e-3)  # the bursts' 5.6 is not the level


def test_calibration_can_be_turned_off_and_old_runs_still_load(tmp_path: Path) -> None:
    grid = build_grid({"layers": "conv", "n": "8", "d": "4", "device": "cpu", "time_budget": 0.001})
    run = run_sweep(grid, tmp_path / "off", measuring=UNCALIBRATED)
    assert run.calibration.empty and run.calibration_s is None
    assert "calibration" not in run.meta
    (tmp_path / "off" / CALIBRATION_FILE).unlink()
    with pytest.raises(AttnbenchError, match=r"has no calibration\.csv"):  # today's: damaged
        load_results(tmp_path / "off")
    meta = json.loads((tmp_path / "off" / "run.json").read_text())
    meta["schema_version"] = 1  # a folder from before calibration existed
    (tmp_path / "off" / "run.json").write_text(json.dumps(meta))
    old = load_results(tmp_path / "off")
    assert old.calibration.empty and list(old.calibration.columns) == [
        "point",
        "before_case",
        "sample",
        "time_s",
    ]


def test_a_resumed_run_numbers_its_calibration_points_on(tmp_path: Path) -> None:
    grid = build_grid(
        {"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "time_budget": 0.001}
        | {"processes": 1}  # one job a case: a point before each
    )
    out = tmp_path / "run"
    calibration = Calibration(size=16, every_s=0.0)  # before every case
    run_sweep(grid, out, measuring=Measuring(calibration=calibration))
    # Cut the last case (row, samples and calibration), as if the run had stopped before it.
    run = load_results(out)
    last = run.frame["case_id"].iloc[-1]
    for name, column in (("results.csv", "case_id"), ("calibration.csv", "before_case")):
        frame = pd.read_csv(out / name)
        frame[frame[column] != last].to_csv(out / name, index=False)
    samples = pd.read_csv(out / "samples.csv")
    samples[samples["case_id"] != last].to_csv(out / "samples.csv", index=False)
    meta = json.loads((out / "run.json").read_text())  # stopped: a finished run cut is corrupt
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    resumed = resume_sweep(out, measuring=Measuring(calibration=calibration))
    points = resumed.calibration.groupby("point")["before_case"].first()
    assert list(points.index) == [0, 1]
    assert list(points) == list(resumed.frame["case_id"])
