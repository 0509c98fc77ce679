"""Multi-head self-attention with sinusoidal positional encoding, as the chapter builds it."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers.entry import Family, LayerEntry, LayerOption
from attnbench.positional import SinusoidalPositionalEncoding
from attnbench.theory import LayerTheory, Sizes, Term, elements, raw_bytes, values


class SelfAttentionLayer(nn.Module):
    """X + P, then softmax(Q K^T / sqrt(d/h)) V over h heads, with bias-free W_q, W_k, W_v, W_o.

    ``fused=False`` materialises the (n x n) attention weights explicitly (the textbook layer);
    ``fused=True`` computes the same function with ``scaled_dot_product_attention``, whose fused
    kernels need not hold the n x n matrix.
    """

    def __init__(self, d: int, heads: int, causal: int = 0, *, fused: bool = False) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"d={d} is not divisible by heads={heads}")
        self.d, self.heads, self.fused, self.causal = d, heads, fused, bool(causal)
        self.pos = SinusoidalPositionalEncoding(d)
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.W_o = nn.Linear(d, d, bias=False)

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, h, n, d/h)
        B, n, _ = t.shape
        return t.view(B, n, self.heads, self.d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        B, n, d = x.shape
        x = self.pos(x)  # (B, n, d)
        q = self._split(self.W_q(x))  # (B, h, n, hs)
        k = self._split(self.W_k(x))  # (B, h, n, hs)
        v = self._split(self.W_v(x))  # (B, h, n, hs)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, h, n, hs)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # (B, h, n, n)
            if self.causal:  # every score is computed; the future ones are masked
                future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # (n, n)
                scores = scores.masked_fill(future, float("-inf"))  # (B, h, n, n)
            weights = torch.softmax(scores, dim=-1)  # (B, h, n, n)
            y = weights @ v  # (B, h, n, hs)
        y = y.transpose(1, 2).reshape(B, n, d)  # (B, n, d)
        return cast("torch.Tensor", self.W_o(y))  # (B, n, d)

    def mixing_stages(self) -> list[nn.Module]:
        return [self]


# ----------------------------------------------------------------------------- entries

HEADS = LayerOption("heads", 4, "h", "Attention heads; d must divide by it.", divides_d=True)
CAUSAL = LayerOption(
    "causal",
    0,
    "causal",
    "Decoder-style attention: each position attends to itself and the positions before it. "
    "FLOPs are counted dense (every score, as the explicit layer computes and masks them); "
    "a fused kernel skips the masked blocks, which only its time shows.",
    minimum=0,
    flag=True,
)
SELF_ATTENTION = Family("self-attention", rank=40, pairwise=True, chapter=True)

# The four projections Q, K, V, O (4·2·b·n·d²), shared by every layer built on this one.
PROJECTIONS = Term(8, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] * s["d"])
_SCORES = Term(4, "b·n²·d", lambda s: s["b"] * s["n"] * s["n"] * s["d"])  # QKᵀ and AV: 2·2·b·n²·d

# The positional-encoding add, b·n·d elements, shared by every layer built on this one.
POSITIONS = elements(1, "b·n·d", lambda s: s["b"] * s["n"] * s["d"])
# The scores are scaled and normalised (softmax), and masked first when causal: every score is
# computed either way, so the FLOPs are the same with and without --causal (a fused kernel may
# skip the masked blocks; neither count credits it, both say what the explicit layer computes).
_SCALED = elements(2, "b·h·n²", lambda s: s["b"] * s["heads"] * s["n"] * s["n"])
_MASKED = elements(1, "causal·b·h·n²", lambda s: s["causal"] * s["b"] * s["heads"] * s["n"] ** 2)

# Bytes moved, op by op (measure.counts.traffic), shared by every layer built on this one: the
# positional add reads x and the table's n rows (once, whatever the batch) and writes x + P;
# each projection reads its input and d x d weight and writes its output.
POSITION_TRAFFIC = (
    values(2, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
    values(1, "n·d", lambda s: s["n"] * s["d"]),
)
PROJECTION_TRAFFIC = (
    values(8, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
    values(4, "d²", lambda s: s["d"] * s["d"]),
)
_BOUNDARY = values(4, "b·n·d", lambda s: s["b"] * s["n"] * s["d"])


def _heads_copy(s: Sizes) -> float:
    """b·n·d where the heads are split (h > 1): a transposed (B, h, n, d/h) tensor that must be
    made contiguous is copied, read and written; with one head the transposes are views."""
    return float(s["heads"] > 1) * s["b"] * s["n"] * s["d"]


_SQUARE = "b·h·n²"


def _scores(s: Sizes) -> float:
    return s["b"] * s["heads"] * s["n"] * s["n"]


# Explicit: QKᵀ reads q, k and writes the scores, the scale and the softmax each read and write
# them, AV reads them and v (3 · 2 · b·h·n²); the products' q, k, v and outputs are the b·n·d
# boundary, and the heads are merged through a copy. Causal: the (n, n) bool mask is made (n²
# bytes), cut to its upper triangle (read and written), and read by masked_fill, which reads
# and writes the scores once more. With b > 1 the products cannot fold batch and heads of the
# transposed q, k and v into one strided matrix, so each is copied first (read and written).
_EXPLICIT_TRAFFIC = (
    *POSITION_TRAFFIC,
    *PROJECTION_TRAFFIC,
    _BOUNDARY,
    values(2, "[h>1]·b·n·d", _heads_copy),
    values(6, "[b>1]·[h>1]·b·n·d", lambda s: float(s["b"] > 1) * _heads_copy(s)),
    values(6, _SQUARE, _scores),
    values(2, "causal·b·h·n²", lambda s: s["causal"] * _scores(s)),
    raw_bytes(4, "causal·n²", lambda s: s["causal"] * s["n"] * s["n"]),
)
# Fused: the kernel reads q, k, v and writes the output and one statistic per row (its
# logsumexp): the n x n scores never reach memory, and the heads merge as a view.
_FUSED_TRAFFIC = (
    *POSITION_TRAFFIC,
    *PROJECTION_TRAFFIC,
    values(4, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
    values(1, "b·h·n", lambda s: s["b"] * s["heads"] * s["n"]),
)

# The fused kernels' backward (flash attention's, on the CPU and on CUDA) recomputes the scores
# QKᵀ from q and k rather than keep the n x n matrix: one product more in a training call.
_RECOMPUTED = Term(2, "b·n²·d", lambda s: s["b"] * s["n"] * s["n"] * s["d"])

# The fused layer computes the same function, so it shares the same theory but for its bytes
# and the scores its backward recomputes.
ATTENTION_THEORY = LayerTheory(
    "O(n^2 d)",
    (PROJECTIONS, _SCORES),
    order=lambda s: s["n"] * s["n"] * s["d"],
    elementwise=(POSITIONS, _SCALED, _MASKED),
    traffic=_EXPLICIT_TRAFFIC,
)

ENTRIES = (
    LayerEntry(
        "attention",
        SelfAttentionLayer,
        SELF_ATTENTION,
        "sinusoidal PE + multi-head self-attention, explicit n x n weights",
        (HEADS, CAUSAL),
        ATTENTION_THEORY,
    ),
    LayerEntry(
        "attention-sdpa",
        partial(SelfAttentionLayer, fused=True),
        SELF_ATTENTION,
        "the same layer through scaled_dot_product_attention (fused kernels)",
        (HEADS, CAUSAL),
        replace(ATTENTION_THEORY, traffic=_FUSED_TRAFFIC, recompute=(_RECOMPUTED,)),
    ),
)
