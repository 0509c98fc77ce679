"""A case's spread between sweeps on this machine: read from its earlier sweeps' entries
(``results.reruns``), kept in the cache (``run.reruns``), recorded in run.json and held by the
interval (``estimators.estimate``'s ``between``)."""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import own_cache
from rich.console import Console

from attnbench.cli.summary import summary_notes
from attnbench.estimators import Between, between_sweeps, estimate, moderated_between
from attnbench.measure.timing import reference
from attnbench.options import build_grid
from attnbench.priors import Prior
from attnbench.results.loader import load_results
from attnbench.results.reruns import betweens, parse_entries, rerun_key, same_state, sweep_entry
from attnbench.run import queue as queue_module
from attnbench.run import reruns as store
from attnbench.run.sweep import run_sweep

TRUE_S = 1e-3


def sweep_of(rng: np.random.Generator, offset: float, rounds: int = 3, within: float = 0.01):
    """A fake sweep of one case: ``rounds`` processes seconds apart, sharing the sweep's
    moment (a log-normal ``offset`` of the whole sweep), 20 samples each."""
    speeds = TRUE_S * math.exp(offset) * np.exp(rng.normal(0.0, within, size=rounds))
    return [list(s * np.exp(rng.normal(0.0, 0.005, size=20))) for s in speeds]


def test_the_spread_between_sweeps_is_their_variance_less_their_own() -> None:
    """The method of moments: sweeps 0.1 apart in log whose own log times carry 0.001 of
    variance each leave 0.01 - 0.001 between them; one sweep leaves none; never under 0."""
    found = between_sweeps([(0.0, 0.001), (0.1, 0.001), (0.2, 0.001)])
    assert found is not None
    assert found.variance == pytest.approx(0.01 - 0.001) and found.df == 2 and found.sweeps == 3
    assert between_sweeps([(0.0, 0.001)]) is None
    assert between_sweeps([(0.0, 0.1), (0.01, 0.1)]) == Between(0.0, 1.0, 2)
    assert between_sweeps([(0.0, 0.0), (math.nan, 0.0)]) is None  # a bad entry is no sweep


def test_a_case_is_shrunk_toward_the_machines_typical_or_takes_it() -> None:
    own = Between(0.0, 1.0, 2)
    typical = Prior(0.004)  # 4 degrees of freedom
    assert moderated_between(own, typical) == Between(0.004 * 4 / 5, 5.0, 2)
    assert moderated_between(None, typical) == Between(0.004, 4.0, 0)
    assert moderated_between(own, None) == own and moderated_between(None, None) is None


def test_the_interval_holds_two_sweeps_moments_by_satterthwaites_rule() -> None:
    """The interval's square reach is the rounds' part plus twice the sweeps' variance, at
    the t of the Welch-Satterthwaite degrees of freedom of the sum."""
    from scipy import stats

    groups = [[1.0, 1.0], [1.1, 1.1], [0.9, 0.9]]
    logs = np.log([1.0, 1.1, 0.9])
    rounds = float(np.var(logs, ddof=1)) * (1 / 3 + 1 / 3)
    sweeps = 2 * 0.01
    df = (rounds + sweeps) ** 2 / (rounds**2 / 2 + sweeps**2 / 3)
    reach = float(stats.t.ppf(0.975, df)) * math.sqrt(rounds + sweeps)
    found = estimate(groups, between=Between(0.01, 3.0, 4))
    assert math.log(found.high_s / found.center_s) == pytest.approx(reach)
    assert found.center_s == estimate(groups).center_s  # the time is this sweep's own
    assert estimate(groups, between=Between(0.0, 3.0, 4)) == estimate(groups)
    assert found.mean_variance == pytest.approx(float(np.var(logs, ddof=1)) / 3)


def test_sweeps_with_moments_of_their_own_are_held_only_with_the_spread_between_them() -> None:
    """Fake sweeps of one case, each with a moment of its own (3% between sweeps) and rounds
    1% apart within: the interval of a sweep's processes alone holds the next sweep's time
    in well under 95% of tries; read with the spread of the sweeps before it, in about 95%."""
    rng = np.random.default_rng(7)
    held_alone, held_with, tries = 0, 0, 400
    for _ in range(tries):
        sweeps = [sweep_of(rng, rng.normal(0.0, 0.03)) for _ in range(8)]
        found = [estimate(s) for s in sweeps]
        entries = [(math.log(f.center_s), f.mean_variance) for f in found]
        alone = found[-2]
        with_history = estimate(sweeps[-2], between=between_sweeps(entries[:-1]))
        rerun = found[-1].center_s
        held_alone += alone.low_s <= rerun <= alone.high_s
        held_with += with_history.low_s <= rerun <= with_history.high_s
    assert held_alone / tries < 0.7
    assert 0.9 <= held_with / tries <= 0.995


def test_what_a_sweep_leaves_of_a_case() -> None:
    """Its log time and that log time's variance, over two rounds or more, none of them kept
    while read disturbed."""
    groups = [[1.0, 1.0], [1.2, 1.2], [1.1, 1.1]]
    entry = sweep_entry(estimate(groups), 2e-4)
    assert entry is not None
    assert entry[0] == pytest.approx(math.log(estimate(groups).center_s))
    assert entry[1] == pytest.approx(estimate(groups).mean_variance) and entry[2] == 2e-4
    assert sweep_entry(estimate([[1.0] * 10]), 1.0) is None  # one round: no variance of its own
    busy = estimate(groups, [2.0, 2.0, 1.0], quiet=1.0)  # two of three disturbed: all kept
    assert busy.disturbed == 2 and busy.left_out == 0 and sweep_entry(busy, 1.0) is None
    quiet_kept = estimate([*groups, [1.0, 1.0]], [1.0, 2.0, 1.0, 1.0], quiet=1.0)  # 1.2 left
    assert quiet_kept.left_out == 1 and sweep_entry(quiet_kept, 1.0) is not None


