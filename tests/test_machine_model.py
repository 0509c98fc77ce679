"""The machine model inside a run: the ceilings a sweep records, the predictions and the
all-layer fit the analysis makes from them, the regime the time exponents are fitted in, and the
op count of the path the timed call really takes."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits import analyse
from attnbench.fits.roofline import host_ops
from attnbench.measure.case import measure_case
from attnbench.measure.counts.traffic import count_traffic
from attnbench.measure.machine.ceilings_file import machine_ceilings
from attnbench.measure.step import make_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import build_grid
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults

runner = CliRunner()


def test_a_sweep_records_the_ceilings_of_its_machine(tiny_run: RunResults) -> None:
    recorded = tiny_run.ceilings
    assert recorded is not None
    threads = int(tiny_run.measured["threads"].iloc[0])
    cached, was_cached = machine_ceilings("cpu", "float32", threads)
    assert was_cached  # the same measurement, from the cache
    # but for a fault's cost: one per run, the one the run measured as it started
    assert recorded == replace(cached, page_fault_s=tiny_run.meta["fault_cost_s"])
    assert tiny_run.meta["ceilings"]["threads"] == threads


@pytest.mark.slow
def test_the_analysis_predicts_every_measured_case_from_the_runs_ceilings(
    wide_run: RunResults,
) -> None:
    analysis = analyse(wide_run)
    assert analysis.ceilings == wide_run.ceilings
    assert set(analysis.machine.index) == set(analysis.frame.index)
    parts = analysis.machine[["compute_s", "memory_s", "latency_s", "faults_s"]].sum(axis=1)
    assert (parts - analysis.machine["predicted_time_s"]).abs().max() < 1e-15
    table = analysis.machine_table()
    assert list(table["layer"]) == ["conv", "rnn", "attention"]
    assert (table["cases"] == 8).all() and (table["model_rms"] > 0).all()
    assert analysis.effective is not None and analysis.effective.cases == 24
    result = runner.invoke(app, ["fit", str(wide_run.path), "--json"])
    payload = json.loads(result.stdout)
    assert [row["layer"] for row in payload["machine"]] == ["conv", "rnn", "attention"]
    assert payload["effective_ceilings"]["cases"] == 24


@pytest.mark.slow
def test_each_time_exponent_has_the_machine_models_own_slope_beside_it(
    wide_run: RunResults,
) -> None:
    """The model's predicted time, fitted over the very sizes the measured exponent was: what
    the counts and the ceilings alone say the curve should be. Other metrics have none."""
    from attnbench.fits.exponents import loglog_exponent

    analysis = analyse(wide_run)
    e, frame = analysis.exponents, analysis.frame
    time = e[e["metric"] == "time_s"]
    assert (
        len(time)
        and time["model"].notna().all()
        and e.loc[e["metric"] != "time_s", "model"].isna().all()
    )
    compared = 0
    for row in time.itertuples():
        other = "d" if row.along == "n" else "n"
        line = frame[(frame["layer"] == row.layer) & (frame[other] == row.fixed)]
        line = line[line[row.along].between(row.range_from, row.range_to)]
        if len(line) != row.points:  # a fit that skipped a size inside its range
            continue
        predicted = analysis.machine.loc[line.index, "predicted_time_s"].tolist()
        expected = loglog_exponent(line[row.along].tolist(), predicted)
        assert expected is not None and row.model == pytest.approx(expected.slope)
        compared += 1
    assert compared >= len(time) // 2
    report = runner.invoke(app, ["fit", str(wide_run.path), "--json"])
    rows = json.loads(report.stdout)["exponents"]
    assert {r["metric"] for r in rows if r["model"] is not None} == {"time_s"}


@pytest.mark.slow
def test_a_run_without_ceilings_has_no_machine_model(wide_run: RunResults) -> None:
    meta = {k: v for k, v in wide_run.meta.items() if k != "ceilings"}
    old = RunResults(wide_run.path, wide_run.frame, wide_run.samples, meta)
    analysis = analyse(old)
    assert analysis.machine.empty and analysis.effective is None
    assert analysis.exponents["model"].isna().all()
    assert analysis.machine_table().empty


@pytest.mark.slow
def test_predict_reads_the_runs_own_ceilings_by_default(
    wide_run: RunResults, tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(wide_run.path, copy)
    meta = json.loads((copy / "run.json").read_text())
    meta["ceilings"].update(peak_flops_per_s=1e9, bandwidth_bytes_per_s=1e8, op_latency_s=1e-3)
    meta["ceilings"].update(host_op_s=2e-3)
    (copy / "run.json").write_text(json.dumps(meta))
    result = runner.invoke(app, ["predict", str(copy), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["machine"]["op_latency_s"] == 1e-3
    assert payload["method"] == "counts"  # its own machine: carried would read as measured
    rows = load_results(copy).measured.set_index("case_id")
    for case in payload["results"]:
        row = rows.loc[case["case_id"]]
        issued = host_ops(row["ops"], row["fused_path"])  # by Python; the rest by torch's C++
        assert case["latency_s"] == pytest.approx(issued * 2e-3 + (row["ops"] - issued) * 1e-3)
    # ceilings from before the host was measured charge one bare op's latency instead
    del meta["ceilings"]["host_op_s"]
    (copy / "run.json").write_text(json.dumps(meta))
    payload = json.loads(runner.invoke(app, ["predict", str(copy), "--json"]).stdout)
    for case in payload["results"]:
        assert case["latency_s"] == pytest.approx(rows.loc[case["case_id"], "ops"] * 1e-3)


def test_a_fused_timed_call_counts_its_own_ops_not_the_unfused_trace() -> None:
    """The timed LSTM runs oneDNN's fused kernel: a few ops, not the unfused recurrence's 8 per
    step, which the FLOP and byte counts still trace."""
    case = build_grid({"layers": "lstm", "n": [32], "d": [8], "device": "cpu"}).cases()[0]
    result = measure_case(case, policy=TimingPolicy(budget_s=0.01, min_samples=3))
    traced = count_traffic(make_step(case, seed=0))
    assert "mkldnn" in result.fused_path
    assert result.ops is not None and result.ops < 10 < 8 * 32 < traced.ops
    assert result.bytes == traced.bytes == case.analytic_bytes()
    rnn = build_grid({"layers": "rnn", "n": [32], "d": [8], "device": "cpu"}).cases()[0]
    plain = measure_case(rnn, policy=TimingPolicy(budget_s=0.01, min_samples=3))
    # nn.RNN's one op runs its steps' ops from C++: named, no fused kernel, every op seen
    assert plain.fused_path.startswith("rnn_tanh (torch's recurrent op")
    assert plain.ops == count_traffic(make_step(rnn, seed=0)).ops


@pytest.mark.slow
def test_a_sweep_says_it_measures_the_ceilings_first_and_counts_them_in_its_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine whose ceilings are not cached, the start line says they are measured first
    and its estimate includes them; the next sweep reads them from the cache and says
    nothing."""
    from attnbench.measure.machine import ceilings_file
    from attnbench.measure.machine import probes as machine
    from attnbench.measure.machine.ceilings import Ceilings
    from attnbench.run.estimate import CEILINGS_S

    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "cache"))
    real = machine.measure_ceilings
    measured: list[int] = []

    def quick(device: str, dtype: str, threads: int, probes: object = None) -> Ceilings:
        measured.append(threads)
        return real(device, dtype, threads, probes=SMALL_PROBES)

    monkeypatch.setattr(ceilings_file, "measure_ceilings", quick)
    args = ["sweep", "--layers", "conv", "--n", "16,32", "--d", "8", "--device", "cpu",
            "--threads", "1", "--time-budget", "0.002", "--no-charts"]  # fmt: skip
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert "measuring this machine's ceilings first" in first.stderr and measured == [1]
    seconds = re.search(r"about (?:(\d+)-)?(\d+) s", first.stderr)
    assert seconds is not None and float(seconds.group(1) or seconds.group(2)) >= CEILINGS_S
    assert load_results(tmp_path / "a").ceilings is not None
    second = runner.invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert second.exit_code == 0 and "ceilings first" not in second.stderr
    assert measured == [1]  # read from the cache
    # A run stopped while they were measured, resumed on a machine without them: said too.
    meta = json.loads((tmp_path / "b" / "run.json").read_text())
    del meta["ceilings"]
    (tmp_path / "b" / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "elsewhere"))
    resumed = runner.invoke(app, ["sweep", "--resume", str(tmp_path / "b"), "--no-charts"])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.stderr and "ceilings first" in resumed.stderr
    assert measured == [1, 1] and load_results(tmp_path / "b").ceilings is not None


