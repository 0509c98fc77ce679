from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from hypothesis import HealthCheck, settings

from attnbench.devices import usable_cpus
from attnbench.layers import REGISTRY, LayerEntry, LayerSource
from attnbench.measure.machine.ceilings_file import machine_ceilings
from attnbench.options import build_grid, default_threads
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.sweep import run_sweep
from attnbench.spec import Grid

# Hypothesis times its examples (a 200 ms deadline each) and fails a test whose inputs come
# slowly (the too_slow health check): wall-clock assertions, which a shared 2-core machine
# trips (test_spec's config test read "1 valid input after 1.60 s" while a sweep ran beside
# it). The suite's properties are about values, so neither applies.
settings.register_profile("attnbench", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("attnbench")


def pytest_configure(config: pytest.Config) -> None:
    """The machine's ceilings, which every sweep records, are measured once for the whole test
    session into a folder of its own (never the user's cache). The count cache is off: a test
    that changes a counter must see it count (tests/test_countcache.py turns it on)."""
    if not (_worker() and os.environ.get("ATTNBENCH_CACHE_DIR")):  # a worker shares its parent's
        os.environ["ATTNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-cache-")
    os.environ["ATTNBENCH_NO_CACHE"] = "1"
    # The command line's sweeps run in this process unless a test asks for the fork server
    # (tests/test_fork.py): a server costs an import of torch, a case a fork and a first call.
    os.environ.setdefault("ATTNBENCH_EXECUTOR", "serial")
    # No sweep of the suite waits for a quiet machine (the suite's own workers are its
    # neighbours); the waiting is tested with fake clocks (tests/test_quiet.py).
    os.environ["ATTNBENCH_WAIT_QUIET"] = "0"
    os.environ["ATTNBENCH_BUSY_CORES"] = "inf"  # nor leaves out a round its neighbours slowed
    _share_the_cores()


def _share_the_cores() -> None:
    """Under pytest-xdist (the suite runs ``-n auto``), each worker gets its share of the cores
    for torch's threads, and so do the processes it starts (OMP_NUM_THREADS): two workers of
    two threads each on a 2-core machine spun against each other, and the fast loop took 170 s
    where one thread each took 84 s (serially: 145 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    share = max(1, usable_cpus() // workers)  # the affinity's CPUs, as xdist and attnbench count
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


@pytest.fixture(scope="session", autouse=True)
def _no_waiting() -> Iterator[None]:
    """Sweeps made through the API wait for no quiet machine either (see above), and no test's
    sweep reads or leaves a machine's quiet level (``run.quiet``): what an earlier test left
    would judge a later one's rounds (tests/test_quiet.py puts the store back). For the whole
    session, since a fixture of a module or the session is made before any test's own: one of
    a test's own patched only the tests, and the fixtures' sweeps waited up to 10 s a round
    (the suite's other worker is a busy neighbour): the shared wide run took 17-42 s to make
    in the fast loop instead of 5 s."""
    from attnbench.run.quiet import MachineQuiet

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr("attnbench.run.queue.ROUND_WAIT_S", 0.0)
        for module in ("attnbench.run.sweep", "attnbench.run.ab"):
            monkeypatch.setattr(f"{module}.read_quiet", lambda path: MachineQuiet())
        monkeypatch.setattr("attnbench.run.sweep.write_quiet", lambda path, machine: None)
        # nor the machine's earlier sweeps of a case (``run.reruns``): they widen its interval
        monkeypatch.setattr("attnbench.run.sweep.read_reruns", lambda path: {})
        monkeypatch.setattr("attnbench.run.sweep.write_reruns", lambda path, entries: None)
        monkeypatch.setattr("attnbench.run.sweep.other_code", lambda path: {})
        # nor does the start's estimate read the suite's other worker as a busy machine
        monkeypatch.setattr("attnbench.run.estimate.machine_load", lambda: None)
        yield


def _worker() -> str:
    """The pytest-xdist worker this process is ("gw0", ...), or "" in the suite's main process."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's ceilings folder goes with it (a run of the suite left one in /tmp); the
    main process removes it, after its workers."""
    folder = os.environ.get("ATTNBENCH_CACHE_DIR", "")
    if _worker():
        return
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


@pytest.fixture(scope="session", autouse=True)
def _session_ceilings() -> None:
    """The machine's ceilings, measured once for the session before any test (every sweep
    records them): under a lock, so that two workers neither measure them twice nor read a
    half-written entry, and every sweep of the session records the same."""
    session = Path(os.environ["ATTNBENCH_CACHE_DIR"])
    session.mkdir(parents=True, exist_ok=True)
    with FileLock(str(session / "ceilings.lock")):
        machine_ceilings(folder=session)  # torch's threads (one a worker under pytest-xdist)
        if default_threads("cpu") != torch.get_num_threads():  # a sweep's, where it differs
            machine_ceilings(threads=default_threads("cpu"), folder=session)


def own_cache(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of a test's own (``ATTNBENCH_CACHE_DIR``), holding the session's machine
    ceilings (``_session_ceilings``): a sweep measures them into an empty cache first, 2-3 s a
    test."""
    session = Path(os.environ["ATTNBENCH_CACHE_DIR"]) / "ceilings"
    (folder / "ceilings").mkdir(parents=True, exist_ok=True)
    for entry in session.glob("*.json"):
        shutil.copy(entry, folder / "ceilings" / entry.name)
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(folder))
    return folder


def _tiny_grid() -> Grid:
    """Two lengths, one width, every layer: a sweep of seconds."""
    return build_grid({"n": "16,32", "d": "8", "device": "cpu", "time_budget": 0.005, "heads": 2})


@pytest.fixture
def tiny_grid() -> Grid:
    return _tiny_grid()


def shared_run(factory: pytest.TempPathFactory, name: str, grid: Callable[[], Grid]) -> RunResults:
    """A sweep made once for the whole suite: by the first of pytest-xdist's workers to ask,
    in the folder they share, under a lock the others wait on and then read the run from."""
    if not _worker():
        return run_sweep(grid(), factory.mktemp("run") / name)
    folder = factory.getbasetemp().parent / f"shared-{name}"  # every worker's temp root
    with FileLock(f"{folder}.lock"):
        done = folder.with_name(f"{folder.name}.made")  # beside the run, not in it
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            run_sweep(grid(), folder)
            done.touch()
    return load_results(folder)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    """One real tiny sweep shared by the tests that only read results."""
    return shared_run(tmp_path_factory, "tiny", _tiny_grid)


@pytest.fixture(scope="session")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    """Four lengths and two widths of conv, rnn and attention: enough for every fit and chart
    (attention's own cost model has four terms and a constant, so it needs seven points)."""
    options = {
        "layers": "conv,rnn,attention",
        "n": "16,32,64,128",
        "d": "8,16",
        "device": "cpu",
        "time_budget": 0.005,
        "heads": 2,
    }
    return shared_run(tmp_path_factory, "wide", lambda: build_grid(options))


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


@pytest.fixture
def read_as_a_user_reads() -> Iterator[None]:
    """A committed run is read with the default busy threshold, as ``attnbench table`` reads
    it: the suite's "never busy" (above) is for its own sweeps, whose workers are each other's
    neighbours, and kept a round the run's reading leaves out."""
    from attnbench.measure.timing.contention import BUSY_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(BUSY_ENV, raising=False)
        yield
