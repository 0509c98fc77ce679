"""What the Ray executor costs against a serial sweep of the same grid, and whether it changes
the times it measures.

Runs one grid three ways in this process, interleaved, --repeat times: serial; Ray with one
worker (the executor's own overhead, nothing in parallel); Ray with as many one-thread workers
as there are CPUs (what a user gets). Every case uses --threads 1, so that each worker's case
has the CPU it reserved. A serial warm-up sweep comes first (the process's first torch calls).

    python benchmarks/ray_overhead.py [--n 64..1024] [--d 64] [--layers ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import ray

from attnbench.options import build_grid
from attnbench.run.executors.base import Executor
from attnbench.run.executors.ray import RayExecutor
from attnbench.run.executors.serial import SerialExecutor
from attnbench.run.sweep import run_sweep


def _sweep(options: dict[str, Any], out: Path, executor: Executor) -> dict[str, Any]:
    """One sweep: seconds to start the workers, then seconds of the sweep itself."""
    t0 = time.perf_counter()
    grid = build_grid(options, executor.resolve_device)
    executor.start(grid)
    t1 = time.perf_counter()
    run = run_sweep(grid, out, executor=executor)
    return {"run": run, "start": t1 - t0, "sweep": time.perf_counter() - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="conv,rnn,attention")
    parser.add_argument("--n", default="64..1024")
    parser.add_argument("--d", default="64")
    parser.add_argument("--time-budget", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    options = {
        "layers": args.layers,
        "n": args.n,
        "d": args.d,
        "threads": 1,
        "time_budget": args.time_budget,
    }
    cpus = os.cpu_count() or 1
    t0 = time.perf_counter()
    ray.init(
        num_cpus=cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1"
    )
    ray_init = time.perf_counter() - t0
    kinds: list[tuple[str, Callable[[], Executor]]] = [
        ("serial", SerialExecutor),
        ("ray, 1 worker", lambda: RayExecutor(workers=1)),
        (f"ray, {cpus} workers", lambda: RayExecutor(workers=cpus)),
    ]
    found: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in kinds}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _sweep(options, Path(tmp) / "warm-up", SerialExecutor())  # first torch calls
            for rep in range(args.repeat):  # interleaved, so a slow minute hits every kind
                for name, make in kinds:
                    executor = make()
                    try:
                        out = Path(tmp) / f"{rep}-{name.replace(' ', '').replace(',', '-')}"
                        found[name].append(_sweep(options, out, executor))
                    finally:
                        executor.close()
    finally:
        ray.shutdown()

    # The reference time of a case: its median over the serial sweeps.
    serial_times = pd.concat(
        [r["run"].measured.set_index("case_id")["time_s"] for r in found["serial"]], axis=1
    ).median(axis=1)
    cases = len(serial_times)
    serial_sweep = statistics.median(r["sweep"] for r in found["serial"])
    print(
        f"grid: {args.layers}, n={args.n}, d={args.d}, --threads 1, {cases} cases, budget "
        f"{args.time_budget} s; {cpus} CPUs; {args.repeat} sweeps of each kind, interleaved; "
        f"ray.init {ray_init:.1f} s"
    )
    print(
        f"{'executor':<16} {'start s':>8} {'sweep s':>8} {'vs serial':>9} {'ms/case':>8} "
        f"{'time ratio':>10} {'ratio p10..p90':>15}"
    )
    for name, _ in kinds:
        runs = found[name]
        sweep = statistics.median(r["sweep"] for r in runs)
        start = statistics.median(r["start"] for r in runs)
        ratios = pd.concat(
            [r["run"].measured.set_index("case_id")["time_s"] / serial_times for r in runs]
        )
        print(
            f"{name:<16} {start:>8.2f} {sweep:>8.2f} {sweep / serial_sweep:>8.2f}x "
            f"{(sweep - serial_sweep) / cases * 1e3:>+8.1f} {ratios.median():>10.3f} "
            f"{ratios.quantile(0.1):>7.3f}..{ratios.quantile(0.9):<7.3f}"
        )
    print(
        "start: build the grid and start the workers (medians); sweep: the sweep itself; "
        "ms/case: (sweep - serial sweep) / cases; time ratio: each case's median time / its "
        "median over the serial sweeps (serial's own spread is the noise floor)"
    )


if __name__ == "__main__":
    main()
