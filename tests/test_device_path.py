"""What the first real GPU run broke, each fixed and tested here without a GPU (tests/test_cuda.py
runs the same on one): a training step in eval mode, which cuDNN's recurrent backward refuses,
and CUDA's fused LSTM and GRU cells, which hide their work from the counters."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch
from synthetic import registry_restored, small_case
from torch import nn

from attnbench import register_layer
from attnbench.measure import case as case_module
from attnbench.measure.case import measure_case, trace_counts
from attnbench.measure.counts import structure
from attnbench.measure.step import make_step
from attnbench.measure.timing.loop import TimingPolicy

SHORT = TimingPolicy(min_block_s=1e-3, min_samples=3, budget_s=0.01, min_time_s=0.005)


class NeedsTrainingMode(nn.Module):
    """Refuses a backward pass unless in training mode, as cuDNN's RNN backward does."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        if torch.is_grad_enabled() and not self.training:
            raise RuntimeError("backward can only be called in training mode")
        return self.proj(x)  # (B, n, d)


def test_a_training_step_runs_the_layer_in_training_mode_and_a_forward_in_eval() -> None:
    with registry_restored():
        register_layer(NeedsTrainingMode, "needs-training")
        train = dataclasses.replace(small_case("needs-training", n=16, d=8), mode="train")
        assert make_step(train, 0).layer.training
        assert not make_step(dataclasses.replace(train, mode="forward"), 0).layer.training
        result = measure_case(train, policy=SHORT)
    assert result.status == "ok", result.error
    assert result.flops == 3 * 2 * (2 * 16) * 8 * 8  # forward, input and weight gradients


@pytest.mark.parametrize(
    ("fused", "counted_on"),
    [(frozenset({"_cudnn_rnn"}), ["cpu"]),
     (frozenset({"_thnn_fused_gru_cell"}), ["cpu"]),
     (frozenset({"_native_multi_head_attention"}), ["cuda:0"]),
     (frozenset(), ["cuda:0"])],
)  # fmt: skip
def test_a_fused_recurrence_in_the_timed_call_sends_the_count_to_the_cpu(
    monkeypatch: pytest.MonkeyPatch, fused: frozenset[str], counted_on: list[str]
) -> None:
    """On the H200, rnn's unfused stand-in for cuDNN read W_ih once per step (one d x d
    matrix a position over its formula, which follows the CPU's one projection), and CUDA's
    fused GRU and LSTM cells hid their gate arithmetic: a case whose timed call ran either is
    counted on the CPU (faked here: no GPU), the device not traced. Another fused path (the
    MultiheadAttention fast path) is counted on the device, through its unfused ops."""
    cpu_case = small_case("rnn", n=24, d=8, batch=1)
    real, _ = case_module._call_counts(cpu_case, None, 0)
    seen: list[str] = []

    def fake(case, step, seed, counting=None):  # type: ignore[no-untyped-def]
        seen.append(case.device)
        return real, "traced"

    monkeypatch.setattr(case_module, "_call_counts", fake)
    gpu_case = dataclasses.replace(cpu_case, device="cuda:0")
    trace_counts(gpu_case, None, 0, fused=fused)
    assert seen == counted_on


def test_the_path_of_a_case_counted_on_the_cpu_follows_the_cpu_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the H200, GRU and LSTM read path 1: the path was measured from CUDA's fused steps
    (2 a position, not the CPU's 9) mixed with the CPU's probes, which made the route look
    direct, and the per-layer probe cache kept that for the CPU recount. A device trace (faked
    with those steps) must not be what the path reads."""
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    real_counts = case_module._call_counts

    def fake(case, step, seed, counting=None):  # type: ignore[no-untyped-def]
        found, source = real_counts(dataclasses.replace(case, device="cpu"), None, seed)
        if case.device == "cpu":
            return found, source
        return dataclasses.replace(found, seq_steps=2 * case.n + 2), source

    monkeypatch.setattr(case_module, "_call_counts", fake)
    n = 64  # a probe length of the route law: the case's own steps are read there
    gpu = dataclasses.replace(small_case("gru", n=n, d=8, batch=1), device="cuda:0")
    found, _ = trace_counts(gpu, None, 0, fused=frozenset({"_thnn_fused_gru_cell"}))
    assert found.seq_steps == 9 * n + 1
    assert found.path_len == n


def test_float32_on_cuda_allows_tf32_rounding_only_where_cudnn_or_cublas_may_use_it() -> None:
    """cuDNN's recurrences round float32 through TF32 by default, so a decode step checked
    against them on a GPU is held to TF32's tolerance; with both switches off, to float32's;
    on the CPU always float32's."""
    from attnbench.devices import TF32_TOLERANCE, TOLERANCE, tolerance, within_tolerance

    cudnn, cublas = torch.backends.cudnn, torch.backends.cuda.matmul
    was = cudnn.allow_tf32, cublas.allow_tf32  # process-wide switches: put back after
    try:
        cudnn.allow_tf32, cublas.allow_tf32 = True, False
        assert tolerance("float32", "cuda:0") == TF32_TOLERANCE
        assert tolerance("float32", "cpu") == TOLERANCE["float32"]
        assert tolerance("float64", "cuda:0") == TOLERANCE["float64"]
        assert within_tolerance(7.7e-4, "float32", "cuda:1") is True  # an H200's cuDNN lstm
        assert within_tolerance(7.7e-4, "float32", "cpu") is False
        cudnn.allow_tf32 = False
        assert tolerance("float32", "cuda:0") == TOLERANCE["float32"]
        cublas.allow_tf32 = True
        assert tolerance("float32", "cuda:0") == TF32_TOLERANCE
    finally:
        cudnn.allow_tf32, cublas.allow_tf32 = was
