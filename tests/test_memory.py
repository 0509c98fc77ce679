from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnbench import build_layer
from attnbench.measure import memory
from attnbench.measure.memory import peak_bytes, peak_of_deltas


def test_peak_of_deltas_is_highest_running_total() -> None:
    assert peak_of_deltas([100, 50, -100, 20, -70]) == 150
    assert peak_of_deltas([-10, 5]) == 0
    assert peak_of_deltas([]) == 0


def test_cpu_peak_counts_memory_freed_inside_the_call() -> None:
    """RSS-style 'after minus before' sees nothing here; allocator events see the 4 MiB."""

    def fn() -> None:
        tmp = torch.ones(1024, 1024)  # 4 MiB, freed before returning
        tmp.sum()
        del tmp

    assert 4 * 2**20 <= peak_bytes(fn, "cpu") < 5 * 2**20


def _attention_peak(name: str, n: int, d: int = 32, heads: int = 4) -> int:
    layer = build_layer(name, d, heads=heads)
    x = torch.randn(1, n, d)
    with torch.no_grad():
        layer(x)  # positional table built outside the measurement
        return peak_bytes(lambda: layer(x), "cpu")


def test_cpu_peak_of_attention_matches_the_n_by_n_weights_it_materialises() -> None:
    n, heads = 512, 4
    weights_bytes = heads * n * n * 4  # one (1, h, n, n) float32 matrix
    peak = _attention_peak("attention", n, heads=heads)
    # scores, scaled scores and softmax weights: two n x n matrices are alive at once
    assert 2 * weights_bytes <= peak <= 3 * weights_bytes


def test_cpu_peak_of_attention_grows_quadratically_in_n() -> None:
    ratio = _attention_peak("attention", 512) / _attention_peak("attention", 256)
    assert 3.5 < ratio < 4.5


def test_fused_attention_does_not_hold_the_n_by_n_matrix() -> None:
    explicit = _attention_peak("attention", 512)
    fused = _attention_peak("attention-sdpa", 512)
    assert 0 < fused < explicit / 4


def test_cuda_peak_reads_allocator_stats_above_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    state = {"allocated": 1000, "peak": 1000}

    def fake_fn() -> None:
        calls.append("fn")
        state["peak"] = 1000 + 4096

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(
        torch.cuda,
        "reset_peak_memory_stats",
        lambda device=None: (calls.append("reset"), state.update(peak=state["allocated"])),
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])
    assert memory.peak_bytes(fake_fn, "cuda:0") == 4096
    assert calls == ["sync", "reset", "fn", "sync"]


def test_devices_without_allocator_stats_report_none() -> None:
    assert peak_bytes(lambda: None, "mps") is None


def test_the_memory_pass_records_the_convolution_implementation_torch_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch-1 Conv1d runs torch's reference kernel on a small input and oneDNN's on a large
    one (above about 32k input elements on this CPU build): the rate jumps there, and the
    ``backend`` column says which ran. A layer without a convolution records none, and the
    count cache keeps what was recorded."""
    from attnbench.measure.case import measure_case, memory_pass
    from attnbench.measure.counts import countcache
    from attnbench.measure.timing.loop import TimingPolicy
    from attnbench.options import build_grid

    grid = build_grid({"layers": "conv,attention", "n": [16, 2048], "d": [128], "device": "cpu"})
    cases = {(c.layer, c.n): c for c in grid.cases()}
    found = {key: memory_pass(case, 0).backends for key, case in cases.items()}
    assert found[("conv", 16)] == {"thnn_conv2d"}
    assert found[("conv", 2048)] == {"mkldnn_convolution"}
    assert found[("attention", 16)] == found[("attention", 2048)] == frozenset()
    policy = TimingPolicy(warmup_calls=1, min_samples=1, min_time_s=0.0, budget_s=1e-3)
    result = measure_case(cases[("conv", 16)], policy=policy)
    assert result.backend == "thnn_conv2d (torch's reference convolution)"
    assert result.to_row()["backend"] == result.backend  # measured: the cache is off
    profile = countcache.Profile(1, 1, frozenset(), backends=frozenset({"thnn_conv2d"}))
    countcache.CountCache(tmp_path).write_profile(cases[("conv", 16)], 0, profile)
    assert countcache.CountCache(tmp_path).read_profile(cases[("conv", 16)], 0) == profile


def test_an_allocation_failure_reads_as_a_size() -> None:
    """A new user's attention at n = 1048576 read "you tried to allocate 17592186044416
    bytes", the allocator's source position before it: the case's error says 16 TiB."""
    from attnbench.measure.memory import oom_text
    from attnbench.units import fmt_bytes

    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 17592186044416 bytes. Error code 12 (Cannot allocate "
        "memory)\nmore"
    )
    assert oom_text(cpu) == (
        "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "16 TiB. Error code 12 (Cannot allocate memory)"
    )
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0)")
    assert oom_text(cuda) == "RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0)"
    assert fmt_bytes(3 * 2**40) == "3 TiB" and fmt_bytes(2**39) == "512 GiB"
