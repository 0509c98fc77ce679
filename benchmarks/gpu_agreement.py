"""attnbench's three timers against the reference timers, on the same module: the step a sweep
times (measure.case.make_step), each layer at each size.

- blocks (the default: synchronised blocks of back-to-back calls) against torch.utils.benchmark's
  blocked_autorange, which times blocks as we do;
- kernels (CUDA graph replays) against Triton's do_bench_cudagraph, which replays a graph of the
  call between CUDA events;
- cold (each call between events, the L2 flushed before it) against Triton's do_bench, which
  flushes the L2 with a 256 MB write before each call (its median asked for);
- kernel_time_s (the profiler's split of a blocks time) against the kernels timer, on the cases
  whose kernels are at least BUSY of the blocks time; and kernel_time_s never over time_s.

The default timer runs twice (first and last): its spread between the two passes is printed
beside the ratios, as the noise a ratio should be read against.

    python benchmarks/gpu_agreement.py [--device cuda] [--n 256,2048] [--d 128] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.benchmark as tub

from attnbench.devices import device_sync
from attnbench.layers import layer_names
from attnbench.measure.case import memory_pass
from attnbench.measure.step import make_step
from attnbench.measure.timing.gputimers import time_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.measure.timing.split import kernel_split
from attnbench.options import build_grid
from attnbench.schema import Timer

try:
    from triton.testing import do_bench, do_bench_cudagraph
except ImportError:  # no Triton (a CPU build): its columns read "-"
    do_bench = do_bench_cudagraph = None

BUSY = 0.8  # kernel_time_s is checked against the kernels timer where kernel_share is this high


def ours(fn: Callable[[], object], device: str, timer: Timer, budget: float) -> float:
    policy = TimingPolicy(budget_s=budget, warmup_calls=1, timer=timer.value)
    return time_step(fn, policy, device, sync=device_sync(device)).stats.median_s


def reference(name: str, fn: Callable[[], object]) -> float | None:
    try:
        if name == "torch":
            timer = tub.Timer(stmt="fn()", globals={"fn": fn})
            return float(timer.blocked_autorange(min_run_time=0.2).median)
        if do_bench is None or do_bench_cudagraph is None:
            return None
        if name == "do_bench":
            return float(do_bench(fn, warmup=25, rep=100, return_mode="median")) / 1e3
        return float(do_bench_cudagraph(fn, rep=100, return_mode="median")) / 1e3
    except Exception as exc:  # a reference that cannot time this call: say so, go on
        print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summary(rows: list[dict[str, Any]], key: str, label: str) -> None:
    found = [r[key] for r in rows if r.get(key)]
    if not found:
        print(f"{label}: none")
        return
    within = sum(abs(x - 1) <= 0.10 for x in found)
    print(
        f"{label}: median {statistics.median(found):.3f}, range {min(found):.3f}-"
        f"{max(found):.3f}, within 10%: {within}/{len(found)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", default="256,2048")
    parser.add_argument("--d", default="128")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layers", default=",".join(layer_names()))
    parser.add_argument("--budget", type=float, default=0.25, help="seconds a timer may take")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    grid = build_grid({"layers": args.layers, "n": args.n, "d": args.d, "device": args.device,
                       "dtype": args.dtype})  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"{'layer':18} {'n':>5} {'blocks':>10} {'self':>6} {'/torch':>7} {'kernels':>10} "
          f"{'/cgraph':>8} {'cold':>10} {'/do_b':>7} {'share':>6} {'kern/k':>7}")  # fmt: skip
    for case in grid.cases():
        try:
            step = make_step(case, seed=0)
            fn = step.call
            fn()
            device_sync(case.device)()
            first = ours(fn, case.device, Timer.BLOCKS, args.budget)
            row: dict[str, Any] = {"layer": case.layer, "n": case.n, "d": case.d}
            row["torch_s"] = reference("torch", fn)
            row["kernels_s"] = ours(fn, case.device, Timer.KERNELS, args.budget)
            row["cudagraph_s"] = reference("do_bench_cudagraph", fn)
            row["cold_s"] = ours(fn, case.device, Timer.COLD, args.budget)
            row["do_bench_s"] = reference("do_bench", fn)
            last = ours(fn, case.device, Timer.BLOCKS, args.budget)
            blocks = statistics.median([first, last])
        except Exception as exc:  # one case that breaks is reported; the others go on
            print(f"{case.layer:18} {case.n:5d} failed: {type(exc).__name__}: {exc}"[:200])
            continue
        try:  # the profiler's split needs CUPTI, which a VM may lack: the timers go on
            ops = memory_pass(case, 0, step).ops
            split = kernel_split(fn, case.device, blocks, ops, sync=device_sync(case.device))
            share, method = split.share, split.method
        except Exception as exc:
            share, method = None, f"none: {type(exc).__name__}: {exc}"[:200]
        row.update(blocks_s=[first, last], self=max(first, last) / min(first, last),
                   kernel_share=share, kernel_time_s=None if share is None else share * blocks,
                   kernel_method=method)  # fmt: skip
        row["blocks/torch"] = ratio(blocks, row["torch_s"])
        row["kernels/cudagraph"] = ratio(row["kernels_s"], row["cudagraph_s"])
        row["cold/do_bench"] = ratio(row["cold_s"], row["do_bench_s"])
        row["kernel_time/kernels"] = ratio(row["kernel_time_s"], row["kernels_s"])
        rows.append(row)

        def cell(value: float | None, width: int, scale: float = 1.0, fmt: str = ".3f") -> str:
            return f"{value * scale:{width}{fmt}}" if value else f"{'-':>{width}}"

        print(f"{case.layer:18} {case.n:5d} {blocks * 1e6:8.1f}us {row['self']:6.3f} "
              f"{cell(row['blocks/torch'], 7)} {cell(row['kernels_s'], 8, 1e6, '.1f')}us "
              f"{cell(row['kernels/cudagraph'], 8)} {cell(row['cold_s'], 8, 1e6, '.1f')}us "
              f"{cell(row['cold/do_bench'], 7)} {cell(share, 6)} "
              f"{cell(row['kernel_time/kernels'], 7)}", flush=True)  # fmt: skip
    summary(rows, "blocks/torch", "blocks / torch.utils.benchmark")
    summary(rows, "kernels/cudagraph", "kernels / do_bench_cudagraph")
    summary(rows, "cold/do_bench", "cold / do_bench")
    busy = [r for r in rows if (r["kernel_share"] or 0) >= BUSY]
    summary(busy, "kernel_time/kernels", f"kernel_time_s / kernels, share >= {BUSY}")
    over = sum((r["kernel_time_s"] or 0) > statistics.median(r["blocks_s"]) for r in rows)
    print(f"kernel_time_s > time_s: {over} of {len(rows)}")
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        print("device:", torch.cuda.get_device_name(torch.device(args.device)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
