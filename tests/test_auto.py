"""``--n auto``: each line doubles n until its rate settles or its next case would not fit.

The plan is driven with results made here (no layer is timed), so every stop is exact; one
small real sweep checks that the queue, the writer and run.json carry it."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from attnbench.errors import AttnbenchError
from attnbench.lengths import AutoN
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingStats
from attnbench.options import build_grid, grid_from_config
from attnbench.run.auto import LEAST_POINTS, AutoPlan, Stopped
from attnbench.spec import Case

GIB = 2**30


def grid(**options: object):  # type: ignore[no-untyped-def]
    return build_grid({"layers": "conv", "d": [64], "n": "auto:64..4096", "device": "cpu",
                       **options})  # fmt: skip


def result(case, time_s: float, *, wall_s: float = 0.3, peak: int = 1000,  # type: ignore[no-untyped-def]
           status: str = "ok") -> CaseResult:  # fmt: skip
    timing = TimingStats((time_s,) * 10, calls_per_sample=1, total_s=10 * time_s)
    ok = status == "ok"
    return CaseResult(
        case, status, 2, timing=timing if ok else None, flops=int(1e6 * case.n) if ok else None,
        elementwise=0, peak_bytes=peak if ok else None, wall_s=wall_s,
    )  # fmt: skip


def run_line(plan: AutoPlan, times: dict[int, float], make=None, **more: object) -> list[int]:  # type: ignore[no-untyped-def]
    """Hand the plan's cases out in order as a queue would (each case's result from ``make``,
    by default ``result``); the lengths that ran."""
    ran = []
    for case in plan.grid.cases():
        go, why = plan.decide(case)
        if not go:
            assert why  # a serial line never waits
            continue
        plan.started(case)
        plan.record((make or result)(case, times[case.n], **more))  # type: ignore[arg-type]
        ran.append(case.n)
    return ran


def run_at_rates(rate: dict[int, float], make=None) -> tuple[AutoPlan, list[int]]:  # type: ignore[no-untyped-def]
    """A conv line of ample budget over ``rate``'s lengths (its work doubles with n, its rate
    at each length given; each case's result from ``make``): the plan, and the lengths that
    ran."""
    plan = AutoPlan(build_grid({"layers": "conv", "d": [64], "n": f"auto:64..{max(rate)}",
                                "device": "cpu", "auto_budget": 1000}))  # fmt: skip
    return plan, run_line(plan, {n: 1e-4 * (n / 64) / rate[n] for n in rate}, make)


def test_auto_parses_and_round_trips_through_run_json() -> None:
    found = grid()
    assert found.n_auto == AutoN(64, 4096) and found.ns == (64, 128, 256, 512, 1024, 2048, 4096)
    recorded = found.to_dict()
    assert recorded["ns"] == "auto:64..4096"
    assert grid_from_config(recorded) == found
    assert build_grid({"n": "auto", "device": "cpu"}).n_auto == AutoN()
    default = build_grid({"device": "cpu"})  # a sweep that names no lengths: auto, everywhere
    assert default.n_auto == AutoN() and default.ds == (64,) and default.auto_budget_s == 60.0
    fixed = build_grid({"n": "64..1024", "device": "cpu"})  # a fixed grid, one option away
    assert fixed.n_auto is None and fixed.ds == (64, 128) and fixed.auto_budget_s == 300.0
    for text in ("auto:5", "auto:64..32", "automatic"):
        with pytest.raises(AttnbenchError, match="--n"):
            build_grid({"n": text, "device": "cpu"})


def test_a_line_stops_once_its_rate_settles() -> None:
    plan = AutoPlan(grid())
    # the rate climbs to 1e12 work/s from n = 256, then holds: 4 lengths settle it at 2048
    rate = {64: 2e11, 128: 5e11, 256: 1e12, 512: 1.02e12, 1024: 0.99e12, 2048: 1.01e12,
            4096: 1e12}  # fmt: skip
    ran = run_line(plan, {n: 1e6 * n / r for n, r in rate.items()})
    assert ran == [64, 128, 256, 512, 1024, 2048]
    line = next(iter(plan.lines.values()))
    assert line.stopped is Stopped.REGIME and line.at_n == 2048
    assert "n=256..2048" in line.why
    described = plan.describe()["lines"][0]
    assert described["stopped"] == "regime" and described["at_n"] == 2048


def test_a_line_stops_before_a_call_predicted_over_the_per_case_limit() -> None:
    plan = AutoPlan(grid(max_case_seconds=0.01))
    rising = {n: 1e-4 * (n / 64) ** 1.5 for n in (64, 128, 256, 512, 1024, 2048, 4096)}
    ran = run_line(plan, rising)  # 0.1, 0.28, 0.8 ms ... a rate that never settles
    line = next(iter(plan.lines.values()))
    assert line.stopped is Stopped.TIME
    # the next call is predicted from the last one and the work's growth (x2): over 0.01 s
    assert ran[-1] == 1024 and rising[1024] * 2 > 0.01 >= rising[1024]


def test_a_line_stops_before_a_peak_predicted_over_the_free_memory() -> None:
    plan = AutoPlan(grid(), memory=lambda device: 10 * GIB)
    ran = []
    for case in plan.grid.cases():
        go, _ = plan.decide(case)
        if not go:
            break
        plan.started(case)
        # a peak 4x per doubling (an n x n score matrix), a rate that keeps climbing
        plan.record(result(case, 1e-4 * (case.n / 64) ** 0.5, peak=GIB * (case.n // 64) ** 2 // 64))
        ran.append(case.n)
    line = next(iter(plan.lines.values()))
    assert line.stopped is Stopped.MEMORY and "GiB" in line.why
    assert ran == [64, 128, 256, 512, 1024]  # 4 GiB at 1024: 16 GiB predicted for 2048


def run_cases(plan: AutoPlan, cases: list, times: dict[int, float], **more: object) -> list[int]:  # type: ignore[type-arg]
    """``run_line`` over some of the plan's cases (one line of several)."""
    ran = []
    for case in cases:
        go, _ = plan.decide(case)
        if not go:
            break
        plan.started(case)
        plan.record(result(case, times[case.n], **more))  # type: ignore[arg-type]
        ran.append(case.n)
    return ran


LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
RISING = {n: 1e-4 * (n / 64) ** 0.5 for n in LENGTHS}  # a rate that keeps climbing
STEADY = {n: 1e-5 * n / 64 for n in LENGTHS}  # a settled rate


def two_lines(budget: float) -> tuple[Any, AutoPlan, list[Case], list[Case]]:
    """conv and rnn at d = 64, n = 64..4096, on ``budget`` seconds: the grid, its plan, and
    each line's cases."""
    two = build_grid({"layers": "conv,rnn", "d": [64], "n": "auto:64..4096", "device": "cpu",
                      "auto_budget": budget})  # fmt: skip
    cases = two.cases()
    return (two, AutoPlan(two), [c for c in cases if c.layer == "conv"],
            [c for c in cases if c.layer == "rnn"])  # fmt: skip


def rows_of(cases: list[Case], times: dict[int, float], wall_s: float) -> Any:
    """A resumed run's rows of ``cases``, measured at ``times``."""
    import pandas as pd

    return pd.DataFrame([
        {"case_id": c.case_id, "n": c.n, "status": "ok", "time_s": times[c.n],
         "flops": 1e6 * c.n, "elementwise": 0.0, "peak_bytes": 1000.0, "wall_s": wall_s,
         "time_total_s": 10 * times[c.n]}
        for c in cases
    ])  # fmt: skip


def test_a_line_stops_where_its_share_of_the_budget_runs_out() -> None:
    two, plan, conv, _ = two_lines(10)
    ran = run_cases(plan, conv, RISING, wall_s=2.0)
    line = plan.line(conv[0])
    # its share: half the budget, rnn, the other line, still going
    assert line.stopped is Stopped.BUDGET and line.allowance_s == pytest.approx(5.0)
    # 2 s each: a third overruns the 5 s share, but a line reaches LEAST_POINTS lengths
    assert len(ran) == LEAST_POINTS == 3
    # the next line's share is what is left, over the lines still going
    rnn = next(c for c in two.cases() if c.layer == "rnn")
    assert plan.decide(rnn) == (True, "")
    # what conv spent: its three cases' 6 s and what their later rounds will cost
    later = sum(p.later_s for p in line.points)
    assert later > 0 and line.wall_s == pytest.approx(6.0 + later)
    assert plan.line(rnn).allowance_s == pytest.approx(10.0 - line.wall_s)


def test_a_line_that_settles_early_leaves_its_share_to_the_lines_ahead_of_it() -> None:
    """Two lines that take turns: rnn's rate settles at its fourth length, conv's keeps rising.
    What rnn did not spend goes to conv, which started first: set once as conv started, its
    share stayed half the budget, and it stopped at its fifth length, not its seventh."""
    two = build_grid({"layers": "conv,rnn", "d": [64], "n": "auto:64..65536", "device": "cpu",
                      "auto_budget": 16})  # fmt: skip
    plan = AutoPlan(two)
    lengths = [64 * 2**i for i in range(11)]
    rising = {n: 1e-4 * (n / 64) ** 0.5 for n in lengths}
    steady = {n: 1e-4 * n / 64 for n in lengths}
    conv = [c for c in two.cases() if c.layer == "conv"]
    rnn = [c for c in two.cases() if c.layer == "rnn"]
    ran: dict[str, list[int]] = {"conv": [], "rnn": []}
    for i in range(len(lengths)):
        for cases, times in ((conv, rising), (rnn, steady)):
            case = cases[i]
            if plan.line(case).stopped is None and plan.decide(case)[0]:
                plan.started(case)
                plan.record(result(case, times[case.n], wall_s=1.0))
                ran[case.layer].append(case.n)
    assert plan.line(rnn[0]).stopped is Stopped.REGIME and ran["rnn"] == lengths[:4]
    assert plan.line(conv[0]).stopped is Stopped.BUDGET
    spent = sum(line.wall_s for line in plan.lines.values())
    assert len(ran["conv"]) == 7 and spent <= 16.0


def interleaved(layers: str, times: dict[str, dict[int, float]], budget: float = 1000,
                fail: tuple[str, int] | None = None, wall_s: float = 0.1,
                ) -> tuple[AutoPlan, dict[str, list[int]]]:  # fmt: skip
    """Lines of ``layers`` at d = 64, n = 64..4096, run as the queue runs them (every line's n
    before any line's 2n, each case ``wall_s`` of wall; ``fail``: a case that fails), then
    what ``reopen`` gives back, as the queue does: the plan, and the lengths each line ran."""
    g = build_grid({"layers": layers, "d": [64], "n": "auto:64..4096", "device": "cpu",
                    "auto_budget": budget})  # fmt: skip
    plan = AutoPlan(g)
    ran: dict[str, list[int]] = {name: [] for name in times}
    waiting, dropped = sorted(g.cases(), key=lambda c: c.n), []
    while waiting:
        case = waiting.pop(0)
        go, why = plan.decide(case)
        assert go or why  # a serial queue never waits
        if not go:
            dropped.append(case)
            continue
        plan.started(case)
        failed = fail == (case.layer, case.n)
        plan.record(result(case, times[case.layer][case.n], wall_s=wall_s,
                           status="failed" if failed else "ok"))  # fmt: skip
        if not failed:
            ran[case.layer].append(case.n)
        if case.n == g.ns[-1]:
            plan.exhausted(case)
        if not waiting:
            waiting = plan.reopen(dropped)
            dropped = [c for c in dropped if c not in waiting]
    return plan, ran


def line_of(plan: AutoPlan, layer: str) -> Any:
    return next(line for key, line in plan.lines.items() if key[0] == layer)


SLOW_RNN = {n: 1e-3 * n / 64 for n in LENGTHS}  # settled, and slower than attention throughout
QUADRATIC = {n: 1e-4 * (n / 64) ** 2 for n in LENGTHS}  # overtakes SLOW_RNN at n = 1024