def test_every_case_reads_its_own_sweeps_or_the_machines_typical() -> None:
    """The typical, the median of the cases' own, is worth as many degrees of freedom as its
    sweeps give (3 sweeps: 2), up to 4: the cases share their sweeps' moments."""
    nan = math.nan  # a sweep whose reference was not read: one state with every other
    past = {"a": ((0.0, 0.0, nan), (0.2, 0.0, 1.0)), "b": ((1.0, 0.0, 1.0), (1.0, 0.0, 1.1)),
            "x": ((5.0, 0.0, 1.0),)}  # fmt: skip
    own = {"a": (0.1, 0.0, 1.0), "b": (1.0, 0.0, 1.0), "c": (2.0, 0.0, 1.0), "x": None}
    found = betweens(own, past, 1.0)
    assert found["a"].sweeps == 3 and found["b"].sweeps == 3
    typical = float(np.median([0.01, 0.0]))  # the median of the cases' own: a's and b's
    assert found["a"].variance == pytest.approx((2 * typical + 2 * 0.01) / 4)
    assert found["a"].df == 4.0
    for key in ("c", "x"):  # no sweep of its own before; one before, none of its own now
        assert found[key].variance == pytest.approx(typical)
        assert (found[key].df, found[key].sweeps) == (2.0, 0)
    many = {k: tuple((float(i), 0.0, 1.0) for i in range(9)) for k in ("a", "b")}
    now = {"a": (9.0, 0.0, 1.0), "b": (9.0, 0.0, 1.0), "c": None}
    assert betweens(now, many, 1.0)["c"].df == 4.0
    assert betweens({"c": (2.0, 0.0, 1.0)}, {}, 1.0) == {}  # a first sweep: nothing between


@pytest.mark.parametrize(("sweeps", "least", "most"), [(3, 0.85, 0.97), (8, 0.92, 0.995)])
def test_cases_sharing_their_sweeps_moments_are_held_about_as_often_as_claimed(
    sweeps: int, least: float, most: float
) -> None:
    """Eight cases whose sweeps share a 5% moment (and 1% of each case's own), read as the
    loader reads them (``betweens``: each case's own, moderated by the typical): the
    interval of the last sweep holds the next sweep's time about 95% of the time, somewhat
    less with few sweeps (a sweep's moment is known from as many sweeps as there are)."""
    rng = np.random.default_rng(5)
    held = total = 0
    for _ in range(60):
        swept = []
        for _ in range(sweeps + 1):
            moment = rng.normal(0.0, 0.05)
            swept.append([sweep_of(rng, moment + rng.normal(0.0, 0.01)) for _ in range(8)])
        found = [[estimate(g) for g in sweep] for sweep in swept]
        past: dict[str, list[tuple[float, float, float]]] = {}
        for sweep in found[: sweeps - 1]:
            for case, one in enumerate(sweep):
                entry = sweep_entry(one, 1.0)
                assert entry is not None
                past.setdefault(str(case), []).append(entry)
        now = {str(c): sweep_entry(e, 1.0) for c, e in enumerate(found[sweeps - 1])}
        spread = betweens(now, past, 1.0)
        for case, groups in enumerate(swept[sweeps - 1]):
            interval = estimate(groups, between=spread[str(case)])
            held += interval.low_s <= found[sweeps][case].center_s <= interval.high_s
            total += 1
    assert least <= held / total <= most


def test_sweeps_in_another_state_of_the_machine_are_read_apart_and_named() -> None:
    """This machine reads its reference at 208 or 310 µs for minutes at a time, lstm then
    0.45x or 1x: a case's spread is read from the sweeps of this sweep's state (its quiet
    reference within 1.25x), and the others say how far that state puts each case."""
    from attnbench.results.reruns import elsewhere

    past = {
        "a": ((0.0, 0.0, 1.0), (0.02, 0.0, 1.1), (-0.9, 0.0, 1.5), (-0.8, 0.0, 1.6)),
        "b": ((1.0, 0.0, 1.0), (1.0, 0.0, 0.9), (0.9, 0.0, 1.5)),
    }
    own = {"a": (0.01, 0.0, 1.0), "b": (1.0, 0.0, 1.0)}
    found = betweens(own, past, 1.0)
    assert found["a"].sweeps == 3 and found["b"].sweeps == 3
    assert found["a"].variance < 1e-4  # 0, 0.02 and 0.01 apart; not 0.9 away
    other = elsewhere(own, past, 1.0)
    assert other is not None and other.sweeps == 2
    assert other.level_ratio == pytest.approx(1.5)  # the median of 1.5, 1.5 and 1.6
    assert other.ratios["a"] == pytest.approx(math.exp(-0.85 - 0.01))
    assert other.ratios["b"] == pytest.approx(math.exp(-0.1))
    assert elsewhere(own, {"a": past["a"][:2]}, 1.0) is None
    assert same_state(1.0, 1.25) and not same_state(1.0, 1.26) and not same_state(1.26, 1.0)
    assert same_state(1.0, math.nan) and same_state(math.nan, 2.0)
    # from the other state's side, the same sweeps: two of its own, and this one named
    there = betweens({"a": (-0.85, 0.0, 1.5)}, past, 1.5)
    assert there["a"].sweeps == 3


