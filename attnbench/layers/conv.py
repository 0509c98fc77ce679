"""A convolution over the sequence: one layer mixes k neighbouring tokens, O(k n d^2), and a
route from the first token to the last takes about n / (k / 2) layers (the table's O(n/k))."""

from __future__ import annotations

import warnings
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers.entry import Family, LayerEntry, LayerOption
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, values


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

    # ------------------------------------------------------------------------- decoding
    # The centred convolution sees (k-1)/2 tokens ahead, which a generator does not have: its
    # decode form is the same weights applied causally, each output seeing the (k-1)·dilation
    # tokens before it and itself. The state is those tokens; a step returns a new one.

    @property
    def _reach(self) -> int:
        """How many tokens before it an output sees: (k-1)·dilation."""
        return (self.conv.kernel_size[0] - 1) * self.conv.dilation[0]

    def _causal(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, d, m) -> (B, d, m - reach)
        return F.conv1d(x, self.conv.weight, self.conv.bias, dilation=self.conv.dilation)

    def causal_forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        """The same weights, causal: left padding of (k-1)·dilation zeros."""
        y = self._causal(F.pad(x.transpose(1, 2), (self._reach, 0)))  # (B, d, n)
        return y.transpose(1, 2)  # (B, n, d)

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        weight = self.conv.weight
        past = torch.zeros(
            batch, self._reach, weight.shape[0], dtype=weight.dtype, device=weight.device
        )
        return {"x": past}  # (B, (k-1)·dilation, d): the tokens before, zeros before the first

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The last (k-1)·dilation tokens of x (B, n, d), zeros before the first."""
        seen = torch.cat([state["x"], x], dim=1)  # (B, reach + n, d)
        return {"x": seen[:, seen.shape[1] - self._reach :].clone()}  # (B, reach, d)

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d): the kernel over the tokens before and it; the new state is a
        new tensor (the window without its oldest token), the given one is left as it was."""
        window = torch.cat([state["x"], x.unsqueeze(1)], dim=1)  # (B, reach + 1, d)
        y = self._causal(window.transpose(1, 2)).squeeze(-1)  # (B, d)
        return y, {"x": window[:, 1:].clone()}  # (B, reach, d)


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
            decode=DecodeTheory(
                "O(k d^2)",
                "O(k d)",
                # The kernel over the k-1 tokens before and the token: 2·b·k·d².
                (Term(2, "b·k·d²", lambda s: s["b"] * s["k"] * s["d"] * s["d"]),),
                (values(1, "b·(k-1)·d", lambda s: s["b"] * (s["k"] - 1) * s["d"]),),
                "causal form of the centred conv: the k-1 tokens before",
                order=lambda s: s["k"] * s["d"] * s["d"],
                elementwise=(),  # the bias is added inside the convolution
            ),
        ),
    ),
)
