"""Restricted (local) self-attention: each token attends to r neighbours on each side, O(r n d).

The cost is really O(r n d): queries are cut into blocks of r, and each block attends to the
3r keys around it (its own block and one on either side), so no n x n matrix is ever formed.
Positions further than r apart are masked inside those 3r-wide windows.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F

from attnbench.layers.attention import (
    CAUSAL,
    HEADS,
    POSITION_TRAFFIC,
    POSITIONS,
    PROJECTION_TRAFFIC,
    PROJECTIONS,
    STEP_POSITION,
    STEP_PROJECTIONS,
    SelfAttentionLayer,
)
from attnbench.layers.entry import Family, LayerEntry, LayerOption
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, elements, raw_bytes, values


class LocalAttentionLayer(SelfAttentionLayer):
    """The same projections and encoding as ``SelfAttentionLayer``; attention within |i - j| <= r.

    With r >= n - 1 it computes exactly the full layer's function (same seeded weights).
    """

    def __init__(self, d: int, heads: int, window: int, causal: int = 0) -> None:
        super().__init__(d, heads, causal)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window

    def _band(self, n: int, blocks: int, device: torch.device, causal: bool) -> torch.Tensor:
        """(blocks, r, 3r) bool: query blk*r + a may see key blk*r - r + c (none after it, when
        causal)."""
        r = self.window
        a = torch.arange(r, device=device).view(1, r, 1)
        c = torch.arange(3 * r, device=device).view(1, 1, 3 * r)
        blk = torch.arange(blocks, device=device).view(blocks, 1, 1)
        key = blk * r - r + c  # (blocks, 1, 3r)
        offset = c - a - r  # key - query
        ahead = 0 if causal else r
        return (offset >= -r) & (offset <= ahead) & (key >= 0) & (key < n)

    def attend(self, x: torch.Tensor, *, causal: bool) -> torch.Tensor:  # x: (B, n, d)
        B, n, d = x.shape
        r, hs = self.window, d // self.heads
        blocks = math.ceil(n / r)
        pad = blocks * r - n
        x = self.pos(x)  # (B, n, d)
        q = self._split(self.W_q(x))  # (B, h, n, hs)
        k = self._split(self.W_k(x))  # (B, h, n, hs)
        v = self._split(self.W_v(x))  # (B, h, n, hs)
        q = F.pad(q, (0, 0, 0, pad)).unflatten(2, (blocks, r))  # (B, h, blocks, r, hs)
        k = F.pad(k, (0, 0, r, pad + r)).unfold(2, 3 * r, r)  # (B, h, blocks, hs, 3r)
        v = F.pad(v, (0, 0, r, pad + r)).unfold(2, 3 * r, r)  # (B, h, blocks, hs, 3r)
        scores = q @ k / math.sqrt(hs)  # (B, h, blocks, r, 3r)
        scores = scores.masked_fill(~self._band(n, blocks, x.device, causal), float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, h, blocks, r, 3r)
        y = weights @ v.transpose(-2, -1)  # (B, h, blocks, r, hs)
        y = y.flatten(2, 3)[:, :, :n]  # (B, h, n, hs)
        y = y.transpose(1, 2).reshape(B, n, d)  # (B, n, d)
        return cast("torch.Tensor", self.W_o(y))  # (B, n, d)

    # ------------------------------------------------------------------------- decoding
    # Causal, token i sees keys i - r .. i (``_band``: offsets -r .. 0): a ring buffer of r + 1
    # slots per head, the token at ``position`` in slot position % (r + 1). Writing it there
    # overwrites the token r + 1 before it, which neither this query nor a later one sees, so
    # a repeat of the same step finds every key it needs where it was.

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        weight = self.W_k.weight
        self.pos.extend(capacity)
        shape = (batch, self.heads, self.window + 1, self.d // self.heads)
        k = torch.zeros(shape, dtype=weight.dtype, device=weight.device)  # (B, h, r+1, hs)
        v = torch.zeros(shape, dtype=weight.dtype, device=weight.device)  # (B, h, r+1, hs)
        return {"k": k, "v": v}

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keys and values of the last r + 1 tokens of x (B, n, d), each in one product,
        into their slots."""
        n, size = x.shape[1], self.window + 1
        start = max(0, n - size)
        self.pos.extend(n)
        x = x[:, start:] + self.pos.P[start:n]  # (B, m, d), m = min(n, r + 1)
        slots = torch.arange(start, n, device=x.device) % size  # (m,)
        state["k"][:, :, slots] = self._split(self.W_k(x))  # (B, h, m, hs)
        state["v"][:, :, slots] = self._split(self.W_v(x))  # (B, h, m, hs)
        return state

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d) at ``position``: its key and value into slot position % (r + 1),
        then attention over the min(position, r) + 1 filled slots (their order in the ring
        does not change a softmax-weighted sum)."""
        q, k, v = self._token(x, position)  # (B, h, hs) each
        slot = position % (self.window + 1)
        state["k"][:, :, slot] = k  # (B, h, hs), in place
        state["v"][:, :, slot] = v  # (B, h, hs), in place
        filled = min(position, self.window) + 1
        keys = state["k"][:, :, :filled]  # (B, h, filled, hs)
        vals = state["v"][:, :, :filled]  # (B, h, filled, hs)
        return self._attend_cached(q, keys, vals), state  # (B, d)


# ----------------------------------------------------------------------------- entries

WINDOW = LayerOption(
    "window",
    16,
    "r",
    "attention-local: neighbours r on each side (r <= the smallest n).",
    at_most_n=True,
    reach=True,
)
RESTRICTED = Family("restricted self-attention", rank=50, kin="self-attention")


def _local_scores(s: Sizes) -> float:
    return s["b"] * math.ceil(s["n"] / s["window"]) * s["window"] * s["window"] * s["d"]


def _local_weights(s: Sizes) -> float:
    return s["b"] * s["heads"] * math.ceil(s["n"] / s["window"]) * s["window"] * s["window"]


def _padded(s: Sizes) -> float:
    """b·P·d: the queries padded to P = ⌈n/r⌉·r positions."""
    return s["b"] * math.ceil(s["n"] / s["window"]) * s["window"] * s["d"]


def _framed(s: Sizes) -> float:
    """b·(P + 2r)·d: keys or values padded by a block on either side."""
    return s["b"] * (math.ceil(s["n"] / s["window"]) + 2) * s["window"] * s["d"]


def _mask(s: Sizes) -> float:
    """Bytes of building the (blocks, r, 3r) band mask: int64 index grids (r, 3r, blocks and
    their differences) and bool comparisons combined with &, the same for any b, h, d, dtype."""
    r, m = s["window"], math.ceil(s["n"] / s["window"])
    return 88 * r + 48 * m + 138 * r * r + 84 * r * m + 18 * m * r * r


def _window_keys(s: Sizes) -> float:
    """b·(min(n, r) + 1)·d: the keys (or values) one causal query sees at context n."""
    return s["b"] * (min(s["n"], s["window"]) + 1) * s["d"]


def _split(s: Sizes) -> float:
    """1 where the heads are split (h > 1), so their transposes are real copies."""
    return float(s["heads"] > 1)


def _copied(s: Sizes) -> float:
    """1 where the products cannot read the unfolded key and value windows in place (more
    than one head or one sequence), so each window is copied out first."""
    return float(s["heads"] > 1 or s["b"] > 1)


def _merge_copy(s: Sizes) -> float:
    """1 where merging the heads back into (B, n, d) copies: split heads, or several sequences
    whose padded tails the cut to n leaves as gaps between them."""
    ragged = s["b"] > 1 and s["n"] % s["window"] != 0
    return float(s["heads"] > 1 or ragged)


# Bytes moved, op by op: the encoding and projections as explicit attention's; q, k, v read
# and written padded (k and v by a block on either side); the products reading the padded q
# and the 3r-wide key and value windows, which are copied out first (read where they lie,
# written 3x) unless one head and one sequence let a product read them in place; q copied
# too where the heads are split and no padding made it contiguous (r dividing n); the
# b·h·⌈n/r⌉·r·3r scores written, read and written by the scale, the mask and the softmax, and
# read (8 in all); the heads merged through a copy (``_merge_copy``); and the mask built
# from index grids.
_TRAFFIC = (
    *POSITION_TRAFFIC,
    *PROJECTION_TRAFFIC,
    values(3, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
    values(2, "[merged by a copy]·b·n·d", lambda s: _merge_copy(s) * s["b"] * s["n"] * s["d"]),
    values(3, "b·P·d", _padded),
    values(12, "[h>1 or b>1]·b·P·d", lambda s: _copied(s) * _padded(s)),
    values(
        2,
        "[h>1]·[r divides n]·b·P·d",
        lambda s: _split(s) * float(s["n"] % s["window"] == 0) * _padded(s),
    ),
    values(4, "b·(P+2r)·d", _framed),
    values(8, "3·b·h·P·r", lambda s: 3 * _local_weights(s)),
    raw_bytes(1, "mask(r, ⌈n/r⌉)", _mask),
)

ENTRIES = (
    LayerEntry(
        "attention-local",
        LocalAttentionLayer,
        RESTRICTED,
        "restricted self-attention: r neighbours each side, blocked, O(r n d)",
        (HEADS, WINDOW, CAUSAL),
        LayerTheory(
            "O(r n d)",
            # Each block of r queries meets 3r keys: QKᵀ and AV are 2·2·b·(⌈n/r⌉·r)·(3r)·d.
            (PROJECTIONS, Term(12, "b·⌈n/r⌉·r²·d", _local_scores)),
            path="O(n/r)",
            order=lambda s: s["window"] * s["n"] * s["d"],
            path_law=lambda s: s["n"] / s["window"],
            # The positional add, then the b·h·⌈n/r⌉·r·3r scores of the blocks scaled, masked
            # to the band (causal or not) and normalised: 3·3 = 9 per b·h·⌈n/r⌉·r².
            elementwise=(POSITIONS, elements(9, "b·h·⌈n/r⌉·r²", _local_weights)),
            traffic=_TRAFFIC,
            decode=DecodeTheory(
                "O(d^2 + r d)",
                "O(r d)",
                # The query meets the min(n, r) + 1 keys and values of its window.
                (STEP_PROJECTIONS, Term(4, "b·(min(n,r)+1)·d", _window_keys)),
                (values(2, "b·(r+1)·d", lambda s: s["b"] * (s["window"] + 1) * s["d"]),),
                "causal window: a ring buffer of r+1 slots written in place",
                order=lambda s: s["window"] * s["d"],
                elementwise=(
                    STEP_POSITION,
                    elements(
                        2,
                        "b·h·(min(n,r)+1)",
                        lambda s: s["b"] * s["heads"] * (min(s["n"], s["window"]) + 1),
                    ),
                ),
            ),
        ),
    ),
)
