"""The Ray executor on a local Ray instance (ray.init(num_cpus=2)): the same rows as a serial
sweep, workers killed in the middle of a case, interruption and resume, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray_layers
from typer.testing import CliRunner

from attnbench.cli import app
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
from attnbench.run.executors.ray import START_TIMEOUT_ENV, RayExecutor, start_timeout  # noqa: E402
from attnbench.run.executors.ray_cluster import death_reason  # noqa: E402

# One worker of the suite runs every Ray test: a local Ray instance starts a dozen processes,
# and two at once on a 2-core machine took a Ray test from 10 s to 48 s.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def SOURCE(name: str) -> LayerSource:
    return LayerSource("python", f"tests:{name}")


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker")


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers may take minutes to start on a machine busy on both cores (Ray's own processes
    and each worker's torch import compete for them): a deadline no neighbour can run out."""
    monkeypatch.setenv(START_TIMEOUT_ENV, "900")


@pytest.fixture(scope="module", autouse=True)
def local_ray(marker_dir: Path) -> Iterator[None]:
    """One local Ray instance with two CPUs for the module; the test layers live in its workers."""
    ray.cloudpickle.register_pickle_by_value(ray_layers)
    ray.init(
        num_cpus=2,
        _node_ip_address="127.0.0.1",  # the loopback: nothing of the test reaches the network
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": ray_layers.register,
            "env_vars": {"ATTNBENCH_TEST_DIR": str(marker_dir)},
        },
    )
    yield
    ray.shutdown()


