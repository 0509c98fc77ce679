"""A gated convolution (Dauphin et al. 2017, "Language modeling with gated convolutional
networks") as an attnbench plugin: y = (W * x) ⊙ σ(V * x), both convolutions of kernel k.

It declares a full entry: the built-in kernel option K (so --k drives it, and the kernel must fit
in the sequence), the convolutional family (so crossovers set attention against it), and its
theory, which attnbench checks against the FLOPs it counts from the real call.
"""

from __future__ import annotations

import torch
from torch import nn

from attnbench.layers import CONVOLUTIONAL, K, LayerEntry
from attnbench.theory import LayerTheory, Term, elements


class GatedConv(nn.Module):
    """One Conv1d(d, 2d, k) with 'same' padding, split into a value half and a gate half."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, 2 * d, k, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        value, gate = self.conv(x.transpose(1, 2)).chunk(2, dim=1)  # (B, d, n) each
        return (value * torch.sigmoid(gate)).transpose(1, 2)  # (B, n, d)


ENTRY = LayerEntry(
    name="gated-conv",
    build=GatedConv,
    family=CONVOLUTIONAL,
    description="gated convolution: Conv1d(d, 2d, k), value ⊙ sigmoid(gate)",
    options=(K,),
    theory=LayerTheory(
        "O(k n d^2)",
        # Two d x d products per kernel tap and position: 2·2·b·n·k·d².
        (Term(4, "b·n·k·d²", lambda s: s["b"] * s["n"] * s["k"] * s["d"] * s["d"]),),
        path="O(n/k)",
        order=lambda s: s["k"] * s["n"] * s["d"] * s["d"],
        path_law=lambda s: s["n"] / s["k"],
        # The gate: a sigmoid and a multiply over b·n·d elements.
        elementwise=(elements(2, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),),
    ),
)
