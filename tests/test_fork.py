"""The fork executor: every timing round of a case in a fresh process forked from a server that
has imported torch, and a case that kills its process (a crash, too much memory, a hang) is a
recorded case, never the end of the sweep."""

from __future__ import annotations

import itertools
import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.measure.record import WORKER_DIED_ERROR
from attnbench.options import build_grid
from attnbench.results.loader import load_results
from attnbench.run import queue
from attnbench.run.executors import default_executor, make_executor
from attnbench.run.executors.fresh import Ending, Limits, run_fresh
from attnbench.run.queue import UNCALIBRATED
from attnbench.run.sweep import run_sweep

pytestmark = pytest.mark.slow  # each sweep starts a fork server: an import of torch

runner = CliRunner()

BREAKING = """
import os
import time

import torch
from torch import nn


class Breaking(nn.Module):
    '''A linear layer that breaks its process from n = 32 on, in the way its factory says.'''

    def __init__(self, d, how):
        super().__init__()
        self.lin, self.how, self.kept = nn.Linear(d, d), how, []

    def forward(self, x):
        if x.shape[1] >= 32:
            if self.how == "abort":
                os.abort()
            if self.how == "memory":
                self.kept.append(torch.ones(2**28))  # 1 GiB, kept
            if self.how == "hang":
                time.sleep(3600)
        return self.lin(x)


def aborts(d):
    return Breaking(d, "abort")


def hogs(d):
    return Breaking(d, "memory")


def hangs(d):
    return Breaking(d, "hang")
"""


@pytest.fixture
def breaking(tmp_path: Path) -> Path:
    path = tmp_path / "breaking.py"
    path.write_text(textwrap.dedent(BREAKING))
    return path


@pytest.fixture
def fork() -> Iterator[object]:
    executor = make_executor("fork")
    try:
        yield executor
    finally:
        executor.close()


def _sweep(layers: str, out: Path, executor: object, **extra: object):  # type: ignore[no-untyped-def]
    grid = build_grid(
        {"layers": layers, "n": "16,32,64", "d": "8", "device": "cpu", "time_budget": 0.01}
        | {"processes": 2}
        | extra
    )
    return run_sweep(grid, out, executor=executor, measuring=UNCALIBRATED)  # type: ignore[arg-type]


def test_every_round_is_a_process_of_its_own(tmp_path: Path, fork: object) -> None:
    run = _sweep("conv,rnn", tmp_path / "run", fork)
    assert set(run.frame["status"]) == {"ok"} and run.meta["cluster"]["executor"] == "fork"
    per_job = run.samples.groupby(["case_id", "round"])["process"]
    assert (per_job.nunique() == 1).all()  # a round's samples come from one process
    assert per_job.first().is_unique  # and no two rounds share one
    assert run.samples.groupby("case_id")["round"].nunique().min() >= 2


def test_a_case_that_aborts_its_process_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path, breaking: Path, fork: object
) -> None:
    run = _sweep(f"{breaking}:aborts,conv", tmp_path / "run", fork)
    rows = run.frame.set_index("n").groupby("layer")
    mine = rows.get_group("breaking:aborts")
    assert mine.loc[16, "status"] == "ok"
    assert mine.loc[32, "status"] == "failed" and mine.loc[32, "attempts"] == 2  # tried twice
    assert mine.loc[32, "error"].startswith(WORKER_DIED_ERROR)
    assert "signal 6 (SIGABRT)" in mine.loc[32, "error"]
    assert mine.loc[64, "status"] == "skipped"  # a larger case would die the same way
    assert set(rows.get_group("conv")["status"]) == {"ok"}  # measured after it
    assert run.status == "complete"


def test_a_case_that_outgrows_its_memory_is_oom_at_once(
    tmp_path: Path, breaking: Path, fork: object
) -> None:
    run = _sweep(f"{breaking}:hogs,conv", tmp_path / "run", fork, max_case_memory="600MiB")
    mine = run.frame[run.frame["layer"] == "breaking:hogs"].set_index("n")
    assert mine.loc[16, "status"] == "ok"
    assert mine.loc[32, "status"] == "oom" and mine.loc[32, "attempts"] == 1  # no second try
    assert "past the 600 MiB it may take" in mine.loc[32, "error"]
    assert mine.loc[64, "status"] == "skipped"
    assert set(run.frame.loc[run.frame["layer"] == "conv", "status"]) == {"ok"}
    assert run.status == "complete" and run.record.config["max_case_memory"] == 600 * 2**20


def test_a_case_that_hangs_is_a_timeout(
    tmp_path: Path, breaking: Path, fork: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue, "wall_limit", lambda grid: 5.0)
    run = _sweep(f"{breaking}:hangs,conv", tmp_path / "run", fork)
    mine = run.frame[run.frame["layer"] == "breaking:hangs"].set_index("n")
    assert mine.loc[32, "status"] == "timeout" and "ran past 5 s" in mine.loc[32, "error"]
    assert mine.loc[64, "status"] == "skipped"
    assert run.status == "complete"


def test_the_command_line_sweeps_in_fresh_processes_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATTNBENCH_EXECUTOR", raising=False)
    assert default_executor() == "fork" and default_executor("instructions") == "serial"
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "sweep", "--layers", "conv", "--n", "16", "--d", "8", "--device", "cpu",
        "--time-budget", "0.01", "--out", str(out), "--no-charts", "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["status"] == "ok"
    assert load_results(out).meta["cluster"]["executor"] == "fork"


