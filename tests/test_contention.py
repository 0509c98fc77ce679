"""The CPU other processes took from a timing round (``measure.timing.contention``): read from
the kernel's counts, carried by the round's samples, and a round that lost more than half a
core left out of its case's time as a round whose reference read slow is."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnbench import estimators
from attnbench.estimators import estimate, kept_rounds
from attnbench.measure.timing import contention, reference
from attnbench.measure.timing.contention import CpuMark, is_busy, others_cores
from attnbench.measure.timing.loop import TimingStats
from attnbench.options import build_grid
from attnbench.results.loader import load_results
from attnbench.run import queue as queue_module
from attnbench.run.executors.wire import timing_from_wire, timing_to_wire
from attnbench.run.sweep import run_sweep


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threshold a user's sweep judges by (conftest sets the suite's to never)."""
    monkeypatch.delenv(contention.BUSY_ENV, raising=False)


def test_the_cores_others_took_are_how_long_the_rounds_threads_waited_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = CpuMark(waited_s=10.0, wall_s=50.0, ran_s=0.0)
    end = CpuMark(waited_s=10.06, wall_s=50.1, ran_s=0.1)  # 60 ms of waiting over 100 ms
    assert others_cores(start, end, cpus=2) == pytest.approx(0.6)
    back = CpuMark(waited_s=10.0, wall_s=50.2, ran_s=0.1)
    assert others_cores(end, back, cpus=2) == 0.0  # never under 0
    short = CpuMark(waited_s=10.06, wall_s=50.0 + contention.MIN_SPAN_S / 2, ran_s=0.0)
    assert others_cores(start, short) is None  # shorter than MIN_SPAN_S: not read
    assert others_cores(None, end) is None and others_cores(start, None) is None
    # capped a quarter of a core past the cores the process left unused: its own threads
    # waiting for each other read so, and a round that ran on every core reads at most that
    slack = contention.CAP_SLACK
    ran = CpuMark(waited_s=10.0, wall_s=50.0, ran_s=1.0)
    every = CpuMark(waited_s=10.1, wall_s=50.1, ran_s=1.2)  # ran 2 of 2 cores, waited 1
    assert others_cores(ran, every, cpus=2) == pytest.approx(slack)
    assert not is_busy(others_cores(ran, every, cpus=2))
    assert others_cores(ran, every, cpus=4) == pytest.approx(1.0)  # 2 left: the waits
    both = CpuMark(waited_s=10.06, wall_s=50.1, ran_s=1.18)  # ran 1.8 cores, waited 0.6
    assert others_cores(ran, both, cpus=2) == pytest.approx(0.2 + slack)
    hog = CpuMark(waited_s=10.06, wall_s=50.1, ran_s=1.1)  # ran 1 core: one left to others
    assert others_cores(ran, hog, cpus=2) == pytest.approx(0.6)
    assert others_cores(ran, CpuMark(10.06, 50.1, 1.3), cpus=2) == 0.0  # never under 0
    monkeypatch.setattr(contention, "PROCESS_CPUS", 4)  # the process's CPUs by default
    assert others_cores(ran, every) == pytest.approx(1.0)


def test_the_waiting_is_read_from_each_threads_schedstat(tmp_path: Path) -> None:
    """The first two fields of each thread's schedstat (ran, waited), in nanoseconds, summed;
    a thread that ended or reads wrong is skipped; none readable, nothing known."""
    tasks = tmp_path / "task"
    for tid, text in (("1", "5000 2000000 7\n"), ("2", "9 3000000 1\n"), ("3", "bad\n")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "schedstat").write_text(text)
    (tasks / "4").mkdir()  # ended: no file
    assert contention.counts(str(tasks)) == pytest.approx((5009e-9, 0.005))
    assert contention.counts(str(tmp_path / "none")) is None
    for tid in ("1", "2"):
        (tasks / tid / "schedstat").write_text("x y\n")
    assert contention.counts(str(tasks)) is None
    assert contention.mark(read=lambda: None) is None  # not Linux: nothing known
    assert contention.mark(read=lambda: (2.0, 7.0), clock=lambda: 3.0) == CpuMark(7.0, 3.0, 2.0)
    if sys.platform == "linux":  # this process's own
        mine = contention.counts()
        assert mine is not None and mine[0] > 0  # it has run


