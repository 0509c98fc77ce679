"""The machine's ceilings: their arithmetic with injected kernel times, the cache, the files that
`predict` will read, and the `machine` command. Nothing here depends on how fast this machine is,
except one real measurement checked for sanity and by ratio."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.devices import for_kind
from attnbench.errors import AttnbenchError
from attnbench.measure.machine import ceilings_file
from attnbench.measure.machine import probes as machine
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.machine.ceilings_file import (
    cache_dir,
    ceilings_from,
    machine_ceilings,
    read_ceilings,
)
from attnbench.measure.machine.probes import (
    DEFAULT_PROBES,
    Probes,
    measure_ceilings,
    stream_elements,
)

runner = CliRunner()
SECONDS = {"gemm": 0.02, "copy": 0.004, "op": 3e-6, "host": 6.4e-4, "conv": 0.01, "attention": 0.05,
           "gemm@8": 0.004, "gemm@16": 0.002, "recurrent": 2e-3,
           "recurrent-short": 3e-4}  # fmt: skip
CURVES = {"gemm": (8, 16), "conv": (4,), "attention": (8,), "recurrent": (4,)}
EW = ["ew.add", "ew.exp"]
SECONDS |= {"ew.add": 1e-5, "ew.exp": 8e-5}
SMALL = {"curve_widths": CURVES, "elementwise_ops": ("add", "exp")}


def fake_timer(calls: list[str]):  # type: ignore[no-untyped-def]
    def timer(name, fn, policy):  # type: ignore[no-untyped-def]
        fn()  # the kernel really runs once: shapes and devices are exercised
        calls.append(name)
        return SECONDS.get(name) or SECONDS[name.partition("@")[0]]

    return timer


def test_each_ceiling_is_its_kernels_work_over_its_time() -> None:
    calls: list[str] = []
    found = measure_ceilings(
        "cpu", "float32", 1, probes=Probes(gemm_side=64, stream_numel=1000, **SMALL),
        timer=fake_timer(calls), fault_cost=lambda: 7e-6,
    )  # fmt: skip
    one_pass = ["gemm", "copy", "op", "host",
                "gemm@8", "gemm@16", "conv@4", "attention@8", "recurrent-short@4",
                "recurrent@4", *EW]  # fmt: skip
    assert calls == one_pass * 2  # two passes over the whole set
    # The curves: (rows x w) @ (w x w) with rows = 2**16 / w, a Conv1d(w, w, 3) over as many
    # positions, 4 heads of width w over 512 positions.
    assert found.gemm_rates == {8: 2 * 8192 * 8 * 8 / 0.004, 16: 2 * 4096 * 16 * 16 / 0.002}
    assert found.conv_rates == {4: 2 * 4 * 4 * 3 * 16384 / 0.01}
    assert found.attention_rates == {8: 4 * 4 * 512 * 512 * 8 / 0.05}
    # nn.LSTM(4, 4): 4 gates x (4x4 input + 4x4 recurrent) products a step, at the slope of the
    # line through 16 steps in 0.3 ms and 256 in 2 ms; what the line leaves at 0 steps is the
    # cost of a call (its set-up)
    per_step = (2e-3 - 3e-4) / (256 - 16)
    assert found.recurrent_rates == {4: pytest.approx(4 * 2 * (2 * 4 * 4) / per_step)}
    assert found.recurrent_call_s == {4: pytest.approx(3e-4 - 16 * per_step)}
    assert found.recurrent_call(4) == pytest.approx(3e-4 - 16 * per_step)
    # each elementwise op over 2**16 elements in cache
    assert found.elementwise_rates == {"add": 2**16 / 1e-5, "exp": 2**16 / 8e-5}
    assert found.elementwise_rate("exp") == 2**16 / 8e-5
    assert found.elementwise_rate("erfinv") == 2**16 / 1e-5  # not measured: an add's rate
    # no single rate for a convolution or a fused attention: their curves hold them
    assert "conv_flops_per_s" not in found.to_dict()
    assert found.rate("conv") == found.conv_rates[4]  # an unknown width: the widest
    assert found.rate("attention") == found.attention_rates[8]
    assert found.square_flops_per_s == 2 * 64**3 / 0.02  # 2·s³ FLOPs of the product
    # the peak is the fastest product any probe ran (here gemm@16's, 40x the fake square's):
    # a ceiling a measured rate exceeds is no ceiling
    curves = [*found.gemm_rates.values(), *found.conv_rates.values()]
    curves += [*found.attention_rates.values(), *found.recurrent_rates.values()]
    assert found.peak_flops_per_s == max(curves) == found.gemm_rates[16]
    assert found.bandwidth_bytes_per_s == 2 * 1000 * 4 / 0.004  # read + written, 4 bytes each
    assert found.stream_bytes == 8000 and found.gemm_side == 64
    assert found.op_latency_s == 3e-6 and found.page_fault_s == 7e-6
    # the host probe: 16 module calls of a Linear (addmm) and a tanh each, 32 ops a call
    assert found.host_op_s == pytest.approx(6.4e-4 / (2 * machine.HOST_PROBE_DEPTH))
    assert found.threads == 1 and found.dtype == "float32" and found.device == "cpu"
    assert found.torch_version == torch.__version__


def test_the_thread_count_is_set_while_measuring_and_restored() -> None:
    before = torch.get_num_threads()
    seen: list[int] = []

    def timer(name, fn, policy):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return SECONDS[name.partition("@")[0]]

    found = measure_ceilings(
        "cpu", "float16", 1, probes=Probes(gemm_side=8, stream_numel=10, **SMALL), timer=timer
    )
    assert seen == [1] * 2 * (10 + len(EW)) and found.threads == 1
    assert found.bandwidth_bytes_per_s == 2 * 10 * 2 / 0.004  # float16: 2 bytes an element
    assert torch.get_num_threads() == before


@pytest.mark.slow
def test_a_device_off_the_cpu_counts_no_faults_and_waits_for_its_queue() -> None:
    """The `meta` device stands in for CUDA here: tensors with no data, kernels that run
    nowhere. The sync the timer is given is the device's, and a fault is not its cost."""
    waited: list[str] = []
    found = measure_ceilings(
        "meta", "float32", None, probes=Probes(gemm_side=32, stream_numel=100, **SMALL),
        timer=fake_timer([]), sync=lambda: waited.append("sync"),
        fault_cost=lambda: pytest.fail("faults read"),
    )  # fmt: skip
    assert found.page_fault_s is None and found.device == "meta"
    assert for_kind(machine.GEMM_SIDE, "cuda:1") == 8192
    assert for_kind(machine.GEMM_SIDE, "cpu") == 1024


