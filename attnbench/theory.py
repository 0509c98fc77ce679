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

SizeFn = Callable[[int, int, int, int, int], float]  # (b, n, d, k, r) -> a size such as b·n·d²
OrderFn = Callable[[int, int, int], float]  # (n, k, r) -> steps, up to a constant


@dataclass(frozen=True)
class Term:
    """One term of a cost formula: ``flops`` FLOPs per unit of ``size``, e.g. 4 · b·n²·d."""

    flops: float
    name: str  # the size, as written in the formula: "b·n²·d"
    size: SizeFn


@dataclass(frozen=True)
class LayerTheory:
    """Theoretical cost of one layer (forward pass), as the chapter's table states it.

    The FLOP formula is the sum of its terms; the cost-model fits use the same terms as their
    columns, so a formula is written once for both.
    """

    complexity: str  # computational complexity, e.g. "O(k n d^2)"
    terms: tuple[Term, ...]
    sequential: str = "O(1)"  # sequential operations
    path: str = "O(1)"  # maximum path length
    row: str = ""  # the table row it belongs to
    # The chapter's order as a size (leading term, constant 1): n²·d for attention.
    order: SizeFn = lambda b, n, d, k, r: 0.0
    sequential_law: OrderFn = lambda n, k, r: 1.0
    path_law: OrderFn = lambda n, k, r: 1.0

    def flops(self, b: int, n: int, d: int, k: int, r: int) -> float:
        """Forward FLOPs of one call."""
        return float(sum(t.flops * t.size(b, n, d, k, r) for t in self.terms))

    @property
    def formula(self) -> str:
        """The FLOP formula, human-readable: "8·b·n·d² + 4·b·n²·d"."""
        return " + ".join(f"{t.flops:g}·{t.name}" for t in self.terms) or "0"


def _log(n: int, k: int) -> float:
    return float(dilated_depth(n, k))


# Sizes shared between layers: the same name is the same column in every cost model.
_PROJECTIONS = Term(8, "b·n·d²", lambda b, n, d, k, r: b * n * d * d)  # Q, K, V, O: 4·2·b·n·d²
_SCORES = Term(4, "b·n²·d", lambda b, n, d, k, r: b * n * n * d)  # QKᵀ and AV: 2·2·b·n²·d


def _recurrent(flops: int) -> LayerTheory:
    # One d x d product for the input and one for the hidden state, per gate: 2·2·gates·b·n·d².
    return LayerTheory(
        "O(n d^2)",
        (Term(flops, "b·n·d²", lambda b, n, d, k, r: b * n * d * d),),
        sequential="O(n)",
        path="O(n)",
        row="recurrent",
        order=lambda b, n, d, k, r: n * d * d,
        sequential_law=lambda n, k, r: float(n),
        path_law=lambda n, k, r: float(n),
    )


def _local_scores(b: int, n: int, d: int, k: int, r: int) -> float:
    return b * math.ceil(n / r) * r * r * d


# The fused layer computes the same function, so it shares the same theory.
_ATTENTION = LayerTheory(
    "O(n^2 d)",
    (_PROJECTIONS, _SCORES),
    row="self-attention",
    order=lambda b, n, d, k, r: n * n * d,
)

THEORY: dict[str, LayerTheory] = {
    "conv": LayerTheory(
        "O(k n d^2)",
        (Term(2, "b·n·k·d²", lambda b, n, d, k, r: b * n * k * d * d),),
        path="O(n/k)",
        row="convolutional",
        order=lambda b, n, d, k, r: k * n * d * d,
        path_law=lambda n, k, r: n / k,
    ),
    "conv-dilated": LayerTheory(
        "O(k n d^2 log_k n)",
        # L = ⌈log_k n⌉ stacked convolutions, each 2·b·n·k·d².
        (Term(2, "L·b·n·k·d²", lambda b, n, d, k, r: _log(n, k) * b * n * k * d * d),),
        sequential="O(log_k n)",
        path="O(log_k n)",
        row="convolutional (dilated)",
        order=lambda b, n, d, k, r: k * n * d * d * _log(n, k),
        sequential_law=lambda n, k, r: _log(n, k),
        path_law=lambda n, k, r: _log(n, k),
    ),
    "rnn": _recurrent(4),
    "gru": _recurrent(12),
    "lstm": _recurrent(16),
    "attention": _ATTENTION,
    "attention-sdpa": _ATTENTION,
    "attention-local": LayerTheory(
        "O(r n d)",
        # Each block of r queries meets 3r keys: QKᵀ and AV are 2·2·b·(⌈n/r⌉·r)·(3r)·d.
        (_PROJECTIONS, Term(12, "b·⌈n/r⌉·r²·d", _local_scores)),
        path="O(n/r)",
        row="restricted self-attention",
        order=lambda b, n, d, k, r: r * n * d,
        path_law=lambda n, k, r: n / r,
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
