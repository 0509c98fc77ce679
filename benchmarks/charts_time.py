"""How long the fits, the charts and the report take on a saved run (default: results/cpu-wide).

Prints seconds for: loading the run, the fits (exponents, cost models, crossovers), building
the Figures, saving each format, and writing the report. Run: python benchmarks/charts_time.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from attnbench.fits import analyse
from attnbench.render.charts import build_charts, save_charts
from attnbench.render.report import write_report
from attnbench.results.loader import load_results


def main(folder: str = "results/cpu-wide", rounds: int = 3) -> None:
    for r in range(rounds):
        t0 = time.perf_counter()
        run = load_results(Path(folder))
        t1 = time.perf_counter()
        analysis = analyse(run)
        t2 = time.perf_counter()
        figures = build_charts(run, analysis)
        t3 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            png = save_charts(figures, Path(tmp), ["png"])
            t4 = time.perf_counter()
            save_charts(figures, Path(tmp), ["svg"])
            t5 = time.perf_counter()
            write_report(run, analysis, png, out=Path(tmp) / "report.md", html_too=True)
            t6 = time.perf_counter()
        print(
            f"round {r + 1}: {len(run.frame)} cases, {len(figures)} charts | load {t1 - t0:.2f} s"
            f" | fits {t2 - t1:.2f} s | build {t3 - t2:.2f} s | png {t4 - t3:.2f} s"
            f" | svg {t5 - t4:.2f} s | report {t6 - t5:.2f} s | total {t6 - t0:.2f} s"
        )


if __name__ == "__main__":
    main(*sys.argv[1:2])
