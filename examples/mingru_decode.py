"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?") from PyPI, as a plugin that generates.

``pip install minGRU-pytorch``. Its module computes a whole sequence with a parallel scan, and
one token from the previous hidden state (``prev_hidden``, ``return_next_prev_hidden``): the two
methods below hand that recurrent form to ``attnbench sweep --mode decode``.
"""

from __future__ import annotations

import torch
from minGRU_pytorch import minGRU
from torch import nn


class MinGRUDecoder(nn.Module):
    """minGRU of width d; ``forward`` is its parallel scan, ``step`` its recurrence."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gru = minGRU(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        return self.gru(x)  # type: ignore[no-any-return]

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        # A zero hidden state: lerp(0, h̃, z) is h̃·z, what minGRU computes with none.
        weight = self.gru.to_hidden_and_gate.weight
        return {"h": torch.zeros(batch, 1, weight.shape[1], dtype=weight.dtype)}  # (B, 1, d)

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out, h = self.gru(x.unsqueeze(1), state["h"], return_next_prev_hidden=True)
        return out[:, 0], {"h": h}  # (B, d), and the new (B, 1, d) hidden state


def make(d: int) -> nn.Module:
    return MinGRUDecoder(d)
