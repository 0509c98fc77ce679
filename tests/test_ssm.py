"""The selective SSM two ways: the same function, n sequential steps against log n."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbench import build_layer
from attnbench.fits import loglog_exponent
from attnbench.layers.registry import entry
from attnbench.layers.ssm import associative_scan, levels, sequential_scan
from attnbench.measure.counts.structure import path_length, traced_steps


def _pair(d: int, state: int, seed: int = 3) -> tuple[torch.nn.Module, torch.nn.Module]:
    step = build_layer("ssm", d, seed=seed, state=state).double()
    scan = build_layer("ssm-scan", d, seed=seed, state=state).double()
    return step, scan


def test_the_same_seed_gives_both_the_same_weights() -> None:
    step, scan = _pair(8, 4)
    for (name, a), (other, b) in zip(
        step.state_dict().items(), scan.state_dict().items(), strict=True
    ):
        assert name == other
        assert torch.equal(a, b)


@pytest.mark.parametrize("n", [1, 2, 3, 17, 256, 1024])
def test_the_scan_computes_the_recurrence_to_float64_rounding(n: int) -> None:
    step, scan = _pair(16, 8)
    x = torch.randn(2, n, 16, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    with torch.no_grad():
        expected, got = step(x), scan(x)  # (2, n, 16) each
    assert got.shape == (2, n, 16)
    assert torch.allclose(got, expected, rtol=0, atol=1e-10)


def test_the_scans_agree_on_their_own() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(1, 37, 3, 2, generator=gen, dtype=torch.float64)  # decays in (0, 1)
    b = torch.randn(1, 37, 3, 2, generator=gen, dtype=torch.float64)
    assert torch.allclose(associative_scan(a, b), sequential_scan(a, b), rtol=0, atol=1e-12)


def test_levels_is_the_ceiling_of_log2() -> None:
    assert [levels(n) for n in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [0, 1, 2, 2, 3, 3, 4, 10, 11]


def test_the_traced_steps_follow_each_law_exactly() -> None:
    """ssm: a fixed number of steps per position; ssm-scan: a fixed number per level."""
    ns = [2, 3, 5, 16, 33, 100, 512]
    step = {n: traced_steps(build_layer("ssm", 8, state=4), n, 8) for n in ns}
    scan = {n: traced_steps(build_layer("ssm-scan", 8, state=4), n, 8) for n in ns}
    per_position = step[3] - step[2]
    per_level = scan[3] - scan[2]
    assert per_position > 0 and per_level > 0
    assert all(step[n] - step[2] == per_position * (n - 2) for n in ns)
    assert all(scan[n] - scan[2] == per_level * (levels(n) - 1) for n in ns)
    law = entry("ssm-scan").theory.sequential_law  # type: ignore[union-attr]
    assert all(law({"n": n}) == levels(n) for n in ns)


@pytest.mark.slow
def test_the_scans_steps_grow_as_log_n_and_the_recurrences_as_n() -> None:
    """The issue's bar: fitted exponent of the scan's steps in n at most 0.3 over 64..4096."""
    ns = [64, 256, 1024, 4096]
    scan = [traced_steps(build_layer("ssm-scan", 8, state=4), n, 8) for n in ns]
    step = [traced_steps(build_layer("ssm", 8, state=4), n, 8) for n in ns]
    assert loglog_exponent(ns, scan).slope <= 0.3  # type: ignore[union-attr]
    assert loglog_exponent(ns, step).slope == pytest.approx(1.0, abs=0.02)  # type: ignore[union-attr]


@pytest.mark.parametrize("n", [8, 20, 64])
def test_path_length_is_n_for_the_recurrence_and_the_levels_for_the_scan(n: int) -> None:
    """Both patterns are full lower-triangular in one application; the route differs: one
    state update per position crossed, or every level of the scan (README, path_len)."""
    step = path_length(lambda _: build_layer("ssm", 8, state=4), n, 8)
    scan = path_length(lambda _: build_layer("ssm-scan", 8, state=4), n, 8)
    assert (step.value, step.method) == (n, "measured")
    assert (scan.value, scan.method) == (math.ceil(math.log2(n)), "measured")


def test_path_length_of_the_scan_past_the_measured_range_still_comes_from_its_trace() -> None:
    scan = path_length(lambda _: build_layer("ssm-scan", 8, state=4), 1000, 8)
    assert (scan.value, scan.method) == (10, "measured")


@pytest.mark.parametrize("layer", ["attention", "attention-sdpa", "attention-linear"])
def test_causal_attention_is_one_sided_and_still_one_step(layer: str) -> None:
    from attnbench.measure.counts.structure import dependency_pattern

    module = build_layer(layer, 8, heads=2, causal=1)
    pattern = dependency_pattern(module, 12, 8)
    assert np.array_equal(pattern, np.tril(np.ones((12, 12), dtype=bool)))
    assert path_length(lambda _: build_layer(layer, 8, heads=2, causal=1), 12, 8).value == 1


def test_causal_local_attention_needs_as_many_hops_as_the_two_sided_one() -> None:
    """A one-sided band of r still reaches r positions back per application."""
    for causal in (0, 1):
        found = path_length(
            lambda _, c=causal: build_layer("attention-local", 8, heads=2, window=4, causal=c),
            21, 8, scale=4,
        )  # fmt: skip
        assert found.value == 5  # ⌈20 / 4⌉


def test_causal_attention_ignores_the_future() -> None:
    module = build_layer("attention", 8, heads=2, causal=1)
    x = torch.randn(1, 10, 8)
    changed = x.clone()
    changed[:, 6:] += 1.0  # only positions 6..9
    with torch.no_grad():
        before, after = module(x), module(changed)  # (1, 10, 8) each
    assert torch.allclose(before[:, :6], after[:, :6])
    assert not torch.allclose(before[:, 6:], after[:, 6:])


def test_causal_fused_and_explicit_attention_agree() -> None:
    explicit = build_layer("attention", 16, seed=2, causal=1)
    fused = build_layer("attention-sdpa", 16, seed=2, causal=1)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        assert torch.allclose(explicit(x), fused(x), atol=1e-5)


def test_causal_local_attention_with_a_window_past_n_is_causal_attention() -> None:
    local = build_layer("attention-local", 16, seed=4, window=12, causal=1)
    full = build_layer("attention", 16, seed=4, causal=1)
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        assert torch.allclose(local(x), full(x), atol=1e-5)
