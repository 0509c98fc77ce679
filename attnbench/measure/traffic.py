"""Bytes moved by one call, counted at the dispatcher: the traffic if nothing stays in cache.

For every aten op of one call, the bytes of each distinct tensor it reads (its tensor
arguments) and of each tensor it writes (its outputs) are added up:

- views and metadata-only ops (``view``, ``transpose``, ``expand``, ``detach``...) move
  nothing and are skipped (``ops.is_view``);
- an in-place op (``add_``) reads its operands, ``self`` included, and writes ``self``: both
  count, as the memory does both; an op that overwrites ``self`` (``fill_``, ``copy_``) or
  an ``out=`` argument writes it without reading it;
- ``empty`` and its kin write nothing (the memory is only reserved); ``_unsafe_view`` and
  ``alias`` return an input's memory under another shape, so they move nothing either;
- a tensor's bytes are its elements times their size, but never more than its storage (an
  expanded tensor that repeats one row reads that row's memory, not the repeats);
- a fused kernel (``scaled_dot_product_attention``, a oneDNN RNN) counts what it reads and
  writes at its boundary: the n x n scores it keeps inside never reach memory. Like the FLOP
  count, the trace runs with the fused paths that can be switched off switched off
  (``ops.unfused``), so explicit attention and the recurrences show every intermediate.

Caches are ignored on purpose: the count is what a call would move through memory if no byte
were reused, an upper bound on the traffic and the denominator of arithmetic intensity
(FLOPs / byte), the roofline's x axis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnbench.measure.ops import is_view, op_name, unfused

TRAFFIC_METHOD = "traced"
# Reserve memory without writing it.
NO_WRITE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
# Return an input's memory under another shape or name, though their schemas do not say so.
ALIASES = frozenset({"_unsafe_view", "alias", "_reshape_alias", "lift_fresh", "detach"})
# In-place ops that overwrite ``self`` without reading it.
OVERWRITE = frozenset({"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_"})


def tensor_bytes(t: torch.Tensor) -> int:
    """The memory one tensor occupies as an operand: elements times their size, capped by its
    storage (a broadcast view repeats memory it reads once)."""
    dense = t.numel() * t.element_size()
    try:
        return min(dense, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a wrapper)
        return dense


def _written_only(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
    """The tensors an op writes without reading: its ``out=`` arguments, and ``self`` of an op
    that overwrites it (``fill_``, ``copy_``)."""
    name = op_name(func)
    found = set()
    for i, arg in enumerate(func._schema.arguments):
        mutable = arg.alias_info is not None and arg.alias_info.is_write
        if mutable and (arg.name.startswith("out") or (arg.name == "self" and name in OVERWRITE)):
            value = kwargs.get(arg.name, args[i] if i < len(args) else None)
            found |= {id(t) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)}
    return found


def moves_data(func: Any) -> bool:
    """Whether an op is a real operation: not a view, nor a rename of an input's memory."""
    return not (is_view(func) or op_name(func) in ALIASES)


def op_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Bytes one aten op call reads and writes (0 for a view or a metadata-only op)."""
    name = op_name(func)
    if not moves_data(func):
        return 0
    skip = _written_only(func, args, kwargs)
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    read = sum(tensor_bytes(t) for t in {id(t): t for t in inputs if id(t) not in skip}.values())
    if name in NO_WRITE:
        return read
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return read + sum(tensor_bytes(t) for t in {id(t): t for t in outputs}.values())


@dataclass(frozen=True)
class Traffic:
    """What one call moved, and how many operations it dispatched to move and compute it (each
    pays the device's per-op latency: ``attnbench machine``'s ``op_latency_s``)."""

    bytes: int
    ops: int


class _TrafficCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if moves_data(func):
            self.total += op_bytes(func, args, kwargs, out)
            self.ops += 1
        return out


def count_traffic(fn: Callable[[], object]) -> Traffic:
    """Bytes read and written by one call of ``fn``, and the ops that did it (views and renames
    are neither)."""
    counter = _TrafficCounter()
    with unfused(), counter:
        fn()
    return Traffic(counter.total, counter.ops)


def count_bytes(fn: Callable[[], object]) -> int:
    """Bytes read and written by one call of ``fn``, every aten op's operands and results."""
    return count_traffic(fn).bytes
