"""Generation: a layer run one token at a time, carrying a state from the tokens before.

A layer that can generate has two methods beside ``forward`` (the protocol ``Decoder``; a
plugin's module adds the same two to be measured in ``--mode decode``):

- ``init_state(batch, capacity)``: the state before any token, as a dict of tensors, sized for
  up to ``capacity`` tokens (a key/value cache is preallocated, as a static cache is, so a step
  neither allocates nor grows it);
- ``step(x, state, position)``: the token at ``position`` (0-based), x (batch, d), given the
  state of the ``position`` tokens before it; returns its output (batch, d) and the new state.

A step must leave what the state says about the earlier tokens as it was (it writes its own
slot in place, or returns new tensors): stepping the same token at the same position twice
gives the same output, so every timed call of a decode case sees a context of exactly n.
A layer may also have ``prefill(x, state)`` for the first tokens at once (x (batch, n, d),
returning the state after them), and ``causal_forward(x)``, the causal layer's parallel output
that the steps must reproduce (a layer without one is taken to be causal as it is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast, runtime_checkable

import torch
from torch import nn

from attnbench.devices import relative_difference
from attnbench.errors import AttnbenchError

State = dict[str, torch.Tensor]


@runtime_checkable
class Decoder(Protocol):
    """A layer that can generate one token at a time (see the module's docstring)."""

    def init_state(self, batch: int, capacity: int) -> State: ...

    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]: ...


def _what(value: object) -> str:
    """A value in a few words, for an error: "a Tensor", "None", "a tuple of 3"."""
    if value is None:
        return "None"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def checked_state(state: object, made_by: str) -> State:
    """The state, if it is one: a dict of tensors by name (else a one-line error)."""
    if not isinstance(state, dict):
        raise AttnbenchError(
            f"{made_by} must return the state as a dict of tensors, got {_what(state)}"
        )
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise AttnbenchError(
                f"{made_by} must return the state as a dict of tensors; {key!r} holds "
                f"{_what(value)}"
            )
    return cast("State", state)


def stepped(result: object, given: State) -> tuple[torch.Tensor, State]:
    """A step's answer, if it is one: (output, state), the state holding what the state it was
    ``given`` held (else a one-line error)."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise AttnbenchError(f"step must return (output, state), got {_what(result)}")
    out, state = result
    state = checked_state(state, "step")
    if set(state) != set(given):
        raise AttnbenchError(
            f"step returned a state of {sorted(state)}, where it was given {sorted(given)}; "
            "a step returns the state it was given, updated"
        )
    return cast("torch.Tensor", out), state


def decoder(layer: nn.Module) -> Decoder | None:
    """The layer as a ``Decoder``, or None for a layer without a step."""
    init = getattr(layer, "init_state", None)
    step = getattr(layer, "step", None)
    if callable(init) and callable(step):
        return cast("Decoder", layer)
    return None


def state_bytes(state: State) -> int:
    """The bytes the state's own tensors hold (each tensor counted once, views by their
    storage's share)."""
    seen: set[int] = set()
    total = 0
    for tensor in state.values():
        key = tensor.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += tensor.untyped_storage().nbytes()
    return total


def prefill(layer: Decoder, x: torch.Tensor, capacity: int) -> State:
    """The state after the tokens of x (batch, n, d): the layer's own ``prefill`` when it has
    one, else one step per token."""
    state = checked_state(layer.init_state(x.shape[0], capacity), "init_state")
    own = cast("Callable[[torch.Tensor, State], State] | None", getattr(layer, "prefill", None))
    if own is not None and x.shape[1] > 0:
        return checked_state(own(x, state), "prefill")
    for position in range(x.shape[1]):
        _, state = stepped(layer.step(x[:, position], state, position), state)
    return state


def decode_all(layer: Decoder, x: torch.Tensor) -> torch.Tensor:
    """Every token of x (batch, n, d) decoded one by one, stacked: (batch, n, d)."""
    state = checked_state(layer.init_state(x.shape[0], x.shape[1]), "init_state")
    outs = []
    for position in range(x.shape[1]):
        y, state = stepped(layer.step(x[:, position], state, position), state)  # (B, d)
        outs.append(y)
    return torch.stack(outs, dim=1)  # (B, n, d)


def causal_output(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The causal layer's parallel output on x (batch, n, d): what decoding must reproduce."""
    own = getattr(layer, "causal_forward", None)
    out = own(x) if callable(own) else layer(x)
    return cast("torch.Tensor", out)


def decode_error(layer: nn.Module, x: torch.Tensor) -> float:
    """The largest difference between the tokens decoded one by one and the causal layer's
    parallel output on x, relative to the output's largest magnitude."""
    found = decoder(layer)
    if found is None:
        raise TypeError(f"{type(layer).__name__} has no decode step")
    with torch.no_grad():
        stepped = decode_all(found, x)  # (B, n, d)
        parallel = causal_output(layer, x)  # (B, n, d)
    return relative_difference(stepped, parallel)