def test_a_cases_key_changes_with_what_makes_it_another_case() -> None:
    row = {"case_id": "conv/n=8/d=4", "compiled": None, "layer_source": "plugin.py sha256 ab"}
    config = {"allocator": "pinned", "timer": "blocks"}
    key = rerun_key(row, config, {"git_commit": "c1"})
    assert key == rerun_key(dict(row), dict(config), {"git_commit": "c1"})
    others = [
        rerun_key({**row, "case_id": "conv/n=16/d=4"}, config, {"git_commit": "c1"}),
        rerun_key({**row, "compiled": "default"}, config, {"git_commit": "c1"}),
        rerun_key({**row, "layer_source": "plugin.py sha256 cd"}, config, {"git_commit": "c1"}),
        rerun_key(row, {**config, "allocator": "system"}, {"git_commit": "c1"}),
        rerun_key(row, {**config, "timer": "events"}, {"git_commit": "c1"}),
        rerun_key(row, config, {"git_commit": "c2"}),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_run_json_entries_that_do_not_read_are_dropped() -> None:
    raw = {
        "a": [[0.1, 0.001, 2e-4], [0.3, 0.002, None], ["x", 1, 1], [1.0, 0.0], [0.2, -1.0, 1],
              [math.inf, 0.0, 1], [0.1, 0.1, "x"], [800.0, 1e-4, 4e-4], [-5.0, 1e300, 1e-4],
              [-40.0, 0.0, 1e-4], [0.1, 0.0, -1.0], [0.1, 0.0, 1e9]],
        "b": "no",
        3: [],
    }  # fmt: skip
    found = parse_entries(raw)
    assert list(found) == ["a"] and found["a"][0] == (0.1, 0.001, 2e-4)
    assert found["a"][1][:2] == (0.3, 0.002) and math.isnan(found["a"][1][2])
    assert len(found["a"]) == 2
    assert parse_entries(None) == {} and parse_entries([1, 2]) == {}


def test_the_store_keeps_each_cases_latest_sweeps_and_the_cases_swept_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "MOST_CASES", 2)
    path = tmp_path / "r.json"
    for i in range(store.KEEP + 2):
        store.write_reruns(path, {"conv": {"a": (float(i), 0.0, 1.0)}})
    kept = store.read_reruns(path)
    assert [x for x, _, _ in kept["conv"]["a"]] == [float(i) for i in range(2, store.KEEP + 2)]
    store.write_reruns(path, {"conv": {"b": (0.0, 0.0, 1.0), "c": (0.0, 0.0, 1.0)}})
    assert list(store.read_reruns(path)["conv"]) == ["b", "c"]  # a, swept first, is dropped
    store.write_reruns(path, {"conv": {"b": (1.0, 0.0, 1.0)}, "rnn": {"d": (0.0, 0.0, math.nan)}})
    kept = store.read_reruns(path)
    assert list(kept["conv"]) == ["c", "b"] and list(kept["rnn"]) == ["d"]
    assert store.of_layers(kept, ["rnn", "gone"]) == {"d": [[0.0, 0.0, None]]}  # JSON: no NaN
    path.write_text("{torn")
    assert store.read_reruns(path) == {}
    (tmp_path / "ro").write_text("")  # a file where the folder should be: skipped, no error
    store.write_reruns(tmp_path / "ro" / "r.json", {"conv": {"a": (0.0, 0.0, 1.0)}})


def with_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write):  # type: ignore[no-untyped-def]
    """A cache of the test's own whose sweeps keep their history (conftest turns it off for
    the suite), ``write`` leaving it, every round reading the machine quiet; the grid: conv
    at two lengths, three rounds a case."""
    own_cache(tmp_path / "cache", monkeypatch)
    monkeypatch.setattr("attnbench.run.sweep.read_reruns", store.read_reruns)
    monkeypatch.setattr("attnbench.run.sweep.write_reruns", write)
    monkeypatch.setattr("attnbench.run.sweep.other_code", store.other_code)

    def around(timing, clock=None, quiet_s=None, wait_s=0.0, sleep=None):  # type: ignore[no-untyped-def]
        return timing(), reference.Around(1e-3, 0.0)

    monkeypatch.setattr(reference, "around", around)
    return build_grid(
        {"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "processes": 3,
         "time_budget": 0.003}
    )  # fmt: skip