@pytest.fixture
def test_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same layers in this process, so that grids may name them."""
    for name, module in ray_layers.TEST_LAYERS.items():
        monkeypatch.setitem(REGISTRY, name, LayerEntry(name, module, source=SOURCE(name)))


def _grid(executor: RayExecutor | None = None, **extra: object) -> Grid:
    options = {"layers": "conv,rnn,attention", "n": "8,16", "d": "8", "heads": 2, "threads": 1}
    options = {**options, "time_budget": 0.01, **extra}
    return build_grid(options, executor.resolve_device if executor else None)


@pytest.fixture
def executor() -> Iterator[RayExecutor]:
    runs_on = RayExecutor()
    yield runs_on
    runs_on.close()


def test_a_ray_sweep_has_the_rows_of_a_serial_one(tmp_path: Path, executor: RayExecutor) -> None:
    serial = run_sweep(_grid(processes=2, max_processes=2), tmp_path / "serial")
    events: list[ProgressEvent] = []
    grid = _grid(executor, processes=2, max_processes=2)
    run = run_sweep(
        grid, tmp_path / "ray", executor=executor, listeners=Listeners(progress=events.append)
    )
    assert sorted(run.frame["case_id"]) == sorted(serial.frame["case_id"])
    for column in ("status", "flops", "seq_steps", "path_len", "threads", "device_name"):
        assert (
            run.frame.set_index("case_id")[column].to_dict()
            == serial.frame.set_index("case_id")[column].to_dict()
        ), column
    assert set(run.frame["node"]) == {socket.gethostname()}
    assert set(run.frame["device_id"]) == {"cpu"}
    assert set(run.samples.groupby("case_id")["round"].nunique()) == {2}
    cluster = run.meta["cluster"]
    assert cluster["executor"] == "ray" and cluster["worker_resources"] == {"num_cpus": 1}
    assert len(cluster["workers"]) == 2  # two CPUs, one thread per case
    assert len({w["pid"] for w in cluster["workers"]}) == 2
    assert all(w["pid"] != os.getpid() for w in cluster["workers"])  # not in this process
    assert max(e.running for e in events) == 2  # two cases at once
    assert run.meta["current_case"] is None and run.status == "complete"


def _kill_when_written(marker: Path, killed: list[int]) -> threading.Thread:
    """Kill (SIGKILL) the process whose pid appears in ``marker``, from outside."""

    def watch() -> None:
        deadline = time.monotonic() + 300  # a margin for a machine busy on both cores
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text():
                pid = int(marker.read_text())
                time.sleep(0.5)  # well inside the case
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_worker_killed_in_a_case_is_survived_and_the_case_retried(
    tmp_path: Path,
    marker_dir: Path,
    executor: RayExecutor,
    test_layers: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    killed: list[int] = []
    watcher = _kill_when_written(marker_dir / "pid", killed)
    events: list[ProgressEvent] = []
    grid = _grid(executor, layers="killed-once,conv")
    run = run_sweep(
        grid, tmp_path / "run", executor=executor, listeners=Listeners(progress=events.append)
    )
    watcher.join(timeout=1)
    assert killed, "the layer never started"
    retries = [e for e in events if e.kind == "retry"]
    assert len(retries) == 1 and retries[0].case.layer == "killed-once"
    assert retries[0].error  # Ray's reason, in one line
    assert "\n" not in retries[0].error
    rows = run.frame.set_index("case_id")
    assert set(rows["status"]) == {"ok"}  # the retry measured it on another worker
    assert len(rows) == 4
    workers = {w["pid"]: w for w in run.meta["cluster"]["workers"]}
    assert killed[0] in workers  # a worker of the sweep, not this process
    # run.json alone tells the story: the dead worker, why, when, and who replaced it.
    dead = workers[killed[0]]
    assert dead["end_reason"].startswith("died: ") and dead["ended"] >= dead["started"]
    # Its replacement is listed once it has started (the other worker may finish the sweep
    # first: a replacement still starting then never ran, and is not a worker of the run).
    replacements = [w for w in workers.values() if "replaces" in w]
    assert [w["replaces"] for w in replacements] in ([], [killed[0]])
    assert dead.get("replaced_by") in (None, *(w["pid"] for w in replacements))
    assert {w["end_reason"] for p, w in workers.items() if p != killed[0]} == {"finished"}
    failed = run.meta["cluster"]["workers_failed"]
    assert len(failed) == 1 and f"pid {killed[0]}" in failed[0]
    assert rows.loc[retries[0].case.case_id, "attempts"] == 2
    time.sleep(1)  # Ray publishes the death from a thread of its own
    assert "(raylet)" not in capsys.readouterr().out  # nothing of Ray's on stdout


def test_a_case_that_kills_every_worker_is_failed_with_the_reason(
    tmp_path: Path, executor: RayExecutor, test_layers: None
) -> None:
    events: list[ProgressEvent] = []
    grid = _grid(executor, layers="doomed,conv", n="8,16,32,64")
    run = run_sweep(
        grid, tmp_path / "run", executor=executor, listeners=Listeners(progress=events.append)
    )
    rows = run.frame.set_index("case_id")
    doomed = rows[rows["layer"] == "doomed"]
    assert doomed.loc["doomed/n=8/d=8/b=1/float32/cpu/forward", "status"] == "failed"
    died = doomed[doomed["status"] == "failed"]
    assert all(e.startswith(WORKER_DIED_ERROR) for e in died["error"])
    assert set(doomed["status"]) <= {"failed", "skipped"}
    assert "skipped" in set(doomed["status"])  # larger cases, after the second death
    assert set(rows.loc[rows["layer"] == "conv", "status"]) == {"ok"}
    assert sum(e.kind == "retry" for e in events) == len(died)  # each died once before failing


def test_an_interrupted_ray_sweep_is_finished_by_resume(
    tmp_path: Path, executor: RayExecutor
) -> None:
    out = tmp_path / "run"

    def stop_after_first(event: ProgressEvent) -> None:
        if event.kind == "done" and event.completed == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(SweepInterrupted):
        run_sweep(
            _grid(executor), out, executor=executor, listeners=Listeners(progress=stop_after_first)
        )
    stopped = load_results(out)
    assert stopped.status == "interrupted" and 1 <= len(stopped.frame) <= 2
    run = resume_sweep(out, executor=executor)
    assert len(run.frame) == 6 and set(run.frame["status"]) == {"ok"}
    assert run.meta["resumes"][0]["cluster"]["executor"] == "ray"


def test_devices_are_checked_against_the_cluster(executor: RayExecutor) -> None:
    assert executor.resolve_device("auto", "float32") == "cpu"
    with pytest.raises(AttnbenchError, match="the Ray cluster has no GPU"):
        executor.resolve_device("cuda", "float32")
    with pytest.raises(AttnbenchError, match="pass --device cuda to use all"):
        executor.resolve_device("cuda:1", "float32")
    with pytest.raises(AttnbenchError, match="no Ray node has 3 CPUs"):
        executor.start(_grid(executor, threads=3))


def test_the_start_deadline_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert start_timeout() == 900.0  # the fixture's
    monkeypatch.delenv(START_TIMEOUT_ENV)
    assert start_timeout() == 120.0
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv(START_TIMEOUT_ENV, bad)
        with pytest.raises(AttnbenchError, match=f"{START_TIMEOUT_ENV}='{bad}': expected"):
            start_timeout()


def test_a_worker_first_unavailable_is_asked_again_until_ray_names_why_it_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node killed mid-call reads first as "temporarily unavailable", before Ray's control
    store names the node's death: the reason recorded is the one Ray gives once it knows."""
    from ray import exceptions

    from attnbench.run.executors import ray as ray_executor

    unavailable = exceptions.ActorUnavailableError("RpcError: Socket closed", None)
    died = exceptions.ActorDiedError()
    answers: list[BaseException | None] = [unavailable, unavailable, died]

    class Actor:
        class __ray_ready__:  # Ray's own name for the call
            @staticmethod
            def remote() -> str:
                return "ref"

    def get(ref: str, timeout: float) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(ray_executor.ray, "get", get)
    monkeypatch.setattr(ray_executor.time, "sleep", lambda s: None)
    assert ray_executor._named_cause(Actor(), unavailable) is died and not answers
    answers[:] = [None]  # it answers after all: the first error stands
    assert ray_executor._named_cause(Actor(), unavailable) is unavailable
    answers[:] = [exceptions.GetTimeoutError("no answer")]  # Ray did not say in time
    assert ray_executor._named_cause(Actor(), unavailable) is unavailable and not answers
    other = exceptions.RayError("gone")
    assert ray_executor._named_cause(Actor(), other) is other  # asked only when unavailable
    monkeypatch.delattr(exceptions, "ActorUnavailableError")  # an older Ray
    assert ray_executor._named_cause(Actor(), other) is other


