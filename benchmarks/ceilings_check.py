"""Are attnbench's ceilings the machine's? Against measurements that share none of its code.

``attnbench machine --remeasure --json`` (its GEMM, its copy) beside torch.utils.benchmark's
``blocked_autorange`` of a 2048³ product and of a copy of 256 MiB (bytes read + written), both
at the same threads, and numpy's ``copyto`` of the same 256 MiB (median of 10), which runs on one
thread: on this 2-core VM one thread does not fill the memory bus, so numpy's rate is shown
beside, not judged. The issue's target: within 25%.

    python benchmarks/ceilings_check.py [--rounds 3] [--policies [--median]]

Each round measures both, interleaved; read the ratios, not the rates (this machine is shared).

``--policies``: how repeatable the whole set of ceilings is (every rate of every curve) and how
long it takes, under the timing policies it uses now against those it used before (each
kernel sampled on past its min_time while its IQR/median was above 5%, up to three times it;
with ``--median``, its median read instead of its fastest, as before 9d9f999; with
``--against curves``, the policies of now but each curve point sampled in blocks of 1 ms for
8 ms, as before they took 0.5 ms for 4 ms), interleaved for ``--rounds`` rounds in this
process: per kernel, the largest reading over the smallest across rounds, and its median and
90th percentile over the kernels.
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


def theirs(threads: int) -> tuple[float, float, float]:
    """FLOP/s of a 2048³ product and bytes/s of a 256 MiB copy (torch.utils.benchmark, at
    ``threads``), and bytes/s of numpy's one-thread copy of the same arrays."""
    import numpy as np
    import torch
    import torch.utils.benchmark as tb

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    timer = tb.Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads)
    gemm = 2 * 2048**3 / timer.blocked_autorange(min_run_time=1.0).median
    src = torch.ones(2**26)  # 256 MiB of float32
    dst = torch.empty_like(src)
    copier = tb.Timer("dst.copy_(src)", globals={"src": src, "dst": dst}, num_threads=threads)
    copy = 2 * src.nbytes / copier.blocked_autorange(min_run_time=1.0).median
    src_np, dst_np = src.numpy(), dst.numpy()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        np.copyto(dst_np, src_np)
        times.append(time.perf_counter() - start)
    return gemm, copy, 2 * src_np.nbytes / statistics.median(times)


def flat(ceilings: object) -> dict[str, float]:
    """Every rate of a Ceilings, by a short name (``gemm_rates`` at 8 is ``gemm@8``)."""
    found = {key: getattr(ceilings, key)
             for key in ("peak_flops_per_s", "bandwidth_bytes_per_s", "op_latency_s")}  # fmt: skip
    for curve in ("gemm_rates", "conv_rates", "attention_rates", "recurrent_rates",
                  "elementwise_rates"):  # fmt: skip
        for width, rate in (getattr(ceilings, curve) or {}).items():
            found[f"{curve.split('_')[0]}@{width}"] = rate
    return found


def policies(rounds: int, median: bool = False, against: str = "spread") -> None:
    import dataclasses

    from attnbench.devices import device_sync
    from attnbench.measure.machine import probes as ceilings
    from attnbench.measure.machine import rates
    from attnbench.measure.timing.loop import time_call

    def median_s(name: str, fn: object, policy: object) -> float:
        return time_call(fn, policy, sync=device_sync("cpu")).median_s  # type: ignore[arg-type]

    now = (rates.CURVE_POLICY, ceilings.CEILING_POLICY, ceilings.LATENCY_POLICY, None)
    # The curves' points in blocks of 1 ms to 8 ms (to 2026-11-26, the second session).
    curves = dataclasses.replace(rates.CURVE_POLICY, min_block_s=1e-3, min_time_s=0.008,
                                 budget_s=0.008)  # fmt: skip
    if against == "curves":
        before = (curves, *now[1:])
    else:  # each kernel sampled on while its spread was wide (to 2026-11-26, the first)
        before = (
            dataclasses.replace(curves, target_rel_ci=0.05, budget_s=0.025),
            dataclasses.replace(ceilings.CEILING_POLICY, target_rel_ci=0.05, budget_s=0.075),
            dataclasses.replace(ceilings.LATENCY_POLICY, budget_s=0.1),
            None if not median else median_s,
        )
    readings: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    seconds: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(rounds):
        for name, (curve, ceiling, latency, timer) in {"before": before, "now": now}.items():
            rates.CURVE_POLICY, ceilings.CEILING_POLICY, ceilings.LATENCY_POLICY = (
                curve, ceiling, latency,
            )  # fmt: skip
            start = time.perf_counter()
            readings[name].append(flat(ceilings.measure_ceilings("cpu", timer=timer)))
            seconds[name].append(time.perf_counter() - start)
    rates.CURVE_POLICY, ceilings.CEILING_POLICY, ceilings.LATENCY_POLICY = now[:3]
    for name, runs in readings.items():
        spread = sorted(max(r[k] for r in runs) / min(r[k] for r in runs) for k in runs[0])
        old = readings["before"]
        ratio = [statistics.median(r[k] for r in runs) / statistics.median(b[k] for b in old)
                 for k in runs[0]]  # fmt: skip
        print(f"{name:6s}: {statistics.median(seconds[name]):.2f} s a measurement; spread "
              f"across rounds, median kernel {statistics.median(spread):.3f}, 90th percentile "
              f"{spread[int(0.9 * len(spread))]:.3f}; rates against before, median "
              f"{statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", action="store_true", help="repeatability of two policies")
    parser.add_argument(
        "--median", action="store_true", help="with --policies: before reads each kernel's median"
    )
    parser.add_argument(
        "--against",
        choices=("spread", "curves"),
        default="spread",
        help="with --policies: before is the spread rule, or only the curves' longer points",
    )
    args = parser.parse_args()
    if args.policies:
        policies(args.rounds, args.median, args.against)
        return
    peaks, bandwidths, numpys = [], [], []
    for r in range(args.rounds):
        found = ours()
        gemm, copy, one_thread = theirs(int(found["threads"]))
        # the large square product's own rate (the peak may be a cache-resident curve's)
        square = found.get("square_flops_per_s") or found["peak_flops_per_s"]
        peaks.append(square / gemm)
        bandwidths.append(found["bandwidth_bytes_per_s"] / copy)
        numpys.append(found["bandwidth_bytes_per_s"] / one_thread)
        print(f"round {r + 1}: attnbench {square / 1e9:.1f} GFLOP/s (square), "
              f"{found['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; torch.utils.benchmark "
              f"{gemm / 1e9:.1f} GFLOP/s, {copy / 1e9:.1f} GB/s; numpy (1 thread) "
              f"{one_thread / 1e9:.1f} GB/s")  # fmt: skip
    print(f"median ratio, peak FLOP/s: {statistics.median(peaks):.2f}; bandwidth: "
          f"{statistics.median(bandwidths):.2f} (target: within 0.75-1.25); bandwidth against "
          f"numpy's one thread: {statistics.median(numpys):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
