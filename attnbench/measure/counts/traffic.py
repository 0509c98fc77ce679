"""Bytes moved by one call, counted at the dispatcher: the traffic if nothing stays in cache.

For every aten op of one call, the bytes of each distinct tensor it reads (its tensor
arguments) and of each tensor it writes (its outputs) are added up:

- views and metadata-only ops (``view``, ``transpose``, ``expand``, ``detach``...) move
  nothing and are skipped (``ops.is_view``);
- an in-place op (``add_``) reads its operands, ``self`` included, and writes ``self``: both
  count, as the memory does both; an op that overwrites ``self`` (``fill_``, ``copy_``) or
  an ``out=`` argument writes it without reading it;
- ``zeros_like`` and its kin read only their argument's shape, so only their writes count;
- ``empty`` and its kin write nothing (the memory is only reserved); ``_unsafe_view``,
  ``alias`` and ``unsafe_split`` return an input's memory under another shape, and
  ``transpose_`` and its kin change only a tensor's strides, so they move nothing either;
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

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from attnbench.measure.counts.elementwise import elements_of
from attnbench.measure.counts.flops import formulas
from attnbench.measure.counts.ops import (
    FUSED_ATTENTION,
    ObservingMode,
    moves_data,
    op_name,
    tensors,
    unfused,
)

TRAFFIC_METHOD = "traced"
# The ``kernels`` entries of elementwise ops: "ew.exp:ELEMENTS:BYTES" (the products' have none).
ELEMENTWISE_PREFIX = "ew."
# Reserve memory without writing it.
NO_WRITE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
# Make a tensor shaped like their tensor argument, reading only its shape, dtype and device.
NO_READ = frozenset(
    {
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
    }
)
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
            found |= {id(t) for t in tensors(value)}
    return found


def op_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Bytes one aten op call reads and writes (0 for a view or a metadata-only op)."""
    name = op_name(func)
    if not moves_data(func):
        return 0
    skip = _written_only(func, args, kwargs)
    inputs = tensors((args, kwargs))
    if name in NO_READ:
        inputs = []
    read = sum(tensor_bytes(t) for t in {id(t): t for t in inputs if id(t) not in skip}.values())
    if name in NO_WRITE:
        return read
    outputs = tensors(out)
    return read + sum(tensor_bytes(t) for t in {id(t): t for t in outputs}.values())


@dataclass(frozen=True)
class Traffic:
    """What one call moved, and how many operations it dispatched to move and compute it (each
    pays the device's per-op latency: ``attnbench machine``'s ``op_latency_s``).

    ``product_bytes`` is the part of ``bytes`` the ops with a FLOP formula (the matrix
    products) moved: a product can be compute-bound, the rest of the traffic (elementwise ops,
    copies) is memory-bound whatever the machine, so the machine model needs the two apart.
    """

    bytes: int
    ops: int
    product_bytes: int = 0
    # Every product by kind and narrow width ("gemm@64", "conv@32", "attention@16"): its
    # (FLOPs, bytes); each kind runs at its own rate, which grows with the width. And every
    # elementwise op by name ("ew.exp"): its (elements, bytes); an exp costs many adds.
    kernels: dict[str, tuple[int, int]] = field(default_factory=dict)

    def kernels_text(self) -> str:
        """The results' ``kernels`` column: "conv@64:FLOPS:BYTES; ew.exp:ELEMENTS:BYTES"."""
        return format_kernels(self.kernels)


def format_kernels(kernels: Mapping[str, tuple[int, int]]) -> str:
    """{kind: (FLOPs, bytes)} as the ``kernels`` column writes it."""
    return "; ".join(f"{k}:{f}:{b}" for k, (f, b) in sorted(kernels.items()))


def kernel_kind(name: str) -> str:
    """The kind of product an op with a FLOP formula is: "conv", "attention" (a fused
    attention kernel, forward or backward), or "gemm" (a matrix multiplication)."""
    if "convolution" in name:
        return "conv"
    if name.removesuffix("_backward") in FUSED_ATTENTION:
        return "attention"
    return "gemm"


