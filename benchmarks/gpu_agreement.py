"""attnbench's per-call time against Triton's do_bench and torch.utils.benchmark, on the same
module: the step a sweep times (measure.case.make_step), each layer at each size.

attnbench times blocks of back-to-back calls between two synchronisations (timing.time_call,
the sweep's policy); do_bench times each call between CUDA events with the L2 cache flushed
before it (median asked for); torch.utils.benchmark's blocked_autorange times blocks, as we do.
The timers run in turn, attnbench twice (first and last), so its own spread between the two
passes is printed beside the ratios: a ratio inside that spread is noise.

    python benchmarks/gpu_agreement.py [--device cuda] [--n 256,2048] [--d 128] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.utils.benchmark as tub

from attnbench.devices import device_sync
from attnbench.layers import layer_names
from attnbench.measure.case import make_step
from attnbench.measure.timing import DEFAULT_POLICY, time_call
from attnbench.spec import build_grid

try:
    from triton.testing import do_bench
except ImportError:  # no Triton (a CPU build): the column reads "-"
    do_bench = None


def ours(fn, device: str) -> float:  # type: ignore[no-untyped-def]
    return time_call(fn, DEFAULT_POLICY, sync=device_sync(device)).median_s


def torch_benchmark(fn) -> float:  # type: ignore[no-untyped-def]
    return tub.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.25).median


def triton(fn) -> float | None:  # type: ignore[no-untyped-def]
    if do_bench is None:
        return None
    return do_bench(fn, warmup=25, rep=250, return_mode="median") / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", default="256,2048")
    parser.add_argument("--d", default="128")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layers", default=",".join(layer_names()))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    grid = build_grid({"layers": args.layers, "n": args.n, "d": args.d, "device": args.device,
                       "dtype": args.dtype})  # fmt: skip
    rows = []
    print(f"{'layer':18} {'n':>5} {'d':>4} {'attnbench':>11} {'self':>6} "
          f"{'/do_bench':>9} {'/torch':>7}")  # fmt: skip
    for case in grid.cases():
        step = make_step(case, seed=0)
        fn = step.call
        first = ours(fn, case.device)
        tri = triton(fn)
        tb = torch_benchmark(fn)
        last = ours(fn, case.device)
        mid = statistics.median([first, last])
        row = {"layer": case.layer, "n": case.n, "d": case.d, "attnbench_s": [first, last],
               "do_bench_s": tri, "torch_benchmark_s": tb}  # fmt: skip
        rows.append(row)
        tri_text = f"{mid / tri:9.3f}" if tri else f"{'-':>9}"
        print(f"{case.layer:18} {case.n:5d} {case.d:4d} {mid * 1e6:9.1f}us "
              f"{max(first, last) / min(first, last):6.3f} {tri_text} {mid / tb:7.3f}",
              flush=True)  # fmt: skip
    for name, key in (("do_bench", "do_bench_s"), ("torch.utils.benchmark", "torch_benchmark_s")):
        ratios = [statistics.median(r["attnbench_s"]) / r[key] for r in rows if r[key]]
        if ratios:
            within = sum(abs(r - 1) <= 0.10 for r in ratios)
            print(
                f"attnbench / {name}: median {statistics.median(ratios):.3f}, "
                f"range {min(ratios):.3f}-{max(ratios):.3f}, within 10%: {within}/{len(ratios)}"
            )
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        print("device:", torch.cuda.get_device_name(torch.device(args.device)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
