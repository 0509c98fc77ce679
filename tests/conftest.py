from __future__ import annotations

import pytest

from attnbench.results import RunResults
from attnbench.runner import run_sweep
from attnbench.spec import Grid, build_grid


def _tiny_grid() -> Grid:
    """Two lengths, one width, every layer: a sweep of seconds."""
    return build_grid({"n": "16,32", "d": "8", "device": "cpu", "time_budget": 0.005, "heads": 2})


@pytest.fixture
def tiny_grid() -> Grid:
    return _tiny_grid()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    """One real tiny sweep shared by the tests that only read results."""
    return run_sweep(_tiny_grid(), tmp_path_factory.mktemp("run") / "tiny")
