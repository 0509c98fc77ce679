"""Timing rounds: every measured case timed again, spread over the sweep in a shuffled order,
its time and interval taken over the rounds, more rounds while the interval is wide."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
from synthetic import rounds_for, samples_for
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.estimators import estimate, iqr
from attnbench.measure.timing.calibration import Calibration
from attnbench.options import build_grid, grid_options
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.estimate import estimate_seconds
from attnbench.run.events import Listeners, ProgressEvent
from attnbench.run.queue import UNCALIBRATED, Measuring
from attnbench.run.sweep import resume_sweep, run_sweep

SMALL_GEMM = Calibration(size=16, every_s=0.0)  # a point before every job


def _grid(rounds: int = 3, **extra: object):
    options = {"layers": "conv,rnn", "n": "8,16", "d": "4", "device": "cpu"}
    return build_grid({**options, "time_budget": 0.003, "processes": rounds, **extra})


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunResults, list]:
    events: list[ProgressEvent] = []
    run = run_sweep(
        _grid(),
        tmp_path_factory.mktemp("r") / "run",
        listeners=Listeners(progress=events.append),
        measuring=Measuring(calibration=SMALL_GEMM),
    )
    return run, events


def test_every_measured_case_has_every_round(three_rounds: tuple[RunResults, list]) -> None:
    run, _ = three_rounds
    per_round = run.samples.groupby(["case_id", "round"]).size()
    rounds = per_round.groupby("case_id").size()
    assert {1, 2, 3} <= set(per_round.index.get_level_values("round"))
    assert rounds.between(3, 6).all() and len(rounds) == 4  # at least 3, at most 2 x 3
    for case_id in run.frame["case_id"]:
        mine = run.samples[run.samples["case_id"] == case_id]
        assert list(mine["sample"]) == list(range(len(mine)))  # numbered on across rounds
        assert [len(r) for r in rounds_for(run, case_id)] == list(mine.groupby("round").size())


def test_statistics_come_from_all_rounds(three_rounds: tuple[RunResults, list]) -> None:
    """The time and its interval are the rounds' (``estimators.estimate``), never the pooled
    samples', and results.csv holds them once the sweep is over."""
    run, _ = three_rounds
    row = run.frame.iloc[0]
    samples = samples_for(run, row["case_id"])
    unmoderated = estimate(rounds_for(run, row["case_id"]))  # every round, no run's prior
    assert row["samples"] == len(samples)
    assert row["rounds"] + row["rounds_disturbed"] >= len(rounds_for(run, row["case_id"]))
    if row["rounds_disturbed"] == 0:  # the same rounds: the same centre
        assert row["time_s"] == pytest.approx(unmoderated.center_s)
    assert row["time_ci_low_s"] < row["time_s"] < row["time_ci_high_s"]
    assert row["time_iqr_s"] == pytest.approx(iqr(samples))
    assert row["flops_per_s"] == pytest.approx(row["flops"] / row["time_s"])
    on_disk = pd.read_csv(run.path / "results.csv").iloc[0]
    assert on_disk["samples"] == len(samples)
    assert on_disk["time_s"] == pytest.approx(row["time_s"])


def test_later_rounds_run_after_the_first_shuffled_and_seeded(
    three_rounds: tuple[RunResults, list], tmp_path: Path
) -> None:
    run, events = three_rounds
    done = [(e.round, e.case.label()) for e in events if e.kind == "done"]
    labels = [e.case.label() for e in events if e.kind == "done" and e.round == 1]
    assert done[:4] == [(1, label) for label in labels]  # first rounds in grid order
    assert [r for r, _ in done] == sorted(r for r, _ in done)  # round by round after them
    later = [label for r, label in done if r > 1]
    orders = [later[i : i + 4] for i in range(0, 8, 4)]  # rounds 2 and 3, every case in each
    assert all(sorted(o) == sorted(labels) for o in orders)
    assert any(o != labels for o in orders)  # shuffled, not the grid's order
    assert events[-1].units_done == 4 * 3 and events[-1].rounds == 3
    later_events = [e for e in events if e.kind == "done" and e.round > 1]
    assert all(e.timing is not None and e.result is None for e in later_events)
    # A calibration point before every job.
    assert run.calibration["point"].nunique() == len(run.samples.groupby(["case_id", "round"]))
    again: list[ProgressEvent] = []
    run_sweep(
        _grid(),
        tmp_path / "again",
        listeners=Listeners(progress=again.append),
        measuring=UNCALIBRATED,
    )
    seen = [(e.round, e.case.label()) for e in again if e.kind == "done" and e.round in (2, 3)]
    assert seen == [(r, label) for r, label in done if r in (2, 3)]  # the seed's order


