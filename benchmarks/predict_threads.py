"""Predict another machine from counts and its ceilings: a 1-thread run from a 2-thread run.

The counts of a call (FLOPs, bytes, ops) do not depend on the machine, so a run measured with 2
threads and the ceilings measured with 1 thread should predict the times a 1-thread run
measures. This sweeps the same grid twice (``--threads 2``, then ``--threads 1``), measures the
1-thread ceilings (``attnbench machine --threads 1 --json``), predicts from the 2-thread run's
counts (``attnbench predict RUN2 --machine CEILINGS1 --method counts``) and carries its
measured times there (``--method carried``), and prints for each method, per layer, the median
relative error |predicted / measured - 1| against the 1-thread run, and over all cases.

    python benchmarks/predict_threads.py [--layers conv,rnn,attention] [--n 64,256,1024] [--d 64]
        [--keep DIR]

Read the ratios: this machine is shared (the issue's target: a median error of at most 30%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "attnbench", *args], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="conv,rnn,gru,attention,attention-sdpa,ssm-scan")
    parser.add_argument("--n", default="64,256,1024")
    parser.add_argument("--d", default="64")
    parser.add_argument("--time-budget", default="0.3")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the two runs and the 1-thread ceilings in this folder "
                             "(to predict them again with another model)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        runs = {}
        for threads in (2, 1):
            out = Path(tmp) / f"t{threads}"
            cli("sweep", "--layers", args.layers, "--n", args.n, "--d", args.d, "--threads",
                str(threads), "--time-budget", args.time_budget, "--no-charts", "--quiet",
                "--out", str(out))  # fmt: skip
            runs[threads] = out
        ceilings = Path(tmp) / "one-thread.json"
        ceilings.write_text(
            cli("machine", "--threads", "1", "--json", "--device", "cpu", "--remeasure")
        )
        predicted = {
            method: json.loads(
                cli("predict", str(runs[2]), "--machine", str(ceilings), "--method", method,
                    "--json")
            )
            for method in ("counts", "carried")
        }  # fmt: skip  # the command as it is typed
        measured = json.loads(
            cli("predict", str(runs[1]), "--machine", str(ceilings), "--method", "counts", "--json")
        )
    one = {r["case_id"].replace("/cpu/", "/"): r for r in measured["results"]}
    print(f"1-thread ceilings: {measured['machine']['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, "
          f"{measured['machine']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"{measured['machine']['op_latency_s'] * 1e6:.2f} µs an op")  # fmt: skip
    for method, found in predicted.items():
        print(f"\n{method}: {found['method_why']}")
        report(found, one)


def report(predicted: dict, one: dict) -> None:
    """Per layer, the median relative error of the predicted 1-thread times, then overall."""
    header = f"{'layer':<16} {'cases':>5} {'median |pred/meas - 1|':>24}"
    print(f"{header}  ratios (predicted / measured)")
    errors: dict[str, list[float]] = {}
    for row in predicted["results"]:
        key = row["case_id"].replace("/cpu/", "/")
        if key not in one or not one[key]["time_s"]:
            continue
        ratio = row["predicted_time_s"] / one[key]["time_s"]
        errors.setdefault(row["layer"], []).append(ratio)
    every = []
    for layer, ratios in errors.items():
        error = statistics.median(abs(r - 1) for r in ratios)
        every += [abs(r - 1) for r in ratios]
        each = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{layer:<16} {len(ratios):>5} {error:>24.1%}  {each}")
    print(f"all cases: median relative error {statistics.median(every):.1%} (target at most 30%)")


if __name__ == "__main__":
    main()
