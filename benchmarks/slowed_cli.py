"""The attnbench CLI with one layer made slower by a known fraction: the A/B benchmark's B.

    python benchmarks/slowed_cli.py LAYER FRACTION sweep [options]

Each call of LAYER runs the real layer, then waits (busy, on the CPU) until FRACTION more of the
time it took has passed, so the slowdown is real, proportional, and noisy like the layer itself.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench.cli import main
from attnbench.layers import REGISTRY


class Slowed(nn.Module):
    """``inner``, each call lengthened by ``extra`` times its own duration (a busy wait)."""

    def __init__(self, inner: nn.Module, extra: float) -> None:
        super().__init__()
        self.inner = inner
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = self.inner(x)  # (B, n, d)
        end = start + (time.perf_counter() - start) * (1 + self.extra)
        while time.perf_counter() < end:
            pass
        return out


def slow_down(name: str, extra: float) -> None:
    entry = REGISTRY[name]

    def build(d: int, **kwargs: Any) -> nn.Module:
        return Slowed(entry.build(d, **kwargs), extra)

    slowed = f"{entry.description}, slowed {extra:+.0%}"
    REGISTRY[name] = replace(entry, build=build, description=slowed)


if __name__ == "__main__":
    layer, fraction, *rest = sys.argv[1:]
    slow_down(layer, float(fraction))
    sys.argv = ["attnbench", *rest]
    main()
