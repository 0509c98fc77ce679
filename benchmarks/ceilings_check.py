"""Are attnbench's ceilings the machine's? Against measurements that share none of its code.

``attnbench machine --remeasure --json`` (its GEMM, its copy) beside torch.utils.benchmark's
``blocked_autorange`` of a 2048³ product at the same threads, and numpy's ``copyto`` of 256 MiB
(bytes read + written, median of 10). The issue's target: within 25%.

    python benchmarks/ceilings_check.py [--rounds 3]

Each round measures both, interleaved; read the ratios, not the rates (this machine is shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def ours() -> dict[str, float]:
    command = [sys.executable, "-m", "attnbench", "machine", "--remeasure", "--json",
               "--device", "cpu"]  # fmt: skip
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def theirs(threads: int) -> tuple[float, float]:
    import numpy as np
    import torch
    import torch.utils.benchmark as tb

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    timer = tb.Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads)
    gemm = 2 * 2048**3 / timer.blocked_autorange(min_run_time=1.0).median
    src = np.ones(2**26, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return gemm, 2 * src.nbytes / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    peaks, bandwidths = [], []
    for r in range(args.rounds):
        found = ours()
        gemm, copy = theirs(int(found["threads"]))
        peaks.append(found["peak_flops_per_s"] / gemm)
        bandwidths.append(found["bandwidth_bytes_per_s"] / copy)
        print(f"round {r + 1}: attnbench {found['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, "
              f"{found['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; torch.utils.benchmark "
              f"{gemm / 1e9:.1f} GFLOP/s, numpy {copy / 1e9:.1f} GB/s")  # fmt: skip
    print(f"median ratio, peak FLOP/s: {statistics.median(peaks):.2f}; bandwidth: "
          f"{statistics.median(bandwidths):.2f} (target: within 0.75-1.25)")  # fmt: skip


if __name__ == "__main__":
    main()
