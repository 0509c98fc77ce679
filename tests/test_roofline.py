"""The machine model: predicted times from counts and ceilings alone, written out by hand, and
the predict command on a real run with a ceilings file."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits.roofline import effective_ceilings, predict, relative_rms
from attnbench.measure.machine.ceilings import Ceilings
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
    # Without product_bytes the call is one roofline: its time is charged to the larger side.
    assert gemm["compute_s"] == 1e9 / 1e11 and gemm["memory_s"] == 0
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


def test_a_products_bytes_add_to_its_arithmetic_and_the_rest_of_the_traffic_too() -> None:
    """Ops run one after another: a compute-bound product and memory-bound elementwise traffic
    add up, where one roofline over the whole call would hide the traffic under the arithmetic."""
    frame = pd.DataFrame(
        [
            # products: 1e9 FLOPs (10 ms) over 1e6 bytes (0.1 ms); elementwise: 5e7 bytes (5 ms)
            {"case_id": "mixed", "flops": 1e9, "bytes": 5.1e7, "product_bytes": 1e6, "ops": 10},
            # products: 1e6 FLOPs (10 us) over 1e8 bytes (10 ms): memory-bound products
            {"case_id": "thin", "flops": 1e6, "bytes": 1e8, "product_bytes": 1e8, "ops": 1},
        ]
    )
    found = predict(frame, MACHINE).set_index("case_id")
    mixed = found.loc["mixed"]
    # A product's arithmetic and its bytes add up: a narrow product does not hide its traffic.
    assert mixed["compute_s"] == pytest.approx(1e-2)
    assert mixed["memory_s"] == pytest.approx(1e-4 + 5e-3)
    assert mixed["predicted_time_s"] == pytest.approx(1e-2 + 1e-4 + 5e-3 + 10 * 2e-6)
    assert mixed["bound"] == "compute"
    one_roofline = max(1e9 / 1e11, 5.1e7 / 1e10) + 10 * 2e-6
    assert mixed["predicted_time_s"] > one_roofline * 1.4
    thin = found.loc["thin"]
    assert thin["compute_s"] == pytest.approx(1e-5) and thin["memory_s"] == pytest.approx(1e-2)
    assert thin["bound"] == "memory"
    parts = found[["compute_s", "memory_s", "latency_s", "faults_s"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(found["predicted_time_s"].to_numpy())


def test_each_kind_of_product_runs_at_its_own_rate() -> None:
    """A convolution and a fused attention kernel take the rates the machine measured for
    them; the rest of the products (matrix multiplications) the GEMM's peak; a machine that
    did not measure a kind runs it at the peak."""
    machine = replace(MACHINE, conv_rates={1: 5e10}, attention_rates={1: 2e10})
    frame = pd.DataFrame(
        [
            # 1e9 FLOPs of GEMMs and 1e9 of convolution, each over 1e6 bytes
            {"case_id": "conv", "flops": 2e9, "bytes": 2e6, "product_bytes": 2e6, "ops": 0,
             "kernels": "conv:1000000000:1000000"},
            {"case_id": "sdpa", "flops": 1e9, "bytes": 1e6, "product_bytes": 1e6, "ops": 0,
             "kernels": "attention:1000000000:1000000"},
            {"case_id": "plain", "flops": 1e9, "bytes": 1e6, "product_bytes": 1e6, "ops": 0,
             "kernels": ""},
        ]
    )  # fmt: skip
    found = predict(frame, machine).set_index("case_id")
    assert found.loc["conv", "compute_s"] == pytest.approx(1e9 / 1e11 + 1e9 / 5e10)
    assert found.loc["sdpa", "compute_s"] == pytest.approx(1e9 / 2e10)
    assert found.loc["plain", "compute_s"] == pytest.approx(1e9 / 1e11)
    at_peak = predict(frame, MACHINE).set_index("case_id")  # rates not measured
    assert at_peak.loc["conv", "compute_s"] == pytest.approx(2e9 / 1e11)


def test_a_product_runs_at_its_kinds_rate_for_its_width() -> None:
    """A 16-wide GEMM runs at the curve's 16-wide rate, a 64-wide one at its own, a width
    between two measured ones at their log-log interpolation; the same run on a machine
    without curves runs every GEMM at the peak."""
    machine = replace(MACHINE, gemm_rates={16: 1e10, 64: 4e10}, conv_rates={16: 2e10})
    frame = pd.DataFrame(
        [
            {"case_id": "narrow", "flops": 2e9, "bytes": 2e6, "product_bytes": 2e6, "ops": 0,
             "kernels": "gemm@16:1000000000:1000000; gemm@64:1000000000:1000000"},
            {"case_id": "between", "flops": 1e9, "bytes": 1e6, "product_bytes": 1e6, "ops": 0,
             "kernels": "gemm@32:1000000000:1000000"},
            {"case_id": "conv", "flops": 1e9, "bytes": 1e6, "product_bytes": 1e6, "ops": 0,
             "kernels": "conv@16:1000000000:1000000"},
        ]
    )  # fmt: skip
    found = predict(frame, machine).set_index("case_id")
    assert found.loc["narrow", "compute_s"] == pytest.approx(1e9 / 1e10 + 1e9 / 4e10)
    assert found.loc["between", "compute_s"] == pytest.approx(1e9 / 2e10)  # halfway in log2
    assert found.loc["conv", "compute_s"] == pytest.approx(1e9 / 2e10)
    flat = predict(frame, MACHINE).set_index("case_id")
    assert flat.loc["narrow", "compute_s"] == pytest.approx(2e9 / 1e11)


def test_each_elementwise_op_runs_at_its_own_rate_or_its_bandwidth() -> None:
    """An exp's elements at the exp's rate, an add's at an add's, each against its own bytes
    over the bandwidth: the larger is charged. An op the machine did not measure runs at an
    add's rate; the traffic no op accounts for (a copy) is memory."""
    machine = replace(MACHINE, elementwise_rates={"add": 1e10, "exp": 1e9})
    frame = pd.DataFrame(
        [
            # exp: 1e8 elements (0.1 s) over 8e8 bytes (0.08 s); add: 1e8 (10 ms) over 1.2e9
            # bytes (0.12 s); a copy of 1e8 bytes (10 ms); erf: 1e6 elements, 1e3 bytes
            {"case_id": "mixed", "flops": 0, "bytes": 2.1e9 + 1e3, "product_bytes": 0,
             "ops": 0, "kernels": "ew.exp:100000000:800000000; ew.add:100000000:1200000000; "
                                  "ew.erf:1000000:1000"},
        ]
    )  # fmt: skip
    found = predict(frame, machine).set_index("case_id").loc["mixed"]
    assert found["compute_s"] == pytest.approx(1e8 / 1e9 + 1e6 / 1e10)
    assert found["memory_s"] == pytest.approx(1.2e9 / 1e10 + 1e8 / 1e10)
    without = predict(frame, MACHINE).set_index("case_id").loc["mixed"]  # no rates: bytes only
    assert without["compute_s"] == 0 and without["memory_s"] == pytest.approx(2.1e9 / 1e10 + 1e-7)


