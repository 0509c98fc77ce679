"""WaveNet's dilated stack: causal convolutions with dilation 1, k, k^2, ... until every output
sees every earlier input, so the path is the table's O(log_k n) and the cost O(k n d^2 log_k n).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers.conv import K
from attnbench.layers.entry import Family, LayerEntry
from attnbench.theory import LayerTheory, Sizes, Term, values


def dilated_depth(n: int, k: int) -> int:
    """Fewest layers L with k^L >= n: then the causal receptive field k^L spans the sequence, so
    every output depends on every input at or before it."""
    if k < 2:
        raise ValueError(f"a dilated stack needs k >= 2, got {k}")
    depth, span = 1, k
    while span < n:
        depth, span = depth + 1, span * k
    return depth


class CausalConv(nn.Module):
    """``nn.Conv1d(d, d, k, dilation)`` seeing positions t, t - dilation, ..., t - (k-1) dilation.

    Left padding only: a route through a stack of these only moves forward in the sequence, so
    it never leaves it (with centred padding, a route would have to step outside to reach far).
    """

    def __init__(self, d: int, k: int, dilation: int) -> None:
        super().__init__()
        self.left = (k - 1) * dilation
        self.conv = nn.Conv1d(d, d, k, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        y = F.pad(x.transpose(1, 2), (self.left, 0))  # (B, d, left + n)
        return cast("torch.Tensor", self.conv(y).transpose(1, 2))  # (B, n, d)


class DilatedConvLayer(nn.Module):
    """``dilated_depth(n, k)`` causal convolutions with dilation k^0, k^1, ..., k^(L-1)
    (WaveNet's stack): every output depends on every earlier input through exactly L layers.

    The depth is part of the architecture: a stack built for n covers n.
    """

    def __init__(self, d: int, k: int, *, n: int) -> None:
        super().__init__()
        if k < 2:
            raise ValueError(f"conv-dilated needs k >= 2, got {k}")
        self.k = k
        self.stages = nn.ModuleList(
            CausalConv(d, k, dilation=k**i) for i in range(dilated_depth(n, k))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        for stage in self.stages:
            x = stage(x)  # (B, n, d)
        return x

    def mixing_stages(self) -> list[nn.Module]:
        return list(self.stages)


# ----------------------------------------------------------------------------- entries

DILATED = Family("convolutional (dilated)", rank=20, rival=True, kin="convolutional")


def _depth(s: Sizes) -> float:
    # n may be fractional (a chart's dense line, a crossover search): the depth covers it.
    return float(dilated_depth(s["n"], s["k"]))  # type: ignore[arg-type]  # a theory reads sizes as floats; the depth is exact in ints


def _layers_size(s: Sizes) -> float:
    return _depth(s) * s["b"] * s["n"] * s["k"] * s["d"] * s["d"]


ENTRIES = (
    LayerEntry(
        "conv-dilated",
        DilatedConvLayer,
        DILATED,
        "causal Conv1d stack, dilation 1, k, k^2, ..., deep enough to cover n",
        # Dilations k^i must grow to cover n.
        (replace(K, minimum=2),),
        LayerTheory(
            "O(k n d^2 log_k n)",
            # L = ⌈log_k n⌉ stacked convolutions, each 2·b·n·k·d².
            (Term(2, "L·b·n·k·d²", _layers_size),),
            sequential="O(log_k n)",
            path="O(log_k n)",
            order=lambda s: s["k"] * s["n"] * s["d"] * s["d"] * _depth(s),
            sequential_law=_depth,
            path_law=_depth,
            elementwise=(),  # padding and convolutions only
            # Each of the L stages pads x on the left by (k-1)·k^i (x read, n + (k-1)·k^i
            # positions written, then read by the convolution with its k·d² weights and bias,
            # which writes y): 4·b·n·d + k·d² + d each, and the paddings sum to k^L - 1.
            traffic=(
                values(4, "L·b·n·d", lambda s: _depth(s) * s["b"] * s["n"] * s["d"]),
                values(1, "L·k·d²", lambda s: _depth(s) * s["k"] * s["d"] * s["d"]),
                values(1, "L·d", lambda s: _depth(s) * s["d"]),
                values(2, "b·(k^L-1)·d", lambda s: s["b"] * (s["k"] ** _depth(s) - 1) * s["d"]),
            ),
        ),
        needs_length=True,
    ),
)
