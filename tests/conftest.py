from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.spec import Grid, build_grid


@pytest.fixture
def tiny_grid() -> Grid:
    """Two lengths, one width, every layer: a sweep of seconds."""
    return build_grid({"n": "16,32", "d": "8", "device": "cpu", "time_budget": 0.005, "heads": 2})


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real tiny sweep shared by the tests that only read results."""
    from attnbench.runner import run_sweep

    grid = build_grid({"n": "16,32", "d": "8", "device": "cpu", "time_budget": 0.005, "heads": 2})
    out: Path = tmp_path_factory.mktemp("run") / "tiny"
    return run_sweep(grid, out)