def test_a_fused_recurrent_kernel_runs_its_flops_at_its_own_rate() -> None:
    """oneDNN's LSTM runs its per-step products and gates as one kernel: the trace's FLOPs at
    the fused kernel's rate for the products' width, and the per-step traffic the unfused
    trace shows stays inside it; the copy outside it is memory. Without the fused path, or on
    a machine that measured no fused kernel, the same counts take the per-op model."""
    machine = replace(MACHINE, recurrent_rates={32: 1e9, 128: 4e9},
                      elementwise_rates={"sigmoid": 1e9})  # fmt: skip
    row = {"case_id": "lstm", "flops": 2e9, "bytes": 3e9 + 1e8, "product_bytes": 2e9,
           "ops": 5, "kernels": "gemm@64:1000000000:1000000000; gemm@16:1000000000:"
           "1000000000; ew.sigmoid:100000000:1000000000",
           "fused_path": "mkldnn_rnn_layer (oneDNN recurrent kernel)"}  # fmt: skip
    fused = predict(pd.DataFrame([row]), machine).iloc[0]
    assert fused["compute_s"] == pytest.approx(2e9 / 2e9)  # 64 wide: halfway, 2e9 FLOP/s
    assert fused["memory_s"] == pytest.approx(1e8 / 1e10)  # the copy outside the kernel
    unfused = predict(pd.DataFrame([{**row, "fused_path": ""}]), machine).iloc[0]
    # each product's 1e9 bytes (0.1 s) besides its 1e9 FLOPs at the peak (0.01 s); the
    # sigmoid's 1e8 elements at 1e9 a second, as long as its bytes: charged to compute
    assert unfused["memory_s"] == pytest.approx((2e9 + 1e8) / 1e10)
    assert unfused["compute_s"] == pytest.approx(2 * 0.01 + 0.1)
    elsewhere = predict(pd.DataFrame([row]), replace(machine, recurrent_rates=None)).iloc[0]
    assert elsewhere["predicted_time_s"] == unfused["predicted_time_s"]