def test_each_kernel_keeps_its_fastest_time_over_the_passes() -> None:
    """A neighbour's burst in one pass slows that pass's times: the other pass's are kept."""
    seen: list[str] = []

    def timer(name, fn, policy):  # type: ignore[no-untyped-def]
        seen.append(name)
        base = SECONDS.get(name) or SECONDS[name.partition("@")[0]]
        burst = name in ("gemm", "copy", "gemm@8") and seen.count(name) == 1
        return 4 * base if burst else base  # four times slower in the first pass

    found = measure_ceilings(
        "cpu", "float32", 1, probes=Probes(gemm_side=64, stream_numel=1000, **SMALL),
        timer=timer, fault_cost=lambda: 1e-6,
    )  # fmt: skip
    assert found.square_flops_per_s == 2 * 64**3 / 0.02
    assert found.bandwidth_bytes_per_s == 2 * 1000 * 4 / 0.004
    assert found.gemm_rates is not None and found.gemm_rates[8] == 2 * 8192 * 8 * 8 / 0.004
    seen.clear()
    once = measure_ceilings(
        "cpu", "float32", 1, probes=Probes(gemm_side=64, stream_numel=1000, passes=1, **SMALL),
        timer=timer, fault_cost=lambda: 1e-6,
    )  # fmt: skip
    assert once.square_flops_per_s == 2 * 64**3 / 0.08  # one pass: the burst stays


