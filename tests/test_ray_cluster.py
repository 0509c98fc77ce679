"""The Ray executor on a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``:
a head without CPUs and worker nodes of one CPU, each its own raylet, all on the loopback).

Nodes are killed (every process, SIGKILL) or frozen (SIGSTOP) in the middle of a case, and
the results folder alone must tell the story: which node died and why, which worker replaced
which, and which cases were measured twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray_layers

from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.layers import REGISTRY, LayerEntry, LayerSource
from attnbench.measure.record import WORKER_DIED_ERROR
from attnbench.options import build_grid
from attnbench.results.files import RUN_FILE
from attnbench.results.loader import load_results
from attnbench.run.events import Listeners, ProgressEvent
from attnbench.run.sweep import resume_sweep, run_sweep
from attnbench.spec import Grid

ray = pytest.importorskip("ray", reason='the Ray tests need pip install "attnbench[ray]"')
psutil = pytest.importorskip("psutil")  # Ray's own dependency
from ray.cluster_utils import Cluster  # noqa: E402

from attnbench.run.executors.ray import START_TIMEOUT_ENV, RayExecutor  # noqa: E402
from attnbench.run.executors.ray_cluster import connect  # noqa: E402

# One worker of the suite runs every Ray test: a local Ray instance starts a dozen processes,
# and two at once on a 2-core machine took a Ray test from 10 s to 48 s.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

LOOPBACK = "127.0.0.1"
# A frozen node is declared dead after health checks missed for about 2 s, not Ray's minute.
FAST_HEALTH_CHECK = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker")


@pytest.fixture(scope="module")
def cluster(marker_dir: Path) -> Iterator[Cluster]:
    """A head node (no CPUs: no case runs there) and this process connected to it through
    attnbench's own ``connect``, which keeps the loopback address as written."""
    ray.cloudpickle.register_pickle_by_value(ray_layers)
    head = {"num_cpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True, head_node_args={**head, "_system_config": FAST_HEALTH_CHECK}
    )
    connect(
        cluster.address,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": ray_layers.register,
            "env_vars": {"ATTNBENCH_TEST_DIR": str(marker_dir)},
        },
    )
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _add_node(cluster: Cluster) -> Any:
    return cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)


@pytest.fixture
def two_nodes(cluster: Cluster, marker_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """Exactly two fresh worker nodes of one CPU each, and no markers of an earlier test."""
    monkeypatch.setenv(START_TIMEOUT_ENV, "900")  # a machine busy on both cores starts slowly
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node, allow_graceful=False)  # SIGKILL ends a frozen node too
    for marker in marker_dir.iterdir():
        marker.unlink()
    _add_node(cluster)
    _add_node(cluster)
    return cluster


@pytest.fixture
def test_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same layers in this process, so that grids may name them."""
    for name, module in ray_layers.TEST_LAYERS.items():
        source = LayerSource("python", f"tests:{name}")
        monkeypatch.setitem(REGISTRY, name, LayerEntry(name, module, source=source))


@pytest.fixture
def executor(two_nodes: Cluster, test_layers: None) -> Iterator[RayExecutor]:
    runs_on = RayExecutor()  # on the cluster this process is connected to
    yield runs_on
    runs_on.close()


def _grid(executor: RayExecutor, layers: str, n: str = "8") -> Grid:
    options = {"layers": layers, "n": n, "d": "8", "heads": 2, "threads": 1, "time_budget": 0.01}
    return build_grid(options, executor.resolve_device)


def _marker(path: Path) -> tuple[int, str]:
    """The pid and Ray node id that a lost layer's call wrote, once it has."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if path.is_file() and len(text := path.read_text().split()) == 2:
            return int(text[0]), text[1]
        time.sleep(0.05)
    raise AssertionError(f"{path.name} was never written")


def _node(cluster: Cluster, node_id: str) -> Any:
    return next(node for node in cluster.worker_nodes if node.node_id == node_id)


@pytest.fixture
def frozen_processes() -> Iterator[list[psutil.Process]]:
    """The processes a test froze, killed when it ends: shutting the cluster down stops the
    raylet, but its children stay stopped forever (two Ray agents of about 85 MB each were
    left behind by every run of the suite)."""
    frozen: list[psutil.Process] = []
    yield frozen
    for process in frozen:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()  # SIGKILL ends a stopped process too