def test_a_fused_recurrent_kernels_set_up_is_latency_once_a_call() -> None:
    """oneDNN sets up its LSTM primitive on every call: the machine's measured cost of a call
    beyond its steps, at the products' width, is charged once per fused kernel the call ran,
    as latency; a machine that measured no such cost (an older file) charges none."""
    machine = replace(MACHINE, recurrent_rates={32: 1e9, 128: 4e9},
                      recurrent_call_s={32: 1e-4, 128: 3e-4})  # fmt: skip
    row = {"case_id": "lstm", "flops": 1e5, "bytes": 1e5, "product_bytes": 1e5, "ops": 5,
           "kernels": "gemm@64:100000:100000",
           "fused_path": "mkldnn_rnn_layer (oneDNN recurrent kernel)"}  # fmt: skip
    found = predict(pd.DataFrame([row]), machine).iloc[0]
    assert found["latency_s"] == pytest.approx(5 * MACHINE.op_latency_s + 2e-4)  # 64: halfway
    assert found["compute_s"] == pytest.approx(1e5 / 2e9)
    assert found["bound"] == "latency"
    older = predict(pd.DataFrame([row]), replace(machine, recurrent_call_s=None)).iloc[0]
    assert older["latency_s"] == pytest.approx(5 * MACHINE.op_latency_s)
    assert found["predicted_time_s"] - older["predicted_time_s"] == pytest.approx(2e-4)
    plain = predict(pd.DataFrame([{**row, "fused_path": ""}]), machine).iloc[0]
    assert plain["latency_s"] == pytest.approx(5 * MACHINE.op_latency_s)  # no fused kernel


def test_the_host_issues_a_fused_recurrent_op_once_and_its_inner_ops_pay_one_dispatch() -> None:
    """nn.RNN, nn.GRU and nn.LSTM each issue one aten op from Python, which runs the whole
    recurrence in torch's C++ (oneDNN's kernel, or each step's ops dispatched from its loop):
    the host's cost per op is charged once per such op, each other op of the call one bare
    op's latency. A call without one charges the host's cost for every op."""
    machine = replace(MACHINE, host_op_s=8e-6)  # a bare op: 2e-6
    row = {"case_id": "gru", "flops": 1e3, "bytes": 1e3, "product_bytes": 1e3, "ops": 200,
           "kernels": "gemm@64:1000:1000", "fused_path": "gru (torch's GRU op)"}  # fmt: skip
    once = 8e-6 + 199 * 2e-6  # not 200 x 8e-6
    assert predict(pd.DataFrame([row]), machine).iloc[0]["latency_s"] == pytest.approx(once)
    # oneDNN's kernel, as a run names it that records the kernel and not torch's op
    kernel = {**row, "fused_path": "mkldnn_rnn_layer (oneDNN recurrent kernel)"}
    assert predict(pd.DataFrame([kernel]), machine).iloc[0]["latency_s"] == pytest.approx(once)
    both = {**row, "fused_path": "lstm (torch's LSTM op); mkldnn_rnn_layer (oneDNN kernel)"}
    assert predict(pd.DataFrame([both]), machine).iloc[0]["latency_s"] == pytest.approx(once)
    issued = {**row, "fused_path": ""}  # a loop in Python: every op issued by the host
    found = predict(pd.DataFrame([issued]), machine).iloc[0]
    assert found["latency_s"] == pytest.approx(200 * 8e-6)
    # ceilings from before host_op_s charge every op the bare latency, as before
    older = predict(pd.DataFrame([row]), MACHINE).iloc[0]
    assert older["latency_s"] == pytest.approx(200 * 2e-6)


