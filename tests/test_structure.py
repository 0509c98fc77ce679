"""Sequential steps and maximum path length follow the table's laws, measured from the layers."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnbench import build_layer
from attnbench.layers.dilated import dilated_depth
from attnbench.measure.counts import structure
from attnbench.measure.counts.chains import ChainTracer, sequential_steps
from attnbench.measure.counts.structure import (
    PATH_MEASURE_MAX,
    LayerBuilder,
    dependency_pattern,
    path_from_pattern,
    path_length,
    probe_lengths,
    route_of,
)

D = 8


def _builder(name: str, **options: int):  # type: ignore[no-untyped-def]
    def build(n: int) -> nn.Module:
        return build_layer(name, D, n=n, heads=2, **options)

    return LayerBuilder(build, (name, tuple(sorted(options.items()))))


def _seq(name: str, n: int, **options: int) -> int:
    layer = _builder(name, **options)(n)
    x = torch.randn(1, n, D)
    with torch.no_grad():
        layer(x)  # lazy set-up (the positional table) stays out, as in a sweep
    return sequential_steps(lambda: layer(x))


def _path(name: str, n: int, **options: int) -> int | None:
    scale = max(options.get("k", 0), options.get("window", 0))
    return path_length(_builder(name, **options), n, D, scale=scale).value


# ----------------------------------------------------------------------------- sequential steps


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_recurrent_steps_grow_linearly_in_n(name: str) -> None:
    steps = {n: _seq(name, n) for n in (8, 16, 32, 64)}
    per_step = (steps[16] - steps[8]) / 8
    assert per_step >= 1
    for n in (32, 64):  # exactly affine: the same ops per recurrence step
        assert steps[n] == steps[8] + per_step * (n - 8)
    assert steps[64] / steps[32] == pytest.approx(2, rel=0.05)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("conv", {"k": 3}),
        ("attention", {}),
        ("attention-sdpa", {}),
        ("attention-local", {"window": 4}),
    ],
)
def test_parallel_layers_take_the_same_steps_at_every_n(name: str, options: dict) -> None:
    steps = {_seq(name, n, **options) for n in (8, 64, 256)}
    assert len(steps) == 1, steps


def test_a_view_or_a_rename_of_memory_adds_no_step() -> None:
    """A bias-free nn.Linear or a matmul on a (B, n, d) input runs view -> mm -> _unsafe_view:
    one op that moves data, so one step (the tracer had counted the closing rename as a
    second)."""
    linear = nn.Linear(D, D, bias=False)
    x, w = torch.randn(2, 5, D), torch.randn(D, D)
    assert sequential_steps(lambda: x @ w) == 1
    assert sequential_steps(lambda: linear(x)) == 1
    assert sequential_steps(lambda: linear(x).reshape(2, 5 * D).view(10, D).t()) == 1
    assert sequential_steps(lambda: linear(linear(x)).relu()) == 3


def test_an_elman_rnn_takes_three_steps_a_position_and_its_stack() -> None:
    """Hand count of the unfused tanh RNN: per position h @ W_hh (addmm), + the input's
    projection (add_), tanh; the input projection runs beside the first, the stack closes."""
    assert [_seq("rnn", n) for n in (1, 2, 8)] == [3 * n + 1 for n in (1, 2, 8)]


@pytest.mark.parametrize("k", [2, 3])
def test_dilated_stack_steps_follow_its_depth(k: int) -> None:
    per_layer = {_seq("conv-dilated", n, k=k) / dilated_depth(n, k) for n in (8, 64, 512)}
    assert len(per_layer) == 1  # a fixed number of ops per layer, L = ceil(log_k n) layers
    assert _seq("conv-dilated", 512, k=k) > _seq("conv-dilated", 8, k=k)


def test_fused_lstm_counts_the_same_steps_as_an_unfused_loop() -> None:
    lstm = nn.LSTM(D, D, batch_first=True)
    cell = nn.LSTMCell(D, D)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(lstm, f"{name}_l0"))

    def unrolled(x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        h = c = torch.zeros(x.shape[0], D)
        out = []
        for t in range(x.shape[1]):
            h, c = cell(x[:, t], (h, c))
            out.append(h)
        return torch.stack(out, 1)

    for n in (8, 32):
        x = torch.randn(1, n, D)
        fused = sequential_steps(lambda x=x: lstm(x)[0])
        assert fused == sequential_steps(lambda x=x: unrolled(x))
        naive = ChainTracer()  # the same trace with the fused kernel left on sees one op
        with torch.no_grad(), naive:
            out = lstm(x)[0]
        assert naive.depth.get(out) == 1 < fused


# ----------------------------------------------------------------------------- path length


@pytest.mark.parametrize("n", [1, 8, 33])
@pytest.mark.parametrize("k", [3, 5, 7])
def test_conv_path_is_exactly_ceil_n_minus_1_over_half_kernel(n: int, k: int) -> None:
    assert _path("conv", n, k=k) == max(1, math.ceil((n - 1) / ((k - 1) // 2)))


@pytest.mark.parametrize("n", [8, 17, 40])
@pytest.mark.parametrize("window", [2, 4])
def test_local_attention_path_is_ceil_n_minus_1_over_r(n: int, window: int) -> None:
    assert _path("attention-local", n, window=window) == math.ceil((n - 1) / window)


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_recurrent_path_is_n(name: str) -> None:
    assert [_path(name, n) for n in (1, 8, 40)] == [1, 8, 40]


@pytest.mark.parametrize("name", ["attention", "attention-sdpa"])
def test_attention_path_is_one(name: str) -> None:
    assert [_path(name, n) for n in (2, 16, 48)] == [1, 1, 1]


@pytest.mark.parametrize("k", [2, 3])
def test_dilated_path_is_its_depth_log_k_n(k: int) -> None:
    # 16 and 32: lengths whose probe steps happen to grow by a constant per doubling, as a
    # scan's do; the stack is still counted stage by stage.
    for n in (4, 9, 16, 27, 32, 64):
        assert _path("conv-dilated", n, k=k) == math.ceil(math.log(n) / math.log(k) - 1e-9)


def test_the_pattern_is_what_the_layer_computes() -> None:
    conv = build_layer("conv", D, k=3)
    pattern = dependency_pattern(conv, 6, D)
    offsets = np.subtract.outer(np.arange(6), np.arange(6))
    assert np.array_equal(pattern, np.abs(offsets) <= 1)
    rnn = build_layer("rnn", D)
    assert np.array_equal(dependency_pattern(rnn, 6, D), offsets >= 0)  # causal, all earlier


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("conv", {"k": 3}),
        ("conv", {"k": 5}),
        ("attention-local", {"window": 4}),
        ("conv-dilated", {"k": 3}),
        ("lstm", {}),
        ("attention", {}),
        ("attention", {"causal": 1}),
        ("attention-local", {"window": 4, "causal": 1}),
        ("ssm", {"state": 2}),
    ],
)
def test_extended_values_equal_a_direct_measurement(name: str, options: dict) -> None:
    n = 2 * PATH_MEASURE_MAX + 3  # beyond direct measurement, and not a probe length
    scale = options.get("k", options.get("window", 0))
    build = _builder(name, **options)
    result = path_length(build, n, D, scale=scale)
    assert result.method.startswith("extended")
    layer = build(n)
    route = route_of(build, D, probe_lengths(scale))
    assert result.value == path_from_pattern(layer, dependency_pattern(layer, n, D), D, route)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("rnn", "recurrence"), ("ssm", "recurrence"), ("ssm-scan", "scan"), ("attention", "direct"),
     ("conv", "direct")],
)  # fmt: skip
def test_the_route_inside_one_application_is_read_from_the_trace(name: str, kind: str) -> None:
    assert route_of(_builder(name), D, probe_lengths(0)).kind == kind


class GlobalToken(nn.Module):
    """Every output sees position 0 and its neighbours: no band, so nothing may be extended."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        return self.conv(x.transpose(1, 2)).transpose(1, 2) + x[:, :1]


