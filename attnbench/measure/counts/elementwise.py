"""Elementwise work of one forward call, counted at the dispatcher.

FLOP counts see only matrix products, so the softmax over h·n² attention scores, or the
n·log n combinations of a parallel scan, are invisible to them. This counter adds up, for
every aten op of one call that computes on floating-point values:

- a pointwise op (torch's ``pointwise`` tag: add, mul, exp, tanh, masked_fill...): the
  elements it produces;
- a reduction (the ``reduction`` tag: sum, mean, amax...) and the ops that normalise or
  accumulate along a dimension without a tag (softmax, log-softmax, cumulative sums and
  products, layer, group, batch and RMS norms): the elements it reads;
- dropout and the gradients of elementwise ops, which carry no tag: the elements they produce;
- a fused attention kernel (``scaled_dot_product_attention``): the elementwise work of the
  explicit layer it replaces, counted from its shapes as its FLOPs are: the b·h·n·n_k scores
  scaled and normalised, and masked too when causal (a fused kernel may skip the masked half;
  the count states what the explicit computation does, as the FLOP count does).

Copies (``clone``, ``copy_``, ``_to_copy``) move data and compute nothing; integer and boolean
results (masks, indices) are bookkeeping: neither is counted. Like the FLOP count, the trace
runs with torch's fused paths off (``ops.unfused``), so a recurrence shows the work of each of
its steps and ``nn.MultiheadAttention`` its softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from attnbench.measure.counts.ops import (
    COMBINE,
    ObservingMode,
    elementwise_kind,
    floating,
    op_name,
    tensors,
    unfused,
)

ELEMENTWISE_METHOD = "traced"  # the elementwise_method of a counted case


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """An argument of an aten op by its schema name (None when absent)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else arg.default_value
    return None


def fused_attention_elements(q: torch.Tensor, k: torch.Tensor, causal: bool) -> int:
    """What the explicit layer computes elementwise on the scores a fused kernel keeps inside:
    scale and softmax (and the causal mask) over b·h·n·n_k scores."""
    scores = math.prod(q.shape[:-1]) * k.shape[-2]  # (B, h, n) x n_k
    return scores * (3 if causal else 2)


def elements_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """The elementwise work one aten op call did (0 for an op that is not elementwise)."""
    kind = elementwise_kind(func)
    if kind == "attention":
        causal = bool(_argument(func, args, kwargs, "is_causal"))
        return fused_attention_elements(args[0], args[1], causal)
    if kind == "along":
        source = args[0] if args else None
        return source.numel() if source is not None and floating(source) else 0
    if kind == "combine":
        source = _argument(func, args, kwargs, COMBINE[op_name(func).rstrip("_")])
        return source.numel() if floating(source) else 0
    if kind == "pointwise":
        return sum(t.numel() for t in tensors(out) if floating(t))
    return 0


class ElementCounter(ObservingMode):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.total += elements_of(func, args, kwargs, out)

    def result(self) -> int:
        return self.total


def count_elementwise(fn: Callable[[], object]) -> int:
    """Elementwise work (elements) of one call of ``fn``; pass a forward call."""
    counter = ElementCounter()
    with unfused(), torch.no_grad(), counter:
        fn()
    return counter.total