def test_a_kernels_time_is_its_fastest_sample_not_its_median(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As STREAM reports its best trial: a neighbour only ever slows a sample, so the fastest
    one is the device's own time."""
    from attnbench.measure.timing.loop import TimingStats

    samples = (0.03, 0.02, 0.05)  # median 0.03, fastest 0.02
    monkeypatch.setattr(
        machine, "time_call",
        lambda fn, policy, clock, sync: TimingStats(samples, 1, sum(samples)),
    )  # fmt: skip
    found = measure_ceilings(
        "cpu", "float32", 1, probes=Probes(gemm_side=64, stream_numel=1000, passes=1, **SMALL),
        fault_cost=lambda: None,
    )  # fmt: skip
    assert found.square_flops_per_s == 2 * 64**3 / 0.02
    assert found.op_latency_s == 0.02


def test_a_real_measurement_is_consistent() -> None:
    """Real kernels, judged only by ratios (this machine is shared): every ceiling positive,
    one op on one element cheaper than a 256³ product, the copy's bytes as stated, a 128-wide
    product faster than an 8-wide one, and an exp slower than an add."""
    found = measure_ceilings(
        "cpu", "float32", 1, probes=Probes(
            gemm_side=256, stream_numel=2**22, elementwise_ops=("add", "exp"), passes=1,
            curve_widths={"gemm": (8, 128), "conv": (16,), "attention": (16,), "recurrent": (16,)},
        ),
    )  # fmt: skip
    assert found.peak_flops_per_s > 0 and found.bandwidth_bytes_per_s > 0
    assert found.gemm_rates is not None and found.gemm_rates[128] > 2 * found.gemm_rates[8]
    assert found.elementwise_rates is not None
    assert found.elementwise_rates["exp"] < found.elementwise_rates["add"]
    assert found.recurrent_rates is not None and found.recurrent_rates[16] > 0
    assert found.rate("conv") > 0 and found.rate("attention") > 0
    assert 0 < found.op_latency_s < 2 * 256**3 / found.peak_flops_per_s
    assert found.stream_bytes == 2 * 2**22 * 4


def test_the_stream_is_well_beyond_the_last_level_cache() -> None:
    assert stream_elements(4, 32 * 2**20) == 4 * 32 * 2**20 // 4  # 4x a 32 MiB cache (STREAM)
    assert stream_elements(4, 1 * 2**20) == 64 * 2**20 // 4  # at least 64 MiB
    assert stream_elements(8, None) == 64 * 2**20 // 8
    # A server's sysfs names its socket's whole L3: 4x 480 MiB would be 1.9 GiB an array.
    assert stream_elements(4, 480 * 2**20) == 512 * 2**20 // 4


def test_a_cuda_devices_stream_is_sized_by_its_own_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    class Properties:
        L2_cache_size = 50 * 2**20

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    assert machine.last_level_cache_bytes("cuda:0") == 50 * 2**20
    assert stream_elements(2, machine.last_level_cache_bytes("cuda:0")) == 200 * 2**20 // 2


def test_the_cache_location_follows_the_environment(tmp_path: Path) -> None:
    assert cache_dir({"ATTNBENCH_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert cache_dir({"XDG_CACHE_HOME": "/b"}) == Path("/b/attnbench")
    assert cache_dir({}) == Path.home() / ".cache" / "attnbench"


PASSES_ASKED: list[int] = []


def _fake(count: list[int]):  # type: ignore[no-untyped-def]
    def measure(device: str, dtype: str, threads: int, probes: Probes = DEFAULT_PROBES) -> Ceilings:
        count.append(threads)
        PASSES_ASKED.append(probes.passes)
        return measure_ceilings(device, dtype, threads,
                                probes=Probes(gemm_side=8, stream_numel=10, **SMALL),
                                timer=fake_timer([]), fault_cost=lambda: 1e-6)  # fmt: skip

    return measure


def test_ceilings_are_cached_per_thread_count_and_remeasured_on_request(tmp_path: Path) -> None:
    count: list[int] = []
    first, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1]
    again, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert cached and again == first and count == [1]  # read, not measured
    _, cached = machine_ceilings("cpu", "float32", 2, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1, 2]  # another thread count: another entry
    _, cached = machine_ceilings(
        "cpu", "float32", 1, remeasure=True, folder=tmp_path, measure=_fake(count)
    )
    assert not cached and count == [1, 2, 1]
    entry = next((tmp_path / "ceilings").glob("*-1t.json"))
    entry.write_text("{broken")
    _, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1, 2, 1, 1]  # a damaged entry is measured again
    assert read_ceilings(entry) == _  # and rewritten whole


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", "not JSON"),
        ("[1, 2]", "not a JSON object of ceilings"),
        ('{"peak_flops_per_s": -1}', "peak_flops_per_s must be a positive number (got -1)"),
        ('{"peak_flops_per_s": 1, "bandwidth_bytes_per_s": 1, "op_latency_s": 1, '
         '"page_fault_s": null}', "missing device"),
        ('{"peak_flops_per_s": true}', "peak_flops_per_s must be a positive number (got True)"),
    ],
)  # fmt: skip
def test_a_bad_ceilings_file_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "ceilings.json"
    path.write_text(content)
    with pytest.raises(AttnbenchError, match=re.escape(message)):
        read_ceilings(path)
    with pytest.raises(AttnbenchError, match=r"cannot read ceilings file .*No such file"):
        read_ceilings(tmp_path / "absent.json")