def test_busy_is_past_a_quarter_of_a_core_or_the_environments_threshold(
    monkeypatch: pytest.MonkeyPatch, judged: None
) -> None:
    assert not is_busy(None) and not is_busy(contention.BUSY_CORES) and is_busy(0.26)
    assert not is_busy(0.21) and is_busy(0.49)  # the quietest busy round, the busiest quiet one
    monkeypatch.setenv(contention.BUSY_ENV, "1.5")
    assert not is_busy(1.4) and is_busy(1.6)
    monkeypatch.setenv(contention.BUSY_ENV, "inf")
    assert not is_busy(64.0)
    monkeypatch.setenv(contention.BUSY_ENV, "lots")  # unreadable: the default
    assert is_busy(0.26)


def test_a_busy_round_is_left_out_while_two_others_remain(judged: None) -> None:
    groups = [[1.0, 1.0], [1.02, 1.02], [2.0, 2.0]]  # the third beside a neighbour: 2x
    kept, disturbed, left_out = kept_rounds(groups, busy=[False, False, True])
    assert kept == groups[:2] and (disturbed, left_out) == (1, 1)
    kept, disturbed, left_out = kept_rounds(groups, busy=[False, True, True])
    assert kept == groups and (disturbed, left_out) == (2, 0)  # one quiet: all kept
    alone = estimate(groups[:2])
    assert estimate(groups, busy=[False, False, True]).center_s == alone.center_s
    assert estimate(groups).center_s > alone.center_s
    stats = TimingStats(
        tuple(s for g in groups for s in g),
        1,
        0.1,
        rounds=(1, 1, 2, 2, 3, 3),
        others_cores=(0.0, 0.0, None, None, 1.0, 1.0),  # not read in round 2: not busy
    )
    assert stats.estimate.center_s == alone.center_s and stats.estimate.disturbed == 1
    back = timing_from_wire(json.loads(json.dumps(timing_to_wire(stats))))
    assert back is not None and back.others_cores == stats.others_cores


def test_a_round_carries_the_cores_others_took_beside_its_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marks = iter([CpuMark(0.0, 0.0, 0.0), CpuMark(0.04, 0.1, 0.1)])
    monkeypatch.setattr(contention, "mark", lambda: next(marks))
    monkeypatch.setattr(reference, "read_reference", lambda clock=None: 1e-4)
    found, beside = reference.around(lambda: "timed")
    assert found == "timed" and beside.others_cores == pytest.approx(0.4)
    assert beside.reference_s == 1e-4 and beside.waited_s == 0.0


def test_a_saved_run_leaves_out_its_rounds_beside_a_busy_neighbour(
    tmp_path: Path, judged: None
) -> None:
    grid = build_grid(
        {"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 3,
         "time_budget": 0.003}
    )  # fmt: skip
    run = run_sweep(grid, tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    assert "others_cores" in run.samples.columns
    samples = run.samples.copy()
    samples["reference_s"] = 1e-3  # every reference quiet
    samples["others_cores"] = 0.0
    samples.to_csv(run.path / "samples.csv", index=False)
    quiet = load_results(run.path).measured.iloc[0]
    first = samples["round"] == samples["round"].min()
    samples.loc[first, "others_cores"] = 1.0  # a neighbour took a core from the first round
    # and the round ran slower for it: twice the slowest sample, past round_marks' bound
    # whatever the real rounds read (doubled, a fast first round had stayed under it)
    slowest, fastest = samples["time_s"].max(), samples["time_s"].min()
    samples.loc[first, "time_s"] = 2.0 * slowest
    samples.to_csv(run.path / "samples.csv", index=False)
    busy = load_results(run.path).measured.iloc[0]
    assert quiet["rounds_disturbed"] == 0 and busy["rounds_disturbed"] == 1
    assert busy["rounds"] == quiet["rounds"] - 1  # left out: the time is the others'
    samples.loc[first, "time_s"] = 0.5 * fastest  # the faster for it: no sign of it
    samples.to_csv(run.path / "samples.csv", index=False)
    unmoved = load_results(run.path).measured.iloc[0]
    assert unmoved["rounds_disturbed"] == 0 and unmoved["rounds"] == quiet["rounds"]


@pytest.mark.slow
def test_a_neighbour_burning_a_core_is_read_beside_the_round() -> None:
    """A real neighbour, a process spinning on a core for the whole round, while this
    process keeps every core it may use busy: its threads wait for one, a quarter of a core's worth
    or more, where the machine's reference does not move."""
    from attnbench.devices import usable_cpus

    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cpus())  # every core it may use (the suite shares them out)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        x = torch.randn(256, 256)
        start = contention.mark()
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            torch.mm(x, x)  # every thread busy, as a timed round's
        found = others_cores(start, contention.mark())
    finally:
        hog.kill()
        hog.wait()
        torch.set_num_threads(threads)
    assert found is not None and found > contention.BUSY_CORES


