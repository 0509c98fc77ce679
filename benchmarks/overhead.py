"""Where a sweep's time goes: the tool's own overhead, per run, per layer, and per phase.

1. For a results folder (default: results/cpu-reference and results/cpu-wide): the cases' wall
   seconds (``wall_s``, summed) against the seconds inside timed blocks (``time_total_s``), and
   the share that is the tool's own overhead, over the run and per layer.
2. ``--phases``: every case of a grid (default: the default sweep's) measured phase by phase in
   this process, as ``measure_case`` does it: build and first call, path length, the traced
   counts (``trace_counts``: one census pass in forward mode; a long recurrent case traced at
   the short probe lengths and extended, ``measure.counts.extend``; a case at a probe length shared
   with its probe), the memory profile, and timing; seconds per phase
   and layer, the four separate passes the census replaced (steps, FLOPs, elementwise work,
   bytes) beside it (not for the extended cases), and the cases furthest outside their timing.
3. ``--sweeps``: the real command (``attnbench sweep --no-charts``) run twice with a fresh,
   empty cache folder (no count cache, no ceilings: cold), then again with it (warm), each
   process timed from the shell: its wall time, the cases' wall time and the seconds inside
   their timed blocks, and the overhead share of the process (start-up included) and of the
   sweep's own record (run.json's ``duration_s``: opening the run to its last result written).

    python benchmarks/overhead.py [RUN ...] [--phases] [--sweeps] [--layers ...] [--n ...] [--d ...]

Read the shares, not the seconds: this machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd

DEFAULT_RUNS = ("results/cpu-reference", "results/cpu-wide")
PHASES = ("build", "path", "census", "memory", "timing")
# The four passes the census replaced in forward mode, timed too for comparison.
SEPARATE = ("steps", "flops", "elementwise", "bytes")


def run_table(folder: Path) -> None:
    from attnbench.results.loader import load_results

    run = load_results(folder)
    frame = run.measured.assign(
        wall=pd.to_numeric(run.measured["wall_s"], errors="coerce"),
        timed=pd.to_numeric(run.measured["time_total_s"], errors="coerce"),
    )
    wall, timed = frame["wall"].sum(), frame["timed"].sum()
    print(f"\n{folder}: {len(frame)} cases, wall {wall:.1f} s, timed {timed:.1f} s, "
          f"overhead {1 - timed / wall:.0%}")  # fmt: skip
    per_layer = frame.groupby("layer", sort=False)[["wall", "timed"]].sum()
    per_layer["outside"] = per_layer["wall"] - per_layer["timed"]
    per_layer["overhead"] = (per_layer["outside"] / per_layer["wall"]).map("{:.0%}".format)
    print(per_layer.round(2).to_string())


def phases(layers: str | None, ns: str | None, ds: str | None) -> None:
    from attnbench.measure import case as measured
    from attnbench.measure.counts import extend
    from attnbench.measure.counts.chains import sequential_steps
    from attnbench.measure.counts.elementwise import count_elementwise
    from attnbench.measure.counts.flops import trace_flops
    from attnbench.measure.counts.traffic import count_traffic
    from attnbench.measure.timing.loop import TimingPolicy, time_call
    from attnbench.options import build_grid

    options = {"device": "cpu"}
    options.update({k: v for k, v in (("layers", layers), ("n", ns), ("d", ds)) if v})
    grid = build_grid(options)
    policy = TimingPolicy(budget_s=grid.time_budget_s, warmup_calls=1)
    seconds: dict[str, dict[str, float]] = defaultdict(
        lambda: dict.fromkeys((*PHASES, *SEPARATE), 0.0)
    )
    worst = []
    measured.prime_instruments()  # as a sweep does: the dispatch-mode start-up is not a case's
    # The path length inside trace_counts, timed apart from the census around it.
    in_path = [0.0]
    real_path = measured.path_length

    def timed_path(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return real_path(*args, **kwargs)
        finally:
            in_path[0] += time.perf_counter() - start

    measured.path_length = timed_path
    is_probe = getattr(extend, "is_probe", lambda case: False)  # (not before 7fe0693)
    for case in grid.cases():
        spent = dict.fromkeys((*PHASES, *SEPARATE), 0.0)
        clock = time.perf_counter()

        def lap(phase: str, spent: dict[str, float] = spent) -> None:
            nonlocal clock
            now = time.perf_counter()
            spent[phase] += now - clock
            clock = now

        step = measured.make_step(case, seed=0)
        step()
        lap("build")
        # Every count as a sweep takes it (census, probes and their law, path length).
        in_path[0] = 0.0
        counts, _ = measured.trace_counts(case, step, 0)
        lap("census")
        spent["census"] -= in_path[0]
        spent["path"] += in_path[0]
        if not extend.is_extended(counts):  # the four passes the census replaced, for scale
            sequential_steps(step.forward)
            lap("steps")
            trace_flops(step)
            lap("flops")
            count_elementwise(step.forward)
            lap("elementwise")
            count_traffic(step)
            lap("bytes")
        # The memory pass as a sweep takes it: at the probes for a long unfused recurrence, as
        # the probe's own where the case is at a probe length.
        profile = (
            extend.extended_profile(case, lambda short: measured.probe_profile(short, 0))
            if extend.is_extended(counts)
            else None
        )
        if profile is None:
            if is_probe(case):
                measured.probe_profile(case, 0, step)
            else:
                measured.memory_pass(case, 0, step)
        lap("memory")
        time_call(step, policy)
        lap("timing")
        for phase, value in spent.items():
            seconds[case.layer][phase] += value
        outside = sum(v for p, v in spent.items() if p in PHASES and p != "timing")
        worst.append((outside - 2 * spent["timing"], case.label(), outside, spent["timing"]))
    table = pd.DataFrame(seconds).T
    table["four passes"] = table[list(SEPARATE)].sum(axis=1)
    table = table.drop(columns=list(SEPARATE))
    table["outside timing"] = table[[p for p in PHASES if p != "timing"]].sum(axis=1)
    table.loc["all"] = table.sum()
    share = table["outside timing"] / (table["outside timing"] + table["timing"])
    table["overhead"] = share.map("{:.0%}".format)
    print(f"\nphases: {len(grid.cases())} cases of {','.join(grid.layers)}, n = {grid.ns}, "
          f"d = {grid.ds}, seconds")  # fmt: skip
    print(table.round(2).to_string())
    print("\nthe cases furthest over 1 s + twice their timing outside it (issue 24's bound):")
    for _, label, outside, timing in sorted(worst, reverse=True)[:5]:
        print(f"  {label}: {outside:.2f} s outside, {timing:.2f} s timing")


def sweeps(layers: str | None, ns: str | None, ds: str | None) -> None:
    from attnbench.results.loader import load_results

    grid = [f"--{k}={v}" for k, v in (("layers", layers), ("n", ns), ("d", ds)) if v]
    print("\nsweeps (attnbench sweep --no-charts; cold: an empty cache folder, warm: again)")
    print(f"{'':>5} {'process s':>9} {'cases s':>8} {'timed s':>8} {'overhead':>9} "
          f"{'in run.json':>12}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "ATTNBENCH_CACHE_DIR": str(Path(tmp) / "cache")}
        for label in ("cold", "warm"):
            out = Path(tmp) / label
            command = [sys.executable, "-m", "attnbench", "sweep", "--quiet", "--no-charts",
                       "--yes", "--out", str(out), *grid]  # fmt: skip
            start = time.perf_counter()
            subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            frame = load_results(out).frame
            timed = frame["time_total_s"].sum()
            meta = json.loads((out / "run.json").read_text())
            start_to_end = dt.datetime.fromisoformat(meta["end_time"]) - dt.datetime.fromisoformat(
                meta["start_time"]
            )
            own = meta.get("duration_s") or start_to_end.total_seconds()  # older: whole seconds
            print(f"{label:>5} {wall:>9.1f} {frame['wall_s'].sum():>8.1f} {timed:>8.1f} "
                  f"{1 - timed / wall:>9.0%} {1 - timed / own:>12.1%}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", default=list(DEFAULT_RUNS))
    parser.add_argument("--phases", action="store_true", help="measure a grid phase by phase")
    parser.add_argument("--sweeps", action="store_true", help="time a cold and a warm sweep")
    parser.add_argument("--layers", default=None)
    parser.add_argument("--n", default=None)
    parser.add_argument("--d", default=None)
    args = parser.parse_args()
    for folder in args.runs:
        run_table(Path(folder))
    if args.phases:
        phases(args.layers, args.n, args.d)
    if args.sweeps:
        sweeps(args.layers, args.n, args.d)


if __name__ == "__main__":
    main()
