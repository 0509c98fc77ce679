"""Convolution over the sequence: k neighbouring tokens mixed per output, O(k n d^2)."""

from __future__ import annotations

import warnings

import torch
from torch import nn


class ConvLayer(nn.Module):
    """``nn.Conv1d(d, d, k)`` with 'same' padding, on (batch, n, d) tokens."""

    def __init__(self, d: int, k: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, k, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        with warnings.catch_warnings():
            # Even k pads asymmetrically through a zero-padded copy; that copy is real cost and
            # is measured, so the warning adds nothing.
            warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
            y = self.conv(x.transpose(1, 2))  # (B, d, n)
        return y.transpose(1, 2)  # (B, n, d)