def test_compare_judges_the_rounds_the_times_are_over(tmp_path: Path, judged: None) -> None:
    """A round 3x slower beside a busy neighbour is left out of the run's time, and so of
    compare's test: the ratio judged is the ratio shown, not one over every round."""
    import shutil

    from attnbench.compare.runs import compare_runs

    grid = build_grid(
        {"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 3,
         "time_budget": 0.003}
    )  # fmt: skip
    base = run_sweep(grid, tmp_path / "base", measuring=queue_module.UNCALIBRATED)
    samples = base.samples.copy()
    samples["reference_s"], samples["others_cores"] = 1e-3, 0.0
    samples["time_s"] = 1e-4 * (1 + 0.01 * samples["round"])  # rounds 1% apart, fixed
    samples.to_csv(base.path / "samples.csv", index=False)
    shutil.copytree(base.path, tmp_path / "new")
    first = samples["round"] == samples["round"].min()
    samples.loc[first, "time_s"] *= 3
    samples.loc[first, "others_cores"] = 1.0
    samples.to_csv(tmp_path / "new" / "samples.csv", index=False)
    new = load_results(tmp_path / "new")
    assert (
        len(new.kept_rounds_of(new.measured.iloc[0]["case_id"]))
        == len(samples["round"].unique()) - 1
    )
    row = compare_runs(load_results(base.path), new).times.iloc[0]
    assert row["ratio_judged"] == pytest.approx(row["ratio"])  # over every round: 1.4x
    assert row["ratio"] == pytest.approx(1.0, rel=0.02)


def test_a_busy_round_counts_toward_least_and_is_left_out_of_the_interval(judged: None) -> None:
    """Three rounds, the first beside a busy neighbour and far off: the case has its least
    (no round more for it, as for a slow reference), and its interval, over the other two
    close rounds, is within the target; read with the busy round, it is not."""
    from attnbench.run.rounds import Replication

    replication = Replication(least=3, most=6, target_rel_ci=0.05)
    rounds = [[2.0e-3] * 5, [1.0e-3] * 5, [1.001e-3] * 5]
    assert replication.stop_of(rounds, 3, busy=[True, False, False]) is not None
    assert replication.stop_of(rounds, 3, busy=[False, False, False]) is None