def product_width(func: Any, args: tuple[Any, ...]) -> int | None:
    """A product's narrow dimension, which its rate depends on (``Ceilings.rate``): the
    smaller of a matrix product's inner and output widths (min(k, n) of (m x k) @ (k x n): the
    rows m grow with the sequence and are left out), the smaller of a convolution's output
    channels and its reduction (input channels x kernel size), an attention's head width.
    None for a product of another shape."""
    name = op_name(func)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        kind = kernel_kind(name)
        if kind == "conv":
            weight = tensors[2] if name.endswith("_backward") else tensors[1]
            reduction = int(weight.shape[1]) * math.prod(int(s) for s in weight.shape[2:])
            return min(int(weight.shape[0]), reduction)
        if kind == "attention":
            q, _, v = tensors[1:4] if name.endswith("_backward") else tensors[:3]
            return min(int(q.shape[-1]), int(v.shape[-1]))
        a, b = tensors[-2:]  # mm, bmm, addmm, baddbmm, mv, dot: the two factors come last
        output = int(b.shape[-1]) if b.dim() > 1 else 1  # a vector out of mv or dot: 1 wide
        return min(int(a.shape[-1]), output)
    except (IndexError, ValueError):
        return None


def parse_kernels(text: object) -> dict[str, tuple[float, float]]:
    """The ``kernels`` column back as {kind: (FLOPs, bytes)} ({} where empty or unreadable)."""
    found: dict[str, tuple[float, float]] = {}
    for part in str(text or "").split(";"):
        pieces = part.strip().split(":")
        if len(pieces) == 3:
            try:
                found[pieces[0]] = (float(pieces[1]), float(pieces[2]))
            except ValueError:
                continue
    return found


class Kernel(NamedTuple):
    """One entry of the ``kernels`` column: a product (kind "gemm", "conv" or "attention";
    ``width`` its inner width, None where unknown or from a run before widths were kept; work in
    FLOPs) or an elementwise op (kind "ew"; ``op`` its name; work in elements), and its bytes."""

    kind: str
    width: int | None
    op: str
    work: float
    moved: float

    @property
    def product(self) -> bool:
        return self.kind != ELEMENTWISE


ELEMENTWISE = "ew"


def kernel_records(text: object) -> list[Kernel]:
    """The ``kernels`` column as typed records, each key read once."""
    found = []
    for key, (work, moved) in parse_kernels(text).items():
        if key.startswith(ELEMENTWISE_PREFIX):
            op = key.removeprefix(ELEMENTWISE_PREFIX)
            found.append(Kernel(ELEMENTWISE, None, op, work, moved))
        else:
            kind, _, width = key.partition("@")
            found.append(Kernel(kind, int(width) if width.isdigit() else None, "", work, moved))
    return found


def kernel_of(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    formulas: Mapping[Any, Callable[..., int]],
) -> tuple[str, int, bool]:
    """One data-moving op as the ``kernels`` column keys it, its work, and whether it is a
    product: ("gemm@16", FLOPs, True) for a product of a known width, ("ew.exp", elements,
    False) for any other op (0 elements: a copy, no kernel of its own)."""
    formula = formulas.get(func._overloadpacket)
    if formula is not None:
        width = product_width(func, args)
        kind = kernel_kind(op_name(func))
        return (
            (kind if width is None else f"{kind}@{width}"),
            int(formula(*args, **kwargs, out_val=out)),
            True,
        )
    work = elements_of(func, args, kwargs, out)
    return f"{ELEMENTWISE_PREFIX}{op_name(func).rstrip('_')}", work, False


class TrafficCounter(ObservingMode):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.ops = 0
        self.products = 0
        self.kernels: dict[str, tuple[int, int]] = {}
        self.formulas = formulas()

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if moves_data(func):
            moved = op_bytes(func, args, kwargs, out)
            self.total += moved
            self.ops += 1
            key, work, product = kernel_of(func, args, kwargs, out, self.formulas)
            if product:
                self.products += moved
            if product or work:
                done_work, done = self.kernels.get(key, (0, 0))
                self.kernels[key] = (done_work + work, done + moved)

    def result(self) -> Traffic:
        return Traffic(self.total, self.ops, self.products, self.kernels)


def count_traffic(fn: Callable[[], object]) -> Traffic:
    """Bytes read and written by one call of ``fn``, and the ops that did it (views and renames
    are neither)."""
    counter = TrafficCounter()
    with unfused(), counter:
        fn()
    return counter.result()