def test_a_rival_that_settles_is_carried_as_far_as_attention_goes() -> None:
    """rnn settles at its fourth length; attention's rate keeps rising and it stays faster.
    Stopped there, rnn's line would end at n = 512 and the chapter's chart would not show the
    two lines side by side: it is carried on as far as attention goes, and says so."""
    plan, ran = interleaved("rnn,attention", {"rnn": SLOW_RNN, "attention": RISING})
    assert ran["attention"] == list(LENGTHS) and ran["rnn"] == list(LENGTHS)
    rnn = line_of(plan, "rnn")
    assert rnn.stopped is Stopped.REGIME and rnn.settled_n == 512
    assert "n=64..512" in rnn.why and "carried on to n=4096" in rnn.why
    assert plan.describe()["lines"][0]["settled_n"] == 512


def test_a_carried_rival_stops_once_attention_overtakes_it() -> None:
    """Attention's time passes rnn's at n = 1024: the crossover is measured, and rnn, carried
    from n = 512, stops there while attention goes on."""
    plan, ran = interleaved("rnn,attention", {"rnn": SLOW_RNN, "attention": QUADRATIC})
    assert ran["rnn"] == [64, 128, 256, 512, 1024]
    assert ran["attention"] == list(LENGTHS)
    assert "carried on to n=1024" in line_of(plan, "rnn").why


def test_a_carried_rival_goes_at_most_a_length_past_where_attention_stops() -> None:
    """Attention's case at n = 1024 fails, which stops its line at 512: rnn, whose 1024 was
    decided first, never waits for attention's word, and stops at 2048's decision."""
    plan, ran = interleaved("rnn,attention", {"rnn": SLOW_RNN, "attention": RISING},
                            fail=("attention", 1024))  # fmt: skip
    assert ran["attention"] == [64, 128, 256, 512]
    assert ran["rnn"] == [64, 128, 256, 512, 1024]
    assert line_of(plan, "rnn").stopped is Stopped.REGIME


def test_a_carried_rival_takes_no_share_of_the_budget_from_attention() -> None:
    """Settled, a carried rnn had kept an equal share of the budget, and attention, the line
    it went on for, stopped short: a settled line's spend is counted as spent and it takes
    no share of what is left."""
    plan, _ = interleaved("rnn,attention", {"rnn": SLOW_RNN, "attention": RISING}, budget=1000)
    rnn, attention = line_of(plan, "rnn"), line_of(plan, "attention")
    assert rnn.settled and rnn.wall_s > 0
    rnn.stopped = attention.stopped = None  # as while both went on, rnn carried
    assert plan._share() == pytest.approx(1000 - rnn.wall_s)  # attention's, all that is left
    rnn.settled = ""  # a line not settled shares what is left with attention
    assert plan._share() == pytest.approx(1000 / 2)


def run_to_512(layers: str) -> tuple[AutoPlan, list[Any]]:
    """Lines of ``layers`` (rnn slow and settled, attention rising, others steady) on a 100 s
    budget, run to n = 512: the plan, and every case by length."""
    g = build_grid({"layers": layers, "d": [64], "n": "auto:64..4096", "device": "cpu",
                    "auto_budget": 100})  # fmt: skip
    plan = AutoPlan(g)
    cases = sorted(g.cases(), key=lambda c: c.n)
    for case in [c for c in cases if c.n <= 512]:
        assert plan.decide(case)[0]
        plan.started(case)
        times = {"rnn": SLOW_RNN, "attention": RISING}.get(case.layer, STEADY)
        plan.record(result(case, times[case.n], wall_s=0.1))
    return plan, cases


def test_a_carried_rival_goes_on_with_attention_when_the_budget_reopens_it() -> None:
    """Attention stops on its share of the budget at n = 512, so rnn, carried from there,
    stops too; once every line has stopped, attention goes on with what the budget left, and
    the rnn carried beside it goes on with it rather than stay at 512."""
    plan, cases = run_to_512("rnn,attention")
    attention, rnn = line_of(plan, "attention"), line_of(plan, "rnn")
    attention.stopped, attention.why = Stopped.BUDGET, "its share ran out"  # as decide does
    later = [c for c in cases if c.n > 512]
    assert plan.decide(later[0]) == (False, rnn.why) and rnn.stopped is Stopped.REGIME
    back = plan.reopen(later)
    assert {c.layer for c in back} == {"rnn", "attention"}
    assert rnn.stopped is None and attention.stopped is None


def test_may_return_says_which_dropped_cases_a_reopening_can_bring_back() -> None:
    """The progress counts the cases a sweep may still measure ("at most"): a case of a line
    the budget stopped, or of the rival carried beside it, may come back while the budget has
    some left; once reopened, or with the budget spent, it may not (it had grown 139 -> 151)."""
    plan, cases = run_to_512("rnn,attention,attention-local")
    attention, rnn, local = (line_of(plan, x) for x in ("attention", "rnn", "attention-local"))
    rnn.stopped = Stopped.REGIME  # settled while attention still goes: the budget may stop
    later = [c for c in cases if c.n > 512]  # attention, and reopen it and rnn beside it
    assert {c.layer for c in later if plan.may_return([c.case_id])} == {
        "rnn"
    }  # (not dropped: attention)
    rnn.stopped = None
    attention.stopped, attention.why = Stopped.BUDGET, "its share ran out"  # as decide does
    for case in later:
        plan.decide(case)
    assert rnn.stopped is Stopped.REGIME and local.stopped is Stopped.REGIME
    back = {c.layer for c in later if plan.may_return([c.case_id])}
    assert back == {"attention", "rnn"}  # attention-local settled, and is no rival
    assert {c.layer for c in plan.reopen(later)} == back  # what reopen then takes on
    attention.stopped = Stopped.BUDGET  # stopped again: its chance was taken
    rnn.stopped = Stopped.REGIME
    assert plan.may_return(c.case_id for c in later) == 0
    attention.reopened = False
    attention.points[-1] = replace(attention.points[-1], wall_s=1000.0)  # the budget spent
    assert plan.may_return(c.case_id for c in later) == 0