def test_effective_ceilings_recover_the_machine_that_made_the_times() -> None:
    """Times made by a known additive machine are fitted back to its ceilings, over layers
    of very different sizes (each layer weighted alike)."""
    rows = []
    for layer, scale in (("big", 1e3), ("small", 1.0)):
        for i, (f, b, o, pf) in enumerate(
            [(1e8, 1e6, 10, 0), (1e6, 1e8, 10, 0), (1e3, 1e3, 500, 0), (1e3, 1e3, 1, 100),
             (5e7, 3e7, 40, 3), (2e5, 7e5, 80, 1)]
        ):  # fmt: skip
            f, b = f * scale, b * scale
            time = f / 5e10 + b / 2e10 + o * 3e-6 + pf * 1e-6
            rows.append({"case_id": f"{layer}{i}", "layer": layer, "flops": f, "bytes": b,
                         "ops": o, "page_faults": pf, "time_s": time})  # fmt: skip
    found = effective_ceilings(pd.DataFrame(rows))
    assert found is not None and found.cases == 12
    assert found.peak_flops_per_s == pytest.approx(5e10, rel=1e-6)
    assert found.bandwidth_bytes_per_s == pytest.approx(2e10, rel=1e-6)
    assert found.op_latency_s == pytest.approx(3e-6, rel=1e-6)
    assert found.page_fault_s == pytest.approx(1e-6, rel=1e-6)
    assert found.predicted.to_numpy() == pytest.approx([r["time_s"] for r in rows], rel=1e-6)
    assert effective_ceilings(pd.DataFrame(rows[:1])) is None


def test_effective_ceilings_scale_the_models_own_terms_when_the_ceilings_are_known() -> None:
    """Times made by a machine whose products run at half the measured rates, whose bytes move
    at twice the bandwidth and whose ops cost 1.5 latencies are fitted back to those ceilings,
    the model's terms (widths and op rates included) scaled one multiplier each."""
    machine = replace(MACHINE, gemm_rates={16: 1e10, 64: 4e10}, elementwise_rates={"exp": 1e9})
    rows = []
    for layer, scale in (("big", 1e3), ("small", 1.0)):
        for i, (f, b, o, width) in enumerate(
            [(1e8, 1e6, 10, 16), (1e6, 1e9, 10, 64), (1e3, 1e3, 500, 16), (5e7, 3e7, 40, 64)]
        ):  # fmt: skip
            kernels = f"gemm@{width}:{f * scale:.0f}:{b * scale / 10:.0f}; ew.exp:{o * 100}:8"
            rows.append({"case_id": f"{layer}{i}", "layer": layer, "flops": f * scale,
                         "bytes": b * scale, "product_bytes": b * scale / 10, "ops": o,
                         "page_faults": 0, "kernels": kernels})  # fmt: skip
    frame = pd.DataFrame(rows)
    terms = predict(frame, machine)
    frame["time_s"] = (2 * terms["compute_s"] + 0.5 * terms["memory_s"]
                       + 1.5 * terms["latency_s"])  # fmt: skip
    found = effective_ceilings(frame, machine)
    assert found is not None and found.cases == 8
    assert found.peak_flops_per_s == pytest.approx(1e11 / 2, rel=1e-6)
    assert found.bandwidth_bytes_per_s == pytest.approx(1e10 * 2, rel=1e-6)
    assert found.op_latency_s == pytest.approx(2e-6 * 1.5, rel=1e-6)
    assert found.predicted.to_numpy() == pytest.approx(frame["time_s"].to_numpy(), rel=1e-6)


def test_relative_rms_is_over_the_mean_time() -> None:
    measured = pd.Series([1.0, 3.0])
    assert relative_rms(measured, pd.Series([1.0, 3.0])) == 0
    assert relative_rms(measured, pd.Series([2.0, 2.0])) == pytest.approx(1 / 2)
    assert math.isnan(relative_rms(pd.Series([], dtype=float), pd.Series([], dtype=float)))


