"""A diagonal selective state-space layer (Mamba's S6, simplified), run two ways.

Per channel c (of d) and state dimension s (of N), with input-dependent Δ, B and C:
    Δ_t = softplus(w_Δ ⊙ x_t + b_Δ)                          (B, d)
    B_t = x_t W_B,   C_t = x_t W_C                             (B, N)
    h_t = exp(Δ_t ⊙ A) ⊙ h_{t-1} + (Δ_t ⊙ x_t) ⊗ B_t          (B, d, N), A = -exp(A_log) < 0
    y_t = h_t C_t + D ⊙ x_t                                    (B, d)
``ssm`` runs the recurrence step by step: n dependent state updates. ``ssm-scan`` computes the
same h with a parallel associative scan over the sequence (Hillis-Steele): the pairs
(a_t, b_t) = (exp(Δ_t A), (Δ_t x_t) ⊗ B_t) compose as (a, b) ∘ (a', b') = (a a', a b' + b), and
⌈log₂ n⌉ levels of that composition give every h_t at once, for n·log n elementwise work instead
of n. Both build the same parameters in the same order, so a seed gives both the same weights.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers.entry import Family, LayerEntry, LayerOption
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, elements, values


class SelectiveSSM(nn.Module):
    """The selective SSM above; ``scan`` chooses how the recurrence is computed."""

    def __init__(self, d: int, state: int, *, scan: bool = False) -> None:
        super().__init__()
        self.scan = scan
        # S4D-real initialisation: A[c, s] = -(s + 1), the same for every channel.
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1.0)).repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        self.dt_weight = nn.Parameter(torch.rand(d) * 0.5)
        self.dt_bias = nn.Parameter(torch.rand(d) - 2.0)  # softplus(-2..-1): steps of ~0.1-0.3
        self.W_B = nn.Linear(d, state, bias=False)
        self.W_C = nn.Linear(d, state, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        a, b, C_t = self._coefficients(x)  # (B, n, d, N) x 2, (B, n, N)
        h = associative_scan(a, b) if self.scan else sequential_scan(a, b)  # (B, n, d, N)
        y = (h @ C_t.unsqueeze(-1)).squeeze(-1)  # (B, n, d): Σ_s h[..., s] C_t[s]
        return y + self.D * x  # (B, n, d)

    def _coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For x (..., d): the decay a and input b of h_t = a ⊙ h_{t-1} + b, each (..., d, N),
        and the readout C_t (..., N)."""
        delta = F.softplus(x * self.dt_weight + self.dt_bias)  # (..., d)
        B_t = self.W_B(x)  # (..., N)
        C_t = self.W_C(x)  # (..., N)
        A = -torch.exp(self.A_log)  # (d, N)
        a = torch.exp(delta.unsqueeze(-1) * A)  # (..., d, N): the decay of each state
        b = (delta * x).unsqueeze(-1) * B_t.unsqueeze(-2)  # (..., d, N): the input it takes in
        return a, b, C_t

    # ------------------------------------------------------------------------- decoding
    # Causal as it is: the state is h (B, d, N), and a step is one update of the recurrence,
    # for ``ssm-scan`` too (its scan computes the same h for a whole sequence at once). A step
    # returns a new h and leaves the given one as it was.

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        d, N = self.A_log.shape
        h = torch.zeros(batch, d, N, dtype=self.A_log.dtype, device=self.A_log.device)
        return {"h": h}  # (B, d, N)

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """h after the prefix x (B, n, d): the layer's own scan, from the given h."""
        a, b, _ = self._coefficients(x)  # (B, n, d, N) x 2
        b[:, 0] += a[:, 0] * state["h"]  # (B, d, N): the first update starts from h
        h = associative_scan(a, b) if self.scan else sequential_scan(a, b)  # (B, n, d, N)
        return {"h": h[:, -1].clone()}  # (B, d, N)

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d): h' = a ⊙ h + b, y = h' C + D ⊙ x."""
        a, b, C_t = self._coefficients(x)  # (B, d, N) x 2, (B, N)
        h = a * state["h"] + b  # (B, d, N)
        y = (h @ C_t.unsqueeze(-1)).squeeze(-1)  # (B, d): Σ_s h[:, :, s] C_t[s]
        return y + self.D * x, {"h": h}  # (B, d)


def sequential_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t, one position after the other (h_{-1} = 0)."""
    h = torch.zeros_like(b[:, 0])  # (B, d, N)
    states = []
    # unbind, not a[:, t] in the loop: the same views, but a backward pass (the path probe's
    # Jacobian) gathers their gradients in one stack instead of one full-size add per step.
    for a_t, b_t in zip(a.unbind(1), b.unbind(1), strict=True):
        h = a_t * h + b_t  # (B, d, N)
        states.append(h)
    return torch.stack(states, dim=1)  # (B, n, d, N)


def associative_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same h by Hillis-Steele: at level k, position t composes with position t - 2^k,
    so after ⌈log₂ n⌉ levels each position holds the composition of everything before it."""
    n = b.shape[1]
    shift = 1
    while shift < n:
        # Positions before ``shift`` compose with the identity (a = 1, b = 0).
        a_prev = F.pad(a[:, : n - shift], (0, 0, 0, 0, shift, 0), value=1.0)  # (B, n, d, N)
        b_prev = F.pad(b[:, : n - shift], (0, 0, 0, 0, shift, 0))  # (B, n, d, N)
        b = a * b_prev + b  # (B, n, d, N)
        a = a * a_prev  # (B, n, d, N)
        shift *= 2
    return b  # with h_{-1} = 0, the b-part of the composition is h_t


# ----------------------------------------------------------------------------- entries

STATE = LayerOption("state", 16, "N", "ssm, ssm-scan: the state size N of each channel.")
STATE_SPACE = Family("state space", rank=70, rival=True)


def levels(n: float) -> int:
    """The scan's levels: ⌈log₂ n⌉ (0 for a single position)."""
    return max(0, math.ceil(math.log2(n))) if n >= 1 else 0


