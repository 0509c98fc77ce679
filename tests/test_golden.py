"""What `table --json` and `fit --json` read in every committed run, held to golden files: a
change inside the house that moves a figure fails here.

After a change that means to move them: ``python tests/test_golden.py --write``, and say why
in the commit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from chartdata import first_difference
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.measure.timing.contention import BUSY_ENV

# committed runs read as a user's shell reads them (conftest's read_as_a_user_reads)
pytestmark = pytest.mark.usefixtures("read_as_a_user_reads")


ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
# Held by the golden files, not by what this checkout has: a run the .gitignore keeps out of a
# clean clone fails here instead of being skipped.
HELD = sorted(p.stem for p in GOLDEN.glob("*.json"))


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


def test_every_golden_run_is_in_the_checkout() -> None:
    missing = [name for name in HELD if not (ROOT / "results" / name / "results.csv").exists()]
    assert not missing, f"committed runs missing from the checkout (.gitignore?): {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name", HELD)
def test_a_committed_run_reads_as_its_golden_file(name: str) -> None:
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    assert same_readings(readings(ROOT / "results" / name), golden) is None


def same_readings(found: dict[str, Any], golden: dict[str, Any]) -> str | None:
    """Where two runs' readings differ, or None: numbers within ``chartdata.TOLERANCE`` of each
    other read the same, since a fit's last digit moves with numpy's and scipy's builds (1e-13
    apart on numpy 2.4.6 against the files' own)."""
    return first_difference(json.loads(json.dumps(found)), golden)


def main() -> None:
    os.environ.pop(BUSY_ENV, None)  # as the tests read them: read_as_a_user_reads
    GOLDEN.mkdir(exist_ok=True)
    runs = sorted(p for p in (ROOT / "results").iterdir() if (p / "results.csv").exists())
    for folder in runs:
        text = json.dumps(readings(folder), indent=1, sort_keys=True)
        (GOLDEN / f"{folder.name}.json").write_text(text + "\n")
        print(f"wrote {GOLDEN.name}/{folder.name}.json")


if __name__ == "__main__" and "--write" in sys.argv:
    main()