def test_a_ceilings_file_from_before_the_kernel_rates_still_reads(tmp_path: Path) -> None:
    """Files written before the convolution and attention rates were measured lack them, and
    files of the time after hold them as null: both read as the curves say, not as an
    error."""
    found = _fake([])("cpu", "float32", 1)
    path = tmp_path / "older.json"
    for single in (None, "absent"):
        older = found.to_dict()
        if single is None:
            older |= {"conv_flops_per_s": None, "attention_flops_per_s": None}
        path.write_text(json.dumps(older))
        read = read_ceilings(path)
        assert read == found
    path.write_text(json.dumps({**found.to_dict(), "conv_flops_per_s": 0}))
    with pytest.raises(AttnbenchError, match="conv_flops_per_s must be a positive number"):
        read_ceilings(path)


def test_a_products_rate_is_read_off_its_kinds_curve_at_its_width() -> None:
    """Between two measured widths the rate is interpolated in log-log; beyond the ends it is
    held; the GEMM's curve ends at the large product's peak; a kind without a curve, or a
    product of unknown width, runs at its kind's single rate."""
    found = _fake([])("cpu", "float32", 1)
    g8, g16 = found.gemm_rates[8], found.gemm_rates[16]
    assert found.rate("gemm", 8) == pytest.approx(g8) and found.rate("gemm", 2) == pytest.approx(g8)
    assert found.rate("gemm", 16) == pytest.approx(g16)
    assert found.rate("gemm", 11) == pytest.approx(g8 * (g16 / g8) ** (math.log2(11) - 3))
    # the fake's large product is 8 wide too, where the curve's own point wins
    wide = replace(found, gemm_side=64)
    assert wide.rate("gemm", 64) == pytest.approx(found.square_flops_per_s)
    assert found.rate("gemm") == found.square_flops_per_s  # the large GEMM's, not the peak
    assert found.rate("conv", 1000) == pytest.approx(found.conv_rates[4])
    assert found.rate("conv") == found.conv_rates[4]  # unknown width: the curve's widest
    # a file from before the curves: its single rates, and the large GEMM's where it has none
    data = {**found.to_dict(), "attention_rates": None, "conv_rates": None}
    older = ceilings_from({**data, "attention_flops_per_s": 3e10, "conv_flops_per_s": None})
    assert older.rate("attention", 8) == pytest.approx(3e10) and older.rate("attention") == 3e10
    assert older.rate("conv", 8) == found.square_flops_per_s
    # a file from before the square was kept apart: its peak was the square's; the peak is
    # then the fastest of it and its curves, as measured today
    before = {k: v for k, v in found.to_dict().items() if k != "square_flops_per_s"}
    before["peak_flops_per_s"] = found.square_flops_per_s
    migrated = ceilings_from(json.loads(json.dumps(before)))
    assert migrated.square_flops_per_s == found.square_flops_per_s
    assert migrated.peak_flops_per_s == pytest.approx(found.peak_flops_per_s)


