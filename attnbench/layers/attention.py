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
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, elements, raw_bytes, values


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
        return self.attend(x, causal=self.causal)  # (B, n, d)

    def causal_forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        """The layer as a decoder computes it in parallel: causal, whatever ``causal`` says."""
        return self.attend(x, causal=True)  # (B, n, d)

    def attend(self, x: torch.Tensor, *, causal: bool) -> torch.Tensor:  # x: (B, n, d)
        B, n, d = x.shape
        x = self.pos(x)  # (B, n, d)
        q = self._split(self.W_q(x))  # (B, h, n, hs)
        k = self._split(self.W_k(x))  # (B, h, n, hs)
        v = self._split(self.W_v(x))  # (B, h, n, hs)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, h, n, hs)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # (B, h, n, n)
            if causal:  # every score is computed; the future ones are masked
                future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # (n, n)
                scores = scores.masked_fill(future, float("-inf"))  # (B, h, n, n)
            weights = torch.softmax(scores, dim=-1)  # (B, h, n, n)
            y = weights @ v  # (B, h, n, hs)
        y = y.transpose(1, 2).reshape(B, n, d)  # (B, n, d)
        return cast("torch.Tensor", self.W_o(y))  # (B, n, d)

    # ------------------------------------------------------------------------- decoding
    # A static key/value cache: ``capacity`` slots per head, preallocated; the step at
    # ``position`` writes its key and value into slot ``position`` in place and attends over
    # slots 0 .. position, so stepping the same token twice writes the same values again.

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        weight = self.W_k.weight
        self.pos.extend(capacity)  # the table covers every position the cache can hold
        shape = (batch, self.heads, capacity, self.d // self.heads)
        k = torch.zeros(shape, dtype=weight.dtype, device=weight.device)  # (B, h, cap, hs)
        v = torch.zeros(shape, dtype=weight.dtype, device=weight.device)  # (B, h, cap, hs)
        return {"k": k, "v": v}

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Keys and values of the n tokens of x (B, n, d), each in one product, into slots
        0 .. n-1."""
        n = x.shape[1]
        x = self.pos(x)  # (B, n, d)
        state["k"][:, :, :n] = self._split(self.W_k(x))  # (B, h, n, hs)
        state["v"][:, :, :n] = self._split(self.W_v(x))  # (B, h, n, hs)
        return state

    def _token(
        self, x: torch.Tensor, position: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of the token x (B, d) at ``position``: each (B, h, hs)."""
        B, d = x.shape
        x = x + self.pos.row(position)  # (B, d)
        q = self.W_q(x).view(B, self.heads, d // self.heads)  # (B, h, hs)
        k = self.W_k(x).view(B, self.heads, d // self.heads)  # (B, h, hs)
        v = self.W_v(x).view(B, self.heads, d // self.heads)  # (B, h, hs)
        return q, k, v

    def _attend_cached(
        self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor
    ) -> torch.Tensor:
        """One query per head (B, h, hs) over the cached keys and values (B, h, m, hs): the
        output (B, d) after W_o. Every cached key is one the query may see."""
        B, h, hs = q.shape
        q = q.unsqueeze(2)  # (B, h, 1, hs)
        if self.fused:  # one query sees all of the keys given: no causal mask
            y = F.scaled_dot_product_attention(q, keys, vals)  # (B, h, 1, hs)
        else:
            scores = q @ keys.transpose(-2, -1) / math.sqrt(hs)  # (B, h, 1, m)
            weights = torch.softmax(scores, dim=-1)  # (B, h, 1, m)
            y = weights @ vals  # (B, h, 1, hs)
        return cast("torch.Tensor", self.W_o(y.reshape(B, h * hs)))  # (B, d)

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d) at ``position``: its key and value into the cache's slot
        ``position``, then attention over slots 0 .. position."""
        q, k, v = self._token(x, position)  # (B, h, hs) each
        state["k"][:, :, position] = k  # (B, h, hs), in place
        state["v"][:, :, position] = v  # (B, h, hs), in place
        keys = state["k"][:, :, : position + 1]  # (B, h, position + 1, hs)
        vals = state["v"][:, :, : position + 1]  # (B, h, position + 1, hs)
        return self._attend_cached(q, keys, vals), state  # (B, d)

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

# One generation step (``DecodeTheory``), shared by every layer built on this one: the four
# projections of one token (4·2·b·d²) and the positional add on it (b·d elements).
STEP_PROJECTIONS = Term(8, "b·d²", lambda s: s["b"] * s["d"] * s["d"])
STEP_POSITION = elements(1, "b·d", lambda s: s["b"] * s["d"])


def _context(s: Sizes) -> float:
    """b·(n+1)·d: the cache at context n holds n + 1 tokens, the step's own included."""
    return s["b"] * (s["n"] + 1) * s["d"]


# At context n the query meets the n + 1 cached keys and values: q·Kᵀ and the weights' product
# with V, 2·2·b·(n+1)·d; its b·h·(n+1) scores are scaled and normalised (no mask: every cached
# key is one it may see). The fused layer's one-query kernel counts the same.
ATTENTION_DECODE = DecodeTheory(
    "O(d^2 + n d)",
    "O(n d)",
    (STEP_PROJECTIONS, Term(4, "b·(n+1)·d", _context)),
    (values(2, "b·(n+1)·d", _context),),
    "causal: a KV cache of n+1 slots written in place",
    order=lambda s: s["n"] * s["d"],
    elementwise=(
        STEP_POSITION,
        elements(2, "b·h·(n+1)", lambda s: s["b"] * s["heads"] * (s["n"] + 1)),
    ),
)

# The fused layer computes the same function, so it shares the same theory but for its bytes
# and the scores its backward recomputes.
ATTENTION_THEORY = LayerTheory(
    "O(n^2 d)",
    (PROJECTIONS, _SCORES),
    order=lambda s: s["n"] * s["n"] * s["d"],
    elementwise=(POSITIONS, _SCALED, _MASKED),
    traffic=_EXPLICIT_TRAFFIC,
    decode=ATTENTION_DECODE,
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
