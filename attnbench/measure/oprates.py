"""How many elements per second each elementwise op computes on this device.

A copy moves an element for the price of its bytes, but an ``exp`` or a ``tanh`` computes for
many times longer than it takes to move one (a 2-core CPU: 7 G elements/s for an add, 1 for an
exp, 0.3 for a tanh, on operands in cache). The machine model charges each elementwise op of a
call the larger of its elements over its op's rate and its bytes over the bandwidth, so the
rates of the ops layers use are measured here, on operands that stay in cache (their memory
cost is the bandwidth's part). An op not in the catalogue runs at an add's rate
(``Ceilings.elementwise_rate``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Each op by its aten name (trailing "_" of in-place variants dropped, as ``kernels`` writes
# it), as a call on x and y (rows, 256), a boolean mask of x's shape: the elements it computes
# are x's (its output's, or for a reduction or a softmax the input's).
CATALOGUE: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]] = {
    "add": lambda x, y, m: torch.add(x, y),
    "sub": lambda x, y, m: torch.sub(x, y),
    "mul": lambda x, y, m: torch.mul(x, y),
    "div": lambda x, y, m: torch.div(x, y),
    "neg": lambda x, y, m: torch.neg(x),
    "pow": lambda x, y, m: torch.pow(x, 2.0),
    "exp": lambda x, y, m: torch.exp(x),
    "log": lambda x, y, m: torch.log(x.abs()),
    "sqrt": lambda x, y, m: torch.sqrt(y),
    "rsqrt": lambda x, y, m: torch.rsqrt(y),
    "sin": lambda x, y, m: torch.sin(x),
    "cos": lambda x, y, m: torch.cos(x),
    "tanh": lambda x, y, m: torch.tanh(x),
    "sigmoid": lambda x, y, m: torch.sigmoid(x),
    "relu": lambda x, y, m: torch.relu(x),
    "gelu": lambda x, y, m: F.gelu(x),
    "silu": lambda x, y, m: F.silu(x),
    "elu": lambda x, y, m: F.elu(x),
    "softplus": lambda x, y, m: F.softplus(x),
    "masked_fill": lambda x, y, m: x.masked_fill(m, 0.0),
    "where": lambda x, y, m: torch.where(m, x, y),
    "_softmax": lambda x, y, m: torch.softmax(x, -1),
    "_log_softmax": lambda x, y, m: torch.log_softmax(x, -1),
    "sum": lambda x, y, m: x.sum(-1),
    "mean": lambda x, y, m: x.mean(-1),
    "amax": lambda x, y, m: x.amax(-1),
    "cumsum": lambda x, y, m: x.cumsum(-1),
}
WIDTH = 256  # the operands' last dimension
# Elements of each operand: 256 KiB at float32 on the CPU, in cache; larger elsewhere.
ELEMENTS = {"cpu": 2**16, "cuda": 2**24, "mps": 2**22}


def operands(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y (rows, 256) of ``dtype`` on ``device`` (y positive) and a mask of x's shape."""
    elements = ELEMENTS.get(device.split(":")[0], ELEMENTS["cpu"])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(elements // WIDTH, WIDTH, generator=gen)  # (rows, 256)
    y = torch.rand(elements // WIDTH, WIDTH, generator=gen) + 0.5  # (rows, 256), positive
    mask = x > 0  # (rows, 256)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype), mask.to(device)
