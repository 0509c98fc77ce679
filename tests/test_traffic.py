"""Bytes moved by one call: every op's operands and results, counted exactly where the answer can
be written out by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from synthetic import small_case, warm_step
from torch import nn

from attnbench import layer_names
from attnbench.measure.counts.traffic import (
    Traffic,
    count_traffic,
    parse_kernels,
    tensor_bytes,
)
from attnbench.measure.record import CaseResult
from attnbench.measure.step import make_step
from attnbench.spec import Case

F32 = 4


def count_bytes(fn: Callable[[], object]) -> int:
    """Bytes read and written by one call of ``fn``: every aten op's operands and results."""
    return count_traffic(fn).bytes


def test_a_linear_layer_moves_its_one_products_operands_and_result() -> None:
    """x (b·n, d_in) and W (d_in, d_out) and the bias read, y (b·n, d_out) written: the views
    around the product (flatten, transpose, unflatten) move nothing."""
    b, n, d_in, d_out = 8, 100, 64, 32
    x = torch.randn(b, n, d_in)
    for bias in (True, False):
        linear = nn.Linear(d_in, d_out, bias=bias)
        with torch.no_grad():
            counted = count_bytes(lambda linear=linear: linear(x))
        hand = F32 * (b * n * d_in + d_in * d_out + b * n * d_out + (d_out if bias else 0))
        assert counted == hand
    wider = nn.Linear(d_in, 2 * d_out)
    with torch.no_grad():  # a changed layer changes the count
        assert count_bytes(lambda: wider(x)) == F32 * (
            b * n * d_in + d_in * 2 * d_out + b * n * 2 * d_out + 2 * d_out
        )


def test_in_place_ops_read_and_write_empty_writes_nothing_views_move_nothing() -> None:
    def steps() -> torch.Tensor:
        y = torch.empty(10)  # reserved, not written: 0
        y.fill_(1.0)  # writes y: 40 (reads nothing but a scalar)
        y.add_(1.0)  # reads y and writes it: 80
        return y.view(2, 5).transpose(0, 1)  # views: 0

    assert count_bytes(steps) == 40 + 80
    assert count_traffic(steps).ops == 3  # empty, fill_, add_: the views dispatch no work


def test_splits_and_in_place_reshapes_move_nothing() -> None:
    """A GRU step splits its gates with ``unsafe_split`` and a recurrence turns its output with
    ``transpose_``: views of memory already there, whatever their schemas say."""
    gates = torch.randn(4, 30)

    def split() -> list[torch.Tensor]:
        return torch.ops.aten.unsafe_split.Tensor(gates, 10, 1)

    def turn() -> torch.Tensor:
        return torch.randn(3, 5).transpose_(0, 1)  # randn writes 60 bytes, transpose_ none

    assert count_traffic(split) == Traffic(0, 0)
    assert count_traffic(turn) == Traffic(15 * F32, 1)


def test_a_broadcast_operand_reads_its_memory_once() -> None:
    row = torch.randn(1, 64)
    wide = row.expand(1000, 64)  # 1000 rows that are one row in memory
    assert tensor_bytes(wide) == 64 * F32
    assert tensor_bytes(torch.randn(3, 5)) == 15 * F32
    out = torch.empty(1000, 64)
    counted = count_bytes(lambda: torch.mul(wide, 2.0, out=out))
    assert counted == 64 * F32 + 1000 * 64 * F32  # the row read once; out= written, not read


def test_a_fused_attention_kernel_moves_its_boundary_not_its_scores() -> None:
    """Explicit attention writes and reads the n x n scores; the fused kernel never does."""
    b, h, n, e = 1, 2, 256, 16
    q, k, v = (torch.randn(b, h, n, e) for _ in range(3))
    with torch.no_grad():
        fused = count_bytes(lambda: F.scaled_dot_product_attention(q, k, v))
        explicit = count_bytes(lambda: ((q @ k.transpose(-1, -2)) / e**0.5).softmax(-1) @ v)
    boundary = 4 * b * h * n * e * F32  # q, k, v read, the output written
    assert boundary <= fused < boundary + b * h * n * F32 * 2  # at most a per-row statistic more
    scores = b * h * n * n * F32
    assert explicit > 4 * scores  # written by the product, read and written by scale, softmax


def test_intensity_is_flops_per_byte() -> None:
    case = Case("conv", 16, 8, 1, "float32", "cpu", "forward", (("k", 3),))
    row = CaseResult(case, "ok", 1, flops=600, bytes=200).to_row()
    assert row["intensity"] == 3.0 and row["bytes"] == 200
    assert CaseResult(case, "ok", 1, flops=600, bytes=None).to_row()["intensity"] is None
    assert CaseResult(case, "ok", 1, flops=None, bytes=200).intensity is None


_case = small_case


def _counted(case: Case) -> int:
    step = warm_step(case)
    return count_traffic(step).bytes


@pytest.mark.parametrize("layer", layer_names())
@pytest.mark.parametrize(("n", "d", "batch"), [(24, 16, 2), (40, 8, 1), (17, 8, 3)])
def test_counted_bytes_equal_each_layers_formula(layer: str, n: int, d: int, batch: int) -> None:
    case = _case(layer, n=n, d=d, batch=batch)
    assert _counted(case) == case.analytic_bytes()