@pytest.mark.slow
def test_a_case_that_did_not_measure_is_not_timed_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import attnbench.run.executors.worker as worker_module
    from attnbench.measure.record import CaseResult

    real = worker_module.measure_case

    def oom_for_rnn(case, **kwargs):  # type: ignore[no-untyped-def]
        if case.layer == "rnn" and case.n == 16:
            raise_oom = CaseResult(case=case, status="oom", threads=1, error="oom")
            return raise_oom
        return real(case, **kwargs)

    monkeypatch.setattr(worker_module, "measure_case", oom_for_rnn)
    run = run_sweep(_grid(), tmp_path / "run", measuring=UNCALIBRATED)
    rounds = run.samples.groupby("case_id")["round"].nunique()
    assert "rnn/n=16/d=4/b=1/float32/cpu/forward" not in rounds.index
    assert rounds.between(3, 6).all()


@pytest.mark.slow
def test_an_interrupted_round_is_finished_by_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"

    def stop_in_round_two(event: ProgressEvent) -> None:
        if event.kind == "done" and event.round == 2:  # the first of round 2
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(SweepInterrupted) as info:
        run_sweep(
            _grid(),
            out,
            listeners=Listeners(progress=stop_in_round_two),
            measuring=UNCALIBRATED,
        )
    # every case on disk, none with its rounds: not "4 of 4 cases", which read finished
    assert "stopped with 0 of 4 cases done and 4 begun, short of their timing rounds," in (
        str(info.value)
    )
    stopped = load_results(out)
    assert len(stopped.frame) == 4  # every row was written in round 1
    from attnbench.cli.render import _short_of_rounds  # what the resume's first line says

    assert _short_of_rounds(stopped) == ", 4 short of their timing rounds"
    import io

    from rich.console import Console

    from attnbench.cli.summary import summary_tables  # what show says: not "4 measured" alone

    buf = io.StringIO()
    summary_tables(stopped, Console(file=buf, width=200))
    assert "4 measured" in buf.getvalue()
    assert "(4 of them short of their timing rounds: --resume finishes them)" in buf.getvalue()
    assert sorted(stopped.samples.groupby("round")["case_id"].nunique()) == [1, 4]
    resumed = resume_sweep(out, measuring=UNCALIBRATED)
    per_round = resumed.samples.groupby("round")["case_id"].nunique()
    assert {r: per_round[r] for r in (1, 2, 3)} == {1: 4, 2: 4, 3: 4}
    assert not resumed.samples.duplicated(["case_id", "sample"]).any()
    assert _short_of_rounds(resumed) == ""
    assert resumed.status == "complete"
    # a resume charges the earlier rounds the whole budget: that is no reason to read budget
    assert "budget" not in resumed.record.round_stops.values()
    assert set(resumed.record.round_stops.values()) <= {"precise", "max rounds"}


def test_rounds_are_validated_and_cost_time() -> None:
    with pytest.raises(AttnbenchError, match="--processes must be >= 1"):
        _grid(rounds=0)
    assert estimate_seconds(_grid(rounds=5)) > estimate_seconds(_grid(rounds=1))
    assert grid_options(_grid(rounds=5))["processes"] == 5


