"""The committed runs under results/ are what the tool makes of them today: every committed
chart's data (lines, bands, markers, labels, scales, limits) is what the tool builds from its
run, held to golden files written from those very chart files; the charts the README and the
manual show are drawn again byte for byte; the README's tables are theirs, and each committed
report.md is what ``attnbench report`` writes. Not held: what only
drawing settles in a chart no page links (ticks, font sizes, where a legend sits).

After a change that means to move what a chart shows: ``attnbench plot results/<run>`` for
each run, then ``python tests/test_committed_runs.py --write`` (it refuses a chart whose data
moved while its file did not), and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chartdata import figure_data, first_difference
from matplotlib.figure import Figure

from attnbench.fits import analyse
from attnbench.measure.timing.contention import BUSY_ENV
from attnbench.render.charts import build_charts, existing_charts, save_charts
from attnbench.render.report import report_markdown
from attnbench.results.loader import load_results

# committed runs read as a user's shell reads them (conftest's read_as_a_user_reads)
pytestmark = pytest.mark.usefixtures("read_as_a_user_reads")

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "charts"
# The committed runs, by name (the golden files name them): never whatever a user's own sweep
# left under results/, which the README's first command writes there.
COMMITTED = sorted(p.stem for p in (ROOT / "tests" / "golden").glob("*.json"))
PLOTTED = [
    ROOT / "results" / name for name in COMMITTED if (ROOT / "results" / name / "charts").is_dir()
]


LINKED = re.compile(r"results/([\w.-]+)/charts/([\w-]+)\.(?:png|svg)")


def shown() -> dict[str, set[str]]:
    """The charts a reader sees: each ``results/<run>/charts/<name>.png`` the README and the
    manual link, by run."""
    found: dict[str, set[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for run, name in LINKED.findall(page.read_text()):
            found.setdefault(run, set()).add(name)
    return found


def digests(folder: Path) -> dict[str, str]:
    """Each committed SVG's sha256, by chart."""
    charts = sorted((folder / "charts").glob("*.svg"))
    return {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in charts}


def charts_of(folder: Path) -> dict[str, Figure]:
    """The run's committed charts as the tool builds them today (as ``attnbench plot`` does)."""
    names = [p.stem for p in sorted((folder / "charts").glob("*.svg"))]
    run = load_results(folder)
    return build_charts(run, analyse(run), names)


def test_the_charts_a_reader_sees_are_committed_charts() -> None:
    seen = shown()
    assert {"cpu-auto", "cpu-machine"} <= set(seen)  # the README's first chart, the manual's
    missing = [f"{run}/{name}" for run, names in seen.items() for name in names
               if not (ROOT / "results" / run / "charts" / f"{name}.svg").exists()]  # fmt: skip
    assert not missing and set(seen) <= {p.name for p in PLOTTED}, missing


def test_chart_data_tells_two_figures_apart_by_a_point_a_colour_or_a_label() -> None:
    def drawn(y: float = 2.0, color: str = "C0", label: str = "n") -> dict[str, Any]:
        figure = Figure()
        ax = figure.add_subplot()
        ax.plot([1, 2], [1, y], color=color, label=label)
        ax.fill_between([1, 2], [0.5, 1], [1.5, 3], alpha=0.2)
        ax.legend()
        return figure_data(figure)

    assert first_difference(drawn(), drawn()) is None
    assert first_difference(drawn(y=2.5), drawn()) == "/axes/0/lines/0/y/1: 2.5 != 2.0"
    assert first_difference(drawn(color="C1"), drawn()).startswith("/axes/0/legend/handles/0")
    assert first_difference(drawn(label="d"), drawn()).startswith("/axes/0/legend/texts/0")


@pytest.mark.slow
@pytest.mark.parametrize("folder", PLOTTED, ids=lambda p: p.name)
def test_a_committed_runs_charts_show_what_the_tool_draws_today(folder: Path, tmp_path: Path):
    figures = charts_of(folder)
    committed = sorted((folder / "charts").glob("*.svg"))  # the PNGs rasterise the same figures
    assert sorted(figures) == sorted(p.stem for p in committed)  # every committed chart built
    data = {name: figure_data(figure) for name, figure in figures.items()}
    golden = json.loads((GOLDEN / f"{folder.name}.json").read_text())
    # the golden data was written from these very files (``main`` refuses stale ones)
    assert golden["files"] == digests(folder), (
        f"results/{folder.name}/charts changed since its golden data was written: "
        "python tests/test_committed_runs.py --write"
    )
    where = first_difference(data, golden["charts"])
    assert where is None, f"attnbench plot {folder.name} shows other data: {where}"
    # the ones a reader sees, drawn again: the same bytes as committed
    seen = {name: figures[name] for name in sorted(shown().get(folder.name, ()))}
    drawn = save_charts(seen, tmp_path, ["svg"])
    differ = [p.name for p in drawn if p.read_bytes() != (folder / "charts" / p.name).read_bytes()]
    assert not differ, f"attnbench plot {folder.name} draws other charts: {differ}"


REPORTS = sorted((ROOT / "results").glob("*/report.md"))


@pytest.mark.slow
@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.name)
def test_a_committed_report_is_what_attnbench_report_writes_today(path: Path) -> None:
    """The committed reports (the manual links results/cpu-wide/report.md) went stale once,
    after a change to the notes, with nothing to catch it: now they are held to the text."""
    run = load_results(path.parent)
    charts = existing_charts(path.parent / "charts")
    text = report_markdown(run, analyse(run), charts, path.parent)
    lines, old = text.splitlines(), path.read_text().splitlines()
    differ = [i + 1 for i, pair in enumerate(zip(lines, old, strict=False)) if len(set(pair)) > 1]
    assert lines == old, (
        f"attnbench report results/{path.parent.name} writes other text (line "
        f"{(differ or [min(len(lines), len(old)) + 1])[0]}): run it, and say why in the commit"
    )


@pytest.mark.slow
def test_the_readmes_tables_are_the_committed_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "readme_tables.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def main() -> None:
    """Write each run's golden data and the digests of the files it was written from; refuse,
    before writing any, a chart whose data moved while its committed file did not (re-plot the
    run first, and pass --replotted)."""
    os.environ.pop(BUSY_ENV, None)  # as the tests read them: read_as_a_user_reads
    GOLDEN.mkdir(exist_ok=True)
    written, stale = {}, []
    for folder in PLOTTED:
        data = {name: figure_data(figure) for name, figure in charts_of(folder).items()}
        files, path = digests(folder), GOLDEN / f"{folder.name}.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        stale += [
            f"results/{folder.name}/charts/{name}.svg"
            for name in data
            if first_difference(data[name], old.get("charts", {}).get(name))
            and files.get(name) == old.get("files", {}).get(name)
        ]
        written[path] = {"charts": data, "files": files}
    # --replotted: every run was re-plotted just now, and data moved that no SVG shows (a
    # z-order that leaves the order of drawing as it was)
    if stale and "--replotted" not in sys.argv:
        sys.exit(
            f"{', '.join(stale)}: other data than when the golden files were written, the same "
            "files: re-plot (attnbench plot results/RUN), then --write again"
        )
    for path, golden in written.items():
        text = json.dumps(golden, sort_keys=True, separators=(",", ":"))
        path.write_text(text + "\n")
        print(f"wrote {path.relative_to(ROOT)} ({len(text) // 1024} KiB)")


if __name__ == "__main__" and "--write" in sys.argv:
    main()