def test_a_fork_sweep_measures_the_ceilings_while_its_servers_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork servers import torch as they start (1.8 s of a cold default sweep, waited for
    before): the ceilings are measured meanwhile, said before the start line, and recorded
    with the run's own page-fault cost, as measured after."""
    import os

    from attnbench.measure.machine import ceilings_file
    from attnbench.measure.machine import probes as machine
    from attnbench.measure.machine.ceilings import Ceilings

    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "cache"))
    real = machine.measure_ceilings
    servers: list[int] = []

    def quick(device: str, dtype: str, threads: int, probes: object = None) -> Ceilings:
        servers.append(_children_running("attnbench.run.executors.child", os.getpid()))
        return real(device, dtype, threads, probes=SMALL_PROBES)

    monkeypatch.setattr(ceilings_file, "measure_ceilings", quick)
    args = ["sweep", "--layers", "conv", "--n", "16", "--d", "8", "--device", "cpu",
            "--threads", "1", "--time-budget", "0.002", "--no-charts", "--executor", "fork",
            "--processes", "1", "--out", str(tmp_path / "a")]  # fmt: skip
    found = runner.invoke(app, args)
    assert found.exit_code == 0, found.output
    said = found.stderr
    assert said.index("ceilings first") < said.index("attnbench ")  # then the start line
    assert servers == [2]  # both fork servers were starting while they were measured
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    assert meta["ceilings"]["page_fault_s"] == meta["fault_cost_s"]


def _small_probes() -> object:
    from attnbench.measure.machine import probes as machine

    return machine.Probes(
        gemm_side=32, stream_numel=1000, passes=1, elementwise_ops=("add",),
        curve_widths={"gemm": (8,), "conv": (8,), "attention": (8,), "recurrent": (8,)},
    )  # fmt: skip


SMALL_PROBES = _small_probes()  # ceilings in a blink: what a sweep's test needs of them


def _children_running(module: str, parent: int) -> int:
    """The processes of ``parent`` running ``python -m module`` (read from /proc)."""
    found = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        found += ppid == parent and module.encode() in command
    return found
