"""Does attnbench's median agree with torch.utils.benchmark's blocked_autorange?

Same layer, same input and thread count, measured interleaved in one process (attnbench, then
torch, repeated),
for conv, rnn and attention at n=512, d=64.  Target: within 10%.

Each round times both back to back, so the round's ratio is free of the machine's drift between
rounds (this shared machine changes speed by tens of percent); the verdict is the median of the
per-round ratios.

    python benchmarks/timing_fidelity.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tb

from attnbench.measure import TimingPolicy, time_call
from attnbench.measure.case import make_step
from attnbench.spec import build_grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--d", type=int, default=64)
    args = parser.parse_args()
    policy = TimingPolicy()  # the sweep's defaults: 0.25 s budget per case
    print(f"{'layer':<10} {'attnbench':>11} {'torch':>11} {'paired':>7} {'ratios per round'}")
    worst = 0.0
    for layer in ("conv", "rnn", "attention"):
        grid = build_grid({"layers": layer, "n": [args.n], "d": [args.d], "device": "cpu"})
        case = grid.cases()[0]
        step = make_step(case, seed=0)
        # Timer defaults to one thread; measure both with the threads the sweep uses.
        timer = tb.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
        ours, theirs, ratios = [], [], []
        for _ in range(args.rounds):
            a = time_call(step, policy).median_s
            b = timer.blocked_autorange(min_run_time=0.25).median
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
        ratio = statistics.median(ratios)
        worst = max(worst, abs(ratio - 1))
        ours_ms, theirs_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        print(
            f"{layer:<10} {ours_ms:>8.3f} ms {theirs_ms:>8.3f} ms {ratio:>7.3f} "
            f"{' '.join(f'{r:.3f}' for r in ratios)}"
        )
    print(f"largest disagreement (median of paired ratios): {worst:.1%} (target < 10%)")


if __name__ == "__main__":
    main()
