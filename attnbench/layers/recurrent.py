"""Recurrent layers: one hidden-state update per token, O(n d^2) work in n sequential steps."""

from __future__ import annotations

from functools import partial
from typing import cast

import torch
from torch import nn

from attnbench.layers.entry import Family, LayerEntry
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, elements, values

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

    # ------------------------------------------------------------------------- decoding
    # Causal as it is: the state is the hidden state h (and an LSTM's cell c), (1, B, d) as
    # torch's module takes it. A step is the module's own call on a sequence of one token,
    # which returns new states and leaves the given ones as they were.

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        weight = next(self.rnn.parameters())
        d = self.rnn.hidden_size
        names = ("h", "c") if self.kind == "lstm" else ("h",)
        return {
            name: torch.zeros(1, batch, d, dtype=weight.dtype, device=weight.device)
            for name in names
        }  # each (1, B, d)

    def _run(
        self, x: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The module over x (B, m, d) from the state: its outputs (B, m, d), the new state."""
        if self.kind == "lstm":
            out, (h, c) = self.rnn(x, (state["h"], state["c"]))  # (B, m, d), (1, B, d) x 2
            return cast("torch.Tensor", out), {"h": h, "c": c}
        out, h = self.rnn(x, state["h"])  # (B, m, d), (1, B, d)
        return cast("torch.Tensor", out), {"h": h}

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The module over the prefix x (B, n, d) in one call; only its last state kept."""
        return self._run(x, state)[1]

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d): one step of the recurrence, h (and c) updated."""
        out, new = self._run(x.unsqueeze(1), state)  # (B, 1, d)
        return out.squeeze(1), new  # (B, d)


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
        decode=DecodeTheory(
            "O(d^2)",
            "O(d)",
            # One step of the recurrence: the forward's work at n = 1, the input bias added
            # apart from its product for b > 1 too (counted so at b = 1 and 2).
            (Term(flops, "b·d²", lambda s: s["b"] * s["d"] * s["d"]),),
            (values(states, "b·d", lambda s: s["b"] * s["d"]),),
            "causal as it is: the hidden state" + (" and the cell" if states == 2 else ""),
            order=lambda s: s["d"] * s["d"],
            elementwise=(
                elements(gate_work, "b·d", lambda s: s["b"] * s["d"]),
                elements(gates, "[b>1]·b·d", lambda s: float(s["b"] > 1) * s["b"] * s["d"]),
            ),
        ),
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
