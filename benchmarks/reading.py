"""How long reading a committed run takes: loading it, fitting it, and `table` and `fit` whole.

    python benchmarks/reading.py [RUN ...] [--repeat 3]

Every reading command (`table`, `fit`, `show`, `plot`, `report`, `compare`) loads a run and
most analyse it; the test suite reads every committed run several times. Prints, per run, the
median over ``--repeat`` in-process repeats (after one warm-up that pays the imports) of:
load_results, analyse, and the two commands through the CLI. Compare figures from one
invocation only: this machine's speed drifts between processes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits import analyse
from attnbench.results.loader import load_results

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("cpu-machine", "cpu-wide", "cpu-auto", "cpu-reference", "gpu-h200-auto", "gpu-h100")


def _median_s(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", default=list(RUNS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runner = CliRunner()

    def command(verb: str, folder: Path) -> None:
        done = runner.invoke(app, [verb, str(folder), "--json"])
        assert done.exit_code == 0, done.output

    folders = [ROOT / "results" / name for name in args.runs]
    analyse(load_results(folders[0]))  # the imports, once
    print(f"{'run':<16} {'cases':>5} {'load':>8} {'analyse':>8} {'table':>8} {'fit':>8}")
    totals = [0.0] * 4
    for folder in folders:
        run = load_results(folder)
        figures = [
            _median_s(lambda f=folder: load_results(f), args.repeat),
            _median_s(lambda r=run: analyse(r), args.repeat),
            _median_s(lambda f=folder: command("table", f), args.repeat),
            _median_s(lambda f=folder: command("fit", f), args.repeat),
        ]
        totals = [a + b for a, b in zip(totals, figures, strict=True)]
        cells = " ".join(f"{s:7.2f}s" for s in figures)
        print(f"{folder.name:<16} {len(run.frame):>5} {cells}")
    print(f"{'all':<16} {'':>5} " + " ".join(f"{s:7.2f}s" for s in totals))


if __name__ == "__main__":
    main()