def _freeze(node: Any, frozen: list[psutil.Process]) -> None:
    """SIGSTOP every process of the node: its raylet and everything it started (kept in
    ``frozen``, for ``frozen_processes`` to kill)."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for process in [raylet, *raylet.children(recursive=True)]:
        process.send_signal(signal.SIGSTOP)
        frozen.append(process)


def _in_background(story: Callable[[], None], marker_dir: Path) -> threading.Thread:
    """Run the test's side of the story beside the sweep; should it fail, every layer is let
    go (no hold, release given), so that the sweep ends and ``_joined`` raises the error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            story()
        except BaseException as exc:  # surfaced by _joined
            errors.append(exc)
            (marker_dir / "hold").unlink(missing_ok=True)
            (marker_dir / "release").touch()

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _joined(thread: threading.Thread) -> None:
    thread.join(timeout=30)
    assert not thread.is_alive()
    for exc in thread.errors:  # type: ignore[attr-defined]
        raise exc


def _run_json(out: Path) -> dict[str, Any]:
    return json.loads((out / RUN_FILE).read_text())


def _rows(out: Path) -> Any:
    return load_results(out).frame.set_index("layer")


def test_a_node_killed_mid_case_is_on_record_and_its_case_measured_by_the_replacement(
    tmp_path: Path,
    marker_dir: Path,
    two_nodes: Cluster,
    executor: RayExecutor,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    hold = marker_dir / "hold"
    hold.touch()  # ``held`` keeps the other worker busy until the lost case has been measured
    killed: dict[str, Any] = {}

    def story() -> None:
        pid, node_id = _marker(marker_dir / "lost-once-1")
        killed.update(pid=pid, node_id=node_id)
        two_nodes.remove_node(_node(two_nodes, node_id), allow_graceful=False)  # all of it
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (out / "results.csv").is_file() and "lost-once" in (out / "results.csv").read_text():
                break
            time.sleep(0.1)
        hold.unlink()

    thread = _in_background(story, marker_dir)
    events: list[ProgressEvent] = []

    def progress(event: ProgressEvent) -> None:
        events.append(event)
        if event.kind == "retry":  # a node joins, where the replacement can start
            # (here, in the main thread: a Ray node registers signal handlers as it starts)
            killed["joined"] = _add_node(two_nodes).node_id

    run_sweep(
        _grid(executor, "lost-once,held"),
        out,
        executor=executor,
        listeners=Listeners(progress=progress),
    )
    _joined(thread)

    # results.csv: both cases measured, the lost one on its second attempt.
    rows = _rows(out)
    assert set(rows["status"]) == {"ok"}
    assert rows.loc["lost-once", "attempts"] == 2 and rows.loc["held", "attempts"] == 1
    # run.json: which node died and why, which worker died with it, which one replaced it.
    cluster = _run_json(out)["cluster"]
    nodes = {n["node_id"]: n for n in cluster["nodes"]}
    assert nodes[killed["node_id"]]["alive"] is False and nodes[killed["node_id"]]["death"]
    assert nodes[killed["joined"]]["alive"] is True  # joined during the sweep, and ran a case
    workers = {w["pid"]: w for w in cluster["workers"]}
    dead = workers[killed["pid"]]
    assert dead["node_id"] == killed["node_id"]
    assert dead["end_reason"].startswith("died: ") and "node" in dead["end_reason"]
    assert killed["node_id"] in dead["end_reason"]  # Ray's reason names the node
    (replacement,) = [w for w in workers.values() if "replaces" in w]
    assert replacement["replaces"] == killed["pid"]
    assert dead["replaced_by"] == replacement["pid"]
    assert replacement["node_id"] == killed["joined"] and replacement["end_reason"] == "finished"
    assert len(workers) == 3
    assert cluster["workers_failed"] == [
        f"{dead['node']} pid {killed['pid']}: {dead['end_reason'].removeprefix('died: ')}"
    ]
    assert [e.case.layer for e in events if e.kind == "retry"] == ["lost-once"]
    time.sleep(1)  # Ray publishes the death from a thread of its own
    assert "(raylet)" not in capsys.readouterr().out


def test_a_case_whose_second_node_dies_too_is_failed_and_its_larger_cases_skipped(
    tmp_path: Path, marker_dir: Path, two_nodes: Cluster, executor: RayExecutor
) -> None:
    """One worker at a time, so that the larger case is not handed out before the smaller one
    has failed: its first node dies, the replacement starts on another node, and that one
    dies too; the third node measures the rest."""
    executor.max_workers = 1
    _add_node(two_nodes)
    out = tmp_path / "run"
    lost: list[str] = []

    def story() -> None:
        for k in (1, 2):
            _, node_id = _marker(marker_dir / f"lost-twice-{k}")
            two_nodes.remove_node(_node(two_nodes, node_id), allow_graceful=False)
            lost.append(node_id)

    thread = _in_background(story, marker_dir)
    run_sweep(_grid(executor, "lost-twice,conv", n="8,16"), out, executor=executor)
    _joined(thread)

    frame = load_results(out).frame.set_index("case_id")
    first = "lost-twice/n=8/d=8/b=1/float32/cpu/forward"
    assert frame.loc[first, "status"] == "failed"
    assert frame.loc[first, "error"].startswith(WORKER_DIED_ERROR)
    # Ray's reason, kept: a node killed mid-call is reported as dead, or, before Ray's control
    # store has noticed, as an actor whose socket closed (one CI run in six read the latter)
    reasons = ("its node has died", "ActorUnavailableError")
    assert any(reason in frame.loc[first, "error"] for reason in reasons)
    assert frame.loc[first.replace("n=8", "n=16"), "status"] == "skipped"
    assert set(frame.loc[frame["layer"] == "conv", "status"]) == {"ok"}
    cluster = _run_json(out)["cluster"]
    assert len(cluster["workers_failed"]) == 2
    nodes = {n["node_id"]: n for n in cluster["nodes"]}
    assert [nodes[i]["alive"] for i in lost] == [False, False]
    died = [w for w in cluster["workers"] if w["end_reason"].startswith("died: ")]
    assert sorted(w["node_id"] for w in died) == sorted(lost)


def test_a_frozen_node_is_declared_dead_by_ray_and_its_case_measured_elsewhere(
    tmp_path: Path,
    marker_dir: Path,
    two_nodes: Cluster,
    executor: RayExecutor,
    frozen_processes: list[psutil.Process],
) -> None:
    out = tmp_path / "run"
    frozen: dict[str, Any] = {}

    def story() -> None:
        pid, node_id = _marker(marker_dir / "lost-once-1")
        frozen.update(pid=pid, node_id=node_id)
        _freeze(_node(two_nodes, node_id), frozen_processes)  # alive to the kernel, silent to Ray

    thread = _in_background(story, marker_dir)
    run_sweep(_grid(executor, "lost-once,conv"), out, executor=executor)
    _joined(thread)

    rows = _rows(out)
    assert set(rows["status"]) == {"ok"} and rows.loc["lost-once", "attempts"] == 2
    cluster = _run_json(out)["cluster"]
    nodes = {n["node_id"]: n for n in cluster["nodes"]}
    assert "health check" in nodes[frozen["node_id"]]["death"]  # missed heartbeats
    dead = next(w for w in cluster["workers"] if w["pid"] == frozen["pid"])
    assert dead["end_reason"].startswith("died: ") and "health check" in dead["end_reason"]
    assert psutil.Process(frozen["pid"]).status() == psutil.STATUS_STOPPED  # never killed


def test_ctrl_c_during_a_re_run_keeps_it_and_resume_finishes_the_sweep(
    tmp_path: Path, marker_dir: Path, two_nodes: Cluster, executor: RayExecutor
) -> None:
    executor.max_workers = 1  # the larger cases wait for the smaller, as in the test above
    _add_node(two_nodes)  # where the re-run starts
    out = tmp_path / "run"

    def story() -> None:
        _, node_id = _marker(marker_dir / "lost-twice-1")
        two_nodes.remove_node(_node(two_nodes, node_id), allow_graceful=False)
        _marker(marker_dir / "lost-twice-2")  # the re-run has started
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: stop handing out cases
        time.sleep(0.5)
        (marker_dir / "release").touch()  # the re-run finishes, and is kept

    thread = _in_background(story, marker_dir)
    with pytest.raises(SweepInterrupted):
        run_sweep(_grid(executor, "lost-twice,conv", n="8,16"), out, executor=executor)
    _joined(thread)

    stopped = load_results(out)
    assert stopped.status == "interrupted"
    frame = stopped.frame.set_index("case_id")
    rerun = frame.loc["lost-twice/n=8/d=8/b=1/float32/cpu/forward"]
    assert rerun["status"] == "ok" and rerun["attempts"] == 2
    assert "lost-twice/n=16/d=8/b=1/float32/cpu/forward" not in frame.index  # never started
    workers = _run_json(out)["cluster"]["workers"]
    reasons = sorted(w["end_reason"].split(":")[0] for w in workers)
    assert reasons.count("died") == 1 and set(reasons) <= {"died", "stopped"}

    resumed = resume_sweep(out, executor=executor)
    assert resumed.status == "complete"
    assert len(resumed.frame) == 4 and set(resumed.frame["status"]) == {"ok"}
    kept = resumed.frame.set_index("case_id").loc["lost-twice/n=8/d=8/b=1/float32/cpu/forward"]
    assert kept["attempts"] == 2  # the re-run's row, not measured a third time
    assert _run_json(out)["resumes"][0]["cluster"]["executor"] == "ray"


def test_connect_leaves_addresses_that_ray_reaches_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """An address that is not the loopback, or a loopback one whose port also answers at the
    machine's network address (a cluster from ``ray start``), goes to ray.init untouched; the
    resolution is turned off only for a cluster on the loopback alone, and only while
    connecting."""
    from ray._private import services

    calls: list[tuple[Any, dict[str, Any], str]] = []

    def init(address: str | None = None, **options: Any) -> None:
        calls.append((address, options, services.resolve_ip_for_localhost("localhost")))

    monkeypatch.setattr(ray, "init", init)
    # The machine's network address, as Ray finds it before this process joins a cluster.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: the route's own address
        ip = probe.getsockname()[0]
    if ip.startswith("127."):
        pytest.skip("this machine has no network address besides the loopback")
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: ip)
    monkeypatch.setattr(services, "get_node_ip_address", lambda address=None: ip)
    resolve = services.resolve_ip_for_localhost
    connect("10.1.2.3:6379", log_to_driver=False)
    connect("auto")
    with socket.create_server(("", 0)) as listening:  # a port open on every address
        everywhere = listening.getsockname()[1]
        connect(f"127.0.0.1:{everywhere}")
    assert [(a, o) for a, o, _ in calls] == [
        ("10.1.2.3:6379", {"log_to_driver": False}),
        ("auto", {}),
        (f"127.0.0.1:{everywhere}", {}),
    ]
    assert {resolved for _, _, resolved in calls} == {ip}  # Ray's own resolution
    with socket.create_server(("127.0.0.1", 0)) as loopback_only:
        port = loopback_only.getsockname()[1]
        connect(f"localhost:{port}")
    assert calls[-1] == (f"localhost:{port}", {"_node_ip_address": "127.0.0.1"}, "localhost")
    assert services.resolve_ip_for_localhost is resolve  # Ray's own again afterwards

    def refused(address: str | None = None, **options: Any) -> None:
        calls.append((address, options, ""))
        raise ConnectionError("refused")  # an OSError: not taken for "nothing answers"

    monkeypatch.setattr(ray, "init", refused)
    before = len(calls)
    with socket.create_server(("", 0)) as listening, pytest.raises(ConnectionError):
        connect(f"127.0.0.1:{listening.getsockname()[1]}")
    assert len(calls) == before + 1  # Ray's error, once: no second try on the loopback


def test_a_refused_connection_says_how_token_authentication_is_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray's own words are "Failed to connect"; the cause (InvalidAuthToken) is only logged."""

    def refused(address: str | None = None, **options: Any) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(AttnbenchError, match="set RAY_AUTH_MODE=token") as error:
        RayExecutor(address="10.1.2.3:6379")
    assert str(error.value).startswith("no Ray cluster at '10.1.2.3:6379': Failed to connect")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # told already: no advice
    with pytest.raises(AttnbenchError) as told:
        RayExecutor(address="10.1.2.3:6379")
    assert "RAY_AUTH_MODE" not in str(told.value)
