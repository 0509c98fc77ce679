"""WaveNet's dilated stack: causal convolutions with dilation 1, k, k^2, ... until every output
sees every earlier input, so the path is the table's O(log_k n) and the cost O(k n d^2 log_k n).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers.conv import K
from attnbench.layers.entry import Family, LayerEntry
from attnbench.theory import DecodeTheory, LayerTheory, Sizes, Term, values


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

    # ------------------------------------------------------------------------- decoding
    # Level i (dilation k^i) needs its input at t, t - k^i, ..., t - (k-1)·k^i: each level keeps
    # a ring buffer of its inputs, the one at t in slot t % size. With size = (k-1)·k^i + 1 the
    # k taps of any t lie in size consecutive positions, so in distinct slots; a buffer one
    # slot shorter would put t where t - (k-1)·k^i is, and writing t there would lose a tap
    # that the step itself, or the same step repeated, still reads. A slot not yet written
    # holds zeros: the left padding. The state is the stack's receptive field, k^L - 1 + L
    # tokens per channel.

    def _levels(self) -> list[tuple[CausalConv, int]]:
        """Each level's convolution and its ring buffer's size."""
        stages = [cast("CausalConv", stage) for stage in self.stages]
        return [(stage, stage.left + 1) for stage in stages]

    def init_state(self, batch: int, capacity: int) -> dict[str, torch.Tensor]:
        levels = self._levels()
        weight = levels[0][0].conv.weight
        d = weight.shape[0]
        return {
            f"level{i}": torch.zeros(batch, size, d, dtype=weight.dtype, device=weight.device)
            for i, (_, size) in enumerate(levels)
        }  # level i: (B, (k-1)·k^i + 1, d)

    def prefill(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stack run on x (B, n, d), each level's last inputs kept in their slots."""
        n = x.shape[1]
        for i, (stage, size) in enumerate(self._levels()):
            start = max(0, n - size)
            slots = torch.arange(start, n, device=x.device) % size  # (m,)
            state[f"level{i}"][:, slots] = x[:, start:]  # (B, m, d), m = min(n, size)
            x = stage(x)  # (B, n, d)
        return state

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], position: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The token x (B, d) at ``position``, through every level: its input into its slot s,
        then the kernel over the k taps, the oldest first. The taps are the slots s, s - k^i,
        ... down to 0, and, wrapped round the ring, s + 1, s + 1 + k^i, ... (earlier): two
        strided slices, no index tensor to build (or copy to the device) on every step."""
        for i, (stage, size) in enumerate(self._levels()):
            ring = state[f"level{i}"]  # (B, size, d)
            slot = position % size
            ring[:, slot] = x  # (B, d), in place
            dilation = stage.conv.dilation[0]
            wrapped = ring[:, slot + 1 :: dilation]  # (B, k - 1 - slot // k^i, d), the oldest
            recent = ring[:, slot % dilation : slot + 1 : dilation]  # (B, slot // k^i + 1, d)
            window = torch.cat([wrapped, recent], dim=1).transpose(1, 2)  # (B, d, k)
            x = F.conv1d(window, stage.conv.weight, stage.conv.bias).squeeze(-1)  # (B, d)
        return x, state


# ----------------------------------------------------------------------------- entries

DILATED = Family("convolutional (dilated)", rank=20, rival=True, kin="convolutional")


def _depth(s: Sizes) -> float:
    # n may be fractional (a chart's dense line, a crossover search): the depth covers it. A
    # cross-layer model reads this term at every case's sizes: at another layer's k of 1 (a
    # conv of kernel 1, which no stack can be) it has no value.
    if s["k"] < 2:
        return math.nan
    return float(dilated_depth(s["n"], s["k"]))  # type: ignore[arg-type]  # a theory reads sizes as floats; the depth is exact in ints


def _step_depth(s: Sizes) -> float:
    """The depth of a stack that decodes at context n: built for its n + 1 tokens."""
    return _depth({**s, "n": s["n"] + 1})


def _receptive(s: Sizes) -> float:
    """b·(k^L + L - 1)·d: the ring buffers' (k-1)·k^i + 1 slots, summed over the L levels."""
    depth = _step_depth(s)
    return float(s["b"] * (s["k"] ** depth + depth - 1) * s["d"])


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
            decode=DecodeTheory(
                "O(k d^2 log_k n)",
                "O(k^L d)",
                # Each of the L levels of a stack built for n + 1 tokens: one kernel, 2·b·k·d².
                (
                    Term(
                        2,
                        "L·b·k·d²",
                        lambda s: _step_depth(s) * s["b"] * s["k"] * s["d"] * s["d"],
                    ),
                ),
                (values(1, "b·(k^L+L-1)·d", _receptive),),
                "causal: each level's ring buffer of (k-1)·k^i + 1 inputs, written in place",
                order=lambda s: _step_depth(s) * s["k"] * s["d"] * s["d"],
                sequential="O(log_k n)",
                elementwise=(),  # the bias is added inside each convolution
                sequential_law=_step_depth,  # its L levels, one after the other
            ),
        ),
        needs_length=True,
    ),
)