def test_the_rate_curves_travel_through_a_file_and_bad_ones_are_one_clear_error(
    tmp_path: Path,
) -> None:
    found = _fake([])("cpu", "float32", 1)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(found.to_dict()))  # JSON keys are strings: "8", "16"
    assert read_ceilings(path) == found
    for curve, message in (
        ({"x": 1.0}, "gemm_rates: width 'x' is not a whole number"),
        ({"8": -1}, "gemm_rates: 8: must be a positive rate (got -1)"),
        ([1, 2], "gemm_rates must be an object of width: FLOP/s"),
    ):
        path.write_text(json.dumps({**found.to_dict(), "gemm_rates": curve}))
        with pytest.raises(AttnbenchError, match=re.escape(message)):
            read_ceilings(path)


def test_a_call_cost_may_be_zero_but_not_negative_and_an_older_file_has_none(
    tmp_path: Path,
) -> None:
    found = replace(_fake([])("cpu", "float32", 1), recurrent_call_s={32: 0.0, 128: 2e-4})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(found.to_dict()))
    assert read_ceilings(path).recurrent_call_s == {32: 0.0, 128: 2e-4}
    assert found.recurrent_call(64) == pytest.approx(1e-4)  # halfway in log2 of the width
    assert found.recurrent_call(8) == 0.0 and found.recurrent_call(512) == 2e-4  # held flat
    path.write_text(json.dumps({**found.to_dict(), "recurrent_call_s": {"32": -1e-5}}))
    message = "recurrent_call_s: 32: must be seconds, 0 or more (got -1e-05)"
    with pytest.raises(AttnbenchError, match=re.escape(message)):
        read_ceilings(path)
    older = {k: v for k, v in found.to_dict().items() if k != "recurrent_call_s"}
    path.write_text(json.dumps(older))
    assert read_ceilings(path).recurrent_call_s is None
    assert replace(found, recurrent_call_s=None).recurrent_call(64) == 0.0


def test_a_fused_kernels_call_cost_is_the_line_through_two_lengths() -> None:
    from attnbench.measure.machine.rates import line_through

    per_step, call = line_through({256: 2.0e-3, 16: 3.0e-4})  # any order
    assert per_step == pytest.approx(1.7e-3 / 240) and call == pytest.approx(3e-4 - 16 * per_step)
    # noise that leaves no room for a set-up: the long run's seconds per step, no call cost
    assert line_through({16: 1e-5, 256: 4e-4}) == (4e-4 / 256, 0.0)  # the line crosses 0
    assert line_through({16: 3e-4, 256: 2e-4}) == (2e-4 / 256, 0.0)  # a falling line


def test_a_cached_entry_without_the_fused_kernels_call_cost_is_measured_again(
    tmp_path: Path,
) -> None:
    count: list[int] = []
    first, _ = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    entry = next((tmp_path / "ceilings").glob("*-1t.json"))
    older = {k: v for k, v in first.to_dict().items() if k != "recurrent_call_s"}
    entry.write_text(json.dumps({**older, "recurrent_rates": {"32": 1e9}}))
    _, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1, 1]
    # a device with no fused LSTM has neither, and its entry stands
    entry.write_text(json.dumps({**older, "recurrent_rates": None}))
    _, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert cached and count == [1, 1]


def test_a_cached_entry_without_rate_curves_is_measured_again(tmp_path: Path) -> None:
    count: list[int] = []
    first, _ = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    entry = next((tmp_path / "ceilings").glob("*-1t.json"))
    entry.write_text(json.dumps({**first.to_dict(), "gemm_rates": None}))
    again, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1, 1] and again.gemm_rates is not None