def test_the_live_queue_and_the_loader_leave_out_the_same_busy_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, judged: None
) -> None:
    """A sweep whose every case's first round lost a core: the queue reads it busy as it
    comes back (its prior and its next round), and the run on disk leaves it out the same."""
    calls: list[int] = []  # one case: its first round is the first call

    def around(timing, clock=None, quiet_s=None, wait_s=0.0, sleep=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        return timing(), reference.Around(1e-3, 0.0, 1.0 if len(calls) == 1 else 0.0)

    monkeypatch.setattr(reference, "around", around)
    seen: list[set[int]] = []
    real = queue_module.JobQueue._queue_next_round

    def spy(self, case_id):  # type: ignore[no-untyped-def]
        seen.append(set(self.busy.get(case_id, set())))
        return real(self, case_id)

    monkeypatch.setattr(queue_module.JobQueue, "_queue_next_round", spy)
    grid = build_grid(
        {"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 3,
         "max_processes": 3, "time_budget": 0.003}
    )  # fmt: skip
    run = run_sweep(grid, tmp_path / "run", measuring=queue_module.UNCALIBRATED)
    assert seen and all(s == {1} for s in seen)  # round 1, read busy as it came back
    row = run.measured.iloc[0]
    # a round beside a busy neighbour is kept where it ran no slower than the slowest quiet
    # round nor than QUIET_FACTOR times their median (estimators.round_marks: quiet rounds of
    # 1.0 and 2.0 ms bound it at 1.875, so one at 1.9 reads disturbed), by queue and loader alike
    medians = run.samples.groupby("round")["time_s"].median()
    quiet = [medians[2], medians[3]]
    bound = min(max(quiet), estimators.QUIET_FACTOR * statistics.median(quiet))
    slow = bool(medians[1] > bound)
    assert row["rounds_disturbed"] == int(slow) and row["rounds"] == 3 - int(slow)
    assert run.disturbed_of(str(row["case_id"])) == {1: slow, 2: False, 3: False}
    by_round = run.samples.groupby("round")["others_cores"].first().tolist()
    assert by_round == [1.0, 0.0, 0.0]


def test_a_busy_flag_a_round_is_one_a_round() -> None:
    with pytest.raises(ValueError):
        kept_rounds([[1.0], [1.0], [1.0]], busy=[True])
    with pytest.raises(ValueError):
        kept_rounds([[1.0], [1.0]], [None], busy=[False, False])


def test_replication_says_which_rule_ends_a_cases_rounds() -> None:
    """Below --processes another round; at the most, max rounds; past the least, precise once
    the interval is tight, budget once it is wide and the budget spent, else another."""
    from attnbench.measure.timing.loop import Stop
    from attnbench.run.rounds import Replication

    replication = Replication(least=3, most=6, target_rel_ci=0.05, budget_s=1.0)
    tight = [[1.0e-3] * 5, [1.001e-3] * 5, [0.999e-3] * 5]
    wide = [[1.0e-3] * 5, [1.6e-3] * 5, [2.5e-3] * 5]
    assert replication.stop_of(wide[:2], 2) is None
    assert replication.stop_of(wide * 2, 6) is Stop.MAX_ROUNDS
    assert replication.stop_of(tight, 3, spent_s=2.0) is Stop.PRECISE
    assert replication.stop_of(wide, 3, spent_s=2.0) is Stop.BUDGET
    assert replication.stop_of(wide, 3, spent_s=0.5) is None


def test_a_thread_that_ends_within_a_round_takes_nothing_from_the_others(
    tmp_path: Path, judged: None
) -> None:
    """Read thread by thread: a thread that ended between the marks is unknown (its whole life
    before the round used to be subtracted, reading a neighbour's share as nothing), and one
    that began in it counts from nothing."""
    tasks = tmp_path / "task"

    def write(threads: dict[str, tuple[int, int]]) -> None:
        for old in tasks.glob("*/schedstat"):
            old.unlink()
        for tid, (ran, waited) in threads.items():
            (tasks / tid).mkdir(parents=True, exist_ok=True)
            (tasks / tid / "schedstat").write_text(f"{ran} {waited} 1\n")

    def marked(wall: float) -> CpuMark:
        threads = contention.thread_counts(str(tasks))
        assert threads is not None
        ran, waited = sum(t[1] for t in threads), sum(t[2] for t in threads)
        return CpuMark(waited, wall, ran, threads)

    write({"1": (1_000_000_000, 500_000_000), "2": (10_000_000_000, 5_000_000_000)})
    start = marked(50.0)
    # over 100 ms: thread 1 ran 50 ms and waited 60; thread 2 ended; thread 3 ran 20, waited 10
    write({"1": (1_050_000_000, 560_000_000), "3": (20_000_000, 10_000_000)})
    end = marked(50.1)
    assert others_cores(start, end, cpus=2) == pytest.approx(0.7)
    assert is_busy(others_cores(start, end, cpus=2))
    summed = (CpuMark(start.waited_s, 50.0, start.ran_s), CpuMark(end.waited_s, 50.1, end.ran_s))
    assert others_cores(*summed, cpus=2) == 0.0  # the totals lose the neighbour
    assert contention.counts(str(tasks)) == pytest.approx((1.07, 0.57))
    # thread 2's id taken by a new thread in the round: its counts fell, so from nothing
    write({"1": (1_050_000_000, 560_000_000), "2": (20_000_000, 10_000_000)})
    assert others_cores(start, marked(50.1), cpus=2) == pytest.approx(0.7)
