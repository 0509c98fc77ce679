"""Recurrent layers: one hidden-state update per token, O(n d^2) work in n sequential steps."""

from __future__ import annotations

from functools import partial
from typing import cast

import torch
from torch import nn

from attnbench.layers.entry import Family, LayerEntry
from attnbench.theory import LayerTheory, Sizes, Term, elements, values

_CELLS: dict[str, type[nn.RNN] | type[nn.GRU] | type[nn.LSTM]] = {
    "rnn": nn.RNN,
    "gru": nn.GRU,
    "lstm": nn.LSTM,
}


class RecurrentLayer(nn.Module):
    """Single-layer RNN / GRU / LSTM, hidden size d, batch-first; returns every hidden state."""

    def __init__(self, kind: str, d: int) -> None:
        super().__init__()
        self.kind = kind
        self.rnn = _CELLS[kind](d, d, num_layers=1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        out, _ = self.rnn(x)  # (B, n, d): h_1 .. h_n
        return cast("torch.Tensor", out)


RECURRENT = Family("recurrent", rank=30, rival=True, chapter=True)


def _unfused_bias(s: Sizes) -> float:
    # torch adds the input projection's bias inside the product (addmm) when the (n, b, d)
    # input it projects is contiguous, which with batch_first means b = 1; otherwise apart.
    return float(s["b"] > 1) * s["b"] * s["n"] * s["d"]


def _traffic(gates: int, step_values: int, states: int) -> tuple[Term, ...]:
    """Bytes of the unrolled recurrence (the trace runs it step by step, ``ops.unfused``).

    The input projection reads x, W_ih (gates·d²) and its bias once and writes the gates of
    every position; each of the n steps reads h and the whole of W_hh and its bias again and
    writes its gates; the gate arithmetic moves ``step_values`` values per position and
    channel; the outputs are stacked (read and written) and so are the final ``states``
    (h, and c for an LSTM), each made as zeros first. With b > 1 the input is copied to
    time-major order and the input bias added apart (``_unfused_bias``).
    """
    g = gates
    return (
        values(2 * g + 4 + step_values, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
        values(g, "n·d²", lambda s: s["n"] * s["d"] * s["d"]),
        values(g, "n·d", lambda s: s["n"] * s["d"]),
        values(g, "d²", lambda s: s["d"] * s["d"]),
        values(g, "d", lambda s: s["d"]),
        values(3 * states, "b·d", lambda s: s["b"] * s["d"]),
        values(2 + 2 * g, "[b>1]·b·n·d", _unfused_bias),
    )


def _theory(gates: int, gate_work: int, step_values: int, states: int) -> LayerTheory:
    # One d x d product for the input and one for the hidden state, per gate: 2·2·gates·b·n·d².
    # ``gate_work``: elements per position and channel of the gate arithmetic (the adds of the
    # two products, the sigmoids and tanhs, the state update), plus the input bias per gate
    # where torch does not fuse it.
    flops = 4 * gates
    return LayerTheory(
        "O(n d^2)",
        (Term(flops, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] * s["d"]),),
        sequential="O(n)",
        path="O(n)",
        order=lambda s: s["n"] * s["d"] * s["d"],
        sequential_law=lambda s: float(s["n"]),
        path_law=lambda s: float(s["n"]),
        elementwise=(
            elements(gate_work, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
            elements(gates, "[b>1]·b·n·d", _unfused_bias),
        ),
        traffic=_traffic(gates, step_values, states),
    )


ENTRIES = (
    LayerEntry(
        "rnn",
        partial(RecurrentLayer, "rnn"),
        RECURRENT,
        "Elman RNN (tanh), hidden d",
        theory=_theory(1, 2, step_values=5, states=1),
    ),
    LayerEntry(
        "gru",
        partial(RecurrentLayer, "gru"),
        RECURRENT,
        "GRU, hidden d",
        theory=_theory(3, 10, step_values=27, states=1),
    ),
    LayerEntry(
        "lstm",
        partial(RecurrentLayer, "lstm"),
        RECURRENT,
        "LSTM, hidden d",
        theory=_theory(4, 13, step_values=34, states=2),
    ),
)
