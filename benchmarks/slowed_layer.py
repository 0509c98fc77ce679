"""Layers made slower by a known amount, as plugin layers for the A/B benchmarks.

    attnbench ab --base-layers attention --layers benchmarks/slowed_layer.py:slowed
    attnbench ab --metric instructions --base-layers benchmarks/slowed_layer.py:plain_work \
        --layers benchmarks/slowed_layer.py:extra_work

``slowed``: the built-in attention, each call lengthened by ``percent`` of its own duration with
a busy wait (a real, proportional slowdown, noisy like the layer; its instruction count follows
the time it waits). ``extra_work``: the same attention, running its whole call once more every
ten calls: 10% more work, in time and in instructions alike, and deterministic (Callgrind counts
blocks of 10 calls, so each block holds exactly one extra call); ``plain_work`` is the same
wrapper without the extra call, its baseline.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from attnbench.layers import build_layer


class Slowed(nn.Module):
    """``inner``, each call lengthened by ``extra`` times its own duration (a busy wait)."""

    def __init__(self, inner: nn.Module, extra: float) -> None:
        super().__init__()
        self.inner = inner
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        start = time.perf_counter()
        out = self.inner(x)
        end = start + (time.perf_counter() - start) * (1 + self.extra)
        while time.perf_counter() < end:
            pass
        return out


class ExtraWork(nn.Module):
    """``inner``, with every ``every``-th call computed twice."""

    def __init__(self, inner: nn.Module, every: int) -> None:
        super().__init__()
        self.inner = inner
        self.every = every
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        self.calls += 1
        if self.calls % self.every == 0:
            self.inner(x)
        return self.inner(x)


def slowed(d: int, heads: int = 4, percent: int = 25) -> nn.Module:
    """attention, made ``percent``% slower with a busy wait."""
    return Slowed(build_layer("attention", d, heads=heads), percent / 100)


def extra_work(d: int, heads: int = 4) -> nn.Module:
    """attention, computing one call in ten twice (10% more work)."""
    return ExtraWork(build_layer("attention", d, heads=heads), 10)


def plain_work(d: int, heads: int = 4) -> nn.Module:
    """The same wrapper as ``extra_work`` with no extra call: the baseline that isolates it."""
    return ExtraWork(build_layer("attention", d, heads=heads), 10**9)
