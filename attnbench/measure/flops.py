"""FLOPs counted from the real call, checked against the analytic table in ``attnbench.theory``.

``torch.utils.flop_counter.FlopCounterMode`` sees the aten ops a call dispatches.  Two gaps make it
silently report 0, and both are closed here:
- fused recurrent kernels (oneDNN LSTM on CPU, cuDNN RNNs on CUDA) hide their matrix products in
  one opaque op: the count is taken with those backends disabled, so the same layer runs its
  products as visible ``mm``/``addmm`` ops;
- the CPU flash-attention op of ``scaled_dot_product_attention`` has no formula in torch: it is
  mapped to torch's own SDPA formula.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

RELATIVE_TOLERANCE = 0.01  # counted vs analytic: agreement within 1%


def _cpu_sdpa_flop(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return flop_counter.sdpa_flop_count(q, k, v)


def _cpu_sdpa_backward_flop(
    grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, q, k, v)


def _custom_mapping() -> dict[Any, Callable[..., int]]:
    aten = torch.ops.aten
    mapping: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_flop
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_backward_flop
    return mapping


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn``, with fused recurrent backends disabled while counting."""
    counter = FlopCounterMode(display=False, custom_mapping=_custom_mapping())
    with ExitStack() as stack:
        # The mkldnn flags context re-applies a TF32 setting that warns on CPU-only builds.
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", UserWarning)
        stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        stack.enter_context(counter)
        fn()
    return int(counter.get_total_flops())


def flops_agree(counted: float, analytic: float) -> bool:
    """True when the counted value is within ``RELATIVE_TOLERANCE`` of the analytic one."""
    if analytic == 0:
        return counted == 0
    return abs(counted - analytic) / analytic <= RELATIVE_TOLERANCE
