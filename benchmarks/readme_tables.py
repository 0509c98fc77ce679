"""The tables of README.md and docs/getting-started.md, written from the committed runs they quote.

Each table sits between two markers (``<!-- NAME:start -->`` and ``<!-- NAME:end -->``) and is
made here from a run under results/:

- ``reference-table``: median time / peak memory of every layer at d = 64 in
  ``results/cpu-reference`` (the default grid);
- ``comparison-table``: ``attnbench table --markdown`` of ``results/cpu-auto`` (the chapter's
  table, measured where each layer's work shows);
- ``wide-table``: the same of ``results/cpu-wide`` (n = 32..2048 at three widths);
- ``decode-table``: the same of ``results/cpu-decode`` (the table for generation, --mode
  decode --n auto).

    python benchmarks/readme_tables.py           # print the tables
    python benchmarks/readme_tables.py --write   # put them into the pages
    python benchmarks/readme_tables.py --check   # exit 1 if a page holds other tables

tests/test_committed_runs.py runs ``--check``: a table of the pages is always the committed
run's.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each page, and the tables it holds.
PAGES = {
    ROOT / "README.md": ("reference-table", "comparison-table", "decode-table"),
    ROOT / "docs" / "getting-started.md": ("reference-table", "wide-table"),
    ROOT / "docs" / "generation.md": ("decode-table",),
}


def reference_table(folder: Path, d: int = 64) -> str:
    """Median time / peak memory per layer (rows) and length (columns) at width ``d``."""
    from attnbench.results.loader import load_results
    from attnbench.units import fmt_bytes, fmt_seconds

    frame = load_results(folder).measured
    frame = frame[frame["d"] == d]
    ns = sorted(frame["n"].unique())
    lines = ["| layer | " + " | ".join(f"n={n}" for n in ns) + " |", "|---" * (len(ns) + 1) + "|"]
    for layer, group in frame.groupby("layer", sort=False):
        by_n = group.set_index("n")
        cells = [
            f"{fmt_seconds(by_n.loc[n, 'time_s'])} / {fmt_bytes(by_n.loc[n, 'peak_bytes'])}"
            if n in by_n.index
            else "–"
            for n in ns
        ]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_table(folder: Path) -> str:
    """``attnbench table --markdown`` of a run."""
    from attnbench.render.blocks import markdown_table
    from attnbench.results.loader import load_results
    from attnbench.table import comparison_table as table
    from attnbench.table import display

    return markdown_table(display(table(load_results(folder))))


def tables() -> dict[str, str]:
    results = ROOT / "results"
    return {
        "reference-table": reference_table(results / "cpu-reference"),
        "comparison-table": comparison_table(results / "cpu-auto"),
        "wide-table": comparison_table(results / "cpu-wide"),
        "decode-table": comparison_table(results / "cpu-decode"),
    }


def written(text: str, found: dict[str, str], names: tuple[str, ...]) -> str:
    """``text`` with each of its marked blocks (``names``) replaced by its table."""
    for name in names:
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"no {name} markers")
        text = pattern.sub(lambda m, t=found[name]: m.group(1) + t + m.group(2), text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="put the tables into the pages")
    group.add_argument("--check", action="store_true", help="exit 1 if a page differs")
    args = parser.parse_args()
    found = tables()
    if not (args.write or args.check):
        for name, table in found.items():
            print(f"<!-- {name} -->\n{table}")
        return
    stale = []
    for page, names in PAGES.items():
        text = page.read_text()
        new = written(text, found, names)
        if args.write:
            page.write_text(new)
        elif new != text:
            stale.append(page.relative_to(ROOT))
    if stale:
        print(f"{', '.join(map(str, stale))}: tables not the committed runs'; run "
              "python benchmarks/readme_tables.py --write", file=sys.stderr)  # fmt: skip
        sys.exit(1)


if __name__ == "__main__":
    main()
