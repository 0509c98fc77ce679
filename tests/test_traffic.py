"""Bytes moved by one call: every op's operands and results, counted exactly where the answer can
be written out by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.measure.record import CaseResult
from attnbench.measure.traffic import count_bytes, count_traffic, tensor_bytes
from attnbench.spec import Case

F32 = 4


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
