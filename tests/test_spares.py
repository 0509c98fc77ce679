"""A fork server's spares: each job's process forked ahead, a dead spare forked again rather
than charged to the job, the host's profiler cost measured once a server, the server picked so
that the last one can reap and fork while the next job runs, and nothing left behind at stop."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from attnbench.measure.timing import split
from attnbench.run.executors import child, fresh, wire
from attnbench.run.executors.fresh import Limits
from attnbench.run.executors.process import pick_server


def test_a_server_is_picked_to_spread_a_case_and_leave_the_last_one_be() -> None:
    assert pick_server([], None, 3) == 0
    assert pick_server([], 0, 3) == 1  # any server would do: not the one still reaping
    assert pick_server([0, 1], 1, 3) == 2  # the one this case has not had
    assert pick_server([0, 1], 2, 3) == 2  # ... even where the last job went (it must wait)
    assert pick_server([0, 1, 2], 0, 3) == 1
    assert pick_server([0], 0, 2) == 1 and pick_server([0, 1], 1, 2) == 0  # two: in turn
    assert pick_server([0], 0, 1) == 0  # one server: it, whatever came before


def server(monkeypatch: pytest.MonkeyPatch, work: Any) -> child._ForkServer:
    """A fork server whose spares run ``work`` on their job's message (no torch, no worker)."""
    monkeypatch.setattr(child, "_prepared", lambda start: work)
    monkeypatch.setattr(child, "job_limits", lambda job: Limits(wall_s=10))
    monkeypatch.setattr(wire, "job_from_wire", lambda message: message)
    monkeypatch.setattr(fresh, "_exiting", [])
    found = child._ForkServer.__new__(child._ForkServer)
    found.start, found.spare = {}, None
    found.ahead()
    return found


def test_a_spare_that_died_before_its_job_is_forked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    here = os.getpid()
    forked = server(
        monkeypatch, lambda message: {"op": "done", "x": message["x"], "pid": os.getpid()}
    )
    assert forked.spare is not None
    first = forked.spare.pid
    os.kill(first, signal.SIGKILL)  # dies waiting (the kernel's OOM killer, a stray signal)
    for _ in range(100):
        with open(f"/proc/{first}/stat", encoding="ascii") as fh:
            if fh.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.01)
    answer = forked.answer({"x": 7})
    assert answer["x"] == 7 and answer["pid"] not in (first, here)  # a new spare ran it
    forked.ahead()
    assert forked.spare is not None and forked.spare.pid != answer["pid"]
    forked.stop()  # the waiting spare leaves and is reaped, with the one that answered
    assert forked.spare is None and fresh._exiting == []
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child of this test's left


def test_the_profiler_cost_measured_in_a_job_is_the_servers_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's process that measured the host's profiler cost sends it back; the server keeps
    it, out of the reply, for every later process; a process handed it sends nothing back."""
    monkeypatch.setattr(split, "_HOST", [])
    monkeypatch.setattr(child, "_worker", lambda start: None)
    monkeypatch.setattr(child, "_run", lambda worker, job: {"op": "done"})
    monkeypatch.setattr(wire, "job_from_wire", lambda message: message)
    work = child._prepared({})
    split.use_profiler_cost(split.ProfilerCost(2e-7, 6e-7))  # as a case's split measures it
    assert work({}) == {"op": "done", child.PROFILER: [2e-7, 6e-7]}
    monkeypatch.setattr(split, "_HOST", [])
    handed = child._prepared({child.PROFILER: [3e-7, 7e-7]})
    assert split.profiler_cost() == split.ProfilerCost(3e-7, 7e-7)  # not measured here
    assert handed({}) == {"op": "done"}
    # the server: the cost comes out of the reply and goes into the next spares' start
    forked = server(monkeypatch, lambda message: {"op": "done", child.PROFILER: [1e-7, 5e-7]})
    try:
        assert forked.answer({}) == {"op": "done"}
        assert forked.start[child.PROFILER] == [1e-7, 5e-7]
    finally:
        forked.stop()
