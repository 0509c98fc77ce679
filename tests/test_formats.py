"""Older formats are migrated in one module, on load: a folder an older attnbench wrote reads
as it did, today's writes the current version, and no other module knows a run could be old.

``tests/formats/v1-0e122b0`` is a sweep made by the code at commit 0e122b0 (format 1, before
processes, time methods and clocks); ``v1-0e122b0.json`` is what `table --json` and `fit --json`
read in it with the code before the migration existed, save where the analysis itself has
changed since (an unfitted model's note says which of its terms are zero, 2026-11-29).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_golden import readings, same_readings

from attnbench.errors import AttnbenchError
from attnbench.formats import (
    FORMAT_VERSION,
    UNRECORDED_ALLOCATOR,
    V1_LATER_RESULTS,
    V2_LATER_RESULTS,
    V3_LATER_RESULTS,
    V5_LATER_RESULTS,
    RawRun,
    migrate_ceilings,
    migrate_run,
    partner_message,
)
from attnbench.measure.counts.countcache import Counting
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.timing.loop import TimingPolicy, TimingStats
from attnbench.results.loader import load_results
from attnbench.results.store import ResultsWriter
from attnbench.run.executors.base import Job
from attnbench.run.executors.wire import done_from_wire, timing_from_wire, timing_to_wire
from attnbench.schema import RESULT_COLUMNS
from attnbench.spec import Case

HERE = Path(__file__).resolve().parent
OLD = HERE / "formats" / "v1-0e122b0"
PACKAGE = HERE.parent / "attnbench"


def test_a_folder_written_by_0e122b0_reads_as_it_did() -> None:
    expected = json.loads((OLD.with_suffix(".json")).read_text())
    assert same_readings(readings(OLD), expected) is None


def test_loading_migrates_once_and_says_what_the_run_did_not_record() -> None:
    header = pd.read_csv(OLD / "results.csv", nrows=0).columns
    lacking = [c for c in RESULT_COLUMNS if c not in header]
    assert lacking  # the fixture is old: it lacks columns today's writer writes
    run = load_results(OLD)
    assert run.meta["schema_version"] == FORMAT_VERSION
    assert list(run.frame.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    # What it lacks and the loader cannot derive from its samples (the rounds' spread it can).
    assert (
        set(run.record.unrecorded)
        == set(lacking)
        - {"rounds", "rounds_disturbed", "spread_between", "spread_within", "compiled"}
        - set(V5_LATER_RESULTS)  # no run before read energy: empty is known
        == {
            "time_method", "sm_clock_mhz", "sm_clock_max_mhz", "throttled_share",
            *V2_LATER_RESULTS,
            *(c for c in V3_LATER_RESULTS if c != "compiled"),  # its cases were eager: known
        }
    )  # fmt: skip
    assert run.record.config["processes"] == 2  # recorded as rounds
    assert run.record.config["max_processes"] == 2
    assert run.record.config["allocator"] == "pinned"  # as recorded (kept)
    assert set(run.samples["process"]) == {0} and run.samples["reference_s"].isna().all()


def test_a_resumed_old_folder_is_written_in_todays_format(tmp_path: Path) -> None:
    copy = tmp_path / "old"
    shutil.copytree(OLD, copy)
    ResultsWriter.reopen(load_results(copy), {"time": "now"})
    assert json.loads((copy / "run.json").read_text())["schema_version"] == FORMAT_VERSION
    header = pd.read_csv(copy / "results.csv", nrows=0).columns
    assert set(RESULT_COLUMNS) <= set(header)
    again = load_results(copy)  # now today's format: nothing left to migrate
    assert again.record.unrecorded == load_results(OLD).record.unrecorded
    assert again.frame[RESULT_COLUMNS].equals(load_results(OLD).frame[RESULT_COLUMNS])


def test_a_folder_of_todays_version_that_lacks_a_column_is_damaged(tmp_path: Path) -> None:
    copy = tmp_path / "v2"
    shutil.copytree(OLD, copy)
    ResultsWriter.reopen(load_results(copy), {"time": "now"})
    (copy / "calibration.csv").write_text("")  # cut at its creation: no points, not damage
    assert load_results(copy).calibration.empty
    frame = pd.read_csv(copy / "results.csv", dtype=str, keep_default_na=False)
    frame.drop(columns=["backend"]).to_csv(copy / "results.csv", index=False)
    with pytest.raises(AttnbenchError, match="lacks column"):
        load_results(copy)
    meta = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**meta, "schema_version": FORMAT_VERSION + 1}))
    with pytest.raises(AttnbenchError, match="newer attnbench"):
        load_results(copy)


def test_each_step_fills_what_a_version_1_folder_may_lack() -> None:
    raw = RawRun(
        meta={"schema_version": 1, "config": {"rounds": 3}, "end_time": "t"},
        results=pd.DataFrame({"case_id": ["a"]}),
        samples=pd.DataFrame({"case_id": ["a"], "sample": ["0"], "time_s": ["1.0"]}),
        calibration=None,
        theories={"layers": {"mine": {"theory": {"terms": []}}, "none": {"theory": None}}},
    )
    new = migrate_run(raw, "x")
    assert set(V1_LATER_RESULTS) <= set(new.results.columns)
    assert new.samples.loc[0, "round"] == "1" and new.samples.loc[0, "process"] == "0"
    assert new.calibration is not None and new.calibration.empty
    assert new.meta["status"] == "complete" and new.meta["config"] == {
        "processes": 3,
        "max_processes": 3,  # as many rounds as asked, never more: no round was cut short
        "allocator": "system",
        "precision": 0.02,  # rounds were added to ±2% before --precision
    }
    assert new.meta["allocator"] == UNRECORDED_ALLOCATOR and new.meta["resumes"] == []
    assert new.theories["layers"]["mine"]["theory"]["traffic"] is None
    assert new.theories["layers"]["none"]["theory"] is None
    assert raw.meta["schema_version"] == 1  # the step copies: what was read is left alone
    assert migrate_run(new, "x") == new  # today's version: nothing to do


def test_a_result_from_a_partner_that_sends_less_reads_as_not_recorded() -> None:
    case = Case("conv", 8, 4, 1, "float32", "cpu", "forward", (("k", 3),))
    job = Job(case, 1, 0, TimingPolicy(), counting=Counting())
    done = done_from_wire(job, {"where": None, "result": None, "timing": None, "point": None,
                                "lost": "it died"})  # fmt: skip  # no load, process or ending
    assert (done.load_1m, done.process, done.ended, done.lost) == (None, "", "", "it died")
    timing = timing_from_wire({"samples_s": [1.0, 2.0], "calls_per_sample": 1, "total_s": 3.0})
    assert timing is not None and timing.clocks_mhz is None and timing.references_s is None
    assert timing.left_out is None  # a partner that did not count the blocks it left out
    sent = TimingStats((1.0, 2.0), 1, 3.0, left_out=2)
    back = timing_from_wire(json.loads(json.dumps(timing_to_wire(sent))))
    assert back is not None and back.left_out == 2  # a worker's count reaches the writer


def test_a_version_6_folder_gets_its_blocks_left_out_as_not_recorded() -> None:
    """Version 7 counts the blocks a round left out (its heap grew again in them); a version-6
    round left them out too, uncounted: the column is empty, not 0."""
    samples = pd.DataFrame({"case_id": ["conv/n=64"], "sample": ["0"], "time_s": ["1e-05"]})
    raw = RawRun(
        meta={"schema_version": 6},
        results=pd.DataFrame({"case_id": ["conv/n=64"], "time_s": ["1e-05"]}),
        samples=samples,
        calibration=None,
        theories={},
    )
    done = migrate_run(raw, "v6")
    assert done.meta["schema_version"] == FORMAT_VERSION == 7
    assert done.samples["blocks_left_out"].tolist() == [""]
    assert "blocks_left_out" not in raw.samples  # the folder as read is left as it was


def test_old_ceilings_and_partners_read_in_todays_shape() -> None:
    old = {"peak_flops_per_s": 1.0, "conv_flops_per_s": 5.0, "attention_flops_per_s": None}
    found = migrate_ceilings(old, "old")
    assert found["conv_rates"] == {"1": 5.0} and "conv_flops_per_s" not in found
    assert found["host_op_s"] is None and found["attention_rates"] is None
    names = {f for f in Ceilings.__dataclass_fields__}
    assert set(found) - {"peak_flops_per_s"} <= names
    with pytest.raises(AttnbenchError, match="conv_flops_per_s must be a positive number"):
        migrate_ceilings({"conv_flops_per_s": -1}, "old")
    assert partner_message("worker", {})["allocator"] == UNRECORDED_ALLOCATOR
    assert partner_message("done", {"process": "p"})["process"] == "p"
    assert partner_message("timing", {"samples_s": [1]})["clocks_mhz"] is None


# Words that say a run, a file or a message could be old.
OLD_WORDS = re.compile(
    r"\bolder\b|\bfrom before\b|\bmade before\b|\bwritten before\b|\brecorded before\b"
    r"|\bpredates?\b|\bold (?:run|file|folder|format|driver|partner)s?\b",
    re.IGNORECASE,
)


def old_words(root: Path) -> list[str]:
    """Where a module but formats.py says a run, a file or a message could be old (a phrase
    split over two lines of a comment or a docstring too)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "formats.py":
            continue
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text())  # lines joined
        found += [f"{path.relative_to(root)}: {m.group(0)}" for m in OLD_WORDS.finditer(text)]
    return found


