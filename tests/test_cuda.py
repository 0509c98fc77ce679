"""The CUDA path for real: these run only where a CUDA device exists (``-m cuda`` selects them,
and everywhere else they are skipped), and exercise what the mocked tests cannot: synchronised
timing of asynchronous kernels, the caching allocator's peaks, the FLOPs of the fused attention
and cuDNN recurrent kernels, and the device's ceilings against an independent measurement.

Times are compared only as ratios, never as absolute figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from attnbench.devices import device_sync, tolerance
from attnbench.layers import BUILTIN, layer_names
from attnbench.measure.case import measure_case
from attnbench.measure.machine.probes import Probes, measure_ceilings
from attnbench.measure.memory import peak_bytes
from attnbench.measure.timing.loop import TimingPolicy, time_call
from attnbench.options import build_grid

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.xdist_group("cuda"),  # one worker: the device's memory and timers their own
]
DEVICE = "cuda:0"
SHORT = TimingPolicy(min_block_s=2e-3, min_samples=5, budget_s=0.05, min_time_s=0.02)


def case_of(layer: str, n: int, d: int, device: str = DEVICE, **options: str):  # type: ignore[no-untyped-def]
    """The one case of a grid of one layer, size and device, built as the CLI builds it."""
    values = {"layers": layer, "n": str(n), "d": str(d), "device": device, **options}
    (case,) = build_grid(values).cases()
    return case


def test_timing_waits_for_the_kernels_it_times() -> None:
    """A kernel that spins a known number of cycles: with the device's sync the time per call
    doubles when the cycles double; launches alone would read the same microseconds."""
    cycles = 2_000_000  # about 1 ms at the H100's clocks

    def spin(k: int):  # type: ignore[no-untyped-def]
        return lambda: torch.cuda._sleep(k * cycles)

    sync = device_sync(DEVICE)
    one = time_call(spin(1), SHORT, sync=sync).median_s
    two = time_call(spin(2), SHORT, sync=sync).median_s
    assert 1.7 < two / one < 2.3
    # Without the sync a host clock reads the launch alone (a block of many calls would not
    # show it: once CUDA's launch queue is full, each launch waits for a kernel to finish).
    start = time.perf_counter()
    spin(2)()
    launch = time.perf_counter() - start
    torch.cuda.synchronize()
    assert launch < 0.5 * two


def test_peak_memory_reads_the_caching_allocator_exactly() -> None:
    numel = 1 << 20
    assert peak_bytes(lambda: torch.empty(numel, device=DEVICE), DEVICE) == 4 * numel

    # A temporary freed inside the call still counts: the peak is two arrays.
    def with_temporary() -> torch.Tensor:
        scratch = torch.empty(numel, device=DEVICE)
        return scratch + 1

    assert peak_bytes(with_temporary, DEVICE) == 8 * numel


def test_fused_attention_keeps_memory_linear_where_explicit_attention_is_quadratic() -> None:
    n, d = 4096, 64
    explicit = measure_case(case_of("attention", n, d), policy=SHORT)
    fused = measure_case(case_of("attention-sdpa", n, d), policy=SHORT)
    assert explicit.status == fused.status == "ok"
    scores = 4 * n * n * 4  # heads x n x n float32 scores
    assert explicit.peak_bytes >= scores
    assert fused.peak_bytes < scores / 8


@pytest.mark.parametrize("layer", ["attention-sdpa", "rnn", "gru", "lstm"])
def test_fused_kernels_are_counted_as_on_the_cpu(layer: str) -> None:
    """Flash / memory-efficient attention and cuDNN's recurrences are single fused ops on CUDA;
    their FLOPs, steps and path length must equal the CPU's counts and the theory."""
    gpu = measure_case(case_of(layer, 128, 64), policy=SHORT)
    cpu = measure_case(case_of(layer, 128, 64, device="cpu"), policy=SHORT)
    assert gpu.status == "ok", gpu.error
    assert gpu.flops == cpu.flops > 0
    assert gpu.flops == pytest.approx(gpu.flops_analytic, rel=1e-9)
    assert gpu.seq_steps == cpu.seq_steps
    # By value too: both sides share the process's per-layer probe cache, so a route read
    # wrong on one side once made both read path 1 for GRU and LSTM.
    assert gpu.path_len == cpu.path_len == (1 if layer == "attention-sdpa" else 128)


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("layer", layer_names())
def test_every_layer_measures_on_cuda_and_counts_as_on_the_cpu(layer: str, mode: str) -> None:
    result = measure_case(case_of(layer, 128, 64, mode=mode), policy=SHORT)
    cpu = measure_case(case_of(layer, 128, 64, device="cpu", mode=mode), policy=SHORT)
    assert result.status == "ok", result.error
    assert result.timing is not None and result.timing.median_s > 0
    assert result.peak_bytes is not None and result.peak_bytes > 0
    assert (result.flops, result.elementwise) == (cpu.flops, cpu.elementwise)
    assert (result.seq_steps, result.path_len) == (cpu.seq_steps, cpu.path_len)
    if mode == "forward":  # every forward count matched its formula on the H200, rnn's bytes
        # too once cuDNN's recurrences were counted on the CPU. CUDA's memory-efficient
        # attention kernel writes no logsumexp in a call without gradients (4·b·h·n bytes
        # the CPU's flash kernel writes), but a philox seed and offset (two int64): on the
        # H200 557,072 bytes against the CPU's 559,104 at n = 128, d = 64
        fused = layer == "attention-sdpa"
        assert result.bytes == cpu.bytes - (4 * 1 * 4 * 128 - 16 if fused else 0)


