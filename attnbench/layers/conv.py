"""A convolution over the sequence: one layer mixes k neighbouring tokens, O(k n d^2), and a
route from the first token to the last takes about n / (k / 2) layers (the table's O(n/k))."""

from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import nn

from attnbench.layers.entry import Family, LayerEntry, LayerOption
from attnbench.theory import LayerTheory, Sizes, Term, values


class ConvLayer(nn.Module):
    """``nn.Conv1d(d, d, k, dilation)`` with 'same' padding, on (batch, n, d) tokens."""

    def __init__(self, d: int, k: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, k, padding="same", dilation=dilation)
        self._first_call = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        if not self._first_call:
            return cast(
                "torch.Tensor", self.conv(x.transpose(1, 2)).transpose(1, 2)
            )  # (B, d, n) -> (B, n, d)
        # Even k pads asymmetrically through a zero-padded copy; that copy is real cost and is
        # measured, so torch's warning adds nothing. torch warns once per process, on a first
        # call: silenced there only, since catch_warnings costs 24 us a call (a third of a
        # conv's time at n = 32, d = 32, measured on every call until this was seen).
        self._first_call = False
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
            y = self.conv(x.transpose(1, 2))  # (B, d, n)
        return cast("torch.Tensor", y.transpose(1, 2))  # (B, n, d)

    def mixing_stages(self) -> list[nn.Module]:
        return [self]


# ----------------------------------------------------------------------------- entries


def _even_padding(s: Sizes) -> float:
    return float(s["k"] % 2 == 0) * s["b"] * (s["n"] + 1) * s["d"]


K = LayerOption("k", 3, "k", "Conv kernel size.", at_most_n=True, reach=True)
CONVOLUTIONAL = Family("convolutional", rank=10, rival=True, chapter=True)


ENTRIES = (
    LayerEntry(
        "conv",
        ConvLayer,
        CONVOLUTIONAL,
        "Conv1d(d, d, k), 'same' padding",
        (K,),
        LayerTheory(
            "O(k n d^2)",
            (Term(2, "b·n·k·d²", lambda s: s["b"] * s["n"] * s["k"] * s["d"] * s["d"]),),
            path="O(n/k)",
            order=lambda s: s["k"] * s["n"] * s["d"] * s["d"],
            path_law=lambda s: s["n"] / s["k"],
            elementwise=(),  # the bias is added inside the convolution
            # The convolution reads x, the k·d² weights and the bias and writes y; an even k
            # pads its one odd position through a copy first (x read, n + 1 positions written,
            # then read by the convolution, which pads the rest symmetrically in place).
            traffic=(
                values(2, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),
                values(1, "k·d²", lambda s: s["k"] * s["d"] * s["d"]),
                values(1, "d", lambda s: s["d"]),
                values(2, "[k even]·b·(n+1)·d", _even_padding),
            ),
        ),
    ),
)