def longest_route(n: int, depends: Callable[[int, int], bool]) -> int:
    """By breadth-first search: the most mixing steps on the shortest route from an input
    position j to an output i reached from it (``depends(i, k)``: y_i reads x_k, one step)."""
    reads = [[i for i in range(n) if depends(i, k)] for k in range(n)]
    most = 0
    for j in range(n):
        reached: dict[int, int] = {}
        frontier, step = [j], 0
        while frontier:
            step += 1
            nxt = [i for k in frontier for i in reads[k] if i not in reached]
            reached.update(dict.fromkeys(nxt, step))
            frontier = list(dict.fromkeys(nxt))
        most = max(most, *reached.values())
    return most


def test_no_law_no_extension_but_a_measurement_at_n() -> None:
    """No band or block law holds at the probes: nothing is extended, and the pattern is
    measured at n itself, where it fits."""

    def build(n: int) -> nn.Module:
        torch.manual_seed(0)
        return GlobalToken(D)

    assert path_length(build, 40, D).method == "measured"
    far = path_length(build, 200, D)
    assert far.method == "measured"
    assert far.value == longest_route(200, lambda i, j: abs(i - j) <= 1 or j == 0)


class MultiScale(nn.Module):
    """Kernel 3 at dilations 1, 2 and 4, summed: offsets 0, ±1, ±2, ±4, a band with gaps (a
    researcher's multi-scale convolution read "none" past n = 64, even with --full-trace)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(d, d, 3, padding=r, dilation=r, groups=d) for r in (1, 2, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        h = x.transpose(1, 2)  # (B, d, n)
        return sum(conv(h) for conv in self.convs).transpose(1, 2)  # type: ignore[union-attr]


def test_a_band_with_gaps_is_measured_at_n() -> None:
    def build(n: int) -> nn.Module:
        torch.manual_seed(0)
        return MultiScale(D)

    found = path_length(build, 256, D)
    assert found.method == "measured"
    assert found.value == longest_route(256, lambda i, j: abs(i - j) in (0, 1, 2, 4)) == 65


class BlockedAttention(nn.Module):
    """Attention whose query block (of ``width``) sees the key blocks ``back`` before it and
    ``ahead`` after it: local attention as blocked kernels compute it, written out here."""

    def __init__(self, d: int, width: int, back: int, ahead: int) -> None:
        super().__init__()
        self.width, self.back, self.ahead = width, back, ahead
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, n, d)
        block = torch.arange(x.shape[1]) // self.width  # (n,)
        ahead = block[None, :] - block[:, None]  # (n, n): key block minus query block
        allowed = (ahead >= -self.back) & (ahead <= self.ahead)
        scores = (q @ k.transpose(1, 2)).masked_fill(~allowed, float("-inf"))  # (B, n, n)
        return scores.softmax(-1) @ v


@pytest.mark.parametrize(("width", "back", "ahead"), [(16, 1, 1), (8, 2, 0), (8, 1, 3)])
def test_blocked_attention_gets_a_path_at_every_n_equal_to_a_count_by_hand(
    width: int, back: int, ahead: int
) -> None:
    def build(n: int) -> nn.Module:
        torch.manual_seed(0)
        return BlockedAttention(D, width, back, ahead)

    keyed = LayerBuilder(build, ("blocked", width, back, ahead))
    for n in (40, 64, 100, 131, 256, 1000):
        blocks = math.ceil(n / width)
        hand = max(1, *(math.ceil((blocks - 1) / r) for r in (back, ahead) if r))
        result = path_length(keyed, n, D)
        assert result.value == hand, (n, result.method)
        expected = "measured" if n <= PATH_MEASURE_MAX else f"extended: blocks of {width}"
        assert result.method.startswith(expected)


def patterns_taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths each dependency pattern is taken at from now on (a Jacobian each)."""
    taken: list[int] = []
    real = structure.dependency_pattern

    def counting(module: nn.Module, n: int, d: int, **kw: int) -> np.ndarray:
        taken.append(n)
        return real(module, n, d, **kw)

    monkeypatch.setattr(structure, "dependency_pattern", counting)
    return taken