def test_death_reasons_are_one_line() -> None:
    text = (
        "The actor died because of an error raised in its creation task, "
        "ray::RayWorker.__init__() (pid=1, ip=1)\n  File x\n"
        "attnbench.errors.AttnbenchError: dtype bfloat16 is not supported natively on cuda:0"
    )
    assert death_reason(RuntimeError(text)) == (
        "AttnbenchError: dtype bfloat16 is not supported natively on cuda:0"
    )
    assert death_reason(
        RuntimeError(
            "The actor died unexpectedly before finishing this task.\n\tclass_name: RayWorker"
        )
    ) == ("The actor died unexpectedly before finishing this task.")
    node_died = (  # Ray 2.60's words when the node went: the node, and how it ended
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RayWorker\n"
        "\tpid: 28362\n\tip: 127.0.0.1\nThe actor died because its node has died. Node Id: "
        "bad8\n\tthe actor's node was terminated unexpectedly: health check failed due to "
        "missing too many heartbeats"
    )
    assert death_reason(RuntimeError(node_died)) == (
        "The actor died because its node has died. Node Id: bad8; the actor's node was "
        "terminated unexpectedly: health check failed due to missing too many heartbeats"
    )


def test_the_cli_runs_a_sweep_through_ray(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["sweep", "--executor", "ray", "--layers", "conv", "--n", "8,16", "--d", "8"]
    result = CliRunner().invoke(
        app, [*args, "--threads", "1", "--time-budget", "0.01", "--out", str(out), "--no-charts"]
    )
    assert result.exit_code == 0, result.output
    assert "through ray on 2 worker(s)" in result.output
    assert "on " + socket.gethostname() + " cpu" in result.output  # each case names its worker
    meta = json.loads((out / RUN_FILE).read_text())
    assert meta["cluster"]["executor"] == "ray"
    bad = CliRunner().invoke(app, [*args, "--device", "cuda", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "has no GPU" in bad.output
    assert "Traceback" not in bad.output


def test_gpu_workers_hold_one_gpu_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path without a GPU: the cluster claims two, so two one-GPU workers are asked for;
    Ray cannot place them here, and the sweep says so instead of waiting for ever."""
    runs_on = RayExecutor(start_timeout_s=3)
    try:
        monkeypatch.setattr(runs_on, "_gpus", lambda: 2)
        assert runs_on.resolve_device("auto", "float32") == "cuda:0"
        grid = build_grid(
            {"layers": "conv", "n": "8", "d": "8", "device": "cuda"}, runs_on.resolve_device
        )
        assert grid.device == "cuda:0"  # what each worker sees its own GPU as
        with pytest.raises(AttnbenchError, match="no Ray worker could start: not started within"):
            runs_on.start(grid)
        assert runs_on.worker_resources == {"num_gpus": 1, "num_cpus": 1}
    finally:
        runs_on.close()


PLUGIN = """
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        return self.proj(x + x.mean(dim=1, keepdim=True))  # (B, n, d)


def make(d):
    return Mixer(d)
"""


def test_a_plugin_file_sweeps_and_resumes_on_ray_workers(
    tmp_path: Path, executor: RayExecutor
) -> None:
    """The workers load the plugin from the source the driver ships them, not from the path."""
    path = tmp_path / "ray_mixer.py"
    path.write_text(PLUGIN)
    out = tmp_path / "run"
    grid = _grid(executor, layers=f"{path}:make,conv")
    run = run_sweep(grid, out, executor=executor)
    rows = run.frame.set_index("case_id")
    assert set(rows["status"]) == {"ok"} and len(rows) == 4
    mixer = rows[rows["layer"] == "ray_mixer:make"].sort_values("n")  # arrival order varies
    assert set(mixer["path_len"]) == {1}  # the mean mixes every position
    assert list(mixer["flops"]) == [2 * n * 8 * 8 for n in (8, 16)]
    assert mixer["layer_source"].str.contains("sha256").all()
    assert all(w["pid"] != os.getpid() for w in run.meta["cluster"]["workers"])
    lines = (out / "results.csv").read_text().splitlines(keepends=True)
    (out / "results.csv").write_text("".join(lines[:-1]))  # as if stopped before the last case
    resumed = resume_sweep(out, executor=executor)
    assert list(resumed.frame["case_id"]) == list(run.frame["case_id"])
    assert set(resumed.frame["status"]) == {"ok"}
