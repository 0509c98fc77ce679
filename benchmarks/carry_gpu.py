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

    python benchmarks/carry_gpu.py
"""

from __future__ import annotations

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
    h200, h100 = load_results(RESULTS / "gpu-h200"), load_results(RESULTS / "gpu-h100")
    target = read_ceilings(RESULTS / "gpu-h100-machine" / "machine-float32.json")
    source = h200.ceilings
    assert source is not None, "results/gpu-h200 recorded its ceilings"
    measured = times(h100.measured, "time_s")
    print(f"{'method (H100 default grid, from the H200)':<58} {'median':>7} within 30%")
    line("no model: the H200's times", measured, times(h200.measured, "time_s"))
    counts = roofline.predict(h200.measured, target)
    line("counts: the H200 run's counts on the H100's ceilings", measured,
         times(counts, "predicted_time_s"))  # fmt: skip  # one table row
    own = roofline.predict(h100.measured, target)
    line("counts: the H100 run's own counts on its ceilings", measured,
         times(own, "predicted_time_s"))  # fmt: skip  # one table row
    hosts = host_ratio(source, target)
    carried = carry(h200.measured, source, target)
    line(f"carried (host ratio {hosts.ratio:.2f} from {hosts.basis})", measured,
         times(carried, "predicted_time_s"))  # fmt: skip  # one table row
    print("\ncarried, had the hosts' cost per op been measured on both at this ratio:")
    for ratio in (1.0, 1.2, 1.4, 1.6, 1.8):
        both = replace(source, host_op_s=1.0), replace(target, host_op_s=ratio)
        line(f"  host ratio {ratio:.1f}", measured,
             times(carry(h200.measured, *both), "predicted_time_s"))  # fmt: skip  # one row
    implied = (times(h100.measured, "time_s") / times(h100.measured, "ops")).median()
    before = (times(h200.measured, "time_s") / times(h200.measured, "ops")).median()
    print(
        f"\nmeasured time per counted op, median over the grid: H200 {before * 1e6:.1f} µs, "
        f"H100 {implied * 1e6:.1f} µs (ratio {implied / before:.2f}); op latency "
        f"{source.op_latency_s * 1e6:.1f} and {target.op_latency_s * 1e6:.1f} µs"
    )


if __name__ == "__main__":
    main()