def test_a_probe_lengths_jacobian_is_taken_once_for_every_case_that_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case at n = 128 (a probe length of a window-16 layer) and the longer cases that probe
    n = 32, 64, 128 share each length's dependency pattern."""
    from attnbench.measure.counts import structure

    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    taken = patterns_taken(monkeypatch)

    def build(n: int) -> nn.Module:
        return build_layer("attention-local", 8, heads=2, window=16, n=n)

    keyed = LayerBuilder(build, ("attention-local", "w16", 0))
    values = [structure.path_length(keyed, n, 8, scale=16).value for n in (128, 256, 512)]
    assert values == [8, 16, 32]  # ⌈(n - 1) / 16⌉ hops of a band of 16
    assert sorted(taken) == [32, 64, 128]


def test_a_scan_reads_its_levels_from_the_steps_the_case_traced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A case's census traced its steps at n already: given them, the scan's path takes no
    trace at n of its own, and reads the same levels; steps off the scan's law give no value."""
    from attnbench.measure.counts import structure

    build = _builder("ssm-scan")
    alone = path_length(build, 128, D)
    traced: list[int] = []
    real = structure.traced_steps
    monkeypatch.setattr(
        structure, "traced_steps", lambda m, n, d: traced.append(n) or real(m, n, d)
    )
    # the route's probes traced afresh
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    given = path_length(build, 128, D, steps=real(build(128), 128, D))
    assert given == alone and given.value == 7  # ⌈log₂ 128⌉ levels
    assert 128 not in traced  # only the probes' traces, for the route
    off = path_length(build, 128, D, steps=real(build(128), 128, D) + 1)
    assert off.value is None and off.method.startswith("none")