@pytest.mark.slow
def test_predict_reads_a_run_and_a_ceilings_file(wide_run: RunResults, tmp_path: Path) -> None:
    ceilings = tmp_path / "other-machine.json"
    ceilings.write_text(json.dumps(MACHINE.to_dict()))
    result = runner.invoke(
        app,
        ["predict", str(wide_run.path), "--machine", str(ceilings), "--method", "counts", "--json"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["machine"]["device_name"] == "a cpu" and payload["method"] == "counts"
    rows = wide_run.measured.set_index("case_id")
    assert len(payload["results"]) == len(rows)
    for case in payload["results"]:
        row = rows.loc[case["case_id"]]
        # products: their FLOPs at the peak (no curves in this file) plus their bytes
        products = row["flops"] / 1e11 + row["product_bytes"] / 1e10
        expected = products + (row["bytes"] - row["product_bytes"]) / 1e10 + row["ops"] * 2e-6
        expected += (row["page_faults"] if pd.notna(row["page_faults"]) else 0) * 1e-6
        assert case["predicted_time_s"] == pytest.approx(expected)
        assert {"layer", "n", "d", "time_s", "bound"} <= set(case)
    table = runner.invoke(
        app, ["predict", str(wide_run.path), "--machine", str(ceilings), "--method", "counts"]
    )
    assert table.exit_code == 0 and "relative RMS" in table.stderr
    assert "Predicted (counts) on the ceilings of a cpu" in " ".join(table.stdout.split())


@pytest.mark.slow
def test_predict_shows_the_run_on_another_machine_crossovers_and_charts(
    wide_run: RunResults, tmp_path: Path
) -> None:
    """On a machine where everything is twice as slow, every predicted time doubles and the
    crossovers (ratios of times) stay where they are; --charts draws the run as it would look
    there, titled with that machine."""
    here, slow = tmp_path / "here.json", tmp_path / "slow.json"
    here.write_text(json.dumps(MACHINE.to_dict()))
    halved = replace(MACHINE, peak_flops_per_s=5e10, bandwidth_bytes_per_s=5e9,
                     op_latency_s=4e-6, page_fault_s=2e-6, device_name="a slow cpu")  # fmt: skip
    slow.write_text(json.dumps(halved.to_dict()))
    found = {}
    for name, path in (("here", here), ("slow", slow)):
        charts = tmp_path / f"charts-{name}"
        result = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(path),
                                     "--json", "--charts", str(charts)])  # fmt: skip
        assert result.exit_code == 0, result.output
        found[name] = json.loads(result.stdout)
        drawn = {Path(p).name for p in found[name]["charts"]}
        assert {"time.png", "crossover.png", "time-split.png", "roofline.png"} <= drawn
    times = {n: {r["case_id"]: r["predicted_time_s"] for r in found[n]["results"]}
             for n in found}  # fmt: skip
    assert all(times["slow"][c] == pytest.approx(2 * t) for c, t in times["here"].items())
    crossings = [found[n]["crossovers"] for n in ("here", "slow")]
    assert crossings[0] and [c["measured"] for c in crossings[0]] == [
        c["measured"] for c in crossings[1]
    ]
    table = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(slow)])
    assert "Crossovers on that machine" in table.stdout


@pytest.mark.slow
def test_predict_says_when_the_ceilings_are_of_another_kind_of_device(
    wide_run: RunResults, tmp_path: Path
) -> None:
    """A CPU run's dispatched ops on a GPU's ceilings: the run counts what its device
    dispatched, and cuDNN fuses what the CPU runs op by op (docs/gpu.md), so predict says so."""
    notes = {}
    for device in ("cpu", "cuda:0"):
        path = tmp_path / f"{device.replace(':', '')}.json"
        path.write_text(json.dumps(replace(MACHINE, device=device).to_dict()))
        result = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(path)])
        assert result.exit_code == 0, result.output
        notes[device] = " ".join(result.stderr.split())
    assert "measured on cpu and the ceilings are of cuda:0" in notes["cuda:0"]
    assert "ceilings are of" not in notes["cpu"]


def test_predict_refuses_bad_input_in_one_line(wide_run: RunResults, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"peak_flops_per_s": 0}')
    result = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(broken)])
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("peak_flops_per_s must be a positive number (got 0)")
    old = tmp_path / "old"
    old.mkdir()
    meta = json.loads((wide_run.path / "run.json").read_text())
    (old / "run.json").write_text(json.dumps({**meta, "schema_version": 1}))  # before bytes
    (old / "samples.csv").write_bytes((wide_run.path / "samples.csv").read_bytes())
    frame = pd.read_csv(wide_run.path / "results.csv", keep_default_na=False)
    frame.drop(columns=["bytes", "ops"]).to_csv(old / "results.csv", index=False)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(MACHINE.to_dict()))
    result = runner.invoke(app, ["predict", str(old), "--machine", str(good)])
    assert result.exit_code == 2 and "cannot be predicted (sweep it again)" in result.stderr


