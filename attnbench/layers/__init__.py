"""The layer registry: name -> builder.  Every layer maps (batch, n, d) to (batch, n, d)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from attnbench.errors import AttnbenchError
from attnbench.layers.attention import SelfAttentionLayer
from attnbench.layers.conv import ConvLayer, DilatedConvLayer
from attnbench.layers.local import LocalAttentionLayer
from attnbench.layers.recurrent import RecurrentLayer


@dataclass(frozen=True)
class LayerInfo:
    """How to build one architecture, and which grid options it takes (``k``, ``heads``,
    ``window``, and ``n`` for a layer whose depth depends on the length it must cover)."""

    name: str
    build: Callable[..., nn.Module]
    options: tuple[str, ...]
    description: str


LAYERS: dict[str, LayerInfo] = {
    info.name: info
    for info in (
        LayerInfo("conv", ConvLayer, ("k",), "Conv1d(d, d, k), 'same' padding"),
        LayerInfo(
            "conv-dilated",
            DilatedConvLayer,
            ("k", "n"),
            "causal Conv1d stack, dilation 1, k, k^2, ..., deep enough to cover n",
        ),
        LayerInfo("rnn", partial(RecurrentLayer, "rnn"), (), "Elman RNN (tanh), hidden d"),
        LayerInfo("gru", partial(RecurrentLayer, "gru"), (), "GRU, hidden d"),
        LayerInfo("lstm", partial(RecurrentLayer, "lstm"), (), "LSTM, hidden d"),
        LayerInfo(
            "attention",
            SelfAttentionLayer,
            ("heads",),
            "sinusoidal PE + multi-head self-attention, explicit n x n weights",
        ),
        LayerInfo(
            "attention-sdpa",
            partial(SelfAttentionLayer, fused=True),
            ("heads",),
            "the same layer through scaled_dot_product_attention (fused kernels)",
        ),
        LayerInfo(
            "attention-local",
            LocalAttentionLayer,
            ("heads", "window"),
            "restricted self-attention: r neighbours each side, blocked, O(r n d)",
        ),
    )
}

DEFAULTS: dict[str, int] = {"k": 3, "heads": 4, "window": 16}


def layer_names() -> tuple[str, ...]:
    return tuple(LAYERS)


def build_layer(name: str, d: int, *, seed: int = 0, **options: int) -> nn.Module:
    """Build layer ``name`` of width ``d`` in eval mode with weights drawn from ``seed``.

    ``options`` are the layer's own (``k`` for conv, ``heads`` and ``window`` for attention,
    ``n`` for conv-dilated); options that the layer does not take are ignored, so one grid can
    drive every layer.  The global RNG is left untouched.
    """
    info = LAYERS.get(name)
    if info is None:
        raise AttnbenchError(f"unknown layer {name!r}; accepted: {', '.join(LAYERS)}")
    if d < 1:
        raise AttnbenchError(f"d must be >= 1, got {d}")
    if "n" in info.options and "n" not in options:
        raise AttnbenchError(f"layer {name!r} is built for a length: pass n")
    kwargs = {opt: options.get(opt, DEFAULTS.get(opt)) for opt in info.options}
    for opt, value in kwargs.items():
        if value < 1:
            raise AttnbenchError(f"{opt} must be >= 1, got {value}")
    if "heads" in kwargs and d % kwargs["heads"]:
        raise AttnbenchError(f"d={d} is not divisible by heads={kwargs['heads']}")
    if name == "conv-dilated" and kwargs["k"] < 2:
        raise AttnbenchError(f"conv-dilated needs k >= 2, got k={kwargs['k']}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = info.build(d=d, **kwargs)
    return layer.eval()
