"""The comparison table's theory, written once.

Every analytic FLOP count and complexity order lives here; the FLOP check in ``measure.flops``,
the tables and (later) the fits all read it from this module.

Conventions: a multiply-add is 2 FLOPs; only matrix products are counted (softmax, biases,
activations, the positional-encoding add and other elementwise work are not), which is also what
``torch.utils.flop_counter`` counts. ``b`` batch, ``n`` sequence length, ``d`` width, ``k`` kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerTheory:
    """Theoretical cost of one layer (forward pass)."""

    complexity: str  # the chapter's order, e.g. "O(k n d^2)"
    flops: Callable[[int, int, int, int], float]  # (b, n, d, k) -> forward FLOPs
    formula: str  # human-readable form of ``flops``


def _attention(b: int, n: int, d: int, k: int) -> float:
    # Four d x d projections (Q, K, V, O): 4 * 2*b*n*d^2.  QK^T and AV: 2 * 2*b*n^2*d.
    return 8 * b * n * d * d + 4 * b * n * n * d


# The fused layer computes the same function, so it shares the same theory.
_ATTENTION = LayerTheory("O(n^2 d)", _attention, "8·b·n·d² + 4·b·n²·d")

THEORY: dict[str, LayerTheory] = {
    "conv": LayerTheory("O(k n d^2)", lambda b, n, d, k: 2 * b * n * k * d * d, "2·b·n·k·d²"),
    # One d x d product for the input and one for the hidden state, per gate.
    "rnn": LayerTheory("O(n d^2)", lambda b, n, d, k: 4 * b * n * d * d, "4·b·n·d²"),
    "gru": LayerTheory("O(n d^2)", lambda b, n, d, k: 12 * b * n * d * d, "12·b·n·d²"),
    "lstm": LayerTheory("O(n d^2)", lambda b, n, d, k: 16 * b * n * d * d, "16·b·n·d²"),
    "attention": _ATTENTION,
    "attention-sdpa": _ATTENTION,
}

# A backward pass computes two products (input gradient and weight gradient) for each forward
# product, so forward + backward costs three forward passes.
TRAIN_FLOP_FACTOR = 3


def analytic_flops(layer: str, *, batch: int, n: int, d: int, k: int, mode: str) -> float:
    """Analytic FLOPs of one call of ``layer`` in ``mode`` ("forward" or "train")."""
    fwd = THEORY[layer].flops(batch, n, d, k)
    return fwd * TRAIN_FLOP_FACTOR if mode == "train" else fwd
