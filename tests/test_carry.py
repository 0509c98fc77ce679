"""A measured run carried to another device: each case's time split into its kernels' part and
the host's, each scaled by the two machines' ceilings, written out by hand; the method chosen
and refused where it cannot be; on an asynchronous device a call costs the larger of the
host's time and the device's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits.carry import can_carry, carry, host_ratio
from attnbench.fits.roofline import predict
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.results.run import RunResults

runner = CliRunner()
SOURCE = Ceilings(
    peak_flops_per_s=1e11, bandwidth_bytes_per_s=1e10, op_latency_s=2e-6, page_fault_s=None,
    device="cuda:0", device_name="GPU A", dtype="float32", threads=16, torch_version="2.13.0",
    hostname="a", measured_at="then", gemm_side=8192, stream_bytes=2**29, host_op_s=20e-6,
)  # fmt: skip  # one field a line would be four times as long
# a target with the same arithmetic, 0.7x the bandwidth and a host 1.5x slower per op
TARGET = replace(
    SOURCE, bandwidth_bytes_per_s=7e9, device_name="GPU B", measured_at="now", host_op_s=30e-6
)
# one GEMM-bound case, one copy-bound case, each 10 ops; the second with its kernels measured
FRAME = pd.DataFrame(
    [
        {"case_id": "gemm", "flops": 1e9, "bytes": 1e6, "product_bytes": 1e6, "ops": 10,
         "time_s": 0.02},
        {"case_id": "copy", "flops": 1e3, "bytes": 1e9, "product_bytes": 0, "ops": 10,
         "time_s": 0.2, "kernel_time_s": 0.15},
    ]
)  # fmt: skip  # a table of cases, a case a row


def test_each_part_of_a_measured_time_scales_with_what_bounds_it() -> None:
    found = carry(FRAME, SOURCE, TARGET).set_index("case_id")
    here = predict(FRAME, SOURCE).set_index("case_id")
    there = predict(FRAME, TARGET).set_index("case_id")
    # gemm: no kernel time measured, so the counts model's device share on the source
    device = here.loc["gemm", "compute_s"] + here.loc["gemm", "memory_s"]
    share = device / (device + here.loc["gemm", "latency_s"])
    ratio = (there.loc["gemm", "compute_s"] + there.loc["gemm", "memory_s"]) / device
    gemm = found.loc["gemm"]
    assert gemm["share_from"] == "model" and gemm["kernel_share"] == pytest.approx(share)
    assert gemm["predicted_time_s"] == pytest.approx(0.02 * (share * ratio + (1 - share) * 1.5))
    # copy: its measured kernels (0.15 of 0.2 s) scale with the bandwidths, the rest with hosts
    copy = found.loc["copy"]
    assert copy["share_from"] == "measured" and copy["kernel_share"] == pytest.approx(0.75)
    assert copy["kernels_s"] == pytest.approx(0.15 / 0.7, rel=1e-6)
    assert copy["host_s"] == pytest.approx(0.05 * 1.5)
    assert copy["bound"] == "device"
    # the same machine both ways: every time as measured
    same = carry(FRAME, SOURCE, SOURCE).set_index("case_id")
    assert same["predicted_time_s"].to_numpy() == pytest.approx([0.02, 0.2])


def test_the_hosts_ratio_is_their_cost_per_op_else_their_op_latency() -> None:
    assert host_ratio(SOURCE, TARGET).ratio == pytest.approx(1.5)
    assert host_ratio(SOURCE, TARGET).basis == "host_op_s"
    older = replace(TARGET, host_op_s=None, op_latency_s=3e-6)
    assert host_ratio(SOURCE, older).ratio == pytest.approx(1.5)
    assert host_ratio(SOURCE, older).basis == "op_latency_s"


def test_a_run_is_carried_only_from_its_own_machine_to_one_of_its_kind() -> None:
    assert can_carry("cuda:0", SOURCE, TARGET) is None
    assert "no ceilings" in str(can_carry("cuda:0", None, TARGET))
    assert "measured on cpu" in str(can_carry("cpu", SOURCE, TARGET))
    assert "own machine" in str(can_carry("cuda:0", SOURCE, SOURCE))


def test_on_an_asynchronous_device_the_host_and_the_device_overlap() -> None:
    """A call whose host issues its ops for longer than the device runs them costs the host's
    time; on the CPU the two add up."""
    frame = pd.DataFrame(
        [{"case_id": "small", "flops": 1e6, "bytes": 1e6, "product_bytes": 1e6, "ops": 100}]
    )
    gpu = predict(frame, SOURCE).iloc[0]
    assert gpu["latency_s"] == pytest.approx(100 * 20e-6)  # the host's cost per op
    assert gpu["predicted_time_s"] == pytest.approx(100 * 20e-6)  # max, the device hidden
    cpu = predict(frame, replace(SOURCE, device="cpu")).iloc[0]
    device = cpu["compute_s"] + cpu["memory_s"]
    assert cpu["predicted_time_s"] == pytest.approx(device + 100 * 20e-6)


@pytest.mark.slow
def test_predict_carries_a_run_to_another_machine_of_its_kind(
    wide_run: RunResults, tmp_path: Path
) -> None:
    """Against a machine like its own but twice as slow in everything, each carried time is
    twice the measured one; --method counts predicts from the counts; a carry to another
    kind of device, or an unknown method, is one clear error."""
    own = wide_run.ceilings
    assert own is not None and own.host_op_s is not None  # a sweep measures it now

    def halved(curve: dict[Any, float] | None) -> dict[Any, float] | None:
        return None if curve is None else {k: v / 2 for k, v in curve.items()}

    slow = replace(
        own,
        peak_flops_per_s=own.peak_flops_per_s / 2,
        bandwidth_bytes_per_s=own.bandwidth_bytes_per_s / 2,
        op_latency_s=own.op_latency_s * 2,
        host_op_s=own.host_op_s * 2,
        page_fault_s=None if own.page_fault_s is None else own.page_fault_s * 2,
        gemm_rates=halved(own.gemm_rates),
        conv_rates=halved(own.conv_rates),
        attention_rates=halved(own.attention_rates),
        elementwise_rates=halved(own.elementwise_rates),
        recurrent_rates=halved(own.recurrent_rates),
        recurrent_call_s=None
        if own.recurrent_call_s is None
        else {k: v * 2 for k, v in own.recurrent_call_s.items()},
        measured_at="later",
    )
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow.to_dict()))
    result = runner.invoke(app, ["predict", str(wide_run.path), "--machine", str(path), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["method"] == "carried" and "host ratio 2.00" in payload["method_why"]
    for case in payload["results"]:
        assert case["predicted_time_s"] == pytest.approx(2 * case["time_s"], rel=0.02)
    counted = runner.invoke(
        app, ["predict", str(wide_run.path), "--machine", str(path), "--method", "counts", "--json"]
    )
    assert json.loads(counted.stdout)["method"] == "counts"
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(replace(slow, device="cuda:0").to_dict()))
    refused = runner.invoke(
        app, ["predict", str(wide_run.path), "--machine", str(gpu), "--method", "carried"]
    )
    assert refused.exit_code == 2 and "measured on cpu" in refused.output
    assert "Traceback" not in refused.output and "--method counts" in refused.output
    wrong = runner.invoke(app, ["predict", str(wide_run.path), "--method", "guess"])
    assert wrong.exit_code != 0 and "carried, counts" in wrong.output


def test_a_carry_on_the_op_latency_stand_in_says_it_can_mislead() -> None:
    """Carried on the op latency (a machine without host_op_s), the method's reason names the
    stand-in and the two ways out; on both machines' host_op_s it does not."""
    from types import SimpleNamespace

    from attnbench.fits.prediction import choose_method

    run = SimpleNamespace(record=SimpleNamespace(config={"device": "cuda:0"}), ceilings=SOURCE)
    chosen, why, _ = choose_method(run, TARGET, None)  # type: ignore[arg-type]
    assert chosen == "carried" and "from host_op_s)" in why and "stand-in" not in why
    older = replace(TARGET, host_op_s=None, op_latency_s=3e-6)
    chosen, why, _ = choose_method(run, older, None)  # type: ignore[arg-type]
    assert chosen == "carried" and "from op_latency_s: a stand-in" in why
    assert "attnbench machine --remeasure" in why and "--method counts" in why
