"""A/A and A/B experiments for the regression gates: false-positive and detection rates.

--suite compare (the default): each repetition runs four real sweeps back to back, each in its
own process as in CI:
  A1, A2     the same sweep twice (A/A: any regression reported is a false positive);
  slowed     one layer made slower by a known fraction (benchmarks/slowed_cli.py), against A2;
  threads    the same sweep with --threads 2 (A runs on the CPU's default, one thread), against
             A2 (until 2026-11-30 the default was torch's two threads and this ran --threads 1).
It prints per-experiment rates, raw and normalised, and the exit codes `attnbench compare` gave.

--suite gate: per repetition, a stored-baseline A/A pair (two sweeps, then compare), an
`attnbench ab` A/A run and an `ab` run with attention made --slowdown slower
(benchmarks/slowed_layer.py). --suite instructions: `ab --metric instructions` A/A, and against
attention computing one call in ten twice (10% more instructions); and the wall time of an
instruction-count sweep of ci.toml's grid. --neighbour runs a second process during every
experiment that keeps one core busy 2-5 s at a time, on and off.

    python benchmarks/regression_rates.py [--reps 5] [--slow-layer attention --slowdown 0.25]
    python benchmarks/regression_rates.py --suite gate --neighbour --reps 10
    python benchmarks/regression_rates.py --suite instructions --neighbour --reps 10
    python benchmarks/regression_rates.py --analyse DIR   # the rates at other thresholds
    python benchmarks/regression_rates.py --suite gate --analyse DIR  # re-read kept repetitions
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnbench.compare import REGRESSION, Comparison, compare_runs
from attnbench.results.loader import load_results
from attnbench.thresholds import Thresholds, parse_fraction

HERE = Path(__file__).resolve().parent


def sweep(out: Path, args: argparse.Namespace, *extra: str, slowed: bool = False) -> float:
    prefix = [str(HERE / "slowed_cli.py"), args.slow_layer, str(args.slowdown)] if slowed else []
    command = [sys.executable, *(prefix or ["-m", "attnbench"]), "sweep", "--quiet"]
    command += ["--no-charts", "--layers", args.layers, "--n", args.n, "--d", args.d]
    command += ["--time-budget", str(args.time_budget), "--processes", str(args.rounds)]
    command += ["--out", str(out), *extra]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def cli_exit(base: Path, new: Path, max_slowdown: str) -> int:
    command = [sys.executable, "-m", "attnbench", "compare", str(base), str(new), "--quiet"]
    return subprocess.run([*command, "--max-slowdown", max_slowdown]).returncode


def flagged(c: Comparison, layer: str | None = None, *, among: bool = True) -> tuple[int, int]:
    """(regressions, cases) over the cases of ``layer`` (among) or of the other layers."""
    t = c.times if layer is None else c.times[(c.times["layer"] == layer) == among]
    return int((t["verdict"] == REGRESSION).sum()), len(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", default="conv,rnn,attention,attention-sdpa")
    parser.add_argument("--n", default="64..512")
    parser.add_argument("--d", default="64")
    parser.add_argument("--time-budget", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slow-layer", default="attention")
    parser.add_argument("--slowdown", type=float, default=0.25)
    parser.add_argument("--max-slowdown", default="10%")
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder")
    parser.add_argument("--analyse", type=Path, help="only judge the runs kept in this folder")
    parser.add_argument("--suite", choices=("compare", "gate", "instructions"), default="compare")
    parser.add_argument("--neighbour", action="store_true", help="a busy process on and off")
    args = parser.parse_args()
    if args.analyse and args.suite == "gate":
        from gate_rates import analyse_kept

        analyse_kept(args)
        return
    if args.analyse:
        threshold_table(args.analyse, args.slow_layer)
        return
    if args.suite != "compare":
        from gate_rates import run_suite  # the gate and instruction experiments

        run_suite(args)
        return
    limit = parse_fraction(args.max_slowdown, "--max-slowdown")
    raw, norm = Thresholds(max_slowdown=limit), Thresholds(max_slowdown=limit, normalize=True)
    tmp = tempfile.TemporaryDirectory()
    root = args.keep or Path(tmp.name)
    record: dict[str, list] = {"aa": [], "slowed": [], "threads": []}
    walls = []
    for rep in range(args.reps):
        folder = root / f"rep{rep}"
        a1, a2, slow, threads = (folder / x for x in ("A1", "A2", "slowed", "threads"))
        walls.append(sweep(a1, args))
        sweep(a2, args)
        sweep(slow, args, slowed=True)
        sweep(threads, args, "--threads", "2")
        runs = {p: load_results(p) for p in (a1, a2, slow, threads)}
        for name, base, new in (("aa", a1, a2), ("slowed", a2, slow), ("threads", a2, threads)):
            c_raw = compare_runs(runs[base], runs[new], raw)
            c_norm = compare_runs(runs[base], runs[new], norm)
            code = cli_exit(base, new, args.max_slowdown) if name != "threads" else None
            entry = {
                "exit": code,
                "raw_any": c_raw.failed("time"),
                "norm_any": c_norm.failed("time"),
                "ratios": c_raw.times["ratio"].round(4).tolist(),
                "norm_ratios": c_raw.times["ratio_normalized"].round(4).tolist(),
                "layers": c_raw.times["layer"].tolist(),
                "n": c_raw.times["n"].tolist(),
                "calibration_ratio": c_raw.calibration.get("ratio"),
            }
            if name == "slowed":
                entry["raw_hit"] = flagged(c_raw, args.slow_layer)
                entry["norm_hit"] = flagged(c_norm, args.slow_layer)
                entry["raw_fp"] = flagged(c_raw, args.slow_layer, among=False)
                entry["norm_fp"] = flagged(c_norm, args.slow_layer, among=False)
            else:
                entry["raw_flagged"] = flagged(c_raw)
                entry["norm_flagged"] = flagged(c_norm)
            record[name].append(entry)
        aa = record["aa"][-1]
        print(
            f"rep {rep}: A/A exit {aa['exit']} ({aa['raw_flagged'][0]} flagged raw, "
            f"{aa['norm_flagged'][0]} normalised); slowed exit {record['slowed'][-1]['exit']} "
            f"({record['slowed'][-1]['raw_hit'][0]}/{record['slowed'][-1]['raw_hit'][1]} hit); "
            f"threads {record['threads'][-1]['raw_flagged'][0]} flagged",
            flush=True,
        )
    summarise(record, args, walls)
    if args.keep:
        (args.keep / "rates.json").write_text(json.dumps(record, indent=1))


def _rate(pairs: list[tuple[int, int]]) -> str:
    hits, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return f"{hits}/{total} = {hits / max(total, 1):.1%}"


def summarise(record: dict[str, list], args: argparse.Namespace, walls: list[float]) -> None:
    reps = len(record["aa"])
    print(
        f"\n{reps} repetitions; grid {args.layers} n={args.n} d={args.d}, budget "
        f"{args.time_budget} s/case; one sweep {np.median(walls):.1f} s (median wall)"
    )
    print(f"threshold: ratio > 1 + {args.max_slowdown} and Mann-Whitney p < 0.01")
    aa = record["aa"]
    ratios = np.array([r for e in aa for r in e["ratios"]])
    print("\nA/A (same sweep twice):")
    print(f"  runs failing (exit 1): {sum(e['exit'] == 1 for e in aa)}/{reps}")
    print(
        f"  cases flagged, raw: {_rate([e['raw_flagged'] for e in aa])}; normalised: "
        f"{_rate([e['norm_flagged'] for e in aa])}"
    )
    print(
        f"  |ratio - 1|: median {np.median(np.abs(ratios - 1)):.1%}, 95th percentile "
        f"{np.percentile(np.abs(ratios - 1), 95):.1%}, max {np.max(np.abs(ratios - 1)):.1%}"
    )
    cal = [e["calibration_ratio"] for e in aa if e["calibration_ratio"]]
    if cal:
        print(f"  calibration GEMM ratio between the two runs: {min(cal):.3f}..{max(cal):.3f}")
    sl = record["slowed"]
    print(f"\nA/B ({args.slow_layer} made {args.slowdown:.0%} slower):")
    print(f"  runs failing (exit 1): {sum(e['exit'] == 1 for e in sl)}/{reps}")
    print(
        f"  {args.slow_layer} cases detected, raw: {_rate([e['raw_hit'] for e in sl])}; "
        f"normalised: {_rate([e['norm_hit'] for e in sl])}"
    )
    print(f"  other cases flagged (false positives), raw: {_rate([e['raw_fp'] for e in sl])}")
    slowed = [
        r
        for e in sl
        for r, layer in zip(e["ratios"], e["layers"], strict=True)
        if layer == args.slow_layer
    ]
    print(f"  measured ratio of the slowed cases: median {np.median(slowed):.3f}")
    th = record["threads"]
    print("\nA/B (--threads 2 against the default, one thread):")
    print(f"  cases flagged, raw: {_rate([e['raw_flagged'] for e in th])}")
    by_layer: dict[str, list[float]] = {}
    for e in th:
        for r, layer, n in zip(e["ratios"], e["layers"], e["n"], strict=True):
            by_layer.setdefault(f"{layer} n={n}", []).append(r)
    for key, values in by_layer.items():
        print(f"    {key:<24} ratio median {np.median(values):.2f}")


THRESHOLDS = (0.10, 0.25, 0.50, 1.00)


def threshold_table(root: Path, slow_layer: str) -> None:
    """Runs failing (any time regression) and cases flagged at several --max-slowdown values,
    from the runs a --keep folder holds: the trade-off between false positives and detection."""
    reps = sorted(p for p in root.iterdir() if p.is_dir())
    runs = {(rep.name, x): load_results(rep / x) for rep in reps for x in ("A1", "A2", "slowed")}
    threads = {
        rep.name: load_results(rep / "threads") for rep in reps if (rep / "threads").is_dir()
    }
    print(f"{len(reps)} repetitions in {root}")
    print(
        f"{'max-slowdown':>12} {'basis':>10} {'A/A runs failing':>17} {'A/A cases':>12} "
        f"{'slowed cases':>13} {'threads-1 cases':>16}"
    )
    for limit in THRESHOLDS:
        for normalize in (False, True):
            t = Thresholds(max_slowdown=limit, normalize=normalize)
            aa = [compare_runs(runs[(r.name, "A1")], runs[(r.name, "A2")], t) for r in reps]
            sl = [compare_runs(runs[(r.name, "A2")], runs[(r.name, "slowed")], t) for r in reps]
            th = [compare_runs(runs[(r.name, "A2")], threads[r.name], t) for r in reps]
            print(
                f"{limit:>12.0%} {'normalised' if normalize else 'raw':>10} "
                f"{sum(c.failed('time') for c in aa):>12}/{len(aa):<4} "
                f"{_rate([flagged(c) for c in aa]):>12} "
                f"{_rate([flagged(c, slow_layer) for c in sl]):>13} "
                f"{_rate([flagged(c) for c in th]):>16}"
            )


if __name__ == "__main__":
    main()