@pytest.mark.parametrize("layer", BUILTIN)
def test_every_layer_decodes_on_cuda_as_on_the_cpu(layer: str) -> None:
    """--mode decode on the GPU: the state lives on it, and the step counts, holds and
    decodes as on the CPU."""
    result = measure_case(case_of(layer, 1024, 64, mode="decode"), policy=SHORT)
    cpu = measure_case(case_of(layer, 1024, 64, device="cpu", mode="decode"), policy=SHORT)
    assert result.status == "ok", result.error
    assert (result.flops, result.state_bytes) == (cpu.flops, cpu.state_bytes)
    assert result.state_check == "ok" and result.decode_check is not None
    # cuDNN's recurrences round through TF32 by default: 3.7e-4 to 7.7e-4 on an H200
    assert result.decode_check <= tolerance("float32", DEVICE)


def test_bfloat16_runs_on_cuda() -> None:
    result = measure_case(case_of("attention", 256, 64, dtype="bfloat16"), policy=SHORT)
    assert result.status == "ok", result.error
    assert result.flops == pytest.approx(result.flops_analytic, rel=1e-9)


def _event_seconds(fn, repeats: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of ``fn`` between CUDA events, one call at a time: an independent clock."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ceilings_agree_with_an_independent_gemm_and_copy(dtype: str) -> None:
    found = measure_ceilings(DEVICE, dtype, probes=Probes(passes=1))
    torch_dtype = getattr(torch, dtype)
    side = 8192
    a = torch.randn(side, side, device=DEVICE).to(torch_dtype)  # (s, s)
    b = torch.randn(side, side, device=DEVICE).to(torch_dtype)  # (s, s)
    gemm = 2 * side**3 / _event_seconds(lambda: a @ b)
    src = torch.randn(1 << 28, device=DEVICE).to(torch_dtype)  # 256 Mi elements
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * src.element_size() / _event_seconds(lambda: dst.copy_(src))
    assert found.peak_flops_per_s == pytest.approx(gemm, rel=0.25)
    assert found.bandwidth_bytes_per_s == pytest.approx(copy, rel=0.25)
    # One tiny op, as launched back to back: within 2x of 2000 of them between two syncs on
    # the host clock (not a sync's round trip per op, which reads several times more).
    x = torch.ones(1, device=DEVICE, dtype=torch_dtype)
    out = torch.empty_like(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(2000):
        torch.add(x, x, out=out)
    torch.cuda.synchronize()
    launch = (time.perf_counter() - start) / 2000
    assert 0.5 * launch <= found.op_latency_s <= 2 * launch
    assert found.page_fault_s is None


def test_ab_a_against_a_on_cuda_reports_no_regression(tmp_path) -> None:  # type: ignore[no-untyped-def]
    command = [sys.executable, "-m", "attnbench", "ab", "--device", "cuda", "--layers",
               "conv,attention", "--n", "256,1024", "--d", "64", "--time-budget", "0.1",
               "--json", "--quiet", "--out", str(tmp_path / "ab")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = json.loads(done.stdout)
    assert not [c for c in verdicts["cases"] if c["verdict"] == "regression"]


@pytest.mark.parametrize(("d", "explicit"), [(64, False), (48, True)])
def test_the_cuda_fast_path_writes_scores_where_the_count_says(d: int, explicit: bool) -> None:
    # ``ops.scores_explicit`` reads torch's CUDA source: head width 16 goes to a fused kernel,
    # 12 to bmm and a softmax. The profiler says what this torch really ran.
    from torch.profiler import profile

    from attnbench.measure.counts.ops import scores_explicit

    attn = torch.nn.MultiheadAttention(d, 4, batch_first=True).to(DEVICE).eval()
    x = torch.randn(1, 64, d, device=DEVICE)  # (B, n, d)
    with torch.no_grad():
        attn(x, x, x, need_weights=False)
        with profile() as prof:
            attn(x, x, x, need_weights=False)
            torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    assert "aten::_native_multi_head_attention" in names
    assert ("aten::bmm" in names) is explicit  # QK^T and AV as products, not a fused kernel
    assert any("softmax" in name for name in names) is explicit
    assert scores_explicit("cuda", d // 4) is explicit


def test_the_kernels_share_is_the_devices_busy_time() -> None:
    """A kernel that spins about 2 ms reads a share near 1 and its kernels' time near the call;
    the same spin split into 200 launches of a tiny add reads launches, not kernels. Read from
    graph replays (``device_split``), and from the profiler where it sees the device's kernels
    (not under gVisor, whose H200 recorded none)."""
    from attnbench.measure.timing.gputimers import device_split
    from attnbench.measure.timing.split import kernel_split

    sync = device_sync(DEVICE)
    spin = lambda: torch.cuda._sleep(4_000_000)  # noqa: E731
    spin_s = time_call(spin, SHORT, sync=sync).median_s
    busy = device_split(spin, DEVICE, spin_s, sync=sync)
    assert "graph replays" in busy.method
    assert busy.share > 0.9 and busy.kernel_s == pytest.approx(spin_s, rel=0.1)
    launches = _launches()
    call = time_call(launches, SHORT, sync=sync).median_s
    assert device_split(launches, DEVICE, call, sync=sync).share < 0.5
    try:
        profiled = kernel_split(spin, DEVICE, spin_s, sync=sync)
    except ValueError as exc:  # no CUPTI: the profiler records no kernel
        assert "no kernel on the device" in str(exc)
    else:
        assert profiled.share > 0.9


def test_a_measured_case_splits_its_time_and_never_reads_more_kernel_than_time() -> None:
    for layer, n in (("attention-sdpa", 4096), ("conv", 64)):
        result = measure_case(case_of(layer, n, 128), policy=SHORT)
        assert result.status == "ok", result.error
        assert 0 <= result.kernel_share <= 1 and "graph replays" in result.kernel_method
        assert result.kernel_time_s <= result.timing.median_s


def _launches(count: int = 200):  # type: ignore[no-untyped-def]
    """A call of ``count`` tiny adds: the host's launches, not the kernels, are its time."""
    x = torch.ones(4, device=DEVICE)

    def call() -> None:
        for _ in range(count):
            x.add_(1.0)

    return call


def test_the_kernels_timer_leaves_the_launches_out_and_keeps_the_kernels() -> None:
    from attnbench.measure.timing.gputimers import time_step

    sync = device_sync(DEVICE)
    kernels = TimingPolicy(**{**SHORT.__dict__, "timer": "kernels"})
    launches = _launches()
    eager = time_call(launches, SHORT, sync=sync).median_s
    replayed = time_step(launches, kernels, DEVICE, sync=sync)
    assert replayed.method.startswith("kernels: CUDA graph replays")
    assert replayed.stats.median_s < 0.5 * eager  # 200 launches vanish in a replay
    spin = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731  # a kernel of about 1 ms
    assert time_step(spin, kernels, DEVICE, sync=sync).stats.median_s == pytest.approx(
        time_call(spin, SHORT, sync=sync).median_s, rel=0.1
    )


def test_the_cold_timer_holds_the_stream_and_flushes_the_l2() -> None:
    from attnbench.measure.timing.gputimers import cuda_timers, time_step

    sync = device_sync(DEVICE)
    cold = TimingPolicy(**{**SHORT.__dict__, "timer": "cold"})
    launches = _launches()
    found = time_step(launches, cold, DEVICE, sync=sync)
    assert "flushed" in found.method
    assert found.stats.median_s < 0.5 * time_call(launches, SHORT, sync=sync).median_s
    # a read of a buffer that fits the L2 is slower with the cache flushed before it
    x = torch.randn(4 * 2**20, device=DEVICE)  # 16 MB, well inside an H100's 50 MB L2
    read = lambda: x.sum()  # noqa: E731
    timers = cuda_timers(DEVICE)
    hot = sorted(timers.event_time(read, 1e-4, False) for _ in range(21))[10]
    flushed = sorted(timers.event_time(read, 1e-4, True) for _ in range(21))[10]
    assert flushed > 1.1 * hot


@pytest.mark.parametrize("layer", layer_names())
def test_every_layer_is_captured_into_a_graph(layer: str) -> None:
    policy = TimingPolicy(**{**SHORT.__dict__, "timer": "kernels"})
    result = measure_case(case_of(layer, 256, 64), policy=policy)
    assert result.status == "ok", result.error
    assert result.time_method.startswith("kernels: CUDA graph replays"), result.time_method
    assert result.kernel_time_s <= result.timing.median_s * (1 + 1e-9)


def test_the_sm_clock_is_on_record_where_nvml_is() -> None:
    pytest.importorskip("pynvml")
    result = measure_case(case_of("attention-sdpa", 1024, 128), policy=SHORT)
    assert result.sm_clock_max_mhz and result.sm_clock_max_mhz > 500
    assert result.sm_clock_mhz and 100 < result.sm_clock_mhz <= result.sm_clock_max_mhz * 1.01
    assert result.timing.clocks_mhz and len(result.timing.clocks_mhz) == result.timing.count
    assert 0 <= result.throttled_share <= 1


def test_energy_is_read_from_the_counter_and_grows_with_the_work() -> None:
    """--energy on a GPU: joules per call from NVML's counter, a draw a card can have, and a
    call of four times the work (attention at 4n, a quarter of the calls) drawing more."""
    pytest.importorskip("pynvml")
    policy = TimingPolicy(**{**SHORT.__dict__, "energy_s": 0.3})
    small = measure_case(case_of("attention", 1024, 128), policy=policy)
    large = measure_case(case_of("attention", 4096, 128), policy=policy)
    for result in (small, large):
        assert result.status == "ok", result.error
        assert result.energy_method.startswith("NVML energy counter"), result.energy_method
        assert result.energy_j is not None and result.energy_j > 0
        assert result.power_w is not None and 30 < result.power_w < 1500
    assert large.energy_j > 4 * small.energy_j  # type: ignore[operator]  # n² work: 16x