def test_a_carried_rival_at_the_ladders_end_stays_stopped_when_attention_is_reopened() -> None:
    """rnn, carried, reached the ladder's last length; attention's last was refused on its
    share. Reopening attention gives rnn nothing to run: it stays stopped, or a finished run
    would read one line 'not stopped'."""
    g = build_grid({"layers": "rnn,attention", "d": [64], "n": "auto:64..4096",
                    "device": "cpu", "auto_budget": 100})  # fmt: skip
    plan = AutoPlan(g)
    cases = sorted(g.cases(), key=lambda c: c.n)
    last = [c for c in cases if c.n == 4096]
    for case in [c for c in cases if c.n < 4096]:
        assert plan.decide(case)[0]
        plan.started(case)
        times = SLOW_RNN if case.layer == "rnn" else RISING
        plan.record(result(case, times[case.n], wall_s=0.1))
    rnn_last = next(c for c in last if c.layer == "rnn")
    assert plan.decide(rnn_last)[0]  # carried: attention is still faster
    plan.started(rnn_last)
    plan.record(result(rnn_last, SLOW_RNN[4096], wall_s=0.1))
    plan.exhausted(rnn_last)
    attention = line_of(plan, "attention")
    attention.stopped, attention.why = Stopped.BUDGET, "its share ran out"  # as decide does
    dropped = [c for c in last if c.layer == "attention"]
    assert plan.reopen(dropped) == dropped
    assert line_of(plan, "rnn").stopped is Stopped.REGIME and attention.stopped is None


def test_a_line_that_is_no_rival_or_has_no_attention_beside_it_stops_where_it_settles() -> None:
    _, ran = interleaved("rnn,conv", {"rnn": STEADY, "conv": RISING})
    assert ran["rnn"] == [64, 128, 256, 512]  # no attention line: nothing to carry it for
    _, ran = interleaved("attention-local,attention",
                         {"attention-local": STEADY, "attention": RISING})  # fmt: skip
    assert ran["attention-local"] == [64, 128, 256, 512]  # not a rival family


def test_a_line_reaches_three_lengths_whatever_its_share_but_not_past_a_calls_limit() -> None:
    """On a loaded machine a line's first case took its whole share, and attention's chart
    was one point: the budget stops a line only from its third length on. A call over
    --max-case-time still stops it at once."""
    one = build_grid({"layers": "conv", "d": [64], "n": "auto:64..4096", "device": "cpu",
                      "auto_budget": 1})  # fmt: skip
    plan = AutoPlan(one)
    rising = {n: 1e-4 * (n / 64) ** 0.5 for n in (64, 128, 256, 512, 1024, 2048, 4096)}
    cases = list(one.cases())
    assert run_cases(plan, cases, rising, wall_s=5.0) == [64, 128, 256]
    assert plan.line(cases[0]).stopped is Stopped.BUDGET
    slow = AutoPlan(one)
    steep = {n: 1e3 * (n / 64) for n in rising}  # 1000 s a call: over the limit at once
    assert run_cases(slow, cases, steep, wall_s=5.0) == [64]
    assert slow.line(cases[0]).stopped is Stopped.TIME


def test_a_case_is_charged_every_round_it_may_get_so_the_budget_bounds_the_sweep() -> None:
    """A case may get up to ``most_rounds`` rounds, and gets them all on a busy machine: the
    budget charges each case that many, so no interval can carry a sweep past it (charged
    ``--processes``, the default sweep ran 103 s of jobs on a 60 s budget)."""
    from attnbench.run.rounds import cost_of

    times = {64: 1e-4}
    for options, most in (({}, 6), ({"max_processes": 4}, 4), ({"processes": 1}, 1)):
        plan = AutoPlan(grid(**options))
        assert plan.grid.most_rounds == most
        case = plan.grid.cases()[0]
        plan.started(case)
        plan.record(result(case, times[64], wall_s=0.5))
        (point,) = plan.line(case).points
        each = cost_of(point.timed_s, point.time_s)
        assert point.later_s == pytest.approx((most - 1) * each)
        assert plan.line(case).wall_s == pytest.approx(0.5 + (most - 1) * each)


def test_the_ladders_end_and_a_failed_case_stop_a_line() -> None:
    plan = AutoPlan(grid())
    ran = run_line(plan, {n: 1e-4 * (n / 64) ** 0.5 for n in (64, 128, 256, 512, 1024, 2048,
                                                              4096)})  # fmt: skip
    assert ran[-1] == 4096
    for case in plan.grid.cases()[-1:]:
        plan.exhausted(case)
    assert next(iter(plan.lines.values())).stopped is Stopped.LONGEST
    plan = AutoPlan(grid())
    first, second = plan.grid.cases()[:2]
    plan.decide(first)
    plan.started(first)
    plan.record(result(first, 1e-4, status="oom"))
    assert plan.decide(second) == (False, "n=64 oom")
    assert plan.line(second).stopped is Stopped.FAILED


def test_a_line_waits_while_its_case_runs_elsewhere() -> None:
    plan = AutoPlan(grid())
    first, second = plan.grid.cases()[:2]
    assert plan.decide(first) == (True, "")
    plan.started(first)
    assert plan.decide(second) == (False, "")  # wait: the line's case before it still runs


