from __future__ import annotations

import functools
import os
import shutil
import tempfile

import pytest
import torch

from attnbench.layers import REGISTRY, LayerEntry, LayerSource
from attnbench.results.run import RunResults
from attnbench.run.executors.process import ForkExecutor
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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        one_thread_per_worker()


def one_thread_per_worker() -> None:
    """Under pytest-xdist (``-n auto``, the addopts: a worker per core) each worker, and every
    process it starts, computes on one thread. Two workers of two threads each on this 2-core
    machine leave every parallel op waiting at its barriers for a descheduled thread: the
    LSTM probes of the machine's ceilings took 40 s instead of 5."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# The longest tests, longest first (about 15 s or more, measured with two workers here on
# 2026-11-28), a name or the start of one: under xdist they go out before the rest, so that
# neither worker starts one of them while the other runs out of tests. The Ray modules, one
# xdist_group of 2-3 minutes on one worker, go first. A test not named here keeps its file's
# order.
LONGEST_FIRST = (
    "tests/test_ray.py::",
    "tests/test_ray_cluster.py::",
    "tests/test_ab.py::test_instruction_counts_repeat_and_gate_an_ab_run",
    "tests/test_history.py::test_change_points_on_seeded_histories_meet_the_targets",
    "tests/test_bisect.py::test_bisect_finds_the_commit_that_made_a_layer_slower",
    "tests/test_committed_runs.py::test_replotting_a_committed_run_draws_its_committed_charts",
    "tests/test_extend.py::test_extended_counts_equal_full_traces_on_every_long_case_of_the_"
    "reference_runs",
    "tests/test_trust.py::test_reading_a_run_never_runs_its_plugin",
    "tests/test_ab.py::test_the_cli_gates_a_slowed_layer_and_passes_an_unchanged_one",
    "tests/test_ab.py::test_every_job_of_either_side_is_a_fresh_process",
    "tests/test_ab.py::test_sides_are_measured_in_turn_abba_round_after_round",
    "tests/test_malformed.py::test_a_mangled_run_gets_one_line_from_every_reading_command",
    "tests/test_fork.py::test_a_cases_rounds_go_to_different_fork_servers",
    "tests/test_interrupt.py::test_a_signal_keeps_every_finished_case_and_resume_completes_the_"
    "sweep",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the tests of ``LONGEST_FIRST`` first (each worker collects, and sorts, the
    same list); a run without workers keeps the files' order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item: pytest.Item) -> int:
        name = item.nodeid.split("[")[0].split("@")[0]
        return next(
            (i for i, s in enumerate(LONGEST_FIRST) if name.startswith(s)), len(LONGEST_FIRST)
        )

    items.sort(key=rank)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: xdist's count (one worker per core), but none where every argument names a
    test (``pytest tests/test_x.py::test_y``): workers would cost more than the test (two
    imports of torch and a collection, 8 s)."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    return None


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
def one_fork_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ab``'s sides (and so bisect's races) fork their rounds from one server each, not
    ``ForkExecutor``'s three. A server is an import of torch (2 s of a core): three a side were
    most of what an ``ab`` run of a tiny grid cost (a bisect race: 20 s, 7.5 s with one).
    Where a test's layer sleeps or the test counts processes, a server's address-space layout
    moves nothing it checks; tests/test_fork.py and tests/test_ab.py keep the three where the
    servers are what they test."""
    import attnbench.run.ab as ab

    monkeypatch.setattr(ab, "ForkExecutor", functools.partial(ForkExecutor, servers=1))


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
