from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch

from attnbench.layers import REGISTRY, LayerEntry, LayerSource
from attnbench.results.run import RunResults
from attnbench.run.sweep import run_sweep
from attnbench.spec import Grid, build_grid


def pytest_configure(config: pytest.Config) -> None:
    """The machine's ceilings, which every sweep records, are measured once for the whole test
    session into a folder of its own (never the user's cache). The count cache is off: a test
    that changes a counter must see it count (tests/test_countcache.py turns it on)."""
    os.environ["ATTNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-cache-")
    os.environ["ATTNBENCH_NO_CACHE"] = "1"
    # The command line's sweeps run in this process unless a test asks for the fork server
    # (tests/test_fork.py): a server costs an import of torch, a case a fork and a first call.
    os.environ.setdefault("ATTNBENCH_EXECUTOR", "serial")
    # No sweep of the suite waits for a quiet machine (the suite's own workers are its
    # neighbours); the waiting is tested with fake clocks (tests/test_quiet.py).
    os.environ["ATTNBENCH_WAIT_QUIET"] = "0"


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps made through the API wait for no quiet machine either (see above), and no test's
    sweep reads or leaves a machine's quiet level (``run.quiet``): what an earlier test left
    would judge a later one's rounds (tests/test_quiet.py puts the store back)."""
    from attnbench.run.quiet import MachineQuiet

    monkeypatch.setattr("attnbench.run.queue.ROUND_WAIT_S", 0.0)
    for module in ("attnbench.run.sweep", "attnbench.run.ab"):
        monkeypatch.setattr(f"{module}.read_quiet", lambda path: MachineQuiet())
    monkeypatch.setattr("attnbench.run.sweep.write_quiet", lambda path, machine: None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's ceilings folder goes with it (a run of the suite left one in /tmp)."""
    folder = os.environ.get("ATTNBENCH_CACHE_DIR", "")
    if os.path.basename(folder).startswith("attnbench-cache-"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def add_layer(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Register a layer for one test only: ``add_layer(name, factory)`` (or a full entry)."""

    def add(name: str, build=None, **entry) -> LayerEntry:  # type: ignore[no-untyped-def]
        found = LayerEntry(name, build, source=LayerSource("python", f"tests:{name}"), **entry)
        monkeypatch.setitem(REGISTRY, name, found)
        return found

    return add


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


@pytest.fixture(scope="session")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    """Four lengths and two widths of conv, rnn and attention: enough for every fit and chart
    (attention's own cost model has four terms and a constant, so it needs seven points)."""
    grid = build_grid(
        {
            "layers": "conv,rnn,attention",
            "n": "16,32,64,128",
            "d": "8,16",
            "device": "cpu",
            "time_budget": 0.005,
            "heads": 2,
        }
    )
    return run_sweep(grid, tmp_path_factory.mktemp("run") / "wide")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread: on a shared 2-core machine two threads meeting stall for up to a
    second (the reference workload's calls took 0.1 s each instead of 0.3 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