def test_a_fresh_process_brings_its_answer_or_how_it_ended() -> None:
    assert run_fresh(lambda: {"op": "done", "x": 1}, Limits(wall_s=10)).answer == {
        "op": "done",
        "x": 1,
    }
    failed = run_fresh(lambda: 1 / 0, Limits(wall_s=10))  # type: ignore[arg-type, return-value]
    assert failed.answer == {"op": "error", "message": "ZeroDivisionError: division by zero"}

    def exits() -> dict[str, object]:
        import os

        os._exit(3)

    gone = run_fresh(exits, Limits(wall_s=10))
    assert gone.answer is None and gone.ending == Ending.DIED
    assert gone.reason == "the process exited with status 3 and no answer"


def test_a_cases_rounds_go_to_different_fork_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork shares its server's address-space layout, which gives it a speed of its own: a
    case's rounds go to both servers; and a job goes to another server than the job before,
    which is still reaping its process and forking the next."""
    from attnbench.run.executors.process import ForkExecutor, _Server

    seen: list[tuple[int, str, int]] = []
    send = _Server.send

    def spy(self, job, where):  # type: ignore[no-untyped-def]
        seen.append((id(self), job.case.case_id, job.round))
        return send(self, job, where)

    monkeypatch.setattr(_Server, "send", spy)
    executor = ForkExecutor()
    try:
        run = _sweep("conv", tmp_path / "run", executor, processes=3, max_processes=3)
    finally:
        executor.close()
    assert run.meta["cluster"]["servers"] == 2
    by_case: dict[str, set[int]] = {}
    for server, case, _ in seen:
        by_case.setdefault(case, set()).add(server)
    assert by_case and all(len(servers) == 2 for servers in by_case.values())
    used: dict[str, list[int]] = {}
    for before, (server, case, _) in zip([None, *seen], seen, strict=False):
        had = used.setdefault(case, [])
        if before is not None and before[0] == server:  # only where the case needed it
            assert all(
                had.count(other) > had.count(server) for other in set(by_case[case]) - {server}
            )
        had.append(server)
    assert sum(a[0] == b[0] for a, b in itertools.pairwise(seen)) < len(seen) / 3


def test_a_spare_process_prepares_before_its_job_and_answers_it() -> None:
    """A server forks a job's process ahead: it makes what every job needs, then waits; the
    job's message reaches what it made; one whose server goes away ends with no answer."""
    from attnbench.run.executors import fresh
    from attnbench.run.executors.fresh import fork_spare, reap, run_spare

    def prepare():  # type: ignore[no-untyped-def]
        made = os.getpid()
        return lambda message: {"op": "done", "made_in": made, "got": message["x"] * 2}

    spare = fork_spare(prepare)
    outcome = run_spare(spare, {"x": 21}, Limits(wall_s=10))
    reap()
    assert outcome.answer == {"op": "done", "made_in": spare.pid, "got": 42}
    idle = fork_spare(prepare)
    os.close(idle.jobs)  # the server gone before a job: the process leaves, saying nothing
    assert os.read(idle.answers, 8) == fresh.PREPARED  # but that it had prepared
    assert os.read(idle.answers, 8) == b""
    _, status = os.waitpid(idle.pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    os.close(idle.answers)


def test_an_answer_comes_back_before_its_process_has_finished_exiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server replies once the answer is whole; the process's teardown (its memory
    unmapped: about 9 ms a round here) is reaped after, while the driver goes on."""
    from attnbench.run.executors import fresh

    def slow_exit(code: int) -> None:
        time.sleep(5)  # a teardown, made long enough to be seen
        os._exit(code)

    monkeypatch.setattr(fresh, "_leave", slow_exit)
    monkeypatch.setattr(fresh, "_exiting", [])  # this test's processes alone
    spare = fresh.fork_spare(lambda: lambda _: {"op": "done"})
    outcome = fresh.run_spare(spare, {}, Limits(wall_s=10))
    assert outcome.answer == {"op": "done"} and fresh._exiting == [spare.pid]
    assert os.waitpid(spare.pid, os.WNOHANG) == (0, 0)  # answered, still exiting
    fresh.reap()
    assert fresh._exiting == []
    with pytest.raises(ChildProcessError):
        os.waitpid(spare.pid, os.WNOHANG)  # reaped


def test_a_spare_forked_to_settle_has_prepared_before_the_server_goes_on(tmp_path: Path) -> None:
    """A spare that set itself up while another server's job timed took a core from that job:
    small cases read up to 1.5x slower and far noisier (benchmarks/spare_overlap.py). Forked to
    settle, the server goes on only once the spare has prepared, and its answer still reads."""
    from attnbench.run.executors import fresh

    mark = tmp_path / "prepared"

    def prepare():  # type: ignore[no-untyped-def]
        time.sleep(0.3)  # a set-up long enough that a server not waiting would see no mark
        mark.write_text(str(os.getpid()))
        return lambda message: {"op": "done", "got": message["x"]}

    spare = fresh.fork_spare(prepare, settle_s=30.0)
    assert mark.read_text() == str(spare.pid)  # prepared before fork_spare returned
    outcome = fresh.run_spare(spare, {"x": 5}, Limits(wall_s=10))
    fresh.reap()
    assert outcome.answer == {"op": "done", "got": 5}
    unsettled = fresh.fork_spare(prepare)  # the default: forked, not waited for
    assert fresh.run_spare(unsettled, {"x": 1}, Limits(wall_s=10)).answer == {
        "op": "done",
        "got": 1,
    }
    fresh.reap()