def test_only_the_formats_module_knows_a_run_could_be_old(tmp_path: Path) -> None:
    assert old_words(PACKAGE) == []
    (tmp_path / "m.py").write_text("x = 1  # a file from\n# before the curves\n")
    assert old_words(tmp_path) == ["m.py: from before"]


def test_a_version_2_folder_gets_the_decode_columns_empty_and_unrecorded() -> None:
    """A folder written before --mode decode (version 2) has no state columns: migrating gives
    them empty and adds them to what the run did not record, and keeps what it said before."""
    raw = RawRun(
        meta={"schema_version": 2, "unrecorded": ["time_method"]},
        results=pd.DataFrame({"case_id": ["conv/n=64"], "time_s": ["1e-05"]}),
        samples=pd.DataFrame(),
        calibration=None,
        theories={},
    )
    done = migrate_run(raw, "v2")
    assert done.meta["schema_version"] == FORMAT_VERSION
    compile_columns = [c for c in V3_LATER_RESULTS if c != "compiled"]
    assert done.meta["unrecorded"] == ["time_method", *V2_LATER_RESULTS, *compile_columns]
    assert all((done.results[c] == "").all() for c in V2_LATER_RESULTS)
    assert done.results["time_s"].tolist() == ["1e-05"]
    assert "state_bytes" not in raw.results  # the folder as read is left as it was
