"""One measured call of a case's layer on its seeded input: what the timing, the counts and
the memory pass of a case all call."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from attnbench.compiling import CompileSpec
from attnbench.devices import DTYPES
from attnbench.errors import AttnbenchError
from attnbench.layers.checks import output_problem
from attnbench.layers.decoding import State, decoder, prefill, state_bytes, stepped
from attnbench.layers.registry import build_layer, entry
from attnbench.measure.compiled import compiled
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
    """One measured call of a case's layer on its input (calling it runs the call).

    In decode mode ``x`` holds the n tokens before and the one stepped (B, n + 1, d), and
    ``state`` the state after the n (``layers.decoding``), which every call reads as it was.
    """

    layer: nn.Module
    x: torch.Tensor  # (B, n, d)
    call: Callable[[], torch.Tensor]
    state: State | None = None
    model: nn.Module | None = None  # the layer compiled (--compile): what ``call`` runs
    first: torch.Tensor | None = None  # decode: the step's output before any timed call

    def __call__(self) -> torch.Tensor:
        return self.call()

    def check(self, out: torch.Tensor) -> None:
        """The first call's answer at the case's own n: a layer maps (B, n, d) to (B, n, d), and
        one that answers in another shape fails its case (the plugin check tries one small n
        only: a layer that cut its output to 100 tokens passed it and was measured at n = 128
        and 256). A decode step's answer is checked where it is made."""
        if self.state is None and tuple(out.shape) != tuple(self.x.shape):
            raise LayerShapeError(
                f"the layer answered an input of shape {tuple(self.x.shape)} with shape "
                f"{tuple(out.shape)}: a sequence layer maps (batch, n, d) to (batch, n, d)"
            )

    def forward(self) -> torch.Tensor:
        """A plain call without gradients (what ``seq_steps`` describes, in any mode): the
        forward pass, or in decode mode the step itself."""
        with torch.no_grad():
            if self.state is not None:
                return self.call()
            return cast("torch.Tensor", self.layer(self.x))


class _Replayed(nn.Module):
    """A layer compiled to replay CUDA graphs (``--compile reduce-overhead``), called as a loop
    that keeps its outputs calls it: a new step begins before each call
    (``torch.compiler.cudagraph_mark_step_begin``), and the output is copied out of the graph's
    memory, which the next replay overwrites. The time holds that copy, b·n·d elements, as a
    caller's that keeps its outputs does (PyTorch's advice for cudagraph trees)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        torch.compiler.cudagraph_mark_step_begin()
        return cast("torch.Tensor", self.model(x)).clone()  # (B, n, d)


class LayerShapeError(AttnbenchError):
    """The layer's output is not its input's shape, (batch, n, d): the case fails."""


class NoDecodeStep(AttnbenchError):
    """The layer has no step to decode with: its decode cases are skipped, not failed."""


def make_step(case: Case, seed: int) -> Step:
    """One measured call: forward, or forward + backward (input and weight gradients)."""
    layer = build_layer(case.layer, case.d, seed=seed, **case.layer_options())
    layer = layer.to(device=case.device, dtype=DTYPES[case.dtype])
    if case.mode == "decode":
        return _decode_step(case, layer, seed)
    x = make_input(case, seed)  # (B, n, d)
    spec = CompileSpec.parse(case.compiled)
    if spec is not None:
        # The layer's lazy state (its positional table grown to n) is built by an eager call
        # before it is compiled, as in a model called before: a graph that replays CUDA graphs
        # must not write state the next replay overwrites (an H200 refused every attention
        # under reduce-overhead so), and the compiled call is not compiled twice for it.
        with torch.no_grad():
            layer(x)
    model = layer if spec is None else compiled(layer, spec)
    if spec is not None and spec.replays_graphs(case.device):
        model = _Replayed(model)
    if case.mode == "forward":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return cast("torch.Tensor", model(x))

        return Step(layer, x, forward, model=None if spec is None else model)

    # A training step runs the layer in training mode, as a training loop would: cuDNN's
    # recurrent backward refuses a module in eval mode, and a layer's dropout or batch norm
    # is part of what training it costs.
    layer.train()
    x_train = x.clone().requires_grad_(True)
    grad_out = torch.randn_like(x)  # (B, n, d)

    def train() -> torch.Tensor:
        layer.zero_grad(set_to_none=True)
        x_train.grad = None
        out = model(x_train)
        out.backward(grad_out)
        return cast("torch.Tensor", out)

    return Step(layer, x, train, model=None if spec is None else model)


def _decode_step(case: Case, layer: nn.Module, seed: int) -> Step:
    """The step of the token after n: the n before prefilled into the state (untimed), then
    checked once to answer in shape and keep its state's size, as a step must."""
    found = decoder(layer)
    if found is None:
        raise NoDecodeStep(
            f"layer {case.layer} has no decode step (give its module init_state and step: "
            "docs/generation.md#your-own-layer)"
        )
    x = make_input(dataclasses.replace(case, n=case.tokens), seed)  # (B, n + 1, d)
    with torch.no_grad():
        state = prefill(found, x[:, : case.n], case.tokens)
    token = x[:, case.n]  # (B, d)

    def decode() -> torch.Tensor:
        with torch.no_grad():
            out, _ = found.step(token, state, case.n)
            return out  # (B, d)

    held = state_bytes(state)
    with torch.no_grad():
        out, after = stepped(found.step(token, state, case.n), state)
    problem = output_problem(out, tuple(token.shape), token.dtype)
    if problem is not None:
        raise AttnbenchError(
            f"layer {case.layer}: its step maps a {tuple(token.shape)} token {problem}; a step "
            "must map (batch, d) to (batch, d) in the input's dtype"
        )
    grown = state_bytes(after)
    if grown > held:
        raise AttnbenchError(
            f"layer {case.layer}: its state grows on every step ({held} bytes at context "
            f"{case.n}, {grown} after one step at the same position); preallocate it for "
            "init_state's capacity and write the token's slot in place"
        )
    return Step(layer, x, decode, state, first=out.clone())


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