def test_rounds_rms_is_how_far_the_runs_rounds_are_from_each_other() -> None:
    """Per layer, the relative RMS between two rounds' per-case medians, the median over
    every pair of rounds, worked out by hand; NaN for a layer timed in one round only."""
    from attnbench.fits.roofline import rounds_rms

    # conv: two cases over three rounds, the medians by round (a: 1, 1, 2 ms; b: 2, 2, 2 ms)
    medians = {("conv/a", 1): 1e-3, ("conv/a", 2): 1e-3, ("conv/a", 3): 2e-3,
               ("conv/b", 1): 2e-3, ("conv/b", 2): 2e-3, ("conv/b", 3): 2e-3}  # fmt: skip
    rows = []
    for (case, rnd), median in medians.items():  # three samples whose median is the median
        rows += [{"case_id": case, "round": rnd, "time_s": median * f} for f in (0.9, 1, 1.5)]
    rows += [{"case_id": "rnn/a", "round": 1, "time_s": 5e-3}]  # one round: nothing to compare
    samples = pd.DataFrame(rows)
    frame = pd.DataFrame({"case_id": ["conv/a", "conv/b", "rnn/a"],
                          "layer": ["conv", "conv", "rnn"]})  # fmt: skip
    found = rounds_rms(samples, frame)
    # rounds 1-2 agree (0); 1-3 and 2-3 differ by 1 ms on a alone: RMS sqrt(1/2) ms over a
    # mean of 1.5 ms; the median of (0, x, x) is x
    assert found["conv"] == pytest.approx(math.sqrt(0.5) * 1e-3 / 1.5e-3)
    assert math.isnan(found["rnn"])
    assert rounds_rms(samples.drop(columns="round"), frame).isna().all()


@pytest.mark.slow
def test_the_machine_table_and_predict_show_how_far_the_rounds_are(
    wide_run: RunResults, tmp_path: Path
) -> None:
    """A run of one round has no floor ("–" in the report); one of two rounds has one per layer,
    in ``fit --json``'s machine rows and in ``predict``'s per-layer lines."""
    from attnbench.fits import analyse
    from attnbench.fits.roofline import rounds_rms
    from attnbench.render.report import machine_display, machine_notes

    first = wide_run.samples[wide_run.samples["round"] == 1]
    single = replace(wide_run, samples=first)
    one = analyse(single).machine_table()
    assert one["rounds_rms"].isna().all()
    twice = first.assign(round=2, time_s=first["time_s"] * 1.5)
    two = replace(wide_run, samples=pd.concat([first, twice], ignore_index=True))
    analysis = analyse(two)
    table = analysis.machine_table().set_index("layer")
    # every case 1.5x slower in round 2: the rounds differ by half of round 1's median m, so
    # their relative RMS is 0.5 * sqrt(mean(m²)) / mean(m)
    medians = first.groupby("case_id")["time_s"].median()
    layer_of = wide_run.measured.set_index("case_id")["layer"]
    for layer in ("conv", "rnn", "attention"):
        m = medians[layer_of.index[layer_of == layer]]
        expected = 0.5 * math.sqrt((m**2).mean()) / m.mean()
        assert table.loc[layer, "rounds_rms"] == pytest.approx(expected)
    assert rounds_rms(two.samples, two.measured).to_dict() == table["rounds_rms"].to_dict()
    shown = machine_display(analysis)
    assert shown["rounds' rel. RMS (the floor)"].str.endswith("%").all()
    # the located misses are not parts of the model's (a new user read "of it" so): they cancel
    assert {"kernels' miss", "overhead's miss"} <= set(shown.columns)
    assert any("either may exceed the model's rel. RMS" in n for n in machine_notes(analysis))
    assert (machine_display(analyse(single))["rounds' rel. RMS (the floor)"] == "–").all()
    folder = tmp_path / "two-rounds"
    shutil.copytree(wide_run.path, folder)
    two.samples.to_csv(folder / "samples.csv", index=False)
    payload = json.loads(runner.invoke(app, ["fit", str(folder), "--json"]).stdout)
    assert all(row["rounds_rms"] >= 0.5 for row in payload["machine"])
    printed = runner.invoke(app, ["predict", str(folder)])
    assert printed.exit_code == 0 and "from each other" in printed.stderr


def test_the_models_miss_is_located_on_the_kernels_or_on_the_overhead() -> None:
    """Two cases of 1 ms: the model's kernel terms miss the measured kernels by 0.3 ms in
    each, its latency the measured overhead by 0.1 ms: 30% and 10% of the time."""
    from attnbench.fits.roofline import split_rms

    frame = pd.DataFrame({"time_s": [1e-3, 1e-3], "kernel_time_s": [0.8e-3, 0.6e-3]})
    machine = pd.DataFrame(
        {"compute_s": [0.9e-3, 0.5e-3], "memory_s": [0.2e-3, 0.0], "faults_s": [0.0, 0.4e-3],
         "latency_s": [0.1e-3, 0.5e-3]}
    )  # fmt: skip
    kernels, overhead = split_rms(frame, machine)
    assert kernels == pytest.approx(0.3) and overhead == pytest.approx(0.1)
    unsplit = frame.assign(kernel_time_s=float("nan"))
    assert all(math.isnan(x) for x in split_rms(unsplit, machine))
