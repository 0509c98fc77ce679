"""The comparison table's theory, written once.

Every analytic FLOP count and complexity order lives here; the FLOP check in ``measure.flops``,
the comparison table and the fits all read it from this module.

Conventions: a multiply-add is 2 FLOPs; only matrix products are counted (softmax, biases,
activations, the positional-encoding add and other elementwise work are not), which is also what
``torch.utils.flop_counter`` counts. ``b`` batch, ``n`` sequence length, ``d`` width, ``k``
kernel, ``r`` attention window (neighbours on each side).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.layers.conv import dilated_depth

FlopFormula = Callable[[int, int, int, int, int], float]  # (b, n, d, k, r) -> forward FLOPs


@dataclass(frozen=True)
class LayerTheory:
    """Theoretical cost of one layer (forward pass), as the chapter's table states it."""

    complexity: str  # computational complexity, e.g. "O(k n d^2)"
    flops: FlopFormula
    formula: str  # human-readable form of ``flops``
    sequential: str = "O(1)"  # sequential operations
    path: str = "O(1)"  # maximum path length
    row: str = ""  # the table row it belongs to


def _attention(b: int, n: int, d: int, k: int, r: int) -> float:
    # Four d x d projections (Q, K, V, O): 4 * 2*b*n*d^2.  QK^T and AV: 2 * 2*b*n^2*d.
    return 8 * b * n * d * d + 4 * b * n * n * d


def _local_attention(b: int, n: int, d: int, k: int, r: int) -> float:
    # Projections as above; each block of r queries meets 3r keys: QK^T and AV are
    # 2 * 2*b*(blocks*r)*(3r)*d, blocks = ceil(n / r).
    return 8 * b * n * d * d + 12 * b * math.ceil(n / r) * r * r * d


def _dilated(b: int, n: int, d: int, k: int, r: int) -> float:
    return dilated_depth(n, k) * 2 * b * n * k * d * d


# The fused layer computes the same function, so it shares the same theory.
_ATTENTION = LayerTheory("O(n^2 d)", _attention, "8·b·n·d² + 4·b·n²·d", row="self-attention")
_RECURRENT = {"sequential": "O(n)", "path": "O(n)", "row": "recurrent"}

THEORY: dict[str, LayerTheory] = {
    "conv": LayerTheory(
        "O(k n d^2)",
        lambda b, n, d, k, r: 2 * b * n * k * d * d,
        "2·b·n·k·d²",
        path="O(n/k)",
        row="convolutional",
    ),
    "conv-dilated": LayerTheory(
        "O(k n d^2 log_k n)",
        _dilated,
        "L·2·b·n·k·d², L = ⌈log_k n⌉ layers",
        sequential="O(log_k n)",
        path="O(log_k n)",
        row="convolutional (dilated)",
    ),
    # One d x d product for the input and one for the hidden state, per gate.
    "rnn": LayerTheory(
        "O(n d^2)", lambda b, n, d, k, r: 4 * b * n * d * d, "4·b·n·d²", **_RECURRENT
    ),
    "gru": LayerTheory(
        "O(n d^2)", lambda b, n, d, k, r: 12 * b * n * d * d, "12·b·n·d²", **_RECURRENT
    ),
    "lstm": LayerTheory(
        "O(n d^2)", lambda b, n, d, k, r: 16 * b * n * d * d, "16·b·n·d²", **_RECURRENT
    ),
    "attention": _ATTENTION,
    "attention-sdpa": _ATTENTION,
    "attention-local": LayerTheory(
        "O(r n d)",
        _local_attention,
        "8·b·n·d² + 12·b·⌈n/r⌉·r²·d",
        path="O(n/r)",
        row="restricted self-attention",
    ),
}

# A backward pass computes two products (input gradient and weight gradient) for each forward
# product, so forward + backward costs three forward passes.
TRAIN_FLOP_FACTOR = 3


def analytic_flops(
    layer: str, *, batch: int, n: int, d: int, k: int = 0, window: int = 0, mode: str = "forward"
) -> float:
    """Analytic FLOPs of one call of ``layer`` in ``mode`` ("forward" or "train")."""
    fwd = THEORY[layer].flops(batch, n, d, k, window)
    return fwd * TRAIN_FLOP_FACTOR if mode == "train" else fwd