def test_a_sweep_records_the_machines_sweeps_before_it_and_leaves_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first sweep finds none (its intervals are its processes'); the second records the
    first's entries in run.json and its cases read two sweeps; a run whose recorded sweeps
    read far apart holds that in its interval, from run.json alone (the cache gone)."""
    grid = with_history(tmp_path, monkeypatch, store.write_reruns)
    first = run_sweep(grid, tmp_path / "one", measuring=queue_module.UNCALIBRATED)
    assert first.record.reruns == {} and first.between == {}
    assert set(first.entries) == {"conv"} and len(first.entries["conv"]) == 2
    second = run_sweep(grid, tmp_path / "two", measuring=queue_module.UNCALIBRATED)
    meta = json.loads((second.path / "run.json").read_text())
    assert {k: [tuple(e) for e in v] for k, v in meta["reruns"].items()} == {
        k: [e] for k, e in first.entries["conv"].items()
    }
    assert {b.sweeps for b in second.between.values()} == {2}
    for path in (tmp_path / "cache").rglob("*.json"):
        path.unlink()
    # earlier sweeps 20% off either way (further where this run's own rounds spread wider,
    # as a loaded machine's 3 ms rounds can: a move inside that spread reads as none): the
    # interval reaches past them; none: its own
    meta["reruns"] = {
        k: [[x + m, w, level], [x - m, w, level]]
        for k, (x, w, level) in second.entries["conv"].items()
        for m in [max(0.2, 2 * math.sqrt(w))]
    }
    (second.path / "run.json").write_text(json.dumps(meta))
    apart = load_results(second.path)
    assert apart.moved is not None and apart.moved.ratio == pytest.approx(1.0)
    assert (apart.moved.cases, apart.moved.sweeps) == (2, 2)
    meta["reruns"] = {  # both earlier sweeps 30% under this one: the loader reads the move
        k: [[x - 0.3, w, level]] * 2 for k, (x, w, level) in second.entries["conv"].items()
    }
    (second.path / "run.json").write_text(json.dumps(meta))
    assert load_results(second.path).moved.ratio == pytest.approx(math.exp(0.3))  # type: ignore[union-attr]
    del meta["reruns"]
    (second.path / "run.json").write_text(json.dumps(meta))
    alone = load_results(second.path)
    assert alone.between == {}
    for wide, narrow in zip(apart.measured.itertuples(), alone.measured.itertuples(), strict=True):
        assert wide.time_s == narrow.time_s
        assert wide.time_ci_high_s / wide.time_s > math.exp(0.2)
        assert wide.time_ci_high_s > narrow.time_ci_high_s
        assert wide.time_stop == narrow.time_stop  # what more rounds could narrow: the same
    # the summary says which, and that more processes cannot narrow the sweeps' part
    from attnbench.cli.reruns import sweeps_note, wide_between_sweeps

    cases = [str(c) for c in apart.measured["case_id"]]
    assert wide_between_sweeps(apart, cases, 0.05) == 2
    # a bound past every case's reach between sweeps (their spread is set from this machine's
    # own rounds above, wider on a busy one): none moves past it
    reach = max(math.expm1(1.96 * math.sqrt(2 * b.variance)) for b in apart.between.values())
    assert wide_between_sweeps(apart, cases, reach + 0.01) == 0
    assert wide_between_sweeps(apart, cases, reach - 0.01) >= 1
    assert wide_between_sweeps(alone, cases, 0.05) == 0
    note = sweeps_note(apart)
    assert note is not None and note.startswith(
        "2 case(s)' ±95% hold how far this machine's sweeps moved them (2 from 3 sweeps of "
        "their own)"
    )
    assert "no earlier sweep of these cases" in (sweeps_note(alone) or "")
    # a move read from few sweeps is itself loose, and widens the ±95% most: the note says so
    # (a new user's second sweep read ×/÷2.1 on every case)
    few = {c: replace(b, df=1.0) for c, b in apart.between.items()}
    assert "(1 degree(s) of freedom)" in (sweeps_note(replace(apart, between=few)) or "")
    assert "degree(s) of freedom" not in note
    # earlier sweeps in another state of the machine (its reference 1.5x): read apart, named
    meta["reruns"] = {
        k: [[x - 0.8, w, 1.5 * level], [x - 0.8, w, 1.5 * level]]
        for k, (x, w, level) in second.entries["conv"].items()
    }
    (second.path / "run.json").write_text(json.dumps(meta))
    other = load_results(second.path)
    assert other.between == {} and other.elsewhere is not None
    assert other.measured["time_ci_high_s"].tolist() == alone.measured["time_ci_high_s"].tolist()
    note = sweeps_note(other) or ""
    assert note.startswith("no earlier sweep of these cases on this machine in this state")
    assert "2 earlier sweep(s) read this machine in another state (its reference 1.50x" in note
    assert "where these cases ran 0.45x" in note
    assert note.endswith("these times: a re-run in that state lands there")
    # a sweep in a slower state than the machine's level: its rounds read disturbed, and it
    # still leaves its entries, judged against its own state's level
    slower = json.loads((second.path / "run.json").read_text())
    slower["quiet"] = {"machine_s": 1e-3 / 1.5, "sweeps": 3, "waited_s": 0.0}
    (second.path / "run.json").write_text(json.dumps(slower))
    busy = load_results(second.path)
    assert (busy.measured["rounds_disturbed"] == busy.measured["rounds"]).all()
    assert len(busy.entries["conv"]) == 2
    # compare says when its two runs ran in different states of the machine
    from attnbench.compare.runs import compare_runs

    samples = busy.samples.copy()
    samples["reference_s"] = 1.5e-3
    (tmp_path / "three").mkdir()
    for found in second.path.iterdir():
        if found.is_file():
            (tmp_path / "three" / found.name).write_bytes(found.read_bytes())
    samples.to_csv(tmp_path / "three" / "samples.csv", index=False)
    warned = compare_runs(second, load_results(tmp_path / "three")).warnings
    assert any(w.startswith("the machine ran in another state in each run") for w in warned)
    assert not any("another state" in w for w in compare_runs(second, second).warnings)
    console = Console(file=io.StringIO(), width=300)
    summary_notes(apart, console)
    assert "2 of them move further than that between this machine's sweeps alone" in (
        console.file.getvalue()  # type: ignore[attr-defined]
    )


def test_compare_holds_two_sweeps_moments_in_its_test() -> None:
    """Two runs 15% apart whose rounds agree within 1%: a regression by their rounds alone;
    not significant where this machine's sweeps of the case spread by 8%, since two sweeps
    land that far apart with nothing changed; and a test with no spread between sweeps is
    Welch's own."""
    from scipy import stats

    from attnbench.compare.verdicts import NOT_SIGNIFICANT, REGRESSION, judge_rounds

    base = [[math.exp(x)] * 5 for x in (0.0, 0.01, -0.01)]
    new = [[math.exp(0.14 + x)] * 5 for x in (0.0, 0.01, -0.005)]
    alone, unit = judge_rounds(base, new)
    assert unit == "rounds" and alone.verdict == REGRESSION
    welch = stats.ttest_ind(
        np.log([g[0] for g in new]), np.log([g[0] for g in base]), equal_var=False,
        alternative="greater",
    )  # fmt: skip
    assert alone.p_value == pytest.approx(float(welch.pvalue), rel=1e-9)
    apart, _ = judge_rounds(base, new, between=Between(0.08**2, 9.0, 10))
    assert apart.verdict == NOT_SIGNIFICANT and apart.p_value > 0.01
    assert apart.ratio == alone.ratio
    assert judge_rounds(base, new, between=Between(0.0, 9.0, 10))[0] == alone


def test_a_stopped_sweep_leaves_nothing_and_its_resume_reads_what_it_first_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep stopped by Ctrl-C leaves no entry; resumed, it goes on with the sweeps it found
    when it began (not the cache's since), leaves its entries once it completes, and a
    completed run resumed again leaves none twice."""
    import signal

    from attnbench.errors import SweepInterrupted
    from attnbench.run.events import Listeners, ProgressEvent
    from attnbench.run.sweep import resume_sweep

    written: list[dict[str, dict[str, tuple[float, float, float]]]] = []

    def write(path: Path, entries):  # type: ignore[no-untyped-def]
        written.append({layer: dict(cases) for layer, cases in entries.items()})
        store.write_reruns(path, entries)

    grid = with_history(tmp_path, monkeypatch, write)
    first = run_sweep(grid, tmp_path / "one", measuring=queue_module.UNCALIBRATED)
    assert len(written) == 1

    def stop(event: ProgressEvent) -> None:
        if event.kind == "done" and event.round == 2:
            os.kill(os.getpid(), signal.SIGINT)

    out = tmp_path / "two"
    with pytest.raises(SweepInterrupted):
        run_sweep(grid, out, listeners=Listeners(progress=stop),
                  measuring=queue_module.UNCALIBRATED)  # fmt: skip
    assert len(written) == 1  # stopped: nothing left
    found = json.loads((out / "run.json").read_text())["reruns"]
    assert len(found) == 2
    store.write_reruns(  # another sweep since: not this run's
        next(iter((tmp_path / "cache").rglob("reruns/*.json"))),
        {"conv": {k: (0.0, 0.0, 1e-3) for k in first.entries["conv"]}},
    )
    resumed = resume_sweep(out, measuring=queue_module.UNCALIBRATED)
    assert json.loads((out / "run.json").read_text())["reruns"] == found
    assert {b.sweeps for b in resumed.between.values()} == {2}
    assert len(written) == 2 and written[1] == dict(resumed.entries)
    resume_sweep(out, measuring=queue_module.UNCALIBRATED)  # complete already
    assert len(written) == 2


def test_the_edges_of_what_an_entry_and_a_key_may_hold() -> None:
    """The bounds of a plausible entry are themselves plausible, the next float past them is
    not; a key's cell reads the same empty whether pandas left it None or NaN."""
    from attnbench.results import reruns

    low, high = reruns.LOG_TIME_RANGE
    assert reruns._plausible(low, 0.0, math.nan) and reruns._plausible(high, 0.0, 1e-3)
    assert not reruns._plausible(math.nextafter(low, -math.inf), 0.0, 1e-3)
    assert not reruns._plausible(math.nextafter(high, math.inf), 0.0, 1e-3)
    assert not reruns._plausible(0.0, reruns.MOST_VARIANCE, 1e-3)
    assert not reruns._plausible(0.0, 0.0, reruns.MOST_REFERENCE_S)
    assert not reruns._plausible(0.0, 0.0, 0.0)
    assert [reruns._text(v) for v in (None, math.nan, "x", 3)] == ["", "", "x", "3"]
    assert same_state(0.0, 1.0) and same_state(1.0, -1.0)  # a reference not read: one state
    found = parse_entries({"a": [["bad"], [10**400, 0.0, None], "105", [0.1, 0.0, 1e-3]], "c": 5})
    assert found == {"a": ((0.1, 0.0, 1e-3),)}  # a bad entry skipped, not the rest; no list


def test_two_rounds_leave_an_entry_and_a_time_not_positive_none() -> None:
    from attnbench.estimators import Estimate

    two = estimate([[1.0, 1.0], [1.1, 1.1]])
    assert sweep_entry(two, 1.0) is not None
    assert sweep_entry(Estimate(0.0, math.nan, math.nan, 3, mean_variance=0.01), 1.0) is None


def test_a_spread_between_sweeps_counts_from_one_degree_of_freedom_not_zero() -> None:
    groups = [[1.0, 1.0], [1.1, 1.1], [0.9, 0.9]]
    assert estimate(groups, between=Between(0.01, 1.0, 2)).rel_ci > estimate(groups).rel_ci
    assert estimate(groups, between=Between(0.01, 0.0, 1)) == estimate(groups)


def test_compare_adds_twice_the_sweeps_variance_at_satterthwaites_df() -> None:
    from scipy import stats

    from attnbench.compare.verdicts import judge_rounds

    base_logs = np.array([0.0, 0.01, -0.01])
    new_logs = np.array([0.14, 0.15, 0.135])
    base = [[math.exp(x)] * 5 for x in base_logs]
    new = [[math.exp(x)] * 5 for x in new_logs]
    parts = [(float(np.var(x, ddof=1)) / 3, 2.0) for x in (new_logs, base_logs)]
    parts.append((2 * 0.08**2, 1.0))
    variance = sum(v for v, _ in parts)
    df = variance**2 / sum(v**2 / d for v, d in parts)
    t = (new_logs.mean() - base_logs.mean()) / math.sqrt(variance)
    found, _ = judge_rounds(base, new, between=Between(0.08**2, 1.0, 2))
    assert found.p_value == pytest.approx(float(stats.t.sf(t, df)), rel=1e-9)
    assert (
        judge_rounds(base, new, between=Between(0.08**2, 0.0, 1))[0] == judge_rounds(base, new)[0]
    )


def test_the_code_a_sweep_ran_is_its_measuring_sources_digest(tmp_path: Path) -> None:
    """An edit to a module a time depends on gives another digest, committed or not; one to
    the terminal's or the charts' does not, nor a file that is not Python source."""
    from attnbench.results.environment import code_digest

    package = tmp_path / "attnbench"
    for name in ("measure/loop.py", "layers/conv.py", "cli/app.py", "render/charts.py"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(f"# {name}\n")
    first = code_digest(package)
    assert len(first) == 64 and first == code_digest(package)
    (package / "cli" / "app.py").write_text("# reworded help\n")
    (package / "render" / "charts.py").write_text("# another colour\n")
    (package / "layers" / "README.md").write_text("notes\n")
    assert code_digest(package) == first
    (package / "layers" / "conv.py").write_text("# conv, faster\n")
    edited = code_digest(package)
    assert edited != first
    (package / "layers" / "conv.py").rename(package / "layers" / "conv2.py")
    assert code_digest(package) not in (first, edited)  # the path is part of it
    assert code_digest() == code_digest()  # attnbench's own: read twice, the same


def test_a_cases_key_names_its_code_by_digest_or_an_older_runs_commit() -> None:
    from attnbench.results.reruns import code_of

    row = {"case_id": "conv/n=8/d=4", "compiled": None, "layer_source": "built-in"}
    config = {"allocator": "pinned", "timer": "blocks"}
    older = {"git_commit": "c1"}
    assert code_of(older) == "commit=c1" and code_of({}) is None
    assert code_of({"git_commit": "c1", "code_digest": "ab12"}) == "code=ab12"
    assert rerun_key(row, config, older).split("|")[3] == "commit=c1"  # as it was: read alike
    assert rerun_key(row, config, {}).split("|")[3] == "commit="
    one = rerun_key(row, config, {"git_commit": "c1", "code_digest": "ab12"})
    assert one == rerun_key(row, config, {"git_commit": "c2", "code_digest": "ab12"})
    assert one != rerun_key(row, config, {"git_commit": "c1", "code_digest": "cd34"})
    folder = Path("/cache")
    assert store.reruns_file("cpu", "float32", 2, "code=" + "a" * 64, folder).stem.endswith(
        "-" + "a" * 12
    )
    assert store.reruns_file("cpu", "float32", 2, None, folder).stem.endswith("-release")


def test_a_first_sweep_of_new_code_takes_the_machines_typical_from_other_codes_sweeps() -> None:
    """Other code's cases give the typical: each key's sweeps apart (their times are their
    code's), in this sweep's state only; a case of this code's own history is shrunk toward
    it; with no other code, a first sweep's intervals hold its own processes."""
    own = {"a": (0.1, 0.0, 1.0), "b": (2.0, 0.0, 1.0)}
    other = {
        "x": ((0.0, 0.0, 1.0), (0.2, 0.0, 1.0), (0.1, 0.0, 1.0)),  # variance 0.01
        "y": ((5.0, 0.0, 1.0), (5.2, 0.0, 1.1), (5.1, 0.0, 1.0)),  # 0.01 too
        "z": ((9.0, 0.0, 1.0), (7.0, 0.0, 2.0)),  # another state: not read
    }
    found = betweens(own, {}, 1.0, other)
    assert set(found) == {"a", "b"}
    for b in found.values():
        assert b.variance == pytest.approx(0.01) and (b.df, b.sweeps) == (2.0, 0)
    assert betweens(own, {}, 1.0, {}) == {} == betweens(own, {}, 1.0)
    assert betweens(own, {}, 1.0, {"z": other["z"]}) == {}  # its sweeps in two states
    # other code's keys with one case: no typical (it needs two); own history and other code
    mixed = betweens(own, {"a": ((0.3, 0.0, 1.0),)}, 1.0, other)
    assert mixed["a"].sweeps == 2 and mixed["b"].sweeps == 0
    typical = float(np.median([0.02, 0.01, 0.01]))  # a's own (0.1 and 0.3), x's, y's
    assert mixed["b"].variance == pytest.approx(typical)
    assert mixed["a"].variance == pytest.approx((2 * typical + 0.02) / 3)


def test_the_store_reads_this_machines_other_code_not_another_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "OTHER_FILES", 2)
    mine = store.reruns_file("cpu", "float32", 2, "code=" + "0" * 64, tmp_path)
    machine = mine.stem.rsplit("-", 1)[0]
    twice = {"conv": {"k1": (0.0, 0.0, 1.0)}}
    store.write_reruns(mine, twice)
    store.write_reruns(mine, twice)  # this code's own: not other code's
    for i, tag in enumerate(["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"]):
        path = mine.parent / f"{machine}-{tag}.json"
        for _ in range(2):
            store.write_reruns(path, {"conv": {f"old{i}": (0.0, 0.0, 1.0)}})
        store.write_reruns(path, {"conv": {f"once{i}": (0.0, 0.0, 1.0)}})  # one sweep: no spread
        os.utime(path, (1_000_000 + i,) * 2)  # written in this order: c latest
    elsewhere = mine.parent / f"{machine}_x-dddddddddddd.json"  # another machine's
    for _ in range(2):
        store.write_reruns(elsewhere, {"conv": {"far": (0.0, 0.0, 1.0)}})
    found = store.other_code(mine)
    assert found == {"conv": {"old2": ((0.0, 0.0, 1.0),) * 2, "old1": ((0.0, 0.0, 1.0),) * 2}}
    assert store.other_code(tmp_path / "none" / "x-y.json") == {}


def test_a_sweep_after_an_edit_reads_the_machines_typical_from_the_code_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sweeps of one code; the third, of other code (its file and keys renamed as an
    edit would), finds no case of its own swept before but records the earlier code's
    entries, holds their typical spread, and says where it came from."""
    from attnbench.cli.reruns import sweeps_note

    grid = with_history(tmp_path, monkeypatch, store.write_reruns)
    for name in ("one", "two"):
        first = run_sweep(grid, tmp_path / name, measuring=queue_module.UNCALIBRATED)
    (path,) = (tmp_path / "cache").rglob("reruns/*.json")
    code = next(iter(first.entries["conv"])).split("|")[3]
    assert code.startswith("code=") and len(code) == len("code=") + 64
    path.rename(path.with_name(path.stem.rsplit("-", 1)[0] + "-before.json"))
    moved = path.with_name(path.stem.rsplit("-", 1)[0] + "-before.json")
    moved.write_text(moved.read_text().replace(code, "code=before"))
    third = run_sweep(grid, tmp_path / "three", measuring=queue_module.UNCALIBRATED)
    meta = json.loads((third.path / "run.json").read_text())
    assert meta["reruns"] == {} and len(meta["reruns_other"]) == 2
    assert all("code=before" in key for key in meta["reruns_other"])
    assert len(third.between) == 2 and {b.sweeps for b in third.between.values()} == {0}
    note = sweeps_note(third) or ""
    borrowed = (
        "no earlier sweep of these cases on this machine is on record; their ±95% hold the "
        "machine's typical move between sweeps instead, read from its sweeps of other cases or "
        "other attnbench code (run.json's reruns and reruns_other): "
    )
    assert note.startswith(borrowed)
    assert note[len(borrowed) :].startswith(("a standard deviation of ", "none past"))
    assert "at most" not in note  # no case of its own to name
    del meta["reruns_other"]  # the typical is run.json's: without it, its processes alone
    (third.path / "run.json").write_text(json.dumps(meta))
    assert load_results(third.path).between == {}


def test_a_sweep_that_moved_its_cases_together_is_named() -> None:
    """Eight cases 30% slower than their earlier sweeps in this state, all of them: the
    sweep's moment moved (a neighbour its reference missed), and the summary says so; cases
    scattered both ways, a small move, too few cases, or another state say nothing."""
    from types import SimpleNamespace

    from attnbench.cli.reruns import moved_note
    from attnbench.results.reruns import Moved, moved

    past = {f"c{i}": ((float(i), 0.0, 1.0), (float(i) + 0.02, 0.0, 1.0)) for i in range(8)}
    slow = {f"c{i}": (float(i) + 0.01 + math.log(1.3), 0.0, 1.0) for i in range(8)}
    found = moved(slow, past, 1.0)
    assert found is not None and found.ratio == pytest.approx(1.3)
    assert (found.cases, found.same_way, found.sweeps) == (8, 8, 2)
    note = moved_note(SimpleNamespace(moved=found))  # type: ignore[arg-type]
    assert note is not None and note.startswith(
        "this sweep ran its cases 1.30x their time in this machine's earlier sweeps of them in "
        "this state (the median of 8 cases' ratios, 8 of them slower; up to 2 earlier sweep(s) "
        "each): the machine ran slower throughout this sweep"
    )
    assert "though its reference read it within 1.25x of theirs" in note
    fast = moved({k: (x - 0.5, w, r) for k, (x, w, r) in slow.items()}, past, 1.0)
    assert fast is not None and fast.ratio < 1
    assert "ran faster throughout" in (moved_note(SimpleNamespace(moved=fast)) or "")  # type: ignore[arg-type]
    scattered = {f"c{i}": (i + 0.01 + (0.2 if i % 2 else -0.2), 0.0, 1.0) for i in range(8)}
    both_ways = moved(scattered, past, 1.0)
    assert both_ways is not None and both_ways.same_way <= 5
    for quiet in (both_ways, Moved(1.04, 8, 8, 2), Moved(1.3, 2, 2, 2), Moved(1.3, 10, 7, 2)):
        assert moved_note(SimpleNamespace(moved=quiet)) is None  # type: ignore[arg-type]
    assert moved_note(SimpleNamespace(moved=None)) is None  # type: ignore[arg-type]
    assert moved(slow, past, 1.5) is None  # earlier sweeps of another state: not compared
    assert moved(slow, {}, 1.0) is None and moved({"c0": None}, past, 1.0) is None


def test_an_edited_plugins_first_sweep_takes_the_typical_from_its_old_key() -> None:
    """The old key (its former sha256) is no case of this sweep's, but its sweeps are this
    machine's: the new key's case takes their typical, where before it read none."""
    past = {
        "plugin|sha256 old|n=8": ((0.0, 0.0, 1.0), (0.2, 0.0, 1.0)),  # variance 0.02
        "plugin|sha256 old|n=16": ((1.0, 0.0, 1.0), (1.2, 0.0, 1.0)),
    }
    found = betweens({"plugin|sha256 new|n=8": (0.5, 0.0, 1.0)}, past, 1.0)
    assert found["plugin|sha256 new|n=8"].variance == pytest.approx(0.02)
    assert found["plugin|sha256 new|n=8"].sweeps == 0


def test_a_runs_level_is_its_rounds_fast_end_and_judged_against_the_machines() -> None:
    """One reading a round however many samples it has; the run's own level where it is
    quieter than the machine's, the machine's where the run read none or a slower one."""
    import pandas as pd

    from attnbench.results.reruns import judging_level, run_level

    samples = pd.DataFrame(
        {"case_id": ["a"] * 10, "round": [1] + [2] * 9, "sample": range(10),
         "reference_s": [1e-3] + [2e-3] * 9}
    )  # fmt: skip
    assert run_level(samples) == 1e-3  # two rounds, not ten samples: the faster round's
    assert math.isnan(run_level(samples.drop(columns="reference_s")))
    assert math.isnan(run_level(samples.iloc[:0]))
    level = run_level(samples)
    assert judging_level(level, 3e-3) == 1e-3 and judging_level(level, 5e-4) == 5e-4
    assert judging_level(level, None) == 1e-3
    unread = run_level(samples.assign(reference_s=math.nan))
    assert judging_level(unread, 3e-3) == 3e-3 and judging_level(unread, None) is None


def test_an_empty_digest_or_commit_names_no_code() -> None:
    from attnbench.results.reruns import code_of

    assert code_of({"code_digest": "", "git_commit": "c1"}) == "commit=c1"
    assert code_of({"code_digest": None, "git_commit": ""}) is None
    assert code_of({"code_digest": 5, "git_commit": 7}) is None  # not text: none


def test_a_case_without_history_does_not_stop_the_shared_move_of_the_rest() -> None:
    from attnbench.results.reruns import moved

    past = {f"c{i}": ((0.0, 0.0, 1.0),) for i in range(1, 4)}
    own = {"c0": (0.3, 0.0, 1.0), **{f"c{i}": (0.3, 0.0, 1.0) for i in range(1, 4)}}
    found = moved(own, past, 1.0)  # c0, first, has no earlier sweep: the others still read
    assert found is not None and found.cases == 3 and found.sweeps == 1


def test_a_runs_state_is_its_rounds_typical_reference_not_its_fast_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose rounds read the slower state's reference but for one read the faster's (the
    22:16 batch: 303 µs in most rounds, 211 at its fast end) ran in the slower state: it is not
    held to the faster state's sweeps but told how far they put its cases. Having run in both,
    it leaves nothing for either state's history (its times may blend them); a run wholly in
    the slower state leaves its entries there. A state is a reading, never the mean of two."""
    import pandas as pd

    from attnbench.cli.reruns import sweeps_note
    from attnbench.results.reruns import run_level, typical_reference

    frame = pd.DataFrame(
        {"case_id": ["a"] * 4 + ["b"] * 2, "round": [1, 1, 2, 3, 1, 2],
         "reference_s": [1e-3, 1e-3, 1.5e-3, 1.5e-3, 1.5e-3, math.nan]}
    )  # fmt: skip
    assert typical_reference(frame) == 1.5e-3 and run_level(frame) == 1e-3  # rounds, not samples
    assert math.isnan(typical_reference(frame.assign(reference_s=math.nan)))
    assert math.isnan(typical_reference(frame.drop(columns="reference_s")))
    assert typical_reference(frame.assign(reference_s=[0.0, 0.0, -1.0, 2e-3, 4e-3, 3e-3])) == 3e-3
    many = pd.DataFrame(
        {"case_id": ["a"] * 7, "round": [1] * 5 + [2, 3], "sample": range(7),
         "reference_s": [1e-3] * 5 + [2e-3] * 2}
    )  # fmt: skip  # a round of five samples is one reading
    assert typical_reference(many) == 2e-3
    halves = frame.assign(reference_s=[1e-3, 1e-3, 1e-3, 1.5e-3, 1.5e-3, 1.5e-3])  # 2 and 2
    assert typical_reference(halves.iloc[:5]) == 1e-3  # not 1.25e-3, one state with both
    grid = with_history(tmp_path, monkeypatch, store.write_reruns)
    run_sweep(grid, tmp_path / "one", measuring=queue_module.UNCALIBRATED)
    second = run_sweep(grid, tmp_path / "two", measuring=queue_module.UNCALIBRATED)
    assert {b.sweeps for b in second.between.values()} == {2}  # one state: held to both
    samples = second.samples.copy()
    first_round = (samples["case_id"] == samples["case_id"].iloc[0]) & (samples["round"] == 1)
    samples["reference_s"] = np.where(first_round, 1e-3, 1.5e-3)
    samples.to_csv(second.path / "samples.csv", index=False)
    slower = load_results(second.path)
    assert slower.between == {} and slower.elsewhere is not None
    assert slower.elsewhere.level_ratio == pytest.approx(1 / 1.5)
    assert "in another state (its reference 0.67x this sweep's)" in (sweeps_note(slower) or "")
    assert slower.entries == {}  # ran in both states: leaves neither a time
    samples["reference_s"] = 1.5e-3
    samples.to_csv(second.path / "samples.csv", index=False)
    wholly = load_results(second.path)
    assert wholly.between == {} and wholly.elsewhere is not None
    assert {e[2] for e in wholly.entries["conv"].values()} == {1.5e-3}
    assert len(wholly.entries["conv"]) == 2


def test_sweeps_no_further_apart_than_their_processes_are_not_said_to_move_by_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new user read "a case's time moves between sweeps by a standard deviation of 0.0%
    typically" beside cases 3-5% apart: the spread is what the sweeps add past their own
    processes', which read the rest. Where it is nil the note says that instead."""
    from attnbench.cli.reruns import sweeps_note

    grid = with_history(tmp_path, monkeypatch, store.write_reruns)
    run_sweep(grid, tmp_path / "one", measuring=queue_module.UNCALIBRATED)
    second = run_sweep(grid, tmp_path / "two", measuring=queue_module.UNCALIBRATED)
    meta = json.loads((second.path / "run.json").read_text())
    meta["reruns"] = {k: [list(e)] * 2 for k, e in second.entries["conv"].items()}  # no move
    (second.path / "run.json").write_text(json.dumps(meta))
    note = sweeps_note(load_results(second.path)) or ""
    assert "their sweeps read most cases no further apart than their own processes did" in note
    assert "the most past it" not in note and "0.0% typically" not in note
    # nothing moved: nor is a move read from few sweeps said to widen the interval
    assert "the ±95% holds their processes' spread alone" in note and "widens" not in note


def test_a_borrowed_typical_move_of_nil_is_not_said_to_be_a_standard_deviation_of_zero(
    tmp_path: Path,
) -> None:
    """A new user read their ±95% "hold the machine's typical move between sweeps instead, a
    standard deviation of 0.0%": where that move is nil, the note says it adds nothing yet."""
    import dataclasses

    from attnbench.cli.reruns import sweeps_note
    from attnbench.estimators import Between

    run = run_sweep(
        build_grid({"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "processes": 2}),
        tmp_path / "run",
        measuring=queue_module.UNCALIBRATED,
    )
    cases = [str(c) for c in run.frame["case_id"]]

    def note(variance: float) -> str:
        borrowed = {c: Between(variance, 4.0, 0) for c in cases}  # the machine's typical
        return " ".join((sweeps_note(dataclasses.replace(run, between=borrowed)) or "").split())

    nil = note(0.0)
    assert "(run.json's reruns and reruns_other): none past their processes' spread" in nil
    assert nil.endswith("so it adds nothing yet") and "a standard deviation of 0.0%" not in nil
    assert "a standard deviation of 3.0%; the ±95% adds that move" in note(0.03**2)


def test_a_typical_move_is_never_said_to_be_over_its_most(tmp_path: Path) -> None:
    """A new user read "a standard deviation of 1.1% typically, 1.0% at most": the typical was
    the median over every case, the machine's borrowed typical too, and the most over the
    cases with sweeps of their own. Both are now over the latter."""
    import dataclasses

    from attnbench.cli.reruns import sweeps_note
    from attnbench.estimators import Between

    run = run_sweep(
        build_grid({"layers": "conv", "n": "8,16,32", "d": "4", "device": "cpu", "processes": 2}),
        tmp_path / "run",
        measuring=queue_module.UNCALIBRATED,
    )
    cases = [str(c) for c in run.frame["case_id"]]
    between = {  # two of their own at 0.5% and 1.0%, one borrowing the machine's 3%
        cases[0]: Between(0.005**2, 2.0, 3),
        cases[1]: Between(0.010**2, 2.0, 3),
        cases[2]: Between(0.03**2, 4.0, 0),
    }
    note = " ".join((sweeps_note(dataclasses.replace(run, between=between)) or "").split())
    assert "(2 from 3 sweeps of their own, 1 from the machine's typical)" in note, note
    assert "by a standard deviation of 0.8% typically, 1.0% at most (" in note, note
    assert "among the cases with sweeps of their own" in note