def test_the_cli_takes_rounds_and_prints_each_round(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            *("sweep", "--layers", "conv", "--n", "8", "--d", "4", "--device", "cpu"),
            *("--time-budget", "0.002", "--processes", "2", "--out", str(out), "--no-charts"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "[1/1] conv n=8 d=4 k=3" in result.stderr  # the first round: the case
    assert "[round 2] conv n=8 d=4 k=3" in result.stderr
    assert load_results(out).meta["config"]["processes"] == 2


def test_every_rounds_cost_counts_toward_the_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds past --processes only while the case's rounds' timed calls stay under
    --time-budget, all of them: at 1 s a round and a budget of 2.5 s, a case whose interval
    stays wide gets a third round and no fourth (only its first round's counted once, so it
    ran all six)."""
    from attnbench.estimators import Estimate
    from attnbench.run import queue as queue_module
    from attnbench.run import rounds as rounds_module

    monkeypatch.setattr(queue_module, "budget_spent", lambda timing: 1.0)
    wide = Estimate(1e-3, 5e-4, 2e-3, 2)  # ±100%
    monkeypatch.setattr(rounds_module, "estimate", lambda *args, **kwargs: wide)
    # a busy neighbour: no round read disturbed
    monkeypatch.setattr(rounds_module, "round_marks", lambda refs, *args: [False] * len(refs))
    grid = build_grid(
        {"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 2,
         "max_processes": 6, "time_budget": 2.5}
    )  # fmt: skip
    run = run_sweep(grid, tmp_path / "run", measuring=Measuring(calibration=SMALL_GEMM))
    assert run.samples["round"].nunique() == 3
    # the rule that ended its rounds is on record: the budget, not --max-processes (6)
    case_id = str(run.frame["case_id"].iloc[0])
    assert run.record.round_stops == {case_id: "budget"}
    # Resumed, the case's budget counts as spent (its rounds' blocks are not on disk to charge
    # again): a complete run measures nothing more, however wide its interval.
    before = (tmp_path / "run" / "results.csv").read_text()
    again = resume_sweep(tmp_path / "run")
    assert again.samples["round"].nunique() == 3
    assert (tmp_path / "run" / "results.csv").read_text() == before


def test_a_round_on_a_gpu_is_charged_its_fresh_process_unless_the_sweep_runs_in_one() -> None:
    """A fresh process on CUDA makes its context and loads cuBLAS and cuDNN (0.64 s on an
    H200), the CPU's fork costs 0.06 s; a serial sweep's rounds pay neither context."""
    from attnbench.run.estimate import estimate_bounds
    from attnbench.run.rounds import PROCESS_S, ROUND_PROCESS_S, cost_of, process_s

    assert process_s("cuda:1") == PROCESS_S["cuda"] > 10 * process_s("cpu")
    assert process_s("cuda:0", fresh=False) == ROUND_PROCESS_S == process_s("cpu")
    assert cost_of(0.1, 1e-3, "cuda:0") - cost_of(0.1, 1e-3, "cpu") == pytest.approx(
        PROCESS_S["cuda"] - ROUND_PROCESS_S
    )
    options = {"layers": "conv,lstm", "n": "64,128", "d": "32", "device": "cuda"}
    gpu = build_grid(options, lambda device, dtype: "cuda:0")
    forked, serial = estimate_bounds(gpu), estimate_bounds(gpu, fresh=False)
    rounds = len(gpu.cases()) * gpu.processes  # the low end: each case's least rounds
    assert forked[0] - serial[0] == pytest.approx(rounds * (PROCESS_S["cuda"] - ROUND_PROCESS_S))


def test_a_compiled_sweeps_estimate_charges_each_round_its_compile() -> None:
    """Every round of a compiled case compiles it again in its process: the estimate charges
    each of the least rounds a graph-broken layer's compile (low) and each of the most a cold
    attention's (high)."""
    from attnbench.run.estimate import COMPILE_S, estimate_bounds
    from attnbench.spec import MORE_PROCESSES

    options = {"layers": "conv,attention", "n": "16,32", "d": "8", "device": "cpu"}
    eager, compiled = build_grid(options), build_grid({**options, "compile": "default"})
    (low, high), (low_c, high_c) = estimate_bounds(eager), estimate_bounds(compiled)
    cases = len(eager.cases())
    assert low_c - low == pytest.approx(cases * eager.processes * COMPILE_S[0])
    most = eager.processes * MORE_PROCESSES
    assert high_c - high == pytest.approx(cases * most * COMPILE_S[1])


def test_time_stop_names_the_budget_where_the_sweep_recorded_it(tmp_path: Path) -> None:
    """A case whose rounds read far apart: time_stop says budget where run.json's round_stops
    says its rounds ended on --time-budget, precise where they reached the sweep's --precision
    (an auto sweep's 5%, past the 2% read back), max rounds where it says so or says nothing (a
    run from before it was recorded), and precise whatever was recorded once they agree."""
    import json

    run = run_sweep(
        build_grid({"layers": "conv", "n": "8", "d": "4", "device": "cpu", "processes": 3}),
        tmp_path / "run",
        measuring=Measuring(calibration=SMALL_GEMM),
    )
    case_id = str(run.frame["case_id"].iloc[0])
    samples = pd.read_csv(run.path / "samples.csv")
    samples["reference_s"] = math.nan  # no round judged disturbed, whatever this machine read
    median = samples["time_s"].median()
    meta = json.loads((run.path / "run.json").read_text())

    def reads(times_by_round: dict[int, float], stops: dict[str, str] | None) -> str:
        found = samples.assign(time_s=samples["round"].map(times_by_round).fillna(median))
        found.to_csv(run.path / "samples.csv", index=False)
        written = {k: v for k, v in meta.items() if k != "round_stops"}
        if stops is not None:
            written["round_stops"] = stops
        (run.path / "run.json").write_text(json.dumps(written))
        return str(load_results(run.path).frame["time_stop"].iloc[0])

    first, second, third = sorted(samples["round"].unique())[:3]
    apart = {first: median, second: 1.6 * median, third: 2.5 * median}
    together = {r: median for r in apart}
    assert reads(apart, {case_id: "budget"}) == "budget"
    assert reads(apart, {case_id: "max rounds"}) == "max rounds"
    assert reads(apart, {case_id: "precise"}) == "precise"
    assert reads(apart, {case_id: "a rule to come"}) == "max rounds"
    assert reads(apart, None) == "max rounds"
    assert reads(together, {case_id: "budget"}) == "precise"


def test_a_resume_records_no_budget_stop_for_rounds_it_charged_the_whole_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted in its second round and resumed, a case whose interval stays wide: the
    resume charges its earlier rounds the whole budget, which is not why its rounds ended, so
    round_stops says nothing of budget (a reviewer's resume read 5 of 6 cases budget)."""
    from attnbench.estimators import Estimate
    from attnbench.run import rounds as rounds_module

    wide = Estimate(1e-3, 5e-4, 2e-3, 2)  # ±100%: never precise
    monkeypatch.setattr(rounds_module, "estimate", lambda *args, **kwargs: wide)
    grid = _grid(time_budget=100.0, max_processes=4)

    def stop_in_round_two(event: ProgressEvent) -> None:
        if event.kind == "done" and event.round == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(SweepInterrupted):
        run_sweep(grid, tmp_path / "run", listeners=Listeners(progress=stop_in_round_two),
                  measuring=UNCALIBRATED)  # fmt: skip
    resumed = resume_sweep(tmp_path / "run", measuring=UNCALIBRATED)
    assert resumed.status == "complete"
    assert "budget" not in resumed.record.round_stops.values()
    assert "budget" not in set(resumed.frame["time_stop"])


def test_precision_is_what_rounds_are_added_for_and_auto_adds_them_only_against_a_mark() -> None:
    """--precision: the interval a sweep adds rounds to reach. ±2% on a fixed grid; --n auto,
    which is after the regime, adds them only to a case that would read ! (5%), unless told.
    The queue's ``Replication`` reads it; a bad value is a one-line error."""
    from attnbench.estimators import IMPRECISE_REL_CI
    from attnbench.run.rounds import Replication

    fixed = build_grid({"layers": "conv", "n": "64", "d": "8", "device": "cpu"})
    auto = build_grid({"layers": "conv", "n": "auto:64..128", "d": "8", "device": "cpu"})
    told = build_grid({"layers": "conv", "n": "auto", "d": "8", "device": "cpu",
                       "precision": "3%"})  # fmt: skip
    assert fixed.precision == 0.02 and auto.precision == IMPRECISE_REL_CI == 0.05
    assert told.precision == pytest.approx(0.03)
    assert Replication.of(told).target_rel_ci == pytest.approx(0.03)
    assert grid_options(told)["precision"] == pytest.approx(0.03)  # run.json keeps it
    # a run from before --precision added rounds to ±2%, its lengths auto or not: read back
    # (``formats``), its grid resumes at 2%; a run that recorded it keeps its own
    from attnbench.formats import FORMAT_VERSION, RawRun, migrate_run
    from attnbench.options import grid_from_config

    def resumed(config: dict[str, object]) -> float:
        meta = {"schema_version": FORMAT_VERSION, "config": config}
        raw = RawRun(meta, pd.DataFrame(), pd.DataFrame(), None, {})
        return grid_from_config(migrate_run(raw, "run").meta["config"]).precision

    assert resumed({k: v for k, v in auto.to_dict().items() if k != "precision"}) == 0.02
    assert resumed(auto.to_dict()) == 0.05
    for bad in ("0%", "150%", "fast", "-1%"):
        with pytest.raises(AttnbenchError, match=r"--precision .*(above 0%|percentage such)"):
            build_grid({"layers": "conv", "n": "64", "d": "8", "precision": bad})


def test_cases_stopped_precise_are_read_again_once_the_sweep_knows_its_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A case stops once its interval is narrow against the spread of the cases before it;
    the interval written is moderated by every case's (a default sweep's 22 cases stopped
    precise at ±5% read ±5.1-7.7% in the end). Once no round is left, each is read again
    against the sweep's spread then, and gets rounds while it is wide: here the spread is
    known small until the last round and large after, so both cases stop at 2 rounds, then
    get their most (4)."""
    from attnbench.estimators import Estimate
    from attnbench.priors import Prior, Priors
    from attnbench.run import queue as queue_module
    from attnbench.run import rounds as rounds_module

    def prior(self: queue_module.JobQueue, quiet: float | None) -> Priors:
        return Priors(run=Prior(1.0 if not (self.first or self.later or self.running) else 0.0))

    def estimate_(rounds, references, quiet, prior, **kwargs):  # type: ignore[no-untyped-def]
        reach = 1.0 if prior is not None and prior.variance >= 0.5 else 0.01
        return Estimate(1e-3, 1e-3 * (1 - reach / 2), 1e-3 * (1 + reach), len(rounds))

    monkeypatch.setattr(queue_module.JobQueue, "prior", prior)
    monkeypatch.setattr(rounds_module, "estimate", estimate_)
    monkeypatch.setattr(rounds_module, "round_marks", lambda refs, *args: [False] * len(refs))
    grid = build_grid(
        {"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "processes": 2,
         "max_processes": 4, "time_budget": 60.0}
    )  # fmt: skip
    run = run_sweep(grid, tmp_path / "run", measuring=UNCALIBRATED)
    assert run.samples.groupby("case_id")["round"].nunique().tolist() == [4, 4]
    assert set(run.record.round_stops.values()) == {"max rounds"}


def test_a_round_read_disturbed_that_ran_no_slower_counts_toward_processes() -> None:
    """The stop rule reads a round's disturbance as the estimate does (``round_marks``): a
    round whose reference read slow but whose time did not is kept, and counts toward
    --processes, where it had been given another round while the estimate kept it."""
    from attnbench.run.rounds import Replication

    rule = Replication(least=3, most=6, target_rel_ci=0.5, budget_s=60.0)
    quiet = [[1.0e-3] * 5, [1.01e-3] * 5]
    fast = rule.stop_of([*quiet, [0.99e-3] * 5], 3, [1.0, 1.0, 2.0], 1.0)
    slow = rule.stop_of([*quiet, [1.6e-3] * 5], 3, [1.0, 1.0, 2.0], 1.0)
    assert fast is not None  # three rounds count: its interval decides
    assert slow is None  # two count: a third is owed
