"""What `table --json` and `fit --json` read in every committed run, held to golden files: a
change inside the house that moves a figure fails here.

After a change that means to move them: ``python tests/test_golden.py --write``, and say why
in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
RUNS = sorted(p for p in (ROOT / "results").iterdir() if (p / "results.csv").exists())


def readings(folder: Path) -> dict[str, Any]:
    """The run's `table --json` and `fit --json`, its own path left out."""
    runner = CliRunner()
    found: dict[str, Any] = {}
    for command in ("table", "fit"):
        done = runner.invoke(app, [command, str(folder), "--json"])
        assert done.exit_code == 0, done.output
        data = json.loads(done.stdout)
        if isinstance(data, dict):
            data.pop("path", None)
        found[command] = data
    return found


@pytest.mark.slow
@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_a_committed_run_reads_as_its_golden_file(folder: Path) -> None:
    golden = json.loads((GOLDEN / f"{folder.name}.json").read_text())
    assert readings(folder) == golden


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for folder in RUNS:
        text = json.dumps(readings(folder), indent=1, sort_keys=True)
        (GOLDEN / f"{folder.name}.json").write_text(text + "\n")
        print(f"wrote {GOLDEN.name}/{folder.name}.json")


if __name__ == "__main__" and "--write" in sys.argv:
    main()
