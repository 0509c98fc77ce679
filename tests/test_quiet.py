"""A busy machine, judged and waited out: the machine's quiet level kept across sweeps
(``run.quiet``), a round that waits for the reference to read quiet (``settle``), and a run
read against the quieter of its own level and the machine's."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import own_cache

from attnbench.estimators import QUIET_FACTOR, quieter, t_quantile
from attnbench.measure.timing import reference
from attnbench.options import build_grid
from attnbench.results.loader import load_results
from attnbench.run import queue as queue_module
from attnbench.run.quiet import KEEP, MachineQuiet, quiet_file, read_quiet, write_quiet
from attnbench.run.sweep import run_sweep
from attnbench.schema import Status

QUIET = 1e-3  # seconds of one reference call on a quiet machine, here


def tiny_grid(**extra: object):  # type: ignore[no-untyped-def]
    options = {"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 3}
    return build_grid({**options, "time_budget": 0.003, **extra})


def readings(monkeypatch: pytest.MonkeyPatch, values: list[float]) -> list[float]:
    """``read_reference`` answers ``values`` in turn (the last one for ever after)."""
    left = list(values)

    def read(clock: object = None) -> float:
        return left.pop(0) if len(left) > 1 else left[0]

    monkeypatch.setattr(reference, "read_reference", read)
    return left


def test_a_round_waits_until_the_machine_reads_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = 2 * QUIET
    readings(monkeypatch, [busy, busy, busy, QUIET])
    slept: list[float] = []
    found, waited = reference.settle(QUIET, 10.0, sleep=slept.append)
    assert found == QUIET and waited == 3 * reference.POLL_S and slept == [reference.POLL_S] * 3


def test_a_round_waits_no_longer_than_it_may(monkeypatch: pytest.MonkeyPatch) -> None:
    readings(monkeypatch, [2 * QUIET])
    slept: list[float] = []
    found, waited = reference.settle(QUIET, 1.0, sleep=slept.append)
    most = round(1.0 / reference.POLL_S)  # 20 x 0.05 s, no more
    assert found == 2 * QUIET and waited == pytest.approx(1.0) and len(slept) == most
    assert reference.settle(QUIET, 0.0, sleep=slept.append) == (2 * QUIET, 0.0)
    assert reference.settle(None, 10.0, sleep=slept.append) == (2 * QUIET, 0.0)  # unknown level


def test_a_waiting_round_keeps_its_cpu_busy_with_reference_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vCPU left idle read the reference 1.1-1.6x slow for its first 0.1-0.2 s of work: a
    round that slept while it waited read disturbed again for that alone. It runs reference
    calls for the poll's length instead, on the clock it is given."""
    now = [0.0]
    calls: list[float] = []

    def call() -> None:
        calls.append(now[0])
        now[0] += 0.01  # each call 10 ms on the fake clock

    monkeypatch.setattr(reference, "reference_call", call)
    reference.keep_busy(0.05, clock=lambda: now[0])
    assert len(calls) == 5 and now[0] == pytest.approx(0.05)
    assert reference.settle.__defaults__ is not None
    assert reference.keep_busy in reference.settle.__defaults__  # the default wait is busy


def test_a_round_that_reads_quiet_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    readings(monkeypatch, [QUIET_FACTOR * QUIET])  # at the factor: still quiet
    assert reference.settle(QUIET, 10.0, sleep=pytest.fail) == (QUIET_FACTOR * QUIET, 0.0)


