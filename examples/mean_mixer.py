"""A plugin layer in one file, without theory: attnbench measures it all the same.

    attnbench sweep --layers examples/mean_mixer.py:make,attention --n 64..1024 --d 64

Each token is mixed with the sequence's mean, then passed through an MLP of width ``width``·d:
every output sees every input in one step, at O(n·d²) cost. ``width`` is this layer's own
option (``--option width=4``).
"""

from __future__ import annotations

import torch
from torch import nn


class MeanMixer(nn.Module):
    def __init__(self, d: int, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, width * d)
        self.down = nn.Linear(width * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        mixed = x + x.mean(dim=1, keepdim=True)  # (B, n, d): every position sees all
        return self.down(torch.relu(self.up(mixed)))  # (B, n, d)


def make(d: int, width: int = 2) -> nn.Module:
    """The sequence's mean added to each token, then an MLP of width width·d."""
    return MeanMixer(d, width)
