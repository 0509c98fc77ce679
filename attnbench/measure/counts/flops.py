"""FLOPs counted from the real call, checked against the analytic table in ``attnbench.theory``.

The count uses torch's own per-op formulas (``torch.utils.flop_counter.flop_registry``, the
table behind ``FlopCounterMode``) in a lean dispatch mode: ``FlopCounterMode`` adds per-op module
bookkeeping that doubled the cost of counting a 1024-step unfused LSTM (0.38 s against 0.18 s).

Three gaps make a plain count silently report 0, and all are closed here:
- fused paths (oneDNN LSTM on CPU, cuDNN RNNs on CUDA, the ``nn.MultiheadAttention`` and
  ``nn.TransformerEncoderLayer`` fast paths) hide their matrix products in one opaque op: the
  count is taken with them switched off (``ops.unfused``), so the same layer runs its products
  as visible ``mm``/``addmm``/``bmm`` ops;
- the CPU flash-attention op of ``scaled_dot_product_attention`` has no formula in torch: it is
  mapped to torch's own SDPA formula, and the matrix-vector products (``mv``, ``addmv``,
  ``dot``, ``addbmm``) get the formula of the matrix product they are, and a grouped
  convolution's backward gets its weight gradient counted per group (torch's counts it as if
  ungrouped: ``groups`` times over);
- any other op that computes on floating values with no formula and is not elementwise work
  or bookkeeping (``ops``) is named in the count's ``uncounted``: a count that misses work says
  so instead of reading low.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import flop_counter

from attnbench.measure.counts.ops import (
    ObservingMode,
    Uncounted,
    elements_touched,
    elementwise_kind,
    is_bookkeeping,
    op_name,
    unfused,
)

RELATIVE_TOLERANCE = 0.01  # counted vs analytic: agreement within 1%


def _cpu_sdpa_flop(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return int(flop_counter.sdpa_flop_count(q, k, v))


def _cpu_sdpa_backward_flop(
    grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    return int(flop_counter.sdpa_backward_flop_count(grad_out, q, k, v))


# The matrix-vector and vector products torch's table lacks (shapes in, as its formulas take
# them; a multiply-add is 2 FLOPs, and an added input is left out, as torch's addmm leaves it):
# x @ v with a 1-D v (a learned query scoring every position) runs ``mv``.
def _mv_flop(a: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return int(2 * a[0] * a[1])  # (m x k) @ (k)


def _addmv_flop(bias: Any, a: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return _mv_flop(a, v)


def _dot_flop(a: Any, b: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return int(2 * a[0])  # (n) . (n)


def _addbmm_flop(bias: Any, a: Any, b: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return int(2 * a[0] * a[1] * a[2] * b[2])  # Σ over the batch of (m x k) @ (k x n)


def _conv_backward_flop(
    grad_out: Any, x: Any, w: Any, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    """torch's formula for a convolution's backward, its weight gradient's term divided by
    ``groups``: torch counts that term as if every input channel met every output channel,
    which in a grouped convolution they do not (a depthwise conv of 64 channels read 64x its
    weight gradient's work in --mode train)."""

    def t(shape: Any) -> list[int]:  # (a, b, ...) -> (b, a, ...): the gradient as a conv
        return [shape[1], shape[0], *shape[2:]]

    # after the weight: bias, stride, padding, dilation, transposed, output padding, groups,
    # and which gradients to take
    transposed, groups, output_mask = bool(args[4]), int(args[6]), args[7]
    total = 0
    if output_mask[0]:  # the input's gradient: torch's count is right for groups
        grad_in = list(out_shape[0])
        total += flop_counter.conv_flop_count(list(grad_out), list(w), grad_in, not transposed)
    if output_mask[1]:
        weight = t(out_shape[1])
        found = (
            flop_counter.conv_flop_count(t(grad_out), t(x), weight)
            if transposed
            else flop_counter.conv_flop_count(t(x), t(grad_out), weight)
        )
        total += found // max(1, int(groups))
    return int(total)


def formulas() -> dict[Any, Callable[..., int]]:
    """torch's per-op formulas, plus the CPU fused-attention ops and the matrix-vector
    products it lacks."""
    table: dict[Any, Callable[..., int]] = dict(flop_counter.flop_registry)
    aten = torch.ops.aten
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa_flop),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_sdpa_backward_flop),
        ("mv", _mv_flop),
        ("addmv", _addmv_flop),
        ("dot", _dot_flop),
        ("vdot", _dot_flop),
        ("addbmm", _addbmm_flop),
        ("convolution_backward", _conv_backward_flop),
    ):
        if hasattr(aten, name):
            table[getattr(aten, name)] = flop_counter.shape_wrapper(formula)
    return table


@dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one call, and the ops whose work no formula or counter read."""

    total: int
    uncounted: str = ""  # ``ops.Uncounted.describe``: empty when every op was accounted for


class FlopCounter(ObservingMode):
    """Adds up the formula of every op that has one; names ops that are neither counted,
    elementwise work nor bookkeeping."""

    def __init__(self, formulas: dict[Any, Callable[..., int]]) -> None:
        super().__init__()
        self.formulas = formulas
        self.total = 0
        self.uncounted = Uncounted({})

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Count one op that ran (``measure.counts.census`` calls this for several counters at
        once)."""
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        elif elementwise_kind(func) is None and not is_bookkeeping(func, out):
            self.uncounted.add(f"aten.{op_name(func)}", elements_touched((args, kwargs), out))

    def result(self) -> FlopCount:
        return FlopCount(self.total, self.uncounted.describe())


def trace_flops(fn: Callable[[], object]) -> FlopCount:
    """FLOPs of one call of ``fn`` with torch's fused paths off, and what went uncounted."""
    counter = FlopCounter(formulas())
    with unfused(), counter:
        fn()
    return counter.result()


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` (``trace_flops`` without the uncounted ops)."""
    return trace_flops(fn).total


def flops_agree(counted: float, analytic: float) -> bool:
    """True when the counted value is within ``RELATIVE_TOLERANCE`` of the analytic one."""
    if analytic == 0:
        return counted == 0
    return abs(counted - analytic) / analytic <= RELATIVE_TOLERANCE
