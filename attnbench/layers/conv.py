"""Convolutions over the sequence: one layer mixes k neighbouring tokens, O(k n d^2).

``ConvLayer`` is the table's single convolution. ``DilatedConvLayer`` stacks convolutions with
dilation 1, k, k^2, ... until every output sees every input, the table's O(log_k n) path.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


class ConvLayer(nn.Module):
    """``nn.Conv1d(d, d, k, dilation)`` with 'same' padding, on (batch, n, d) tokens."""

    def __init__(self, d: int, k: int = 3, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, k, padding="same", dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        with warnings.catch_warnings():
            # Even k pads asymmetrically through a zero-padded copy; that copy is real cost and
            # is measured, so the warning adds nothing.
            warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
            y = self.conv(x.transpose(1, 2))  # (B, d, n)
        return y.transpose(1, 2)  # (B, n, d)

    def mixing_stages(self) -> list[nn.Module]:
        return [self]


def dilated_depth(n: int, k: int) -> int:
    """Fewest layers L with k^L >= 2n - 1: then the centred receptive field (k^L - 1) / 2 reaches
    n - 1 positions either way, so every output depends on every input."""
    if k < 2:
        raise ValueError(f"a dilated stack needs k >= 2, got {k}")
    depth, span = 1, k
    while span < 2 * n - 1:
        depth, span = depth + 1, span * k
    return depth


class DilatedConvLayer(nn.Module):
    """``dilated_depth(n, k)`` 'same'-padded convolutions with dilation k^0, k^1, ..., k^(L-1).

    The depth is part of the architecture: a stack built for n covers n.  Odd k keeps each
    layer centred (even k would make the stack see only one side).
    """

    def __init__(self, d: int, k: int = 3, *, n: int) -> None:
        super().__init__()
        if k < 3 or k % 2 == 0:
            raise ValueError(f"conv-dilated needs an odd k >= 3, got {k}")
        self.k = k
        self.stages = nn.ModuleList(
            ConvLayer(d, k, dilation=k**i) for i in range(dilated_depth(n, k))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        for stage in self.stages:
            x = stage(x)  # (B, n, d)
        return x

    def mixing_stages(self) -> list[nn.Module]:
        return list(self.stages)
