from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from synthetic import samples_for

from attnbench.errors import AttnbenchError
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingStats
from attnbench.results.environment import environment
from attnbench.results.files import prepare_out_dir
from attnbench.results.loader import load_results
from attnbench.results.store import ResultsWriter
from attnbench.schema import RESULT_COLUMNS
from attnbench.spec import Case

CASE = Case("attention", 64, 16, 1, "float32", "cpu", "forward", (("heads", 4),))


def _write(tmp_path: Path) -> Path:
    writer = ResultsWriter.create(
        tmp_path / "run", config={"layers": ["attention"]}, environment={}
    )
    writer.update(cases_total=2)
    ok = CaseResult(
        case=CASE,
        status="ok",
        threads=2,
        timing=TimingStats(samples_s=(1e-3, 2e-3, 4e-3), calls_per_sample=2, total_s=0.014),
        peak_bytes=12345,
        flops=1000,
        flops_analytic=1000.0,
        wall_s=0.5,
    )
    failed = CaseResult(
        case=Case("conv", 64, 16, 1, "float32", "cpu", "forward", (("k", 3),)),
        status="failed",
        threads=2,
        error="RuntimeError: boom, with a comma",
    )
    writer.append(ok)
    writer.append(failed)
    writer.finish()
    return writer.out_dir


def test_round_trip_keeps_values_and_raw_samples(tmp_path: Path) -> None:
    run = load_results(_write(tmp_path))
    frame = run.frame
    assert list(frame.columns) == RESULT_COLUMNS
    row = frame.iloc[0]
    assert row["case_id"] == CASE.case_id
    assert row["time_s"] == pytest.approx(2e-3)
    assert row["samples"] == 3 and row["calls_per_sample"] == 2
    assert row["peak_bytes"] == 12345
    assert row["flops_per_s"] == pytest.approx(1000 / 2e-3)
    assert row["flops_check"] == "ok"
    assert pd.isna(row["k"]) and row["heads"] == 4
    assert samples_for(run, CASE.case_id) == [1e-3, 2e-3, 4e-3]
    failed = frame.iloc[1]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: boom, with a comma"
    assert pd.isna(failed["time_s"])
    assert run.meta["end_time"] is not None and run.meta["cases_total"] == 2


def test_rows_are_on_disk_before_the_run_finishes(tmp_path: Path) -> None:
    writer = ResultsWriter.create(tmp_path / "run", config={}, environment={})
    writer.append(CaseResult(case=CASE, status="failed", threads=1, error="x"))
    # no finish(): as after a crash
    run = load_results(tmp_path / "run")
    assert len(run.frame) == 1 and run.meta["end_time"] is None and run.status == "running"


def test_the_run_records_its_seconds_start_to_finish_over_every_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """duration_s: from opening the run to its last result written, to the millisecond, each
    session's added (a resume's pause between is not the sweep's time)."""
    from attnbench.results import store

    now = iter([100.0, 112.3456, 500.0, 502.5])  # open, finish; reopen, finish
    monkeypatch.setattr(store.time, "monotonic", lambda: next(now))
    writer = ResultsWriter.create(tmp_path / "run", config={}, environment={})
    writer.append(CaseResult(case=CASE, status="failed", threads=1, error="x"))
    writer.finish("interrupted")
    run = load_results(tmp_path / "run")
    assert run.meta["duration_s"] == 12.346
    again = ResultsWriter.reopen(run, {"time": "later"})
    again.finish()
    assert load_results(tmp_path / "run").meta["duration_s"] == pytest.approx(14.846)


def test_existing_run_is_never_overwritten(tmp_path: Path) -> None:
    out = _write(tmp_path)
    # complete: nothing to finish, but its failed case can be measured again
    retry = f"measure its 1 broken case\\(s\\) again with --resume '{out}' --retry"
    with pytest.raises(AttnbenchError, match="already holds a complete run; choose a new") as e:
        prepare_out_dir(out)
    assert "--retry" in str(e.value)
    meta = json.loads((out / "run.json").read_text())
    # a run.json without a status is complete where it has an end time (as formats reads it)
    (out / "run.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "status"}))
    with pytest.raises(AttnbenchError, match=retry):
        prepare_out_dir(out)
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    with pytest.raises(AttnbenchError, match=r"already holds a run; .* finish that run with"):
        prepare_out_dir(out)


def test_a_folder_with_a_stray_results_file_is_refused_without_advice_to_resume_it(
    tmp_path: Path,
) -> None:
    """A new user's folder held a results.csv alone: --out said "finish that run with
    --resume", and --resume then said it was no results folder. Neither file is touched."""
    stray = tmp_path / "mydata"
    stray.mkdir()
    (stray / "results.csv").write_text("mine\n")
    with pytest.raises(AttnbenchError) as refused:
        prepare_out_dir(stray)
    said = str(refused.value)
    assert "already holds a results.csv but no run.json" in said and "--resume" in said
    assert "finish that run" not in said
    with pytest.raises(AttnbenchError, match=r"results folder \(no run.json\)$"):
        load_results(stray)
    assert (stray / "results.csv").read_text() == "mine\n"
    (stray / "results.csv").unlink()
    (stray / "run.json").write_text("{}")
    with pytest.raises(AttnbenchError, match=r"already holds a run\.json but no results\.csv"):
        prepare_out_dir(stray)


def test_out_under_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(AttnbenchError, match="is a file"):
        prepare_out_dir(blocker)
    with pytest.raises(AttnbenchError, match="not writable"):
        prepare_out_dir(blocker / "sub")


def test_a_value_that_is_not_a_number_names_its_column_and_case(tmp_path: Path) -> None:
    """A new user's mangled results.csv read "Unable to parse string 'abc' at position 2",
    naming neither the column nor the row."""
    out = _write(tmp_path)
    frame = pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)
    frame.loc[0, "time_s"] = "abc"
    frame.to_csv(out / "results.csv", index=False)
    with pytest.raises(
        AttnbenchError, match="corrupt: column 'time_s' holds 'abc', not a number"
    ) as err:
        load_results(out)
    assert f"(case {frame.loc[0, 'case_id']!r})" in err.value.message
    frame.loc[0, "time_s"], frame.loc[0, "n"] = "1e-3", "-7"  # a size no sweep measures
    frame.to_csv(out / "results.csv", index=False)
    with pytest.raises(AttnbenchError, match="has n = -7, not a size of 1 or more"):
        load_results(out)


