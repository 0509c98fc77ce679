"""The executor seam: the runner with workers that finish out of order, die, and sit on
different devices, without Ray (a fake executor runs real jobs in this process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from attnbench.cli.summary import summary_notes
from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.measure.record import WORKER_DIED_ERROR
from attnbench.measure.timing.calibration import Calibration
from attnbench.options import build_grid
from attnbench.results.files import RUN_FILE
from attnbench.results.loader import load_results
from attnbench.run.events import Listeners, ProgressEvent
from attnbench.run.executors import make_executor
from attnbench.run.executors.base import Job, JobDone, Placement, Take
from attnbench.run.executors.serial import SerialExecutor
from attnbench.run.executors.worker import Worker
from attnbench.run.queue import UNCALIBRATED, Measuring
from attnbench.run.sweep import resume_sweep, run_sweep
from attnbench.spec import Grid

SMALL_GEMM = Calibration(size=16, every_s=0.0)  # a point before every job


def _grid(rounds: int = 1, **extra: Any) -> Grid:
    """``rounds`` rounds a case, no more (one: a job is a case)."""
    options = {"layers": "conv,rnn", "n": "8,16,32", "d": "4", "device": "cpu"}
    fixed = {"processes": rounds, "max_processes": rounds}
    return build_grid({**options, "time_budget": 0.003, **fixed, **extra})


class FakeCluster:
    """Two workers in this process, named as two machines (optionally with two device models).

    Both take a job before either reports, and the second reports first, so results arrive out
    of grid order.  ``die`` says, for a job, whether its worker dies in it (the job is lost).
    """

    name = "fake"
    in_process = False

    def __init__(
        self,
        *,
        devices: tuple[str, str] = ("CPU model A", "CPU model A"),
        die: Callable[[Job], bool] = lambda job: False,
        fail_after: int | None = None,
    ) -> None:
        self.devices = devices
        self.die = die
        self.fail_after = fail_after  # raise (the cluster is gone) after this many jobs
        self.ran: list[tuple[str, int, str]] = []  # (case_id, round, node) in running order
        self.begun_during_run: list[Any] = []
        self._workers: list[Worker] = []
        self.meta_path: Path | None = None

    def resolve_device(self, name: str, dtype: str) -> str:
        return SerialExecutor().resolve_device(name, dtype)

    def environment(self, device: str) -> dict[str, Any]:
        return SerialExecutor().environment(device)

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        return SerialExecutor().ceilings(grid, fault_cost)

    def start(self, grid: Grid) -> dict[str, Any]:
        if not self._workers:
            for i, model in enumerate(self.devices):
                worker = Worker(grid.device, grid.threads)
                worker.where = Placement(f"node{i}", "cpu", model, worker.where.threads)
                self._workers.append(worker)
        return {"executor": self.name, "workers": [w.describe() for w in self._workers]}

    @property
    def workers(self) -> int:
        return len(self._workers)

    def run(self, take: Take) -> Iterator[JobDone]:
        count = 0
        while True:
            batch = [(w, job) for w in self._workers if (job := take(w.where)) is not None]
            if not batch:
                return
            for worker, job in reversed(batch):  # the later one reports first
                count += 1
                if self.fail_after is not None and count > self.fail_after:
                    raise AttnbenchError("the fake cluster went away")
                self.ran.append((job.case.case_id, job.round, worker.where.node))
                if self.die(job):
                    yield JobDone(job, worker.where, lost="ActorDiedError: worker killed")
                else:
                    yield worker.run(job)

    def close(self) -> None:
        self._workers.clear()


@pytest.mark.slow
def test_rows_match_a_serial_run_whatever_order_they_arrive_in(tmp_path: Path) -> None:
    serial = run_sweep(
        _grid(rounds=2), tmp_path / "serial", measuring=Measuring(calibration=SMALL_GEMM)
    )
    cluster = FakeCluster()
    events: list[ProgressEvent] = []
    run = run_sweep(
        _grid(rounds=2),
        tmp_path / "fake",
        executor=cluster,
        measuring=Measuring(calibration=SMALL_GEMM),
        listeners=Listeners(progress=events.append),
    )
    assert list(run.frame["case_id"]) != list(serial.frame["case_id"])  # arrival order
    assert set(run.frame["case_id"]) == set(serial.frame["case_id"])
    statuses = dict(zip(run.frame["case_id"], run.frame["status"], strict=True))
    assert statuses == dict(zip(serial.frame["case_id"], serial.frame["status"], strict=True))
    for column in ("flops", "seq_steps", "path_len"):  # exact metrics do not depend on where
        assert (
            run.frame.set_index("case_id")[column].to_dict()
            == serial.frame.set_index("case_id")[column].to_dict()
        )
    assert set(run.frame["node"]) == {"node0", "node1"}
    assert set(serial.frame["node"]) == {os.uname().nodename}
    assert set(run.samples.groupby("case_id")["round"].nunique()) == {2}
    assert len(run.calibration.groupby("point")) == 12  # one point per job, on its worker
    assert run.meta["cluster"]["executor"] == "fake"
    assert max(e.running for e in events) == 2
    assert events[-1].units_done == 12
    assert run.meta["current_case"] is None and run.status == "complete"


def test_a_job_whose_worker_dies_once_runs_again_elsewhere(tmp_path: Path) -> None:
    target = "rnn/n=16/d=4/b=1/float32/cpu/forward"
    cluster = FakeCluster(die=lambda job: job.case.case_id == target and job.attempt == 1)
    events: list[ProgressEvent] = []
    run = run_sweep(
        _grid(),
        tmp_path / "run",
        executor=cluster,
        listeners=Listeners(progress=events.append),
        measuring=UNCALIBRATED,
    )
    assert run.frame.set_index("case_id").loc[target, "status"] == "ok"
    retries = [e for e in events if e.kind == "retry"]
    assert [e.case.case_id for e in retries] == [target]
    assert "worker killed" in retries[0].error
    assert [c for c, _, _ in cluster.ran].count(target) == 2
    attempts = run.frame.set_index("case_id")["attempts"]
    assert attempts[target] == 2 and set(attempts.drop(target)) == {1}  # on record
    console = Console(record=True, width=300)
    summary_notes(run, console)
    text = console.export_text()
    assert "1 case(s) ran on a second worker after the first died in them" in text
    assert "rnn n=16 d=4" in text


def test_a_job_whose_worker_dies_twice_is_failed_and_blocks_larger_cases(tmp_path: Path) -> None:
    target = "rnn/n=8/d=4/b=1/float32/cpu/forward"
    cluster = FakeCluster(die=lambda job: job.case.case_id == target)
    grid = _grid(layers="rnn,conv", n="8,16,32,64")
    run = run_sweep(grid, tmp_path / "run", executor=cluster, measuring=UNCALIBRATED)
    rows = run.frame.set_index("case_id")
    assert rows.loc[target, "status"] == "failed"
    assert rows.loc[target, "error"].startswith(WORKER_DIED_ERROR)
    assert "worker killed" in rows.loc[target, "error"]
    assert rows.loc[target, "node"] in ("node0", "node1")  # where it died the second time
    assert rows.loc[target, "attempts"] == 2
    assert [c for c, _, _ in cluster.ran].count(target) == 2
    # n=16 and n=32 were handed out beside the two tries of n=8, so they ran; n=64 came up
    # after the second death: skipped, as after an out-of-memory case
    assert rows.loc["rnn/n=64/d=4/b=1/float32/cpu/forward", "status"] == "skipped"
    assert "crashed" in rows.loc["rnn/n=64/d=4/b=1/float32/cpu/forward", "error"]
    assert set(rows.loc[rows["layer"] == "conv", "status"]) == {"ok"}


@pytest.mark.slow
def test_a_lost_later_round_is_retried_then_left_out(tmp_path: Path) -> None:
    target = "conv/n=8/d=4/k=3/b=1/float32/cpu/forward"
    cluster = FakeCluster(die=lambda job: job.case.case_id == target and job.round == 2)
    run = run_sweep(_grid(rounds=3), tmp_path / "run", executor=cluster, measuring=UNCALIBRATED)
    assert run.frame.set_index("case_id").loc[target, "status"] == "ok"
    assert sorted(run.samples[run.samples["case_id"] == target]["round"].unique()) == [1, 3]
    assert [(c, r) for c, r, _ in cluster.ran].count((target, 2)) == 2


@pytest.mark.slow
def test_later_rounds_stay_on_the_device_model_of_the_first(tmp_path: Path) -> None:
    cluster = FakeCluster(devices=("GPU model A", "GPU model B"))
    run = run_sweep(_grid(rounds=3), tmp_path / "run", executor=cluster, measuring=UNCALIBRATED)
    model = dict(zip(run.frame["case_id"], run.frame["device_name"], strict=True))
    node_model = {"node0": "GPU model A", "node1": "GPU model B"}
    assert set(model.values()) == {"GPU model A", "GPU model B"}
    for case_id, _round, node in cluster.ran:
        assert node_model[node] == model[case_id]
    assert set(run.samples.groupby("case_id")["round"].nunique()) == {3}


@pytest.mark.slow
def test_a_signal_lets_running_jobs_finish_and_resume_completes(tmp_path: Path) -> None:
    out = tmp_path / "run"

    def stop_early(event: ProgressEvent) -> None:
        if event.kind == "done" and event.completed == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(SweepInterrupted):
        run_sweep(
            _grid(),
            out,
            executor=FakeCluster(),
            listeners=Listeners(progress=stop_early),
            measuring=UNCALIBRATED,
        )
    stopped = load_results(out)
    assert len(stopped.frame) == 2  # the job running beside the first was written too
    assert stopped.status == "interrupted"
    run = resume_sweep(out, executor=FakeCluster())
    assert len(run.frame) == 6 and set(run.frame["status"]) == {"ok"}
    assert run.meta["resumes"][0]["cluster"]["executor"] == "fake"


def test_an_executor_that_fails_keeps_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(
        AttnbenchError,
        match=r"went away; the 2 finished case\(s\) are saved: "
        r"attnbench sweep --resume",
    ):
        run_sweep(_grid(), out, executor=FakeCluster(fail_after=2), measuring=UNCALIBRATED)
    run = load_results(out)
    assert len(run.frame) == 2 and run.status == "interrupted"


@pytest.mark.slow
def test_out_of_process_workers_leave_no_case_for_resume_to_blame(tmp_path: Path) -> None:
    """A case runs in a worker, so the sweep's own death says nothing about the case."""
    out = tmp_path / "run"
    seen: list[Any] = []

    def look(event: ProgressEvent) -> None:
        if event.kind == "start":
            seen.append(load_results(out).meta["current_case"])

    run_sweep(
        _grid(),
        out,
        executor=FakeCluster(),
        listeners=Listeners(progress=look),
        measuring=UNCALIBRATED,
    )
    assert seen and set(seen) == {None}
    serial_seen: list[Any] = []
    out2 = tmp_path / "serial"

    def look_serial(event: ProgressEvent) -> None:
        if event.kind == "start":
            serial_seen.append(load_results(out2).meta["current_case"])

    run_sweep(
        _grid(),
        out2,
        listeners=Listeners(progress=look_serial),
        measuring=UNCALIBRATED,
    )
    assert serial_seen[0] == "conv/n=8/d=4/k=3/b=1/float32/cpu/forward"