@pytest.mark.slow
def test_an_auto_sweep_records_what_stopped_each_line(tmp_path: Path) -> None:
    from rich.console import Console

    from attnbench.cli.summary import summary_notes
    from attnbench.results.loader import load_results
    from attnbench.run.queue import UNCALIBRATED
    from attnbench.run.sweep import resume_sweep, run_sweep

    options = {"layers": "conv,ssm", "n": "auto:16..128", "d": [8], "device": "cpu",
               "time_budget": 0.02, "auto_budget": 60}  # fmt: skip
    run = run_sweep(options, tmp_path / "auto", measuring=UNCALIBRATED)
    meta = json.loads((tmp_path / "auto" / "run.json").read_text())
    lines = {line["layer"]: line for line in meta["auto"]["lines"]}
    assert set(lines) == {"conv", "ssm"} and meta["config"]["ns"] == "auto:16..128"
    for layer, line in lines.items():
        assert line["stopped"] in {s.value for s in Stopped}
        ran = sorted(run.frame.loc[run.frame["layer"] == layer, "n"])
        assert ran == [16 * 2**i for i in range(len(ran))] and ran[-1] == line["at_n"]
    assert meta["cases_total"] == len(run.frame)
    record = load_results(tmp_path / "auto").record.auto  # read once, typed
    assert {(a.layer, a.d, a.at_n) for a in record} == {
        (layer, 8, line["at_n"]) for layer, line in lines.items()
    }
    assert {a.stopped for a in record} == {Stopped(line["stopped"]) for line in lines.values()}
    shown = io.StringIO()  # the summary after the sweep says how far its lines got
    summary_notes(load_results(tmp_path / "auto"), Console(file=shown, width=10_000))
    assert re.search(r"note: --n auto: (all|\d of) 2 lines reached their regime", shown.getvalue())
    again = resume_sweep(tmp_path / "auto", measuring=UNCALIBRATED)  # nothing left to measure
    assert len(again.frame) == len(run.frame) and load_results(tmp_path / "auto").status == (
        "complete"
    )
    # a resumed run keeps what stopped each line (it had read "2 had not stopped")
    resumed = json.loads((tmp_path / "auto" / "run.json").read_text())["auto"]["lines"]
    assert {line["layer"]: line["stopped"] for line in resumed} == {
        layer: line["stopped"] for layer, line in lines.items()
    }


def test_an_accelerators_default_lengths_are_auto() -> None:
    """On a GPU the CPU's lengths are all overhead (the times flat in n): its default is auto;
    lengths given stay as given."""
    on_gpu = build_grid({"device": "cuda"}, lambda name, dtype: "cuda:0")
    assert on_gpu.n_auto == AutoN() and on_gpu.ns[0] == 64
    given = build_grid({"device": "cuda", "n": "64..1024"}, lambda name, dtype: "cuda:0")
    assert given.n_auto is None and given.ns == (64, 128, 256, 512, 1024)


def test_ab_refuses_auto_lengths() -> None:
    from attnbench.run.ab import side_grids

    with pytest.raises(AttnbenchError, match="give the lengths"):
        side_grids({"layers": "conv", "n": "auto", "device": "cpu"}, None, 0.05)


def test_the_summary_names_the_lines_an_auto_sweep_stopped_short_of_their_regime() -> None:
    from attnbench.cli.reach import auto_note
    from attnbench.results.record import AutoLine, RunRecord

    def line(layer: str, stopped: Stopped | None, at_n: int, d: int = 64) -> AutoLine:
        return AutoLine(layer, d, stopped, at_n, "")

    assert auto_note(()) == ""  # a fixed grid
    settled = (line("conv", Stopped.REGIME, 4096), line("rnn", Stopped.REGIME, 1024))
    assert auto_note(settled).startswith("--n auto: all 2 lines reached their regime")
    note = auto_note((
        *settled, line("attention", Stopped.BUDGET, 4096), line("lstm", Stopped.BUDGET, 512),
        line("ssm", Stopped.TIME, 2048), line("gru", None, 256),
    ))  # fmt: skip
    # the lines that did are named (a new user looked for the one)
    assert note.startswith("--n auto: 2 of 6 lines reached their regime (conv, rnn: counted")
    assert ", 1 had not stopped (the run is unfinished); 3 stopped short of it" in note
    assert (
        "attention at n=4096, lstm at n=512 on their share of the budget (a larger "
        "--auto-budget takes them on)" in note
    )
    assert "ssm at n=2048 on the per-call limit (a larger --max-case-seconds takes it on)" in note
    assert "gru" not in note and "d=64" not in note  # one width: not named
    wide = auto_note((line("conv", Stopped.REGIME, 64, 32), line("conv", Stopped.MEMORY, 128)))
    assert wide.endswith(": conv d=64 at n=128 on the free memory")
    failed = AutoLine("rnn", 64, Stopped.FAILED, None, "")
    one = auto_note((line("conv", Stopped.BUDGET, 64), failed))
    assert "conv at n=64 on its share of the budget (a larger --auto-budget takes it on)" in one
    assert one.endswith("rnn before its first length on a failed case")  # no length measured
    # run.json's lines, read once into the record; one that is not a line is left out
    meta = {"auto": {"lines": [
        {"layer": "conv", "d": 64, "stopped": "longest n", "at_n": 512, "why": "last"},
        {"layer": "rnn", "d": "x"}, "junk",
        {"layer": "gru", "d": 32, "stopped": "no such stop", "at_n": None},
    ]}}  # fmt: skip
    assert RunRecord.parse(meta).auto == (
        AutoLine("conv", 64, Stopped.LONGEST, 512, "last"),
        AutoLine("gru", 32, None, None, ""),
    )
    # a rival carried past its regime beside attention is named, with how far it went
    carried = AutoLine("rnn", 64, Stopped.REGIME, 2048, "", settled_n=512)
    note = auto_note((carried, line("attention", Stopped.BUDGET, 2048)))
    assert "carried on past it beside attention" in note and "rnn from n=512 to 2048" in note
    assert "carried" not in auto_note(settled)


def test_an_interrupted_auto_sweep_records_how_far_its_lines_got(tmp_path: Path) -> None:
    """run.json's auto lines are written as each case finishes, so a sweep stopped early has
    them too, and the summary of the unfinished run says that some lines had not stopped."""
    from attnbench.errors import SweepInterrupted
    from attnbench.results.loader import load_results
    from attnbench.run.events import Listeners
    from attnbench.run.queue import UNCALIBRATED
    from attnbench.run.sweep import run_sweep

    def stop_after_the_first(event) -> None:  # type: ignore[no-untyped-def]
        if event.kind == "done":
            raise KeyboardInterrupt

    options = {"layers": "conv,ssm", "n": "auto:16..128", "d": [8], "device": "cpu",
               "time_budget": 0.02, "auto_budget": 60, "processes": 1}  # fmt: skip
    with pytest.raises(SweepInterrupted):
        run_sweep(options, tmp_path / "auto", measuring=UNCALIBRATED,
                  listeners=Listeners(progress=stop_after_the_first))  # fmt: skip
    lines = load_results(tmp_path / "auto").record.auto
    assert {line.layer for line in lines} == {"conv", "ssm"}
    assert any(line.stopped is None for line in lines)
    from attnbench.cli.reach import auto_note

    assert "had not stopped (the run is unfinished)" in auto_note(lines)


