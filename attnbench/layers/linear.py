"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): the softmax kernel
replaced by a feature map, so attention costs O(n·d²) instead of O(n²·d).

With φ(x) = elu(x) + 1 > 0, each output is, per head (non-causal):
    y_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j)).
The keys and values are summed once into a (d/h x d/h) matrix per head, so no n x n matrix
exists, and every output still depends on every input (path length 1).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from attnbench.layers.attention import (
    CAUSAL,
    HEADS,
    POSITION_TRAFFIC,
    PROJECTION_TRAFFIC,
    PROJECTIONS,
    STEP_PROJECTIONS,
    SelfAttentionLayer,
    _heads_copy,
)
from attnbench.layers.entry import Family, LayerEntry
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, elements, values


class LinearAttentionLayer(SelfAttentionLayer):
    """The same projections and encoding as ``SelfAttentionLayer``; φ(Q)(φ(K)ᵀV), normalised."""

    def attend(self, x: torch.Tensor, *, causal: bool) -> torch.Tensor:  # x: (B, n, d)
        B, n, d = x.shape
        x = self.pos(x)  # (B, n, d)
        q = F.elu(self._split(self.W_q(x))) + 1  # (B, h, n, hs), positive
        k = F.elu(self._split(self.W_k(x))) + 1  # (B, h, n, hs), positive
        v = self._split(self.W_v(x))  # (B, h, n, hs)
        if causal:  # prefix sums: position i sees the keys and values up to i
            kv = torch.cumsum(k.unsqueeze(-1) @ v.unsqueeze(-2), dim=2)  # (B, h, n, hs, hs)
            z = torch.cumsum(k, dim=2)  # (B, h, n, hs)
            num = (q.unsqueeze(-2) @ kv).squeeze(-2)  # (B, h, n, hs)
            den = (q.unsqueeze(-2) @ z.unsqueeze(-1)).squeeze(-1)  # (B, h, n, 1)
        else:
            kv = k.transpose(-2, -1) @ v  # (B, h, hs, hs): Σ_j φ(k_j) v_jᵀ
            z = k.sum(dim=-2, keepdim=True)  # (B, h, 1, hs): Σ_j φ(k_j)
            num = q @ kv  # (B, h, n, hs)
            den = q @ z.transpose(-2, -1)  # (B, h, n, 1)
        y = (num / den).transpose(1, 2).reshape(B, n, d)  # (B, n, d)
        return cast("torch.Tensor", self.W_o(y))  # (B, n, d)

    # ------------------------------------------------------------------------- decoding
    # The causal form is a recurrence: the running sums S = Σ_j φ(k_j) v_jᵀ (d/h x d/h per
    # head) and z = Σ_j φ(k_j) are the whole state, whatever the context. A step returns new
    # sums and leaves the ones it was given as they were.

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        weight = self.W_k.weight
        self.pos.extend(capacity)
        hs = self.d // self.heads
        S = torch.zeros(batch, self.heads, hs, hs, dtype=weight.dtype, device=weight.device)
        z = torch.zeros(batch, self.heads, hs, dtype=weight.dtype, device=weight.device)
        return {"S": S, "z": z}  # S (B, h, hs, hs), z (B, h, hs)

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The sums over the n tokens of x (B, n, d): φ(K)ᵀV in one product, and Σφ(K)."""
        x = self.pos(x)  # (B, n, d)
        k = F.elu(self._split(self.W_k(x))) + 1  # (B, h, n, hs), positive
        v = self._split(self.W_v(x))  # (B, h, n, hs)
        S = state["S"] + k.transpose(-2, -1) @ v  # (B, h, hs, hs)
        z = state["z"] + k.sum(dim=-2)  # (B, h, hs)
        return {"S": S, "z": z}

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d) at ``position``: S' = S + φ(k)vᵀ, z' = z + φ(k), and
        y = φ(q)ᵀS' / φ(q)ᵀz', as the causal forward's prefix sums give it."""
        B, d = x.shape
        q, k, v = self._token(x, position)  # (B, h, hs) each
        q = F.elu(q) + 1  # (B, h, hs), positive
        k = F.elu(k) + 1  # (B, h, hs), positive
        S = state["S"] + k.unsqueeze(-1) @ v.unsqueeze(-2)  # (B, h, hs, hs)
        z = state["z"] + k  # (B, h, hs)
        num = q.unsqueeze(-2) @ S  # (B, h, 1, hs)
        den = q.unsqueeze(-2) @ z.unsqueeze(-1)  # (B, h, 1, 1)
        y = (num / den).reshape(B, d)  # (B, d)
        return cast("torch.Tensor", self.W_o(y)), {"S": S, "z": z}  # (B, d)