@pytest.mark.slow
def test_serial_is_the_default_and_ray_is_imported_only_when_asked() -> None:
    assert isinstance(make_executor("serial"), SerialExecutor)
    with pytest.raises(AttnbenchError, match="only with --executor ray"):
        make_executor("serial", address="auto")
    with pytest.raises(AttnbenchError, match="unknown executor 'dask'"):
        make_executor("dask")
    code = "import sys, attnbench.cli, attnbench.run.sweep; print('ray' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "False"  # the CLI and the core load without importing Ray


def test_a_missing_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("attnbench.run.executors.ray", "attnbench.run.executors.ray_cluster"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(AttnbenchError, match=r'pip install "attnbench\[ray\]"'):
        make_executor("ray")


def test_the_cli_says_how_to_install_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from attnbench.cli import app

    for module in ("attnbench.run.executors.ray", "attnbench.run.executors.ray_cluster"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["sweep", "--executor", "ray", "--out", str(out)])
    assert result.exit_code == 2
    assert 'pip install "attnbench[ray]"' in result.output
    assert "Traceback" not in result.output
    assert not (out / RUN_FILE).exists()


def test_job_and_placement_survive_a_round_trip_through_pickle() -> None:
    """What crosses to a worker and back must pickle (Ray ships both)."""
    import pickle

    grid = _grid()
    job = Job(grid.cases()[0], 1, 0, replace(grid_policy(grid)), calibration=SMALL_GEMM)
    assert pickle.loads(pickle.dumps(job)) == job
    worker = Worker("cpu", None)
    done = worker.run(job)
    back = pickle.loads(pickle.dumps(done))
    assert back.result is not None and back.result.status == "ok"
    assert back.result.node == worker.where.node and back.point is not None


def grid_policy(grid: Grid) -> Any:
    from attnbench.measure import TimingPolicy

    return TimingPolicy(budget_s=grid.time_budget_s, warmup_calls=1)


@pytest.mark.slow
def test_a_serial_sweep_leaves_the_callers_thread_count(tmp_path: Path) -> None:
    import torch

    from attnbench.devices import usable_cpus

    before = torch.get_num_threads()
    other = 1 if before > 1 else 2  # a count this process may use (never above its CPUs)
    if other > usable_cpus():
        pytest.skip("one CPU: no second thread count to sweep with")
    run = run_sweep(_grid(threads=other), tmp_path / "run", measuring=UNCALIBRATED)
    assert set(run.frame["threads"]) == {other}  # the cases ran with --threads
    assert run.meta["environment"]["torch_threads"] == other
    assert torch.get_num_threads() == before


def test_a_job_crosses_the_wire_with_its_calibration_spacing() -> None:
    """A Ray worker rebuilds the job from plain data: the calibration's size, spacing and
    policy all arrive (a message from before the spacing existed gets the defaults)."""
    from attnbench.measure.timing.calibration import CALIBRATION_EVERY_S
    from attnbench.measure.timing.loop import DEFAULT_POLICY
    from attnbench.run.executors.wire import job_from_wire, job_to_wire

    case = _grid().cases()[0]
    job = Job(case=case, round=1, seed=0, policy=DEFAULT_POLICY, calibration=SMALL_GEMM)
    back = job_from_wire(job_to_wire(job))
    assert back.calibration == SMALL_GEMM and back.calibration.every_s == 0.0
    assert back.calibration.policy == SMALL_GEMM.policy
    slow = replace(SMALL_GEMM, policy=replace(SMALL_GEMM.policy, budget_s=0.5))
    assert job_from_wire(job_to_wire(replace(job, calibration=slow))).calibration == slow
    older = job_to_wire(job)
    older["calibration"] = {"size": 16}
    assert job_from_wire(older).calibration == Calibration(size=16, every_s=CALIBRATION_EVERY_S)
