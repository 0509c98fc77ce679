"""The machine model: predicted times from counts and ceilings alone, written out by hand, and
the predict command on a real run with a ceilings file."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits.roofline import predict, relative_rms
from attnbench.measure.ceilings import Ceilings
from attnbench.results.run import RunResults

runner = CliRunner()
MACHINE = Ceilings(
    peak_flops_per_s=1e11, bandwidth_bytes_per_s=1e10, op_latency_s=2e-6, page_fault_s=1e-6,
    device="cpu", device_name="a cpu", dtype="float32", threads=2, torch_version="2.13.0",
    hostname="here", measured_at="now", gemm_side=1024, stream_bytes=2**29,
)  # fmt: skip


def test_each_term_and_the_bound_follow_the_counts() -> None:
    frame = pd.DataFrame(
        [
            {"case_id": "gemm-like", "flops": 1e9, "bytes": 1e6, "ops": 10, "page_faults": 0},
            {"case_id": "copy-like", "flops": 1e6, "bytes": 1e9, "ops": 10, "page_faults": 0},
            {"case_id": "loop-like", "flops": 1e3, "bytes": 1e3, "ops": 10_000, "page_faults": 0},
            {"case_id": "faulting", "flops": 1e3, "bytes": 1e3, "ops": 1, "page_faults": 5000},
            {"case_id": "untraced", "flops": 1e9, "bytes": None, "ops": None, "page_faults": 0},
        ]
    )
    found = predict(frame, MACHINE).set_index("case_id")
    assert list(found.index) == ["gemm-like", "copy-like", "loop-like", "faulting"]
    gemm = found.loc["gemm-like"]
    assert gemm["compute_s"] == 1e9 / 1e11 and gemm["memory_s"] == 1e6 / 1e10
    assert (
        gemm["predicted_time_s"] == pytest.approx(1e-2 + 10 * 2e-6) and gemm["bound"] == "compute"
    )
    assert found.loc["copy-like", "bound"] == "memory"
    assert found.loc["copy-like", "predicted_time_s"] == pytest.approx(1e9 / 1e10 + 10 * 2e-6)
    assert found.loc["loop-like", "bound"] == "latency"
    assert found.loc["loop-like", "latency_s"] == pytest.approx(10_000 * 2e-6)
    assert found.loc["faulting", "bound"] == "faults"
    assert found.loc["faulting", "faults_s"] == pytest.approx(5000 * 1e-6)
    # Where faults are not counted (CUDA), they add nothing.
    on_gpu = predict(frame, replace(MACHINE, page_fault_s=None)).set_index("case_id")
    assert on_gpu.loc["faulting", "faults_s"] == 0


def test_relative_rms_is_over_the_mean_time() -> None:
    measured = pd.Series([1.0, 3.0])
    assert relative_rms(measured, pd.Series([1.0, 3.0])) == 0
    assert relative_rms(measured, pd.Series([2.0, 2.0])) == pytest.approx(1 / 2)
    assert math.isnan(relative_rms(pd.Series([], dtype=float), pd.Series([], dtype=float)))


def test_predict_reads_a_run_and_a_ceilings_file(wide_run: RunResults, tmp_path: Path) -> None:
    ceilings = tmp_path / "other-machine.json"
    ceilings.write_text(json.dumps(MACHINE.to_dict()))
    result = runner.invoke(
        app, ["predict", str(wide_run.path), "--machine", str(ceilings), "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["machine"]["device_name"] == "a cpu"
    rows = wide_run.measured.set_index("case_id")
    assert len(payload["results"]) == len(rows)
    for case in payload["results"]:
        row = rows.loc[case["case_id"]]
        expected = max(row["flops"] / 1e11, row["bytes"] / 1e10) + row["ops"] * 2e-6
        expected += (row["page_faults"] if pd.notna(row["page_faults"]) else 0) * 1e-6
        assert case["predicted_time_s"] == pytest.approx(expected)
        assert {"layer", "n", "d", "time_s", "bound"} <= set(case)
    table = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(ceilings)])
    assert table.exit_code == 0 and "relative RMS" in table.stderr
    assert "Predicted from the counts and the ceilings of a cpu" in " ".join(table.stdout.split())


def test_predict_refuses_bad_input_in_one_line(wide_run: RunResults, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"peak_flops_per_s": 0}')
    result = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(broken)])
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("peak_flops_per_s must be a positive number (got 0)")
    old = tmp_path / "old"
    old.mkdir()
    for name in ("run.json", "samples.csv"):
        (old / name).write_bytes((wide_run.path / name).read_bytes())
    frame = pd.read_csv(wide_run.path / "results.csv", keep_default_na=False)
    frame.drop(columns=["bytes", "ops"]).to_csv(old / "results.csv", index=False)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(MACHINE.to_dict()))
    result = runner.invoke(app, ["predict", str(old), "--machine", str(good)])
    assert result.exit_code == 2 and "cannot be predicted (sweep it again)" in result.stderr
