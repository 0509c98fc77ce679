"""Recurrent layers: one hidden-state update per token, O(n d^2) work in n sequential steps."""

from __future__ import annotations

import torch
from torch import nn

_CELLS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


class RecurrentLayer(nn.Module):
    """Single-layer RNN / GRU / LSTM, hidden size d, batch-first; returns every hidden state."""

    def __init__(self, kind: str, d: int) -> None:
        super().__init__()
        self.kind = kind
        self.rnn = _CELLS[kind](d, d, num_layers=1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        out, _ = self.rnn(x)  # (B, n, d): h_1 .. h_n
        return out
