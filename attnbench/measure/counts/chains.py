"""Sequential steps: the longest chain of dependent ops behind a call's output, traced at the
dispatcher (one forward call, or one decode step writing into its state)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from attnbench.measure.counts.ops import (
    ObservingMode,
    moves_data,
    storage_of,
    tensors,
    unfused,
    writes_in_place,
)


class ChainTracer(ObservingMode):
    """Gives every tensor the length of the longest op chain that produced it.

    ``buffers`` are a decode step's state: an op that writes into one in place (a token into
    its slot of a preallocated cache) passes its depth to the buffer, so a later read of any
    view of it (the cache's filled slots) continues the chain; without it a dilated stack's
    levels, each reading what the one before wrote into its ring, would read as one. Other
    in-place writes (into disjoint chunks of one tensor, as unfused LSTM cells make) are
    followed by their own tensor only, as they always were.
    """

    def __init__(self, buffers: Sequence[torch.Tensor] = ()) -> None:
        super().__init__()
        self.depth: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.buffers = {storage_of(t) for t in buffers}
        self.written: dict[int, int] = {}  # a buffer's storage -> its latest write's depth

    def _of(self, t: torch.Tensor) -> int:
        own = self.depth.get(t, 0)
        if not self.written:
            return int(own)
        return max(int(own), self.written.get(storage_of(t), 0))

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        inputs = tensors((args, kwargs))
        if inputs:
            base = max(self._of(t) for t in inputs)
            depth = base + 1 if moves_data(func) else base  # views, renames: no step
            for t in tensors(out):
                self.depth[t] = depth
            if self.buffers and writes_in_place(func):
                for t in tensors(out):
                    key = storage_of(t)
                    if key in self.buffers:
                        self.written[key] = max(self.written.get(key, 0), depth)


def sequential_steps(fn: Callable[[], torch.Tensor], buffers: Sequence[torch.Tensor] = ()) -> int:
    """Length of the longest chain of dependent ops behind ``fn()``'s output (one forward call,
    or a decode step writing into its state's ``buffers``)."""
    tracer = ChainTracer(buffers)
    with unfused(), torch.no_grad(), tracer:
        out = fn()
    return int(tracer.depth.get(out, 0))
