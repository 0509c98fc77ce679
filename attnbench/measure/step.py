"""One measured call of a case's layer on its seeded input: what the timing, the counts and
the memory pass of a case all call."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from attnbench.devices import DTYPES
from attnbench.layers.registry import build_layer, entry
from attnbench.measure.counts.structure import LayerBuilder
from attnbench.spec import Case


def make_input(case: Case, seed: int) -> torch.Tensor:
    """The seeded (batch, n, d) input every layer of a case gets."""
    # seed + 1: the input must not be the same random stream as the layer's weights.
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(case.batch, case.n, case.d, generator=gen)  # (B, n, d)
    return x.to(device=case.device, dtype=DTYPES[case.dtype])


@dataclass(frozen=True)
class Step:
    """One measured call of a case's layer on its input (calling it runs the call)."""

    layer: nn.Module
    x: torch.Tensor  # (B, n, d)
    call: Callable[[], torch.Tensor]

    def __call__(self) -> torch.Tensor:
        return self.call()

    def forward(self) -> torch.Tensor:
        """A plain forward call (what ``seq_steps`` describes, in either mode)."""
        with torch.no_grad():
            return cast("torch.Tensor", self.layer(self.x))


def make_step(case: Case, seed: int) -> Step:
    """One measured call: forward, or forward + backward (input and weight gradients)."""
    layer = build_layer(case.layer, case.d, seed=seed, **case.layer_options())
    layer = layer.to(device=case.device, dtype=DTYPES[case.dtype])
    x = make_input(case, seed)  # (B, n, d)
    if case.mode == "forward":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return cast("torch.Tensor", layer(x))

        return Step(layer, x, forward)

    # A training step runs the layer in training mode, as a training loop would: cuDNN's
    # recurrent backward refuses a module in eval mode, and a layer's dropout or batch norm
    # is part of what training it costs.
    layer.train()
    x_train = x.clone().requires_grad_(True)
    grad_out = torch.randn_like(x)  # (B, n, d)

    def train() -> torch.Tensor:
        layer.zero_grad(set_to_none=True)
        x_train.grad = None
        out = layer(x_train)
        out.backward(grad_out)
        return cast("torch.Tensor", out)

    return Step(layer, x, train)


def layer_builder(case: Case, seed: int) -> LayerBuilder:
    """Builds the case's layer for any length n (for path-length probes), keyed by its layer,
    its code (the source it was registered from: a plugin registered again with other code
    under the same name is another layer), options and seed."""
    options = case.layer_options()

    def build(n: int) -> nn.Module:
        return build_layer(case.layer, case.d, seed=seed, **{**options, "n": n})

    return LayerBuilder(build, (case.layer, entry(case.layer).source, case.options, seed))


def release_memory(device: str) -> None:
    """Give memory held by a failed case back, so the next case starts clean."""
    gc.collect()  # the failed call's tensors may sit in reference cycles through its traceback
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()