def test_a_route_probed_at_the_cases_length_reads_the_steps_the_case_traced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a probe length the case's own census steps stand in for the route's trace there: the
    same route and path, one trace fewer; steps that leave the recurrence's law change it."""
    from attnbench.measure.counts import structure

    build = _builder("gru")
    real = structure.traced_steps
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    alone = path_length(build, 64, D)
    traced: list[int] = []
    monkeypatch.setattr(
        structure, "traced_steps", lambda m, n, d: traced.append(n) or real(m, n, d)
    )
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    steps = real(build(64), 64, D)
    given = path_length(build, 64, D, steps=steps)
    assert given == alone and given.value == 64
    assert traced == [16, 32]  # 64 read from the case's steps
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    assert route_of(build, D, (16, 32, 64), {64: steps + 1}).kind != "recurrence"


@pytest.mark.parametrize(
    "name", ["conv", "conv-dilated", "attention", "attention-sdpa", "attention-local",
             "attention-linear"],
)  # fmt: skip
def test_a_direct_route_reads_the_same_pattern_in_float32(name: str) -> None:
    """Half the time, the same non-zeros: a direct route multiplies few derivatives."""
    build = _builder(name, k=3, window=4)
    for n in probe_lengths(4):
        layer = build(n)
        wide = dependency_pattern(layer, n, D)
        assert np.array_equal(dependency_pattern(layer, n, D, dtype=torch.float32), wide)


