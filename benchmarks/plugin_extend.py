"""Seconds a long case of a plugin recurrence spends tracing its counts and memory, extended
from the probes (checked at n / 4) against traced in full (``ATTNBENCH_FULL_TRACE=1``).

A plugin layer has no theory to vouch for its law, so its long cases used to be traced in
full: a researcher's GRU at n = 4096 waited on the tracer. Each measurement runs in a fresh
count cache (nothing read from an earlier one) with the timing left out, both ways
interleaved, median of ``--repeats``.

    python benchmarks/plugin_extend.py [--n 1024,4096] [--d 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from attnbench.layers import REGISTRY, LayerEntry
from attnbench.measure.case import measure_case
from attnbench.measure.counts.countcache import Counting
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import build_grid

NO_TIMING = TimingPolicy(
    warmup_calls=0, min_block_s=0.0, min_samples=1, max_samples=1, budget_s=0.0
)


class PluginGRU(torch.nn.Module):
    """torch's GRU as a researcher would put it on the table: a plugin, no theory."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(d, d, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        return self.gru(x)[0]


class LoopRNN(torch.nn.Module):
    """An Elman recurrence written as a Python loop over the positions."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.step = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        h = torch.zeros_like(x[:, 0])  # (B, d)
        out = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.step(h) + x[:, t])  # (B, d)
            out.append(h)
        return torch.stack(out, dim=1)  # (B, n, d)


def seconds(layer: str, n: int, d: int, full: bool) -> tuple[float, str]:
    case = build_grid({"layers": layer, "n": [n], "d": [d], "device": "cpu"}).cases()[0]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNBENCH_CACHE_DIR"] = cache
        start = time.perf_counter()
        result = measure_case(
            case, policy=NO_TIMING, counting=Counting(cache=True, full_trace=full)
        )
        return time.perf_counter() - start, str(result.counts_source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1024,4096")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, module in (("plugin-gru", PluginGRU), ("loop-rnn", LoopRNN)):
        REGISTRY[name] = LayerEntry(name, module)
    print(f"{'layer':<11} {'n':>5}  {'extended s':>10}  {'full s':>7}  {'ratio':>5}  source")
    for name in ("plugin-gru", "loop-rnn"):
        for n in map(int, args.n.split(",")):
            short, full, source = [], [], ""
            for _ in range(args.repeats):  # interleaved: a neighbour slows both alike
                s, source = seconds(name, n, args.d, full=False)
                short.append(s)
                full.append(seconds(name, n, args.d, full=True)[0])
            a, b = statistics.median(short), statistics.median(full)
            print(f"{name:<11} {n:>5}  {a:>10.2f}  {b:>7.2f}  {a / b:>5.2f}  {source}")


if __name__ == "__main__":
    main()