def _bndN(s: Sizes) -> float:
    return s["b"] * s["n"] * s["d"] * s["state"]


# B_t and C_t: 2·2·b·n·d·N; the readout h_t·C_t: 2·b·n·d·N.
_FLOPS = (Term(6, "b·n·d·N", _bndN),)


def _scan_levels(s: Sizes) -> float:
    return float(levels(s["n"]))


def _elementwise(scan: bool) -> tuple[Term, ...]:
    """Per channel: Δ = softplus(w·x + b), Δ·x, the skip D·x and the output add (6·b·n·d).
    Per state: Δ·A, its exp and (Δ·x)·B (3·b·n·d·N), once A = -exp(A_log) (2·d·N). Then the
    recurrence: a multiply and an add per state and position (2·b·n·d·N) step by step; the
    scan's combination (a·b' + b, a·a') is three per state and position at each of its
    L = ⌈log₂ n⌉ levels (3·L·b·n·d·N): the n log n work that buys log n steps."""
    per_channel = elements(6, "b·n·d", lambda s: s["b"] * s["n"] * s["d"])
    table = elements(2, "d·N", lambda s: s["d"] * s["state"])
    if not scan:
        return (per_channel, elements(3 + 2, "b·n·d·N", _bndN), table)
    levels_term = elements(3, "L·b·n·d·N", lambda s: _scan_levels(s) * _bndN(s))
    return (per_channel, elements(3, "b·n·d·N", _bndN), levels_term, table)


def _bdN(s: Sizes) -> float:
    return s["b"] * s["d"] * s["state"]


def _decode(scan: bool) -> DecodeTheory:
    """One step of the recurrence, for both layers: B_t, C_t and the readout (6·b·d·N), the
    per-channel work (6·b·d), Δ·A, its exp, (Δ·x)·B and the update a·h + b (5·b·d·N), and
    A = -exp(A_log) (2·d·N): the forward's work at n = 1."""
    form = "causal as it is: the state h of the recurrence"
    return DecodeTheory(
        "O(d N)",
        "O(d N)",
        (Term(6, "b·d·N", _bdN),),
        (values(1, "b·d·N", _bdN),),
        form + (", one update a step (not the scan)" if scan else ""),
        order=lambda s: s["d"] * s["state"],
        elementwise=(
            elements(6, "b·d", lambda s: s["b"] * s["d"]),
            elements(5, "b·d·N", _bdN),
            elements(2, "d·N", lambda s: s["d"] * s["state"]),
        ),
    )


def _traffic(scan: bool) -> tuple[Term, ...]:
    """Bytes moved, op by op. Per channel (b·n·d values): Δ's scale, bias and softplus, the
    projections' input, Δ·x, the readout's output, the skip and the output add, 19 in all.
    The tables (d·N): the projections' weights, A = -exp(A_log), and Δ·A's operand. Per
    position (b·n·N): B_t and C_t written, B_t and C_t read. Per state and position (b·n·d·N,
    the bulk): Δ·A written, its exp read and written, (Δ·x)·B written, h read by the readout.
    Step by step, each of the n updates a·h + b reads and writes a (b, d, N) state twice and
    the n states are stacked (read and written), 8 more, after one zero state. The scan
    instead pads shifted copies of a and b (the part of them it keeps read, all written) and
    combines them (a·b' + b and a·a': 9 per state and position) at each of its L levels."""
    common = (
        values(19, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
        values(3, "d", lambda s: s["d"]),
        values(7, "d·N", lambda s: s["d"] * s["state"]),
        values(4, "b·n·N", lambda s: s["b"] * s["n"] * s["state"]),
        values(5, "b·n·d·N", _bndN),
    )
    if not scan:
        steps = values(8, "b·n·d·N", _bndN)
        return (*common, steps, values(1, "b·d·N", lambda s: s["b"] * s["d"] * s["state"]))
    shifted = values(
        -2, "b·(2^L-1)·d·N", lambda s: s["b"] * (2 ** _scan_levels(s) - 1) * s["d"] * s["state"]
    )
    return (*common, values(13, "L·b·n·d·N", lambda s: _scan_levels(s) * _bndN(s)), shifted)


ENTRIES = (
    LayerEntry(
        "ssm",
        partial(SelectiveSSM, scan=False),
        STATE_SPACE,
        "diagonal selective SSM (Mamba's S6): input-dependent Δ, B, C; step by step",
        (STATE,),
        LayerTheory(
            "O(n d N)",
            _FLOPS,
            sequential="O(n)",
            path="O(n)",
            order=lambda s: s["n"] * s["d"] * s["state"],
            sequential_law=lambda s: float(s["n"]),
            path_law=lambda s: float(s["n"]),
            elementwise=_elementwise(scan=False),
            traffic=_traffic(scan=False),
            decode=_decode(scan=False),
        ),
    ),
    LayerEntry(
        "ssm-scan",
        partial(SelectiveSSM, scan=True),
        STATE_SPACE,
        "the same SSM through a parallel associative scan (Hillis-Steele): log n levels",
        (STATE,),
        LayerTheory(
            "O(n d N log n)",
            _FLOPS,
            sequential="O(log n)",
            path="O(log n)",
            order=lambda s: s["n"] * s["d"] * s["state"] * max(_scan_levels(s), 1.0),
            sequential_law=_scan_levels,
            path_law=_scan_levels,
            elementwise=_elementwise(scan=True),
            traffic=_traffic(scan=True),
            decode=_decode(scan=True),
        ),
    ),
)