def test_a_line_stopped_in_its_regime_whose_final_times_moved_off_it_is_named() -> None:
    """A line stops on its cases' first rounds; their later rounds move the times. Where the
    final rates no longer settle, the note says so, as ``attnbench table`` will."""
    import pandas as pd

    from attnbench.cli.reach import Reading, auto_note, final_readings
    from attnbench.results.record import AutoLine

    ns = [256, 512, 1024, 2048]
    work = [float(n) * 1e6 for n in ns]  # the counted work grows as n
    steady = [w / 100e9 for w in work]  # 100 G a second at every length: settled
    rows = pd.DataFrame({
        "layer": ["conv"] * 4 + ["rnn"] * 4, "d": [64] * 8, "n": ns * 2,
        "flops": work * 2, "elementwise": [0.0] * 8,
        "time_s": [*steady, *steady[:3], steady[3] * 1.5],  # rnn's last: 1.5x, out of the band
        "kernel_share": [0.9] * 8,  # their kernels measured, and most of the time
    })  # fmt: skip
    lines = (
        AutoLine("conv", 64, Stopped.REGIME, 2048, ""),
        AutoLine("rnn", 64, Stopped.REGIME, 2048, ""),
    )
    read = final_readings(lines, rows)
    assert read == {"conv": Reading.TOP, "rnn": Reading.NONE}
    note = auto_note(lines, read)
    assert note.startswith("--n auto: all 2 lines reached their regime (counted work per second")
    assert (
        "settled over 4 lengths on their first rounds; on their final times 1 of them no "
        "longer reads settled, within 20% (rnn reads unsettled)"
    ) in note
    # no kernels measured: the table reads an unsettled line by its slopes (a flat rate reads
    # overhead-bound there), a fit the note does not make, so it claims nothing of it
    assert "rnn" not in final_readings(lines, rows.assign(kernel_share=float("nan")))
    # its kernels under half the time at every length: overhead-bound, as the table reads it
    shares = rows.assign(kernel_share=[0.9] * 4 + [0.3] * 4)
    assert final_readings(lines, shares)["rnn"] is Reading.OVERHEAD
    assert "(rnn reads overhead-bound)" in auto_note(lines, final_readings(lines, shares))
    one_over = shares.assign(kernel_share=[0.9] * 4 + [0.3] * 3 + [0.6])
    assert final_readings(lines, one_over)["rnn"] is Reading.NONE
    rows.loc[7, "time_s"] = steady[3]
    assert set(final_readings(lines, rows).values()) == {Reading.TOP}


def test_a_line_stops_where_its_first_rounds_settle_within_the_narrower_band() -> None:
    """First rounds 18% apart over four lengths settle a fit (within 20%) but not --n auto
    (within 15%): the later rounds move a case's time by a few percent, and a line stopped
    there read unsettled on its final times. The line goes on until its first rounds settle."""
    from attnbench.regime import AUTO_BAND, REGIME_BAND, settled_sizes

    assert AUTO_BAND < REGIME_BAND
    # the rate swings 18% with no trend up to 512, then holds within 5%
    rate = {64: 1.18, 128: 1.0, 256: 1.18, 512: 1.0, 1024: 1.05, 2048: 1.05, 4096: 1.05,
            8192: 1.05}  # fmt: skip
    plan, ran = run_at_rates(rate)
    sizes = [64, 128, 256, 512]
    assert settled_sizes(sizes, [rate[n] for n in sizes]) == sizes  # a fit reads them settled
    assert ran == [64, 128, 256, 512, 1024, 2048, 4096]  # --n auto: 512..4096, within 15%
    assert plan.line(plan.grid.cases()[0]).stopped is Stopped.REGIME


def test_a_line_whose_first_rounds_rise_goes_on_though_their_slope_is_uncertain() -> None:
    """First rounds within 15% whose rate rises 0.045 a doubling, with scatter: 0 is inside
    the slope's interval over four lengths, so their fit alone reads them settled, but final
    times narrow the interval and read the trend (attention-linear's first rounds, 0.060, and
    its final times, 0.068, on 2026-11-30). --n auto goes on until the slope itself is within
    AUTO_TREND."""
    from attnbench.regime import AUTO_TREND, REGIME_TREND, settled_sizes, trendless

    assert AUTO_TREND < REGIME_TREND
    rate = {64: 1.0, 128: 1.12, 256: 1.03, 512: 1.14, 1024: 1.17, 2048: 1.16, 4096: 1.17,
            8192: 1.17}  # fmt: skip
    first = [64, 128, 256, 512]
    assert trendless(first, [rate[n] for n in first])  # 0 inside its interval
    assert not trendless(first, [rate[n] for n in first], AUTO_TREND)  # slope 0.045
    assert settled_sizes(first, [rate[n] for n in first], 0.15) == first
    plan, ran = run_at_rates(rate)
    assert ran == [64, 128, 256, 512, 1024]  # 128..1024: slope 0.034
    assert plan.line(plan.grid.cases()[0]).stopped is Stopped.REGIME