@pytest.mark.parametrize(
    ("layer", "options"),
    [
        ("attention", {"causal": 1}), ("attention", {"heads": 1}),
        ("attention-sdpa", {"causal": 1}), ("attention-linear", {"causal": 1}),
        ("attention-linear", {"causal": 1, "heads": 1}), ("attention-linear", {"heads": 1}),
        ("attention-local", {"causal": 1}), ("attention-local", {"window": 8}),
        ("conv", {"k": 4}), ("conv", {"k": 5}), ("conv-dilated", {"k": 2}),
        ("ssm", {"state": 4}), ("ssm-scan", {"state": 4}),
    ],
)  # fmt: skip
def test_every_option_keeps_the_bytes_formula(layer: str, options: dict[str, int]) -> None:
    for batch in (1, 2):
        case = _case(layer, batch=batch, **options)
        assert _counted(case) == case.analytic_bytes()


def test_the_bytes_formula_follows_the_layer_not_the_other_way() -> None:
    """What the scores cost shows in the count: explicit attention moves 6·b·h·n² values of
    them, the fused kernel none; a dtype of half the size moves half the values' bytes."""
    explicit = [_counted(_case("attention", n=n, batch=1)) for n in (16, 32)]
    fused = [_counted(_case("attention-sdpa", n=n, batch=1)) for n in (16, 32)]
    h = 4
    assert [e - f for e, f in zip(explicit, fused, strict=True)] == [
        F32 * (6 * h * n * n + 2 * n * 16 - h * n) for n in (16, 32)
    ]
    half = _case("conv", batch=1, dtype="bfloat16")
    assert half.analytic_bytes() == _case("conv", batch=1).analytic_bytes() / 2
    assert _counted(half) == half.analytic_bytes()


def _products(found: Traffic) -> set[str]:
    return {k for k in found.kernels if not k.startswith("ew.")}


def test_each_product_is_recorded_by_its_kind_and_narrow_width() -> None:
    """Convolutions, fused attention kernels and matrix products run at rates of their own,
    which grow with the product's narrow width: each is recorded under kind@width."""
    conv = _case("conv", batch=1)  # d = 16, k = 3: 16 channels out, a reduction of 48
    step = make_step(conv, seed=0)
    found = count_traffic(step)
    assert set(found.kernels) == {"conv@16"}
    flops, moved = found.kernels["conv@16"]
    assert flops == conv.analytic_flops() and moved == found.bytes == found.product_bytes
    assert parse_kernels(found.kernels_text()) == {"conv@16": (flops, moved)}
    # four heads of 4: the fused kernel is 4 wide, the projections (n x 16) @ (16 x 16) 16 wide
    sdpa = count_traffic(make_step(_case("attention-sdpa", batch=1), seed=0))
    assert _products(sdpa) == {"attention@4", "gemm@16"}
    assert 0 < sdpa.kernels["attention@4"][1] < sdpa.product_bytes
    assert sum(sdpa.kernels[k][1] for k in _products(sdpa)) == sdpa.product_bytes
    # explicit attention: scores (n x 4) @ (4 x n) and weights (n x n) @ (n x 4) are 4 wide
    explicit = count_traffic(make_step(_case("attention", batch=1), seed=0))
    assert _products(explicit) == {"gemm@4", "gemm@16"}
    wider = count_traffic(make_step(_case("attention", batch=1, heads=2), seed=0))
    assert _products(wider) == {"gemm@8", "gemm@16"}  # a changed layer, changed widths
    # the rows (the sequence) are left out: a longer sequence keeps the widths
    longer = count_traffic(make_step(_case("conv", batch=1, n=64), seed=0))
    assert set(longer.kernels) == {"conv@16"}


def test_each_elementwise_op_is_recorded_by_name_with_its_elements_and_bytes() -> None:
    """An exp costs many adds: each op's elements and bytes are kept apart (``ew.`` + its
    aten name), and their elements add up to the elementwise count."""
    x = torch.randn(8, 32)

    def call() -> torch.Tensor:
        y = torch.exp(x)  # 256 elements; reads 1 KiB, writes 1 KiB
        y.add_(1.0)  # in place: 256 elements, reads and writes y
        return torch.softmax(y, -1)  # 256 elements read

    with torch.no_grad():
        found = count_traffic(call)
    assert found.kernels == {
        "ew.exp": (256, 2 * 1024), "ew.add": (256, 2 * 1024), "ew._softmax": (256, 2 * 1024),
    }  # fmt: skip
    rnn = small_case("rnn", batch=1)
    traced = count_traffic(make_step(rnn, seed=0))
    ew = {k: v for k, v in traced.kernels.items() if k.startswith("ew.")}
    assert set(ew) == {"ew.add", "ew.tanh"}
    assert sum(e for e, _ in ew.values()) == rnn.analytic_elements()
    assert parse_kernels("conv:1:2; junk; attention:x:3") == {"conv": (1.0, 2.0)}


def test_a_bytes_term_counts_bytes_whatever_the_dtype() -> None:
    """``raw_bytes`` (a bool mask: a byte a value) against ``values`` (the run's dtype): the
    same count weighs 4 bytes a value in float32 and 1 as bytes; the formula names each."""
    from attnbench.theory import LayerTheory, Term, elements, raw_bytes, traffic_bytes, values

    def size(s: dict[str, int]) -> int:
        return s["n"] ** 2

    mask, scores = raw_bytes(3, "n²", size), values(2, "n²", size)
    assert mask == Term(3, "n²", size, unit="byte")
    # and an elementwise term is one (the fits' rate of it is elements per second)
    assert elements(5, "n²", size) == Term(5, "n²", size, unit="element")
    assert traffic_bytes((mask, scores), {"n": 10}, itemsize=4) == 3 * 100 + 2 * 100 * 4
    theory = LayerTheory("O(n²)", (), traffic=(scores, mask))
    assert theory.traffic_formula == "(2·n²) values + 3·n² bytes"