def test_a_route_chooses_the_dtype_of_its_jacobians(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.measure.counts import structure

    seen: dict[str, set[torch.dtype]] = {}
    real = structure.dependency_pattern
    # no pattern read from an earlier test
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    for name in ("attention", "rnn"):
        found: set[torch.dtype] = set()

        def spy(*args, found=found, **kwargs):  # type: ignore[no-untyped-def]
            found.add(kwargs.get("dtype", torch.float64))
            return real(*args, **kwargs)

        monkeypatch.setattr(structure, "dependency_pattern", spy)
        assert path_length(_builder(name), 48, D).value is not None
        seen[name] = found
    assert seen == {"attention": {torch.float32}, "rnn": {torch.float64}}


def test_a_pattern_reads_the_module_it_is_given_even_one_that_reads_as_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The path code hands the layer it built to the pattern: a module that is falsy (an empty
    container's ``__len__``) is still that layer, not a reason to build another."""
    from attnbench.measure.counts import structure

    class Falsy(nn.Module):
        def __len__(self) -> int:
            return 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d)
            return x.cumsum(dim=1)

    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    builds: list[int] = []

    def build(n: int) -> nn.Module:
        builds.append(n)
        return Falsy()

    keyed = LayerBuilder(build, ("falsy-test",))
    pattern = structure._pattern_of(keyed, 8, 2, structure.Route("direct"), Falsy())
    assert builds == [] and pattern.tolist() == np.tril(np.ones((8, 8), dtype=bool)).tolist()


@pytest.mark.parametrize(
    "name", ["conv", "conv-dilated", "rnn", "gru", "lstm", "attention", "attention-sdpa",
             "attention-local", "attention-linear", "ssm", "ssm-scan"],
)  # fmt: skip
def test_the_batched_backward_equals_torchs_own(name: str) -> None:
    """``batched_vjp`` (vmap over the engine's backward, no sympy) gives exactly the gradients
    ``torch.autograd.grad(..., is_grads_batched=True)`` does, and so the same pattern."""
    from attnbench.measure.counts.ops import unfused
    from attnbench.measure.counts.structure import batched_vjp

    n = 12
    layer = _builder(name, k=3, window=2)(n).double()
    x = torch.randn(1, n, D, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(n, 1, n, D, dtype=torch.float64)  # (n_out, 1, n, D)
    with unfused():
        y = layer(x)  # (1, n, D)
        (public,) = torch.autograd.grad(y, x, probe, is_grads_batched=True, retain_graph=True)
        ours = batched_vjp(y, x, probe)
    assert torch.equal(ours, public)


def test_the_batched_backward_falls_back_on_torchs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose private engine call refuses these arguments gets the public function."""
    import torch.autograd.graph as graph

    from attnbench.measure.counts.structure import batched_vjp

    def changed(*args: object, **kwargs: object) -> None:
        raise TypeError("run_backward(): incompatible function arguments")

    layer = _builder("rnn")(6).double()
    x = torch.randn(1, 6, D, dtype=torch.float64, requires_grad=True)
    y = layer(x)  # (1, 6, D)
    probe = torch.randn(6, 1, 6, D, dtype=torch.float64)  # (6, 1, 6, D)
    (public,) = torch.autograd.grad(y, x, probe, is_grads_batched=True, retain_graph=True)
    monkeypatch.setattr(graph, "_engine_run_backward", changed)
    assert torch.equal(batched_vjp(y, x, probe), public)


@pytest.mark.slow
def test_a_path_measurement_leaves_sympy_unimported() -> None:
    """The reason for ``batched_vjp``: torch's public batched gradient imports sympy (0.35 s)."""
    import subprocess
    import sys

    code = (
        "import sys; from attnbench import build_layer; "
        "from attnbench.measure.counts.structure import dependency_pattern; "
        "dependency_pattern(build_layer('rnn', 8, n=16), 16, 8); "
        "print('sympy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


class Blocked(nn.Module):
    """Attention inside blocks of 32, each block also seeing its neighbours: a length that is
    not a multiple of 32 is refused, as a windowed layer without padding refuses it."""

    def __init__(self, d: int, block: int = 32) -> None:
        super().__init__()
        self.block, self.mix = block, nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d)
        b, n, d = x.shape
        if n % self.block:
            raise ValueError(f"n={n} is not a multiple of {self.block}")
        blocks = x.view(b, n // self.block, self.block, d).mean(dim=2)  # (B, n/block, d)
        padded = nn.functional.pad(blocks, (0, 0, 1, 1))  # (B, n/block + 2, d)
        near = padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]  # a block and its neighbours
        return self.mix(x + near.repeat_interleave(self.block, dim=1))  # (B, n, d)


def test_probes_a_layer_refuses_are_taken_at_the_shortest_lengths_it_accepts() -> None:
    """The usual probes (16, 32, 64) are refused; the shortest doubling lengths the layer
    accepts come first, so its law is proven where it is cheap and extended to n."""
    assert structure.fallback_probes(1024)[:3] == [(32, 64, 128), (64, 128, 256), (128, 256, 512)]
    assert structure.fallback_probes(96) == [(24, 48, 96), (48, 96, 192), (96, 192, 384)]
    found = path_length(lambda n: Blocked(D), 1024, D)
    assert found.value == 31  # 32 blocks, a dependency moves one block an application
    assert found.method.startswith("extended: blocks of 32") and "n=32..128" in found.method


def test_a_pattern_that_would_not_fit_is_stated_not_measured_and_the_rest_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its first positions, under the allocator's watch, take more than the pattern may: the
    path is not measured, and says why; a pattern that fits is taken in chunks, the same."""
    layer = build_layer("attention", D)
    whole = dependency_pattern(layer, 64, D)
    seen: list[int] = []
    chunk = structure._next_chunk
    monkeypatch.setattr(structure, "_next_chunk", lambda *a: seen.append(a[3]) or chunk(*a))
    dependency_pattern(layer, 64, D)
    first = seen[-1]  # what the first 8 positions took at their peak
    monkeypatch.setattr(structure, "PATTERN_BYTES", 2 * first)  # chunks of about 16
    assert np.array_equal(dependency_pattern(layer, 64, D), whole)
    monkeypatch.setattr(structure, "PATTERN_BYTES", first // 2)  # not even the first positions
    with pytest.raises(structure.PatternTooCostly, match="not measured"):
        dependency_pattern(layer, 64, D)
    from attnbench.measure.case import auxiliary

    value, method = auxiliary(lambda: path_length(lambda n: build_layer("attention", D), 64, D))
    assert value is None and method.startswith("none: PatternTooCostly: the dependency pattern")


def test_the_probe_cache_is_bounded_and_keyed_by_the_layers_code(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A second sweep in the same process reads only what the same code gave: a builder's key
    names the layer's source; and the oldest answers go once the cache holds its size."""
    from dataclasses import replace

    from attnbench.layers.registry import REGISTRY
    from attnbench.measure.step import layer_builder
    from attnbench.options import build_grid

    case = build_grid({"layers": "conv", "n": [16], "d": [8], "device": "cpu"}).cases()[0]
    before = layer_builder(case, 0).key
    entry = REGISTRY["conv"]
    monkeypatch.setitem(REGISTRY, "conv", replace(entry, source=replace(entry.source, digest="x")))
    assert layer_builder(case, 0).key != before  # the same name, other code: another key
    monkeypatch.setattr(structure, "_PROBE_CACHE", type(structure._PROBE_CACHE)())
    monkeypatch.setattr(structure, "PROBE_CACHE_SIZE", 2)
    computed = []
    for tag in ("a", "b", "a", "c", "b"):
        builder = structure.LayerBuilder(lambda n: nn.Identity(), tag)
        structure._cached("route", builder, 8, (4,), lambda t=tag: computed.append(t) or t)
    # "a" was read again before "c" came, so "b" went first; "b" is computed again at the end
    assert computed == ["a", "b", "c", "b"]
    assert list(structure._PROBE_CACHE) == [("route", "c", 8, (4,)), ("route", "b", 8, (4,))]


def test_a_chain_continues_through_a_write_into_a_buffer() -> None:
    """A value written in place into a decode step's state buffer, then read back through a
    view of it, is one chain: a dilated step's levels each read what the one before wrote into
    its ring. A buffer that is not the state is followed as before (an unfused LSTM cell's
    in-place writes into disjoint chunks of its gates are not one another's inputs)."""
    x = torch.randn(4)
    buffer = torch.zeros(2, 4)

    def through_buffer() -> torch.Tensor:
        h = x
        for _ in range(5):
            buffer[1] = torch.tanh(h)  # written in place
            h = buffer[1] * 2  # read back through a view
        return h

    assert sequential_steps(through_buffer, buffers=(buffer,)) >= 10
    assert sequential_steps(through_buffer) <= 2


def test_a_dilated_decode_step_is_as_deep_as_its_stack() -> None:
    """The dilated stack's step runs its L levels one after the other: its chain grows with L
    (log_k of the context), where a plain conv's step does not."""
    from attnbench.layers import build_layer
    from attnbench.layers.decoding import prefill

    def steps(name: str, n: int) -> int:
        layer = build_layer(name, 8, n=n + 1)
        x = torch.randn(1, n + 1, 8)
        with torch.no_grad():
            state = prefill(layer, x[:, :n], n + 1)
        return sequential_steps(lambda: layer.step(x[:, n], state, n)[0], tuple(state.values()))

    assert steps("conv-dilated", 8) < steps("conv-dilated", 64) < steps("conv-dilated", 512)
    assert steps("conv", 8) == steps("conv", 512)


def test_a_probes_findings_are_kept_in_the_count_cache_for_the_next_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each first round of the fork executor is a process of its own: what one case probed (the
    route, the band, the paths at the probe lengths) the next reads back from the count cache,
    the same path without a Jacobian taken. A finding is kept only within ``probes_on_disk``,
    for a layer whose code can be told unchanged; an entry that does not read is probed again."""
    from attnbench.layers.registry import entry
    from attnbench.measure.counts.countcache import CountCache
    from attnbench.measure.counts.probecache import probes_on_disk
    from attnbench.measure.step import layer_builder
    from attnbench.options import build_grid

    grid = build_grid({"layers": "attention-local", "n": "512", "d": "8", "device": "cpu"})
    (case,) = grid.cases()
    reach = entry(case.layer).reach(case.option_values)
    store = CountCache(tmp_path / "cache")
    taken = patterns_taken(monkeypatch)

    def fresh_process() -> structure.PathLength:  # a process's own cache starts empty
        monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
        return path_length(layer_builder(case, 0), case.n, case.d, scale=reach)

    with probes_on_disk(store):
        first = fresh_process()
    assert first.method.startswith("extended") and taken  # probed, and written
    written = sorted((tmp_path / "cache" / "laws").rglob("*.json"))
    assert written
    taken.clear()
    with probes_on_disk(store):
        again = fresh_process()
    assert again == first and taken == []  # read back: no pattern taken
    for entry_file in written:  # entries that do not read: probed again, the same path
        entry_file.write_text('{"nothing": 1}')
    with probes_on_disk(store):
        assert fresh_process() == first and taken
    taken.clear()
    assert fresh_process() == first and taken  # outside it: memory alone, probed again
    # a layer registered from Python: no digest tells its code unchanged, never on disk
    from attnbench.layers.entry import LayerSource

    python = (case.layer, LayerSource("python", "tests"), case.options, 0)
    anonymous = structure.LayerBuilder(layer_builder(case, 0).build, python)
    monkeypatch.setattr(structure, "_PROBE_CACHE", OrderedDict())
    before = sorted((tmp_path / "cache" / "laws").rglob("*.json"))
    with probes_on_disk(store):
        path_length(anonymous, case.n, case.d, scale=reach)
    assert sorted((tmp_path / "cache" / "laws").rglob("*.json")) == before


def test_a_layer_that_mixes_no_positions_has_no_path_not_attentions_one() -> None:
    """Each output of a pointwise layer (and of a conv of kernel 1) depends on its own position
    alone: no route joins two positions, so its path has no value and says why; measured up to
    the probes and above them alike. A kernel of 3 joins neighbours: its path is n - 1 again."""
    from attnbench.measure.counts.structure import NO_MIXING

    class Pointwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(D, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, n, D) -> (1, n, D)
            return torch.tanh(self.proj(x))

    pointwise = LayerBuilder(lambda n: Pointwise(), ("pointwise", "tests", (), 0))
    one = LayerBuilder(lambda n: build_layer("conv", D, k=1, n=n), ("conv", "k1", (), 0))
    three = LayerBuilder(lambda n: build_layer("conv", D, k=3, n=n), ("conv", "k3", (), 0))
    for n in (32, 256):  # measured, then extended from the probes
        assert path_length(pointwise, n, D) == structure.PathLength(None, NO_MIXING)
        assert path_length(one, n, D) == structure.PathLength(None, NO_MIXING)
        assert path_length(three, n, D).value == n - 1


def test_probe_findings_of_other_options_seeds_widths_and_routes_stay_apart(
    tmp_path: Path,
) -> None:
    """Each finding is kept under its layer's options, seed, d, probe lengths and (a path's or a
    band's) route: a finding written for one is never read back for another."""
    from attnbench.layers.registry import entry
    from attnbench.measure.counts.countcache import CountCache
    from attnbench.measure.counts.probecache import on_disk, probes_on_disk
    from attnbench.measure.counts.routes import Route

    source = entry("conv").source
    k3, k5 = (("k", 3),), (("k", 5),)
    written = [
        (("conv", source, k3, 0), 8, (16, 32, 64), 1),
        (("conv", source, k5, 0), 8, (16, 32, 64), 2),  # another option
        (("conv", source, k3, 1), 8, (16, 32, 64), 3),  # another seed
        (("conv", source, k3, 0), 16, (16, 32, 64), 4),  # another width
        (("conv", source, k3, 0), 8, (16, 32, 128), 5),  # other probes
        (("conv", source, k3, 0), 8, (64, Route("recurrence", 1, 0)), 6),  # a route
        (("conv", source, k3, 0), 8, (64, Route("direct")), 7),  # another route
    ]
    with probes_on_disk(CountCache(tmp_path)):
        for key, d, probes, value in written:
            assert on_disk("stages", key, d, probes, lambda v=value: v) == value
        for key, d, probes, value in written:  # read back: each its own, none computed
            assert on_disk("stages", key, d, probes, lambda: -1) == value
    assert len(list(tmp_path.rglob("*.json"))) == len(written)
