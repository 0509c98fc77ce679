"""Predict one GPU from another: the H100's default grid from the H200's run, by each method.

The data is committed: results/gpu-h200 (the default grid on one H200, its ceilings in
run.json), results/gpu-h100 (the same grid on one H100) and results/gpu-h100-machine (the
H100's ceilings). It prints, per method, the median of |predicted / measured - 1| over the
H100's 110 cases and how many are within 30%:

- no model: the H200's measured times taken as the H100's;
- counts: each run's counts on the H100's ceilings (``attnbench predict --method counts``);
- carried: the H200's measured times carried by the two machines' ceilings (the default);

then how the carried error moves with the ratio of the two hosts' cost per op, which
ceilings measured before ``host_op_s`` cannot give (the op latency stands in for it).
``--reverse`` predicts the H200's grid from the H100's run instead, on the H200's ceilings of
2026-11-27 (results/gpu-h200-timers, with its ``host_op_s``).

    python benchmarks/carry_gpu.py [--reverse]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from attnbench.fits import roofline
from attnbench.fits.carry import carry, host_ratio
from attnbench.measure.machine.ceilings_file import read_ceilings
from attnbench.results.loader import load_results

RESULTS = Path(__file__).resolve().parents[1] / "results"


def line(name: str, measured: pd.Series, predicted: pd.Series) -> None:
    """One row: the median |predicted / measured - 1| and the cases within 30%."""
    errors = (predicted.reindex(measured.index) / measured - 1).abs().dropna()
    print(f"{name:<58} {errors.median():>7.1%} {int((errors <= 0.3).sum()):>4} of {len(errors)}")


def times(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame.set_index("case_id")[column].astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reverse", action="store_true", help="the H200 from the H100's run")
    reverse = parser.parse_args().reverse
    h200, h100 = load_results(RESULTS / "gpu-h200"), load_results(RESULTS / "gpu-h100")
    h100_ceilings = read_ceilings(RESULTS / "gpu-h100-machine" / "machine-float32.json")
    if reverse:  # from the H100's run to the H200's grid: the target's host cost is known
        target = read_ceilings(RESULTS / "gpu-h200-timers" / "machine-float32.json")
        source, h200, h100 = h100_ceilings, h100, h200  # h200: the source run, h100: the truth
        names = ("H200", "H100")
    else:
        target = h100_ceilings
        source = h200.ceilings  # type: ignore[assignment]
        names = ("H100", "H200")
    assert source is not None, "the source run recorded its ceilings"
    measured = times(h100.measured, "time_s")
    print(f"{f'method ({names[0]} default grid, from the {names[1]})':<58} {'median':>7} "
          "within 30%")  # fmt: skip
    line(f"no model: the {names[1]}'s times", measured, times(h200.measured, "time_s"))
    counts = roofline.predict(h200.measured, target)
    line(f"counts: the {names[1]} run's counts on the {names[0]}'s ceilings", measured,
         times(counts, "predicted_time_s"))  # fmt: skip  # one table row
    own = roofline.predict(h100.measured, target)
    line(f"counts: the {names[0]} run's own counts on its ceilings", measured,
         times(own, "predicted_time_s"))  # fmt: skip  # one table row
    hosts = host_ratio(source, target)
    carried = carry(h200.measured, source, target)
    line(f"carried (host ratio {hosts.ratio:.2f} from {hosts.basis})", measured,
         times(carried, "predicted_time_s"))  # fmt: skip  # one table row
    print("\ncarried, had the hosts' cost per op been measured on both at this ratio:")
    for ratio in (
        (1 / r for r in (1.0, 1.2, 1.4, 1.6, 1.8)) if reverse else (1.0, 1.2, 1.4, 1.6, 1.8)
    ):
        both = replace(source, host_op_s=1.0), replace(target, host_op_s=ratio)
        line(f"  host ratio {ratio:.2f}", measured,
             times(carry(h200.measured, *both), "predicted_time_s"))  # fmt: skip  # one row
    implied = (times(h100.measured, "time_s") / times(h100.measured, "ops")).median()
    before = (times(h200.measured, "time_s") / times(h200.measured, "ops")).median()
    print(
        f"\nmeasured time per counted op, median over the grid: {names[1]} {before * 1e6:.1f} "
        f"µs, {names[0]} {implied * 1e6:.1f} µs (ratio {implied / before:.2f}); op latency "
        f"{source.op_latency_s * 1e6:.1f} and {target.op_latency_s * 1e6:.1f} µs"
    )


if __name__ == "__main__":
    main()