def test_a_sample_that_is_not_a_time_is_left_out_and_said(tmp_path: Path) -> None:
    """A hand-edited samples.csv with an infinite, a negative and an empty time: the run still
    reads (it crashed with "'float' object has no attribute 'numerator'"), those samples are
    left out with a warning, and every case keeps a finite time."""
    import math
    import shutil

    out = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "results" / "ci-reference", out)
    samples = pd.read_csv(out / "samples.csv", dtype=str, keep_default_na=False)
    samples.loc[[0, 5], "time_s"] = ["inf", "-1e-3"]
    samples.loc[9, "time_s"] = ""
    samples.to_csv(out / "samples.csv", index=False)
    run = load_results(out)
    assert any(w.startswith("ignored 3 sample(s) whose time is not a time") for w in run.warnings)
    assert len(run.samples) == len(samples) - 3
    assert all(math.isfinite(t) and t > 0 for t in run.measured["time_s"])


@pytest.mark.parametrize("damage", ["no_dir", "not_results", "bad_json", "schema", "columns"])
def test_loader_refuses_what_is_not_a_valid_results_folder(tmp_path: Path, damage: str) -> None:
    out = _write(tmp_path)
    if damage == "no_dir":
        out = tmp_path / "nowhere"
        message = "is not a folder"
    elif damage == "not_results":
        out = tmp_path / "empty"
        out.mkdir()
        message = "is not an attnbench results folder"
    elif damage == "bad_json":
        (out / "run.json").write_text("{ truncated")
        message = "unreadable or corrupt"
    elif damage == "schema":
        meta = json.loads((out / "run.json").read_text())
        meta["schema_version"] = 99
        (out / "run.json").write_text(json.dumps(meta))
        message = "schema version 99"
    else:
        (out / "results.csv").write_text("case_id,layer\nx,conv\n")
        message = "lacks column"
    with pytest.raises(AttnbenchError, match=message):
        load_results(out)


def test_environment_records_what_a_reader_needs() -> None:
    env = environment("cpu")
    for key in (
        "attnbench_version",
        "torch_version",
        "device_name",
        "cpu_model",
        "torch_threads",
        "cuda_version",
        "cudnn_version",
        "git_commit",
        "git_dirty",
    ):
        assert key in env
    assert env["device"] == "cpu" and env["torch_threads"] >= 1


def test_run_json_is_as_readable_as_the_csv_files(tmp_path: Path) -> None:
    """run.json is renamed from a temporary file (0600 as made): it gets the mode the folder's
    CSV files get, so the other readers of a shared results folder can read it too."""
    writer = ResultsWriter.create(tmp_path / "run", config={}, environment={})
    writer.append(CaseResult(case=CASE, status="failed", threads=1, error="x"))
    writer.finish()
    csv_mode = (tmp_path / "run" / "results.csv").stat().st_mode & 0o777
    assert (tmp_path / "run" / "run.json").stat().st_mode & 0o777 == csv_mode


def test_an_atomic_write_gets_the_umasks_mode_not_mkstemps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above passes under a 077 umask whatever the writer does (0600 both ways):
    with the mode a 022 umask gives, a file renamed from mkstemp's 0600 reads 0644."""
    from attnbench import storage

    monkeypatch.setattr(storage, "FILE_MODE", 0o644)
    storage.write_text_atomic(tmp_path / "x.json", "{}")
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644


def test_the_newest_run_is_the_one_started_last_not_the_file_written_last(tmp_path: Path) -> None:
    """``table`` with no folder reads the run started last, as run.json records it: in a fresh
    clone every committed run.json is as new as its checkout, and one of them (a GPU run) was
    shown to a new user before any sweep of theirs."""
    import json
    import os

    from attnbench.results.files import latest_results

    for name, started, written in (("mine", "2026-12-01T07:00:00+00:00", 100),
                                   ("committed", "2026-11-26T05:52:29+00:00", 200)):  # fmt: skip
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"start_time": started}))
        os.utime(folder / "run.json", (written, written))
    assert latest_results(tmp_path).name == "mine"
    (tmp_path / "mine" / "run.json").write_text("{}")  # no record: the file's time decides
    assert latest_results(tmp_path).name == "mine"  # written now, after the other started
    os.utime(tmp_path / "mine" / "run.json", (300, 300))
    assert latest_results(tmp_path).name == "committed"


def test_an_ab_folder_is_told_apart_and_its_sides_named(tmp_path: Path) -> None:
    """table on an ab run's folder said only that it was no results folder: its two sides are."""
    from attnbench.results.loader import load_results

    for side in ("base", "current"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "run.json").write_text("{}")
    with pytest.raises(AttnbenchError) as caught:
        load_results(tmp_path)
    said = caught.value.message
    assert "results folder (no run.json and no results.csv); it holds an ab run, whose" in said
    base, current = tmp_path / "base", tmp_path / "current"
    assert said.endswith(f"sides are results folders: {base} and {current}")
    (tmp_path / "current" / "run.json").unlink()
    with pytest.raises(AttnbenchError, match=r"results\.csv\)$"):
        load_results(tmp_path)
