"""The committed runs under results/ are what the tool makes of them today: re-plotting each
draws its committed charts byte for byte, and the README's tables are theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.render.charts import plot_run
from attnbench.results.loader import load_results

ROOT = Path(__file__).resolve().parents[1]
# The committed runs, by name (the golden files name them): never whatever a user's own sweep
# left under results/, which the README's first command writes there.
COMMITTED = sorted(p.stem for p in (ROOT / "tests" / "golden").glob("*.json"))
PLOTTED = [
    ROOT / "results" / name for name in COMMITTED if (ROOT / "results" / name / "charts").is_dir()
]


@pytest.mark.slow
@pytest.mark.parametrize("folder", PLOTTED, ids=lambda p: p.name)
def test_replotting_a_committed_run_draws_its_committed_charts(folder: Path, tmp_path: Path):
    committed = sorted((folder / "charts").glob("*.svg"))  # the PNGs rasterise the same figures
    names = [p.stem for p in committed]
    run = load_results(folder)
    drawn = plot_run(run, names=names, formats=["svg"], out_dir=tmp_path)  # as `plot` draws
    assert sorted(p.stem for p in drawn) == sorted(names)  # every committed chart drawn again
    differ = [p.name for p in committed if (tmp_path / p.name).read_bytes() != p.read_bytes()]
    assert not differ, f"attnbench plot {folder} draws other charts: {differ}"


@pytest.mark.slow
def test_the_readmes_tables_are_the_committed_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "readme_tables.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