def test_the_machine_command_prints_and_caches_the_ceilings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    count: list[int] = []
    monkeypatch.setattr(ceilings_file, "measure_ceilings", _fake(count))
    result = runner.invoke(app, ["machine", "--json", "--threads", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["square_flops_per_s"] == 2 * 8**3 / 0.02 and payload["threads"] == 1
    assert payload["cached"] is False
    table = runner.invoke(app, ["machine", "--threads", "1", "--device", "cpu"])
    assert table.exit_code == 0 and "peak FLOP/s" in table.stdout
    assert "convolution" not in table.stdout  # the curves below hold it, the widest last
    for row in ("GEMM by width", "conv by width", "attention by width", "fused LSTM by width",
                "elementwise ops"):  # fmt: skip
        assert row in table.stdout
    assert "read from the cache" in table.stderr and count == [1]
    written = tmp_path / "ceilings"
    assert read_ceilings(next(written.glob("*.json"))).threads == 1  # a file predict can read
    again = runner.invoke(app, ["machine", "--json", "--threads", "1", "--device", "cpu",
                                "--remeasure", "--passes", "3"])  # fmt: skip
    assert again.exit_code == 0 and PASSES_ASKED[-1] == 3 and count == [1, 1]
    bad = runner.invoke(app, ["machine", "--passes", "0"])
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --passes must be at least 1 (got 0)"
    bad = runner.invoke(app, ["machine", "--threads", "0"])
    assert (
        bad.exit_code == 2 and bad.stderr.strip() == "error: --threads must be at least 1 (got 0)"
    )
    bad = runner.invoke(app, ["machine", "--dtype", "float8"])
    assert bad.exit_code == 2 and "unknown dtype 'float8'; accepted: float32" in bad.stderr


def test_an_lstm_calls_flops_are_counted_and_follow_its_steps_and_width() -> None:
    from attnbench.measure.machine.rates import lstm_flops

    # 4 gates x (w x w input + w x w recurrent) products a step, 2 FLOPs a multiply-add
    assert lstm_flops(4, 16) == 16 * 4 * 2 * (2 * 4 * 4)
    assert lstm_flops(4, 32) == 2 * lstm_flops(4, 16) and lstm_flops(8, 16) == 4 * lstm_flops(4, 16)


def test_a_long_lstm_call_is_counted_at_three_lengths_and_extended_only_on_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ceilings' 256-step LSTM FLOPs come from 16, 32 and 64 traced steps where those lie on
    a line, and equal a full trace; a count that is not a line is traced in full."""
    import torch

    from attnbench.measure.counts.flops import count_flops
    from attnbench.measure.counts.ops import unfused
    from attnbench.measure.machine import rates

    monkeypatch.setattr(rates, "_LSTM_FLOPS", {})
    cell = torch.nn.LSTM(8, 8, batch_first=True).eval()
    x = torch.zeros(1, 256, 8)
    with torch.no_grad(), unfused():
        full = count_flops(lambda: cell(x))
    traced: list[int] = []
    real = rates.count_flops

    def spy(fn):  # type: ignore[no-untyped-def]
        inputs = [c.cell_contents for c in fn.__closure__]
        traced.extend(int(t.shape[1]) for t in inputs if isinstance(t, torch.Tensor))  # steps
        return real(fn)

    monkeypatch.setattr(rates, "count_flops", spy)
    with torch.no_grad():
        assert rates._lstm_flops(cell, x) == full
    assert traced == list(rates.LAW_STEPS)  # 112 steps traced, not 256
    monkeypatch.setattr(rates, "_LSTM_FLOPS", {})
    traced.clear()
    monkeypatch.setattr(rates, "count_flops", lambda fn: spy(fn) ** 2)  # no line any more
    with torch.no_grad():
        rates._lstm_flops(cell, x)
    assert traced == [*rates.LAW_STEPS, 256]


def test_a_catalogue_that_gains_an_op_reads_no_entry_measured_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Else the model would read the new op at an add's rate from an entry that lacks it.
    from attnbench.measure.machine import rates

    count: list[int] = []
    machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    _, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert cached and count == [1]
    before = ceilings_file.cache_key("cpu", "float32", 1)
    monkeypatch.setitem(rates.CATALOGUE, "erf", lambda x, y, m: torch.erf(x))
    assert ceilings_file.cache_key("cpu", "float32", 1) != before
    _, cached = machine_ceilings("cpu", "float32", 1, folder=tmp_path, measure=_fake(count))
    assert not cached and count == [1, 1]
