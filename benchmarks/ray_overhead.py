"""What the Ray executor costs against a serial sweep of the same grid, and whether it changes
the times it measures.

Runs one grid four ways in this process: serial; Ray with one worker (the executor's own
overhead, nothing in parallel); Ray with as many one-thread workers as there are CPUs (what a
user gets); then serial again (how much two serial runs differ on this machine, the yardstick
for the ratios). Every case uses --threads 1 so that each worker's case has the CPU it reserved.

    python benchmarks/ray_overhead.py [--n 64..1024] [--d 64] [--layers conv,rnn,attention]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from attnbench.ray_executor import RayExecutor
from attnbench.results import RunResults
from attnbench.runner import run_sweep
from attnbench.spec import build_grid


def _sweep(options: dict[str, Any], out: Path, executor: RayExecutor | None) -> dict[str, Any]:
    start = time.perf_counter()
    started = 0.0
    if executor is not None:
        grid = build_grid(options, executor.resolve_device)
        executor.start(grid)
        started = time.perf_counter() - start
    else:
        grid = build_grid(options)
    run = run_sweep(grid, out, executor=executor)
    return {"run": run, "wall": time.perf_counter() - start, "start": started}


def _ratios(run: RunResults, reference: RunResults) -> list[float]:
    a = run.measured.set_index("case_id")["time_s"]
    b = reference.measured.set_index("case_id")["time_s"]
    shared = a.index.intersection(b.index)
    return [float(a[c] / b[c]) for c in shared]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="conv,rnn,attention")
    parser.add_argument("--n", default="64..1024")
    parser.add_argument("--d", default="64")
    parser.add_argument("--time-budget", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    options = {
        "layers": args.layers,
        "n": args.n,
        "d": args.d,
        "threads": 1,
        "time_budget": args.time_budget,
        "rounds": args.rounds,
    }
    cpus = os.cpu_count() or 1
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("serial", _sweep(options, Path(tmp) / "serial", None)))
        t0 = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray_init = time.perf_counter() - t0
        try:
            for workers in (1, cpus):
                executor = RayExecutor(workers=workers)
                try:
                    out = Path(tmp) / f"ray{workers}"
                    rows.append((f"ray, {workers} worker(s)", _sweep(options, out, executor)))
                finally:
                    executor.close()
        finally:
            ray.shutdown()
        rows.append(("serial again", _sweep(options, Path(tmp) / "serial2", None)))

    serial = rows[0][1]
    cases = len(serial["run"].frame)
    print(
        f"grid: {args.layers}, n={args.n}, d={args.d}, threads 1, {cases} cases, "
        f"budget {args.time_budget} s, {args.rounds} round(s); {cpus} CPUs; "
        f"ray.init {ray_init:.1f} s"
    )
    print(
        f"{'executor':<20} {'wall s':>7} {'workers up s':>12} {'sweep s':>8} "
        f"{'per case ms':>11} {'median ratio':>12} {'ratio range':>15}"
    )
    for name, row in rows:
        sweep_s = row["wall"] - row["start"]
        ratios = _ratios(row["run"], serial["run"]) if row is not serial else [1.0]
        overhead = (sweep_s - (serial["wall"])) / cases * 1e3 if row is not serial else 0.0
        print(
            f"{name:<20} {row['wall']:>7.1f} {row['start']:>12.1f} {sweep_s:>8.1f} "
            f"{overhead:>+11.1f} {statistics.median(ratios):>12.3f} "
            f"{min(ratios):>7.3f}..{max(ratios):<7.3f}"
        )
    print(
        "per case ms: (sweep s - serial wall s) / cases, start-up excluded; "
        "ratio: time_s of each case / the first serial run's"
    )


if __name__ == "__main__":
    main()