def test_a_line_stops_two_lengths_past_a_plateau_its_rate_fell_from() -> None:
    """A rate can hold in cache within 20% but never within --n auto's 15% on its first rounds,
    then fall out of cache (conv and attention-linear on 2026-11-30 ran on to the end of their
    budget). Where it stays under that plateau at two lengths past it, the line stops: the table
    fits it on the plateau. A fall of one length, or a dip the rate climbs back from, goes on."""
    rate = {64: 0.5, 128: 0.7, 256: 0.85, 512: 1.0, 1024: 1.18, 2048: 1.02, 4096: 1.12,
            8192: 0.8, 16384: 0.7, 32768: 0.65, 65536: 0.64}  # fmt: skip
    plan, ran = run_at_rates(rate)
    assert ran == [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    line = plan.line(plan.grid.cases()[0])
    assert line.stopped is Stopped.REGIME and line.at_n == 16384
    assert line.why == (
        "rate within 20%, with no trend, over n=512..4096 (4 lengths), then under it at the 2 "
        "lengths past it, to n=16384"
    )
    back = {**rate, 16384: 1.05, 32768: 1.06, 65536: 1.04}  # a dip at 8192, then the plateau
    plan, ran = run_at_rates(back)
    assert ran[-1] > 16384
    # attention-local's first rounds on 2026-11-30: over 512..4096 within 16%, its slope 0.05
    # (past --n auto's 0.04, but its interval holds 0, as the table reads it), then a fall
    rates = [18.4, 26.9, 35.4, 41.6, 46.2, 48.2, 45.4, 39.7, 37.3, 35.0, 34.1]
    local = {64 * 2**i: rate for i, rate in enumerate(rates)}
    plan, ran = run_at_rates(local)
    assert ran[-1] == 16384 and "over n=512..4096" in plan.line(plan.grid.cases()[0]).why

    # a length whose rate was not read (its work not counted) is no fall past the plateau
    def uncounted(case, time_s):  # type: ignore[no-untyped-def]
        found = result(case, time_s)
        return replace(found, flops=None, elementwise=None) if case.n > 4096 else found

    plan, ran = run_at_rates(rate, uncounted)
    assert ran[-1] == 65536 and plan.line(plan.grid.cases()[0]).stopped is not Stopped.REGIME


def test_a_resumed_auto_run_keeps_its_lines_budget_stops_unless_the_budget_grew() -> None:
    """A line the budget stopped stays stopped on resume, its spend a finished line's, so the
    resumed run measures what a run straight through would; a larger --auto-budget takes it
    on. A failed line is its rows' to say."""
    two, plan, conv, _ = two_lines(10)
    ran = run_cases(plan, conv, RISING, wall_s=2.0)
    assert plan.line(conv[0]).stopped is Stopped.BUDGET and len(ran) == 3
    rows = rows_of(conv[:3], RISING, 2.0)
    recorded = plan.describe()["lines"]
    again = AutoPlan(two)
    again.restore(rows, recorded, 10.0)
    assert again.line(conv[0]).stopped is Stopped.BUDGET
    assert again.decide(conv[3])[0] is False
    rnn = next(c for c in two.cases() if c.layer == "rnn")
    again.decide(rnn)  # the rest of the budget is rnn's: conv's spend is a finished line's
    assert again.line(rnn).allowance_s == pytest.approx(10.0 - again.line(conv[0]).wall_s)
    larger = AutoPlan(replace(two, auto_budget_s=100.0))
    larger.restore(rows, recorded, 10.0)
    assert larger.line(conv[0]).stopped is None and larger.decide(conv[3]) == (True, "")


def test_a_line_the_budget_stopped_goes_on_with_what_the_others_left() -> None:
    """conv's share ran out while rnn still went; rnn settled and left most of its share.
    Once every line has stopped, conv goes on with what is left, once."""
    _, plan, conv, rnn = two_lines(12)
    assert run_cases(plan, conv, RISING, wall_s=1.5) == [64, 128, 256]  # its 6 s share spent
    assert plan.line(conv[0]).stopped is Stopped.BUDGET
    assert plan.reopen(conv[3:]) == []  # rnn still going: nothing is left to give yet
    assert run_cases(plan, rnn, STEADY, wall_s=0.1) == [64, 128, 256, 512]
    assert plan.line(rnn[0]).stopped is Stopped.REGIME
    back = plan.reopen(conv[3:])
    assert back == conv[3:] and plan.line(conv[0]).stopped is None
    assert plan.decide(conv[3]) == (True, "")  # what rnn left pays for n = 512
    ran = run_cases(plan, conv[3:], RISING, wall_s=1.5)
    assert ran and plan.line(conv[0]).stopped is Stopped.BUDGET
    spent = sum(line.wall_s for line in plan.lines.values())
    assert spent <= 12.0 and plan.reopen(conv[3 + len(ran) :]) == []  # once


def test_a_line_whose_chance_was_taken_is_not_reopened_on_resume() -> None:
    """run.json says which lines had their chance at what was left (taken or not, as when the
    budget was spent): a resume does not give it again, nor to a run that did not record it,
    so a resumed run measures what the run straight through did."""
    two, plan, conv, rnn = two_lines(6)
    run_cases(plan, conv, RISING, wall_s=1.0)
    run_cases(plan, rnn, RISING, wall_s=1.0)  # rnn's rate climbs too: the budget stops both
    assert all(line.stopped is Stopped.BUDGET for line in plan.lines.values())
    assert plan.reopen(conv[3:]) == []  # nothing left: no case comes back, the chance is spent
    recorded = plan.describe()["lines"]
    assert all(line["reopened"] for line in recorded)
    rows = rows_of([*conv[:3], *rnn[:3]], RISING, 0.1)
    for record in (recorded, [{k: v for k, v in r.items() if k != "reopened"} for r in recorded]):
        again = AutoPlan(two)
        again.restore(rows, record, 6.0)  # the rows cost less now: budget would be left
        assert again.reopen(conv[3:]) == []


def test_a_resumed_carried_line_is_not_judged_again_on_its_final_times() -> None:
    """rnn settled at n = 512 on its first rounds and was carried on beside attention when the
    run was cut off. Its final times, more rounds in, read a rate that falls past 512: replayed
    before its record, they stopped it as a fallen plateau, and the resumed run measured less
    than a run straight through. The record's settled length is applied first."""
    plan, _ = interleaved("rnn,attention", {"rnn": SLOW_RNN, "attention": RISING})
    recorded = [dict(line, stopped=None, why="") for line in plan.describe()["lines"]]
    assert next(r for r in recorded if r["layer"] == "rnn")["settled_n"] == 512
    g = plan.grid
    rnn = sorted((c for c in g.cases() if c.layer == "rnn" and c.n <= 2048), key=lambda c: c.n)
    # a rate within 20% (not 15%) to n = 512, then falling: a plateau it fell from
    rate = {64: 1.0, 128: 1.18, 256: 1.0, 512: 1.18, 1024: 0.6, 2048: 0.4, 4096: 0.3}
    falling = {n: SLOW_RNN[n] / rate[n] for n in LENGTHS}
    again = AutoPlan(g)
    again.restore(rows_of(rnn, falling, 0.1), recorded, g.auto_budget_s)
    line = line_of(again, "rnn")
    assert line.stopped is None and line.settled_n == 512  # carried on, as straight through
    fresh = AutoPlan(g)
    fresh.restore(rows_of(rnn, falling, 0.1), None, g.auto_budget_s)
    assert line_of(fresh, "rnn").stopped is Stopped.REGIME  # what the final times alone read


def test_a_line_stopped_short_whose_final_times_settled_is_named_with_where() -> None:
    """A line can pass a plateau and fall off it at longer lengths (attention-linear's
    rate held over n = 512..4096 and fell to 0.73x by 32768): the budget stops it short of a
    regime at the top, and attnbench table fits it on the plateau. Another's final times can
    settle at its last lengths, which its first rounds did not. The note says which is which,
    and a line whose rate climbed on past a plateau is not read settled there."""
    import pandas as pd

    from attnbench.cli.reach import Reading, auto_note, final_readings
    from attnbench.results.record import AutoLine

    ns = [256, 512, 1024, 2048, 4096, 8192, 16384]
    rates = {
        "attention-linear": [40.0, 55.0, 60.0, 59.0, 59.0, 49.0, 45.0],  # a plateau, a fall
        "attention": [20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0],  # never settles
        "ssm": [20.0, 30.0, 40.0, 41.0, 40.0, 41.0, 40.0],  # settled at the top at last
        "lstm": [50.0, 51.0, 50.0, 51.0, 70.0, 90.0, 120.0],  # a plateau it climbed on from
    }
    work = [float(n) * 1e6 for n in ns]
    rows = pd.DataFrame([
        {"layer": layer, "d": 64, "n": n, "flops": w, "elementwise": 0.0, "time_s": w / (r * 1e9),
         "kernel_share": 0.9}
        for layer, line in rates.items() for n, w, r in zip(ns, work, line, strict=True)
    ])  # fmt: skip
    lines = (
        AutoLine("conv", 64, Stopped.REGIME, 4096, ""),
        *(AutoLine(layer, 64, Stopped.BUDGET, 16384, "") for layer in rates),
    )
    read = final_readings(lines, rows)
    assert {k: v for k, v in read.items() if k != "conv"} == {
        "attention-linear": Reading.BELOW,
        "attention": Reading.NONE,
        "ssm": Reading.TOP,
        "lstm": Reading.NONE,
    }
    note = auto_note(lines, read)
    # a line stops on its first rounds and the table reads its final times: two sentences, as
    # "stopped before their rate settled" beside "settled at its last lengths" read as a
    # contradiction to a new user
    assert (
        "4 stopped short of it on their first rounds: attention-linear at n=16384, attention at"
    ) in note
    assert note.endswith(
        "(a larger --auto-budget takes them on). On their final times (every round), attnbench "
        "table reads ssm as settled at its last lengths (its exponent is fitted there); "
        "attention-linear as settled lower down, on a plateau its rate then fell from (its "
        "exponent is fitted there); attention, lstm as unsettled (their rates did not settle on "
        "the lengths they reached)"
    )
    # every length's kernels under half the time: overhead-bound, as the table reads it
    overhead = {**read, "attention": Reading.OVERHEAD}
    assert (
        "attention as overhead-bound (its kernels under half the time at every length); lstm as "
        "unsettled (its rate did not settle on the lengths it reached)"
    ) in auto_note(lines, overhead)
    assert "so what they measured is read below it" in auto_note(lines)  # nothing read
    both = {**read, "attention": Reading.BELOW}  # two lines fitted lower down: plural
    assert "(their exponents are fitted there)" in auto_note(lines, both)
    # a line never measured (failed before its first length) is not said to read unsettled
    failed = AutoLine("gru", 64, Stopped.FAILED, None, "")
    note = auto_note((*lines, failed), read)
    assert "gru before its first length on a failed case" in note and "gru read" not in note
    # a line whose last length's work was not counted settled at its top, not lower down
    rows.loc[(rows["layer"] == "ssm") & (rows["n"] == 16384), "flops"] = float("nan")
    rows.loc[(rows["layer"] == "ssm") & (rows["n"] == 16384), "elementwise"] = float("nan")
    assert final_readings(lines, rows)["ssm"] is Reading.TOP


def test_the_note_claims_no_reading_of_a_width_the_table_does_not_read() -> None:
    """attnbench table reads a layer at its largest width with two lengths: a line at another
    width gets no reading, so the note does not say "attnbench table reads" it (an H200's auto
    run: attention d=64 named unsettled where the table read d=128 alone). One line stopped
    short reads "its", not "their"."""
    import pandas as pd

    from attnbench.cli.reach import Reading, auto_note, final_readings
    from attnbench.results.record import AutoLine

    ns = [256, 512, 1024, 2048]
    rows = pd.DataFrame([
        {"layer": "attention", "d": d, "n": n, "flops": n * 1e6, "elementwise": 0.0,
         "time_s": n * 1e6 / (r * 1e9), "kernel_share": 0.9}
        for d in (64, 128) for n, r in zip(ns, [20.0, 40.0, 60.0, 80.0], strict=True)
    ])  # fmt: skip
    lines = tuple(AutoLine("attention", d, Stopped.BUDGET, 2048, "") for d in (64, 128))
    assert final_readings(lines, rows) == {"attention d=128": Reading.NONE}
    one = (AutoLine("attention", 128, Stopped.BUDGET, 2048, ""),)
    note = auto_note(one, {"attention": Reading.OVERHEAD})
    assert "1 stopped short of it on its first rounds: attention at n=2048" in note
    assert (
        "On its final times (every round), attnbench table reads attention as overhead-bound"
        in note
    )