LINEAR = Family("linear self-attention", rank=60, rival=True, kin="self-attention")
_PREFIX_SUMS = elements(
    1, "causal·b·n·d²/h", lambda s: s["causal"] * s["b"] * s["n"] * s["d"] * s["d"] / s["heads"]
)


def _bdd_h(s: Sizes) -> float:
    return s["b"] * s["d"] * s["d"] / s["heads"]


def _bnd(s: Sizes) -> float:
    return s["b"] * s["n"] * s["d"]


def _batched(s: Sizes) -> float:
    """b·n·d where more than one sequence and split heads make the products copy operands."""
    return float(s["b"] > 1) * _heads_copy(s)


# Bytes moved, op by op: the encoding and projections as explicit attention's; φ (elu, then
# + 1, each read and written) on Q and K; the products' operands and results, the sum Σφ(K),
# the division and the copy that merges the heads, with no n x n tensor anywhere. Non-causal:
# φ(K)ᵀV and Σφ(K) are (d/h x d/h) and d/h per head (b·d²/h, b·d), and with b > 1 four
# transposed operands are copied before their products. Causal: the outer products and their
# prefix sums are (d/h x d/h) per position (b·n·d²/h, written, then read and written by the
# cumsum, then read), and the copies happen at any batch.
_TRAFFIC = (
    *POSITION_TRAFFIC,
    *PROJECTION_TRAFFIC,
    values(6, "b·n·d", _bnd),
    values(2, "[h>1]·b·n·d", _heads_copy),
    values(10, "b·n·d", _bnd),
    values(2, "causal·b·n·d", lambda s: s["causal"] * _bnd(s)),
    values(8, "causal·[h>1]·b·n·d", lambda s: s["causal"] * _heads_copy(s)),
    values(8, "[b>1]·(1-causal)·[h>1]·b·n·d", lambda s: _batched(s) * (1 - s["causal"])),
    values(2, "(1-causal)·b·d²/h", lambda s: (1 - s["causal"]) * s["b"] * s["d"] ** 2 / s["heads"]),
    values(2, "(1-causal)·b·d", lambda s: (1 - s["causal"]) * s["b"] * s["d"]),
    values(2, "b·h·n", lambda s: s["b"] * s["heads"] * s["n"]),
    values(4, "causal·b·n·d²/h", lambda s: s["causal"] * _bnd(s) * s["d"] / s["heads"]),
)

ENTRIES = (
    LayerEntry(
        "attention-linear",
        LinearAttentionLayer,
        LINEAR,
        "kernelized linear attention, φ(x) = elu(x) + 1: no n x n matrix, O(n d^2)",
        (HEADS, CAUSAL),
        LayerTheory(
            "O(n d^2)",
            (
                PROJECTIONS,
                # φ(K)ᵀV and φ(Q)·(φ(K)ᵀV): 2·2·b·h·n·(d/h)² = 4·b·n·d²/h.
                Term(4, "b·n·d²/h", lambda s: s["b"] * s["n"] * s["d"] * s["d"] / s["heads"]),
                # The normaliser φ(Q)·Σφ(K): 2·b·h·n·(d/h) = 2·b·n·d.
                Term(2, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
            ),
            order=lambda s: s["n"] * s["d"] * s["d"],
            # The positional add (1), φ = elu + 1 on Q and K (4), Σφ(K) (1: its b·n·d inputs)
            # and the division (1): 7·b·n·d. Causal, the sum becomes a prefix sum of φ(K), and
            # the b·n·d²/h outer products φ(k_j)v_jᵀ, which a product sums otherwise, are
            # prefix-summed too.
            elementwise=(elements(7, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]), _PREFIX_SUMS),
            traffic=_TRAFFIC,
            decode=DecodeTheory(
                "O(d^2)",
                "O(d^2/h)",
                (
                    STEP_PROJECTIONS,
                    # φ(k)vᵀ and φ(q)ᵀS': 2·2·b·h·(d/h)²; the normaliser φ(q)ᵀz': 2·b·d.
                    Term(4, "b·d²/h", _bdd_h),
                    Term(2, "b·d", lambda s: s["b"] * s["d"]),
                ),
                (values(1, "b·d²/h", _bdd_h), values(1, "b·d", lambda s: s["b"] * s["d"])),
                "causal: the running sums S and z, whatever the context",
                order=lambda s: s["d"] * s["d"],
                # The forward's elementwise work of one causal position: the positional add,
                # φ on q and k, z + φ(k) and the division (7·b·d), and S + φ(k)vᵀ (b·d²/h).
                elementwise=(
                    elements(7, "b·d", lambda s: s["b"] * s["d"]),
                    elements(1, "b·d²/h", _bdd_h),
                ),
            ),
        ),
    ),
)