def test_around_times_once_the_wait_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing runs after the wait, and the round carries the slower of the readings
    either side of it: a round that gave up waiting is still read disturbed."""
    readings(monkeypatch, [3 * QUIET, 3 * QUIET, 3 * QUIET])
    order: list[str] = []
    found, beside = reference.around(
        lambda: order.append("timed") or 7, quiet_s=QUIET, wait_s=0.1, sleep=order.append
    )
    assert order == [reference.POLL_S, reference.POLL_S, "timed"]
    assert (found, beside.reference_s) == (7, 3 * QUIET)
    assert beside.waited_s == pytest.approx(0.1)


def test_the_machine_keeps_its_latest_levels_and_reads_their_median() -> None:
    """A sweep busy throughout (5.0) is one among several; a machine slower for good (4.0 from
    now on) reads its own level once it is most of the latest sweeps'."""
    machine = MachineQuiet()
    assert machine.level is None
    for level in [5.0, *[2.0] * (KEEP - 1)]:
        machine = machine.after(level)
    assert machine.level == 2.0 and len(machine.levels) == KEEP
    for _ in range(KEEP // 2):
        assert machine.level == 2.0
        machine = machine.after(4.0)
    assert machine.level == 3.0  # half and half
    assert machine.after(4.0).level == 4.0
    assert machine.after(float("nan")) == machine and machine.after(0.0) == machine
    assert quieter(None, 2.0, 3.0) == 2.0 and quieter(None, None) is None


def test_the_levels_survive_a_cache_that_is_gone_or_torn(tmp_path: Path) -> None:
    path = quiet_file(2, tmp_path)
    assert read_quiet(path) == MachineQuiet()  # none kept yet
    write_quiet(path, MachineQuiet((1.0, 2.0)))
    assert read_quiet(path).levels == (1.0, 2.0)
    path.write_text('{"levels": [1.0, ')  # a write cut short
    assert read_quiet(path) == MachineQuiet()
    (tmp_path / "ro").write_text("")  # a file where the folder should be: not written, no error
    write_quiet(tmp_path / "ro" / "q.json", MachineQuiet((1.0,)))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache of the test's own, the machine's store in it as a sweep has it (conftest keeps
    the other tests' sweeps away from it), and the session's ceilings copied into it: measuring
    them again took 2 s a test."""
    own_cache(tmp_path / "cache", monkeypatch)
    monkeypatch.setattr("attnbench.run.sweep.read_quiet", read_quiet)
    monkeypatch.setattr("attnbench.run.sweep.write_quiet", write_quiet)
    yield tmp_path / "cache"


def test_a_sweep_is_judged_against_the_machine_and_leaves_its_level(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that read every round at twice the machine's kept level ran busy throughout:
    every round reads disturbed, its jobs carry the machine's level and a wait within
    --wait-quiet, run.json records both, and the sweep leaves its own level for the next."""
    monkeypatch.setattr(queue_module, "ROUND_WAIT_S", 10.0)
    grid = tiny_grid(wait_quiet=9)
    path = quiet_file(grid.threads or __import__("torch").get_num_threads())  # the sweep's
    write_quiet(path, MachineQuiet((QUIET,)))
    waits: list[tuple[float | None, float]] = []

    def around(timing, clock=None, quiet_s=None, wait_s=0.0, sleep=None):  # type: ignore[no-untyped-def]
        waits.append((quiet_s, wait_s))
        return timing(), reference.Around(2 * QUIET, min(wait_s, 4.0))  # waits 4 s, in vain

    monkeypatch.setattr(reference, "around", around)
    run = run_sweep(grid, tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    assert waits[0] == (QUIET, 9.0)  # the first round: the machine's level, all of the wait
    assert [w for _, w in waits[1:3]] == [5.0, 1.0]  # then what is left of --wait-quiet
    assert all(w == 0.0 for _, w in waits[3:])
    assert run.record.machine_quiet_s == QUIET and run.record.waited_s == 9.0
    assert json.loads((run.path / "run.json").read_text())["quiet"]["sweeps"] == 1
    row = run.measured.iloc[0]
    assert row["rounds_disturbed"] == row["rounds"]  # all kept: none was quiet
    assert read_quiet(path).levels == (QUIET, 2 * QUIET)  # its own level, for the next


def test_a_run_is_read_against_the_machines_level(tmp_path: Path, cache: Path) -> None:
    """The loader judges rounds against the machine's level run.json recorded: a run busy
    from start to end (its own fast end read busy) has every round read disturbed."""
    grid = tiny_grid()
    run = run_sweep(grid, tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    samples = run.samples.copy()
    rounds = sorted(samples["round"].unique())
    busy = {r: (2.4 if r == rounds[0] else 2.0) * QUIET for r in rounds}  # within 1.25x
    samples["reference_s"] = samples["round"].map(busy)
    samples.to_csv(run.path / "samples.csv", index=False)
    meta = json.loads((run.path / "run.json").read_text())
    for machine, disturbed in [(None, 0), (QUIET, len(rounds))]:
        meta["quiet"] = {"machine_s": machine, "sweeps": 1, "waited_s": 0.0}
        (run.path / "run.json").write_text(json.dumps(meta))
        again = load_results(run.path)
        assert again.measured.iloc[0]["rounds_disturbed"] == disturbed
    assert again.record.machine_quiet_s == QUIET


def test_the_summary_says_what_was_waited_and_which_times_are_a_busy_machines(
    tmp_path: Path, cache: Path
) -> None:
    """A run whose rounds all read busy against the machine's level, after waiting: the notes
    name the wait and the cases left without two quiet rounds; a quiet run has neither."""
    from attnbench.cli.summary import replication_notes

    run = run_sweep(tiny_grid(), tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    samples = run.samples.copy()
    samples["reference_s"] = QUIET  # a quiet machine, every round
    samples.to_csv(run.path / "samples.csv", index=False)
    quiet = load_results(run.path)
    assert not [n for n in replication_notes(quiet) if "busy" in n or "waited" in n]
    first = samples["round"] == samples["round"].min()  # one busy round, left out: not busy
    samples.loc[first, "reference_s"] = 2 * QUIET
    # and slower for it (one no slower is kept): three times the slowest sample, whatever the
    # real rounds read (a fast first round tripled could stay under round_marks' bound)
    samples.loc[first, "time_s"] = 3 * samples["time_s"].max()
    samples.to_csv(run.path / "samples.csv", index=False)
    meta = json.loads((run.path / "run.json").read_text())
    meta["quiet"] = {"machine_s": QUIET, "sweeps": 3, "waited_s": 0.0}
    (run.path / "run.json").write_text(json.dumps(meta))
    one = load_results(run.path)
    assert one.measured.iloc[0]["rounds_disturbed"] == 1
    assert not [n for n in replication_notes(one) if "busy" in n]
    samples["reference_s"] = 2 * QUIET
    samples.to_csv(run.path / "samples.csv", index=False)
    meta = json.loads((run.path / "run.json").read_text())
    meta["quiet"] = {"machine_s": QUIET, "sweeps": 3, "waited_s": 42.0}
    (run.path / "run.json").write_text(json.dumps(meta))
    notes = replication_notes(load_results(run.path))
    assert any(n.startswith("1 case(s) had fewer than two quiet rounds") for n in notes)
    assert any("waited 42 s in all" in n and "--wait-quiet 60" in n for n in notes)
    meta["quiet"] = {"machine_s": QUIET, "sweeps": 3, "waited_s": 0.25}  # a new user read "0 s"
    (run.path / "run.json").write_text(json.dumps(meta))
    notes = replication_notes(load_results(run.path))
    assert any("waited under a second in all" in n for n in notes)
    # every round disturbed after so short a wait: the note says how both hold
    assert any("can be disturbed while it times" in n for n in notes)
    samples["reference_s"] = QUIET
    samples.to_csv(run.path / "samples.csv", index=False)
    notes = replication_notes(load_results(run.path))
    waited = [n for n in notes if "waited under a second" in n]
    assert waited and "disturbed" not in waited[0]


def test_the_start_estimate_holds_what_the_rounds_may_wait_for_quiet(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waits are in no case's time: the start says how long they may last beside the
    estimate (a default first sweep said about 15-60 s and took 150 s, 37 s of it waiting)."""
    from rich.console import Console

    from attnbench.cli.render import SweepProgress
    from attnbench.run.estimate import QUIET as NOT_BUSY
    from attnbench.run.events import Listeners, SweepStart

    # the two estimates compared: not scaled by whatever load the suite's workers left
    monkeypatch.setattr("attnbench.run.sweep.machine_busy", lambda *a, **k: NOT_BUSY)

    starts: list[SweepStart] = []
    for wait in (0.0, 30.0):
        run_sweep(tiny_grid(wait_quiet=wait), tmp_path / f"wait{wait:g}",
                  measuring=queue_module.UNCALIBRATED,
                  listeners=Listeners(on_start=starts.append))  # fmt: skip
    none, some = starts
    assert (none.waits_s, some.waits_s) == (0.0, 30.0)
    assert some.estimate_s == none.estimate_s and some.estimate_low_s == none.estimate_low_s
    line = io.StringIO()
    progress = SweepProgress(Console(file=line, width=400), quiet=False)
    progress.started(some)
    assert " of measuring (and up to 30 s waiting for quiet) -> " in line.getvalue()
    assert ": 1 case on cpu " in line.getvalue()  # one case: not "1 cases"
    progress.started(none)
    assert line.getvalue().count("waiting for quiet") == 1
    assert line.getvalue().count(" of measuring -> ") == 1  # the estimate is the measuring's


def test_a_busy_machine_is_read_against_its_quiet_level_or_else_its_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start reads how busy the machine is: its reference against the quiet level kept,
    in the thread count the level is of; before any level, the load past the CPUs."""
    import torch

    from attnbench.run.estimate import QUIET as QUIET_MACHINE
    from attnbench.run.estimate import machine_busy

    threads = torch.get_num_threads()
    seen: list[int] = []

    def read(value: float):  # type: ignore[no-untyped-def]
        return lambda: seen.append(torch.get_num_threads()) or value

    monkeypatch.setattr("attnbench.run.estimate.usable_cpus", lambda: 2)
    busy = machine_busy(QUIET, 1, read(2.5 * QUIET), load=lambda: 1.0)
    assert busy.slowdown == pytest.approx(2.5) and "reference reads 2.5x its quiet" in busy.why
    # read in 1 thread, put back; a busy reading is read again, twice, and stays busy
    assert seen == [1, 1, 1] and torch.get_num_threads() == threads
    quiet = machine_busy(QUIET, 1, read(1.2 * QUIET), load=lambda: 2.0)  # within QUIET_FACTOR
    assert quiet == QUIET_MACHINE
    # the slower of the two tests: a reference that reads quiet beside a load past the CPUs
    monkeypatch.setattr("attnbench.run.estimate.runnable_now", lambda: 99.0)
    # (6 tasks + the sweep's 2 threads) on 2 CPUs: each gets a quarter of one
    busy = machine_busy(QUIET, 2, read(0.6 * QUIET), load=lambda: 6.0)
    assert busy.slowdown == pytest.approx(4.0) and busy.why == "its 1-minute load is 6.0 on 2 CPUs"
    assert machine_busy(QUIET, 2, read(5 * QUIET), load=lambda: 6.0).slowdown == 5.0
    busy = machine_busy(None, 1, read(9.0), load=lambda: 4.0)  # no level: the load alone
    assert busy.slowdown == pytest.approx(2.5) and len(seen) == 8  # no reference read
    assert machine_busy(None, 8, load=lambda: 4.0).slowdown == pytest.approx(3.0)  # 2 threads
    assert machine_busy(None, 2, load=lambda: 2.0) == QUIET_MACHINE  # a sweep's own last minute
    # the load lags: three tasks runnable now, of a load of 6, say 2.5x; none now, quiet
    assert machine_busy(None, 2, load=lambda: 6.0, runnable=lambda: 3.0).slowdown == 2.5
    assert machine_busy(None, 2, load=lambda: 6.0, runnable=lambda: 0.0) == QUIET_MACHINE
    assert machine_busy(None, 2, load=lambda: 6.0, runnable=lambda: None).slowdown == 4.0
    assert machine_busy(None, 1, load=lambda: None) == QUIET_MACHINE


def test_one_stalled_reading_of_the_reference_is_no_busy_machine() -> None:
    """A start whose first reading stalls (a new user's read 2251.5x) reads again: the
    quietest of the readings, no more of them once one reads quiet."""
    from attnbench.run.estimate import QUIET as QUIET_MACHINE
    from attnbench.run.estimate import START_READINGS, machine_busy

    readings = [2251.5 * QUIET, 1.1 * QUIET, 9.0]
    busy = machine_busy(QUIET, 1, lambda: readings.pop(0), load=lambda: 0.0)
    assert busy == QUIET_MACHINE and readings == [9.0]
    readings = [3 * QUIET, 2.0 * QUIET, 2.5 * QUIET, QUIET]
    busy = machine_busy(QUIET, 1, lambda: readings.pop(0), load=lambda: 0.0)
    assert busy.slowdown == pytest.approx(2.0) and len(readings) == 4 - START_READINGS


def test_a_busy_machines_start_scales_the_estimate_and_says_what_a_quiet_one_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep beside a neighbour said 5-9 s and took 195 s: the start now
    scales its estimate by how busy the machine reads, and says so; an auto sweep's budget
    bounds it, its lines' first lengths apart."""
    from rich.console import Console

    from attnbench.cli.render import SweepProgress
    from attnbench.cli.startline import busy_note
    from attnbench.run.estimate import estimate_bounds
    from attnbench.run.events import Listeners, SweepStart

    grid = tiny_grid()
    low, high = estimate_bounds(grid)
    assert estimate_bounds(grid, slowdown=3.0) == pytest.approx((3 * low, 3 * high))
    auto = build_grid({"layers": "conv", "n": "auto:8..64", "d": "4", "device": "cpu",
                       "auto_budget": 5})  # fmt: skip
    assert estimate_bounds(auto)[1] == 5.0  # the budget bounds it
    # but not every line's first lengths, which run whatever their share (run.auto)
    auto_low, auto_high = estimate_bounds(auto, slowdown=1e6)
    assert auto_low == 5.0 and auto_high > 1e3
    monkeypatch.setattr("attnbench.run.sweep.read_quiet", lambda path: MachineQuiet((QUIET,)))
    monkeypatch.setattr("attnbench.run.estimate.read_reference", lambda: 3 * QUIET)
    starts: list[SweepStart] = []
    with pytest.raises(KeyboardInterrupt):  # stopped at its start: only the start matters

        def first(start: SweepStart) -> None:
            starts.append(start)
            raise KeyboardInterrupt

        run_sweep(grid, tmp_path / "busy", measuring=queue_module.UNCALIBRATED,
                  listeners=Listeners(on_start=first))  # fmt: skip
    (start,) = starts
    assert start.busy.slowdown == pytest.approx(3.0)
    assert start.estimate_s > 2.5 * high and start.estimate_low_s > 2.5 * low
    line = io.StringIO()
    SweepProgress(Console(file=line, width=1000), quiet=False).started(start)
    note = line.getvalue().splitlines()[1]
    assert note.startswith("note: the machine is busy (its reference reads 3.0x its quiet ")
    assert grid.threads == 1  # the CPU's one thread: no word of ops on several (a new user
    assert (  # on one read "ops on several threads far slower")
        "while it stays so its cases run at least 3.0x slower than on a quiet machine; the "
        "estimate counts the 3.0x alone, and a quiet machine would take " in note
    )
    several = busy_note(start.busy, 1.0, 2.0, auto=False, threads=2)
    assert "3.0x slower than on a quiet machine, ops on several threads far slower;" in several
    assert "several threads" in busy_note(start.busy, 1.0, 2.0, auto=False)  # torch's own
    busy_auto = SweepStart(auto, tmp_path, {}, 1, 5.0, busy=start.busy, estimate_low_s=5.0)
    line = io.StringIO()
    SweepProgress(Console(file=line, width=1000), quiet=False).started(busy_auto)
    assert "quiet machine, and its lines reach shorter lengths within" in line.getvalue()


def test_the_ab_start_holds_what_both_sides_may_wait_for_quiet(tmp_path: Path) -> None:
    """An A/B run's rounds wait for quiet too, each side up to its --wait-quiet (a new user's
    "about 3-7 s" took 48 s under load)."""
    from rich.console import Console

    from attnbench.cli.render import ABProgress
    from attnbench.run.ab import ABStart
    from attnbench.run.estimate import Busy

    grids = {side: tiny_grid(wait_quiet=20.0) for side in ("base", "current")}
    env = {"attnbench_version": "x", "torch_version": "y", "python_version": "3"}
    for waits, says in ((0.0, False), (40.0, True)):
        start = ABStart(grids, tmp_path, {s: {} for s in grids}, {s: env for s in grids},
                        7.0, (), 3.0, waits)  # fmt: skip
        line = io.StringIO()
        with ABProgress(Console(file=line, width=400), quiet=False) as progress:
            progress.started(start)
        first = line.getvalue().splitlines()[0]
        assert "about 3-7 s" in first
        assert (" (and up to 40 s waiting for quiet) -> " in first) is says
    busy = ABStart(grids, tmp_path, {s: {} for s in grids}, {s: env for s in grids}, 14.0, (),
                   6.0, 0.0, Busy(2.0, "its 1-minute load is 6.0 on 2 CPUs"))  # fmt: skip
    line = io.StringIO()
    with ABProgress(Console(file=line, width=400), quiet=False) as progress:
        progress.started(busy)
    first, *rest = line.getvalue().splitlines()
    (note,) = [n for n in rest if n.startswith("note: the machine is busy (its 1-minute")]
    assert "about 6-14 s" in first
    assert note.endswith("counts the 2.0x alone, and a quiet machine would take about 3-7 s")


def test_a_run_timed_in_one_process_a_case_says_its_intervals_hold_that_process_only(
    tmp_path: Path, cache: Path
) -> None:
    """A run whose cases each had one round (--processes 1, or a run of an older attnbench):
    read back, the summary says their intervals describe one process; with rounds, it does
    not."""
    from attnbench.cli.summary import replication_notes

    run = run_sweep(tiny_grid(), tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    assert run.samples.groupby("case_id")["round"].nunique().min() > 1
    assert not [n for n in replication_notes(run) if "one process" in n]
    samples = run.samples.copy()
    samples["round"], samples["process"] = 1, 0  # every sample in one round, one process
    samples.to_csv(run.path / "samples.csv", index=False)
    notes = replication_notes(load_results(run.path))
    timed = len(run.measured)
    assert [n for n in notes if n.startswith(f"{timed} case(s) were timed in one process")]


def test_a_case_of_one_round_beside_cases_of_several_takes_their_spread(
    tmp_path: Path, cache: Path
) -> None:
    """One case's rounds but one failed (here: its samples folded into one round), its
    neighbours' kept: its interval is the spread between processes typical of theirs, not its
    one process's samples, and the summary says so."""
    from attnbench.cli.summary import replication_notes
    from attnbench.estimators import estimate
    from attnbench.priors import prior_of

    grid = tiny_grid(n="8,16,32,64")
    run = run_sweep(grid, tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    samples = run.samples.copy()
    alone = samples["case_id"].eq(samples["case_id"].iloc[0])
    samples.loc[alone, "round"] = 1
    samples["reference_s"], samples["others_cores"] = 1e-4, 0.0  # every round read quiet
    # times of known spreads, not this machine's: under a loaded suite the real ones once gave
    # a prior on under one degree of freedom, whose interval is none (nan)
    case = samples["case_id"].astype("category").cat.codes
    step = (0.01 + 0.004 * case) * samples["round"]
    samples["time_s"] = 1e-3 * (1 + step) * (1 + 1e-3 * (samples.index % 5))
    samples.to_csv(run.path / "samples.csv", index=False)
    read = load_results(run.path)
    (note,) = [n for n in replication_notes(read) if "one process" in n]
    assert note.startswith("1 case(s) were timed in one process (one round): their ±95% is the")
    row = read.measured[read.measured["case_id"].eq(samples["case_id"].iloc[0])].iloc[0]
    others = read.measured[read.measured["rounds"].ge(2)]
    assert row["rounds"] == 1 and len(others) == 3
    own = estimate([list(samples.loc[alone, "time_s"])])  # its samples' order statistics
    logs = [
        (
            float(np.var(np.log(g.groupby("round")["time_s"].median()), ddof=1)),
            g["round"].nunique() - 1.0,
        )
        for _, g in samples[~alone].groupby("case_id")
    ]
    prior = prior_of(logs)
    assert prior is not None
    reach = math.log(row["time_ci_high_s"] / row["time_s"])
    assert reach == pytest.approx(
        t_quantile(0.975, prior.df) * math.sqrt(2 * prior.variance), rel=1e-6
    )
    # Under --processes 1 the cases of several rounds had a disturbed one to replace: their
    # spread is no process's typical, and a case of one keeps its samples' interval.
    meta = json.loads((run.path / "run.json").read_text())
    meta["config"]["processes"] = 1
    (run.path / "run.json").write_text(json.dumps(meta))
    alone_run = load_results(run.path)
    row = alone_run.measured[alone_run.measured["case_id"].eq(samples["case_id"].iloc[0])].iloc[0]
    assert (row["time_ci_low_s"], row["time_ci_high_s"]) == (own.low_s, own.high_s)
    (note,) = [n for n in replication_notes(alone_run) if "one process" in n]
    assert "holds that process's samples only" in note


def test_a_resumed_run_keeps_its_level_and_its_waits(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped after 40 s of waits, judged against a level the cache no longer has:
    its resume goes on with that level (not the cache's, quieter or not: it holds the run's own
    by then) and with what is left of --wait-quiet (20 s), and run.json adds this session's
    waits to the 40."""
    import os
    import signal

    from attnbench.errors import SweepInterrupted
    from attnbench.run.events import Listeners, ProgressEvent
    from attnbench.run.sweep import resume_sweep

    monkeypatch.setattr(queue_module, "ROUND_WAIT_S", 10.0)
    waits: list[tuple[float | None, float]] = []

    def around(timing, clock=None, quiet_s=None, wait_s=0.0, sleep=None):  # type: ignore[no-untyped-def]
        waits.append((quiet_s, wait_s))
        return timing(), reference.Around(QUIET, min(wait_s, 1.0))  # quiet after a second

    monkeypatch.setattr(reference, "around", around)

    def stop(event: ProgressEvent) -> None:
        if event.kind == "done" and event.round == 2:
            os.kill(os.getpid(), signal.SIGINT)

    out = tmp_path / "run"
    with pytest.raises(SweepInterrupted):
        run_sweep(tiny_grid(), out, listeners=Listeners(progress=stop),
                  measuring=queue_module.UNCALIBRATED)  # fmt: skip
    meta = json.loads((out / "run.json").read_text())
    meta["quiet"] = {"machine_s": QUIET / 2, "sweeps": 4, "waited_s": 40.0}
    (out / "run.json").write_text(json.dumps(meta))
    grid = tiny_grid()
    write_quiet(quiet_file(grid.threads or 1), MachineQuiet((QUIET / 4,)))
    waits.clear()
    resumed = resume_sweep(out, measuring=queue_module.UNCALIBRATED)
    assert waits and waits[0] == (QUIET / 2, 10.0)  # the level it had; 20 s left of 60
    assert all(w <= 20.0 - i for i, (_, w) in enumerate(waits))  # each 1 s waited is spent
    assert resumed.record.machine_quiet_s == QUIET / 2
    assert read_quiet(quiet_file(grid.threads or 1)).levels == (QUIET / 4,)  # not its own again
    assert resumed.record.waited_s == pytest.approx(40.0 + min(len(waits), 20))


def job_queue(tmp_path: Path, grid: Any, in_process: bool = True) -> Any:
    """A sweep's job queue over ``grid``, writing under ``tmp_path``, driven by hand."""
    from attnbench.results.store import ResultsWriter
    from attnbench.run.signals import GracefulStop

    writer = ResultsWriter.create(tmp_path / "run", grid.to_dict(), {}, grid.option_names())
    return queue_module.JobQueue(
        grid, writer, measuring=queue_module.UNCALIBRATED, in_process=in_process,
        progress=None, stop=GracefulStop(),
    )  # fmt: skip


def first_rounds(jobs: Any, seconds: Any, wall_s: Any) -> list[tuple[str, int]]:
    """Hand out and finish every first round the queue gives, each case timed at
    ``seconds(case, i)`` a call (i: how many ran before it) and taking ``wall_s(case)``: the
    (layer, n) of each, in the order they ran."""
    from attnbench.measure.record import CaseResult
    from attnbench.measure.timing.loop import TimingStats
    from attnbench.run.executors.base import JobDone, Placement

    here = Placement("host", "cpu", "cpu", 1)
    order: list[tuple[str, int]] = []
    while (job := jobs.take(here)) is not None and job.round == 1:
        case, call = job.case, seconds(job.case, len(order))
        order.append((case.layer, case.n))
        timing = TimingStats((call,) * 5, calls_per_sample=1, total_s=5 * call)
        result = CaseResult(case, "ok", 1, timing=timing, flops=case.n * 1000, elementwise=0,
                            peak_bytes=1000, wall_s=wall_s(case))  # fmt: skip
        jobs.finish(JobDone(job, here, result=result))
    return order


def test_jobs_out_at_once_share_what_is_left_of_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs handed out before any comes back (Ray's workers, one each) are each granted only
    what the others have not been: 15 s of --wait-quiet, 10 s a round, gives 10 s, 5 s and
    none. A retry keeps its job's grant; a job back frees its grant for the next."""
    from attnbench.run.executors.base import JobDone, Placement

    monkeypatch.setattr(queue_module, "ROUND_WAIT_S", 10.0)
    jobs = job_queue(tmp_path, tiny_grid(layers="conv,rnn", n="8,16", wait_quiet=15), False)
    here = Placement("host", "cpu", "cpu", 1)
    out = [jobs.take(here) for _ in range(3)]
    assert [job.policy.wait_s for job in out if job is not None] == [10.0, 5.0, 0.0]
    first = out[0]
    assert first is not None
    jobs.finish(JobDone(first, here, lost="the worker died"))
    retry = jobs.take(here)
    assert retry is not None and retry.attempt == 2 and retry.policy.wait_s == 10.0
    jobs.finish(JobDone(retry, here, lost="the worker died again"))  # recorded failed: back
    last = jobs.take(here)  # rnn at n = 16: what the two still out leave
    assert last is not None and last.case.layer == "rnn" and last.policy.wait_s == 10.0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({}, "each case in 3-6 fresh processes (to ±2%; 3 fork servers)"),
        ({"precision": "4%"}, "each case in 3-6 fresh processes (to ±4%; 3 fork servers)"),
        ({"max_processes": 3}, "each case in 3 fresh processes (3 fork servers)"),
        (
            {"processes": 4, "max_processes": 5},
            "each case in 4-5 fresh processes (to ±2%; 3 fork servers)",
        ),
        # one round is never added to: not "1-2" (it had said so)
        ({"processes": 1}, "each case in a fresh process (3 fork servers)"),
    ],
)
def test_the_start_line_counts_the_rounds_a_case_may_get(
    options: dict[str, object], said: str
) -> None:
    from attnbench.cli.render import workers_text

    grid = tiny_grid(**options)
    assert workers_text({"executor": "fork", "servers": 3}, grid) == f", {said}"


def test_the_start_line_says_the_threads_the_sweep_sets() -> None:
    from dataclasses import replace

    from attnbench.cli.render import threads_text

    grid = tiny_grid()
    assert grid.threads == 1 and threads_text(grid) == ", 1 thread"  # the CPU's default
    assert threads_text(replace(grid, threads=2)) == ", 2 threads"
    assert threads_text(replace(grid, threads=None)) == ""  # torch's own: nothing set


def test_a_first_rounds_line_says_it_is_one_round_of_several() -> None:
    """Of three rounds, the first is one: its median is named so and its own interval is not
    printed beside the case's (a new user read "72.5 µs ±3.8%" on the live line and "43.1 µs
    ±14.3%" in the table as two claims about the same time). One round is the case's own."""
    from attnbench.cli.render import case_line
    from attnbench.measure.record import CaseResult
    from attnbench.measure.timing.loop import TimingStats
    from attnbench.run.events import ProgressEvent

    case = tiny_grid().cases()[0]
    timing = TimingStats((1e-4, 1.01e-4, 0.99e-4) * 4, calls_per_sample=1, total_s=1.2e-3)
    result = CaseResult(case, Status.OK, 2, timing=timing, flops=10, peak_bytes=100)
    several = case_line(ProgressEvent("done", 0, 1, case, result, 1, 1, 3))
    assert "  round 1: 100 µs (12 samples)" in several and "±" not in several
    alone = case_line(ProgressEvent("done", 0, 1, case, result, 1, 1, 1))
    assert "  100 µs ±" in alone and "round 1" not in alone
    # --processes 1 --max-processes 3: sure of one round, it may get more
    may = case_line(ProgressEvent("done", 0, 1, case, result, 1, 1, 1), most=3)
    assert "  round 1: 100 µs (12 samples)" in may and "±" not in may


def test_an_auto_sweeps_lines_count_up_to_the_cases_it_may_measure() -> None:
    """--n auto drops the lengths a settled line will not reach, so the count planned falls
    during the sweep ([1/165] ... [83/90] to a new user): the start line says "at most" and
    the lines "≤"; a fixed grid's count is exact."""
    from rich.console import Console

    from attnbench.cli.render import SweepProgress, case_line
    from attnbench.run.events import ProgressEvent, SweepStart

    auto = build_grid({"layers": "conv,rnn", "n": "auto:64..1024", "d": "8", "device": "cpu"})
    line = io.StringIO()
    progress = SweepProgress(Console(file=line, width=400), quiet=False)
    progress.started(SweepStart(auto, Path("out"), {"executor": "fork", "servers": 3}, 1, 10.0))
    assert "n from 64 until each settles: at most 10 cases)" in line.getvalue()
    assert progress.upto
    case = auto.cases()[0]
    event = ProgressEvent("done", 0, 9, case, None, 1)
    assert case_line(event, upto=True).startswith("[1/≤9] conv n=64")
    assert case_line(event).startswith("[1/9] conv n=64")
    # the counter keeps the column the count planned at the start took, as that count falls
    assert progress.width == 2
    progress(ProgressEvent("done", 0, 9, case, None, 1))
    assert line.getvalue().splitlines()[-1].startswith("[ 1/≤9] conv n=64")


def test_ab_sides_ask_for_their_pairs_and_no_more() -> None:
    """ab adds no pairs: each side's most rounds are its pairs, and --max-processes and
    --precision, which would say otherwise, are refused."""
    from attnbench.errors import AttnbenchError
    from attnbench.run.ab import side_grids

    grids = side_grids({"layers": "conv", "n": "8", "d": "4", "device": "cpu"}, None, 0.01)
    assert {g.most_rounds for g in grids.values()} == {10}  # the pairs, never more
    with pytest.raises(AttnbenchError, match="--max-processes applies to sweep"):
        side_grids({"layers": "conv", "n": "8", "d": "4", "max_processes": 20}, None, 0.01)
    with pytest.raises(AttnbenchError, match="--precision applies to sweep"):
        side_grids({"layers": "conv", "n": "8", "d": "4", "precision": "5%"}, None, 0.01)
    with pytest.raises(AttnbenchError, match="not --n auto: --auto-budget applies to sweep"):
        side_grids({"layers": "conv", "n": "8", "d": "4", "auto_budget": 5.0}, None, 0.01)


def test_ab_help_lists_none_of_the_options_it_refuses() -> None:
    """A new user read --auto-budget, --precision and --max-processes in ab --help as ab's: they
    are hidden there, and still get ab's one-line reason when given."""
    from typer.testing import CliRunner

    from attnbench.cli import app

    def rows(command: str) -> set[str]:  # the options its --help lists, each a row's first word
        shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        return {m.group(1) for m in re.finditer(r"^│ (--[a-z-]+)", shown, re.MULTILINE)}

    listed = rows("ab")
    assert {"--processes", "--layers", "--n"} <= listed
    assert not {"--auto-budget", "--precision", "--max-processes"} & listed
    assert {"--auto-budget", "--precision", "--max-processes"} <= rows("sweep")
    runner = CliRunner()
    given = runner.invoke(app, ["ab", "--layers", "conv", "--n", "8", "--precision", "5%"])
    assert given.exit_code == 2 and "--precision applies to sweep" in given.output


def test_an_auto_grid_runs_every_lines_n_before_any_lines_2n(tmp_path: Path) -> None:
    """First rounds by length across the lines: line by line, the first lines ran on their
    equal share of --auto-budget while the lines that settle early had not yet left theirs."""
    jobs = job_queue(tmp_path, tiny_grid(layers="conv,rnn,ssm", n="auto:8..64"))
    # a rate that never settles: every other case twice as slow
    order = first_rounds(jobs, lambda case, i: 1e-6 * case.n * (1 + (i + 1) % 2), lambda c: 1e-3)
    assert [n for _, n in order] == sorted(n for _, n in order)  # 8 for all, then 16, ...
    assert [layer for layer, _ in order[:3]] == ["conv", "rnn", "ssm"]
    assert len(order) == 12  # four lengths of three lines


def test_a_line_the_budget_stopped_is_taken_up_again_once_every_line_stopped(
    tmp_path: Path,
) -> None:
    """conv's share runs out at n = 64 while rnn goes on; rnn settles with its share half
    spent, and conv's n = 64 runs after all, on what rnn left."""
    jobs = job_queue(tmp_path, tiny_grid(layers="conv,rnn", n="auto:8..512", auto_budget=8))

    def climbs(case: Any) -> bool:  # conv's rate keeps climbing: it never settles
        return bool(case.layer == "conv")

    order = first_rounds(
        jobs,
        lambda case, i: 1e-6 * (case.n**0.5 if climbs(case) else case.n),
        lambda case: 1.0 if climbs(case) else 0.05,
    )
    assert order[-1] == ("conv", 64) and order.index(("rnn", 64)) < len(order) - 1
    assert jobs.auto is not None
    conv = next(line for key, line in jobs.auto.lines.items() if key[0] == "conv")
    assert conv.reopened and conv.at_n == 64


def test_the_progress_count_of_an_auto_sweep_never_grows_when_a_line_is_reopened(
    tmp_path: Path,
) -> None:
    """The progress shows "at most N" cases: conv's share runs out and its later cases are
    dropped, then reopened once rnn settles. Counting only what no line will reach, N falls
    and never rises (it had grown from 139 to 151 in a default sweep)."""
    jobs = job_queue(tmp_path, tiny_grid(layers="conv,rnn", n="auto:8..512", auto_budget=8))
    counts: list[int] = []
    jobs.progress = lambda event: counts.append(event.total)  # what the counter shows

    def climbs(case: Any) -> bool:
        return bool(case.layer == "conv")

    order = first_rounds(  # rnn's rate climbs to n = 64, then settles over 64..512
        jobs,
        lambda case, i: 1e-6 * (case.n**0.5 if climbs(case) else max(case.n, 64)),
        lambda case: 1.0 if climbs(case) else 0.05,
    )
    assert order[-1] == ("conv", 64) and ("rnn", 512) in order  # reopened once rnn stopped
    assert counts == sorted(counts, reverse=True)
    assert counts[-1] >= len(order)
