"""Verdicts of `attnbench compare` on synthetic samples, and the runs they are read from."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from synthetic import case, cases_grid, make_run, noisy

from attnbench.compare import (
    IMPROVEMENT,
    NOT_COMPARED,
    NOT_SIGNIFICANT,
    REGRESSION,
    THROTTLED,
    TOO_FEW,
    UNCHANGED,
    compare_runs,
    judge_count,
    judge_overall,
    judge_rounds,
    judge_time,
    smallest_p,
)
from attnbench.errors import AttnbenchError
from attnbench.render.verdicts import display_table, schema, to_json
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.thresholds import Thresholds, parse_fraction, rounds_to_reach

# ----------------------------------------------------------------------------- time verdicts


def test_a_clear_slowdown_is_a_regression() -> None:
    v = judge_time(noisy(1.0, seed=1), noisy(1.3, seed=2))
    assert v.verdict == REGRESSION
    assert v.ratio == pytest.approx(1.3, rel=0.03)
    assert v.p_value < 1e-6


def test_a_clear_speed_up_is_an_improvement() -> None:
    v = judge_time(noisy(1.0, seed=1), noisy(0.7, seed=2))
    assert v.verdict == IMPROVEMENT
    assert v.p_value < 1e-6


@pytest.mark.slow
def test_noise_alone_is_rarely_a_regression() -> None:
    """Same distribution, 10% spread, 400 draws: independent samples pass for a regression at
    most as often as alpha allows (1%), and at 2% spread never (the ratio rule holds them)."""
    verdicts = [
        judge_time(noisy(1.0, spread=0.1, seed=s), noisy(1.0, spread=0.1, seed=1000 + s)).verdict
        for s in range(400)
    ]
    assert verdicts.count(REGRESSION) <= 0.015 * 400
    assert verdicts.count(IMPROVEMENT) <= 0.015 * 400
    quiet = [judge_time(noisy(1.0, seed=s), noisy(1.0, seed=1000 + s)).verdict for s in range(400)]
    assert REGRESSION not in quiet and IMPROVEMENT not in quiet


def test_a_big_ratio_from_overlapping_samples_is_not_significant() -> None:
    base = [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]
    new = [1.0, 1.0, 3.0, 3.0, 3.0, 3.0]  # median 3.0 against 2.0, the same values
    v = judge_time(base, new)
    assert v.ratio == pytest.approx(1.5)
    assert v.verdict == NOT_SIGNIFICANT and v.p_value > 0.01


def test_a_small_significant_slowdown_below_the_threshold_is_unchanged() -> None:
    v = judge_time(noisy(1.0, spread=0.001, seed=1), noisy(1.05, spread=0.001, seed=2))
    assert v.p_value < 1e-6 and v.verdict == UNCHANGED
    assert (
        judge_time(
            noisy(1.0, spread=0.001, seed=1),
            noisy(1.05, spread=0.001, seed=2),
            Thresholds(max_slowdown=0.02),
        ).verdict
        == REGRESSION
    )


def test_too_few_samples_get_no_verdict_even_when_twice_as_slow() -> None:
    v = judge_time([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert v.verdict == TOO_FEW and math.isnan(v.p_value) and v.ratio == 2.0
    # Five a side can reach p = 1/252 < 0.01; four a side cannot (1/70).
    assert smallest_p(5, 5) == pytest.approx(1 / 252)
    assert judge_time([1.0] * 5, [2.0] * 5).verdict == REGRESSION
    assert judge_time([1.0] * 4, [2.0] * 4, Thresholds(min_samples=2)).verdict == TOO_FEW


def test_rounds_are_the_test_unit_when_there_are_enough() -> None:
    """One slow round in five is a busy moment, not a regression; five slow rounds are one.
    The test is Welch's on the logs of the rounds' medians, the ratio that of the two times
    over their rounds (geometric means of the rounds' medians)."""
    from scipy import stats

    base = [noisy(1.0, 10, seed=r) for r in range(5)]
    one_slow = [noisy(1.0, 10, seed=10 + r) for r in range(4)] + [noisy(1.8, 10, seed=20)]
    verdict, unit = judge_rounds(base, one_slow)
    assert unit == "rounds" and verdict.verdict in (UNCHANGED, NOT_SIGNIFICANT)
    assert verdict.p_value > 0.05
    # Pooled as plain samples, the same data is "significant": why rounds are the unit.
    flat = judge_time([s for r in base for s in r], [s for r in one_slow for s in r])
    assert flat.p_value < 0.01
    all_slow = [noisy(1.3, 10, seed=30 + r) for r in range(5)]
    verdict, unit = judge_rounds(base, all_slow)
    assert unit == "rounds" and verdict.verdict == REGRESSION
    logs = [np.log([np.median(r) for r in side]) for side in (all_slow, base)]
    welch = stats.ttest_ind(*logs, equal_var=False, alternative="greater").pvalue
    assert verdict.p_value == pytest.approx(welch)
    assert verdict.ratio == pytest.approx(np.exp(logs[0].mean() - logs[1].mean()))
    assert verdict.ratio == pytest.approx(1.3, rel=0.03)


def test_one_round_a_side_falls_back_to_the_samples() -> None:
    base = [noisy(1.0, 10, seed=1)]
    new = [noisy(1.3, 10, seed=10)]
    verdict, unit = judge_rounds(base, new)
    assert unit == "samples" and verdict.verdict == REGRESSION
    three = judge_rounds([noisy(1.0, 10, seed=r) for r in range(3)],
                         [noisy(1.3, 10, seed=10 + r) for r in range(3)])  # fmt: skip
    assert three[1] == "rounds" and three[0].verdict == REGRESSION  # Welch's reaches 3 v 3


def test_missing_samples_are_not_compared() -> None:
    assert judge_time([], [1.0] * 10).verdict == NOT_COMPARED


def test_exact_metrics_fail_on_any_increase() -> None:
    assert judge_count(100, 101) == REGRESSION
    assert judge_count(100, 99) == IMPROVEMENT
    assert judge_count(100, 100) == UNCHANGED
    assert judge_count(100, float("nan")) == NOT_COMPARED
    assert judge_count(100, 101, tolerance=0.02) == UNCHANGED


@pytest.mark.slow
def test_overall_is_the_geometric_mean_tested_across_cases() -> None:
    v = judge_overall([1.2] * 5 + [1.3] * 5)
    assert v.ratio == pytest.approx(math.sqrt(1.2 * 1.3))
    assert v.verdict == REGRESSION and v.p_value < 0.01
    mixed = judge_overall([1.3, 0.77] * 6)
    assert mixed.ratio == pytest.approx(1.0, abs=0.01) and mixed.verdict == UNCHANGED
    assert judge_overall([1.5] * 6).verdict == TOO_FEW  # 0.5**6 > 0.01: no test can decide
    assert judge_overall([0.8] * 8).verdict == IMPROVEMENT


@pytest.mark.parametrize(
    ("text", "value"), [("10%", 0.10), ("0.1", 0.1), ("150%", 1.5), ("0%", 0.0)]
)
def test_fractions_parse_from_percentages(text: str, value: float) -> None:
    assert parse_fraction(text, "--max-slowdown") == pytest.approx(value)


@pytest.mark.parametrize("text", ["3", "ten", "-5%", "nan%"])
def test_bad_fractions_are_one_line_errors(text: str) -> None:
    with pytest.raises(AttnbenchError, match="--max-slowdown"):
        parse_fraction(text, "--max-slowdown")


@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_rounds_to_reach_is_what_the_signed_rank_test_needs(alpha: float) -> None:
    from scipy.stats import wilcoxon

    def p(pairs: int, against: int) -> float:
        diffs = [float(i + 1) * (-1 if i < against else 1) for i in range(pairs)]
        return float(wilcoxon(diffs, alternative="greater").pvalue)

    least, roomy = rounds_to_reach(alpha, slack=1), rounds_to_reach(alpha)
    assert p(least, 0) <= alpha < p(least - 1, 0)  # every pair one way: no fewer will do
    assert p(roomy, 2) <= alpha  # the two smallest pairs the other way: still a verdict


def test_thresholds_refuse_nonsense() -> None:
    with pytest.raises(AttnbenchError, match="alpha"):
        Thresholds(alpha=1.5)
    with pytest.raises(AttnbenchError, match="min-samples"):
        Thresholds(min_samples=1)


# ----------------------------------------------------------------------------- runs


def test_identical_runs_pass_every_gate(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid())
    c = compare_runs(base, make_run(tmp_path / "b", cases_grid()))
    assert set(c.times["verdict"]) == {UNCHANGED}
    # a time run counts no instructions, and a forward run has no decode state
    counted = ~c.counts["metric"].isin(["instructions", "state_bytes"])
    assert set(c.counts.loc[counted, "verdict"]) == {UNCHANGED}
    assert set(c.counts.loc[~counted, "verdict"]) == {NOT_COMPARED}
    assert not c.failed("all") and c.regressions() == []
    assert c.overall_verdict.verdict == UNCHANGED and c.warnings == ()


def test_a_slower_case_fails_the_time_gate_only(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid())
    new = make_run(tmp_path / "b", cases_grid(rnn_128={"samples": noisy(1.5e-3, seed=9)}))
    c = compare_runs(base, new)
    row = c.times.set_index("case_id").loc[case("rnn", 128).case_id]
    assert row["verdict"] == REGRESSION and row["ratio"] == pytest.approx(1.5, rel=0.03)
    assert c.failed("time") and c.failed("all")
    assert not c.failed("deterministic") and not c.failed("none")
    assert c.regressions("time")[0].startswith("rnn/n=128/d=16")


def test_more_flops_steps_or_memory_fail_the_deterministic_gate(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid())
    new = make_run(
        tmp_path / "b",
        cases_grid(
            conv_64={"flops": 128_000}, rnn_32={"steps": 2}, conv_256={"peak": 4097},
            rnn_128={"bytes": 64 * 128 + 1},
        ),
    )  # fmt: skip
    c = compare_runs(base, new)
    bad = c.counts[c.counts["verdict"] == REGRESSION]
    assert sorted(zip(bad["layer"], bad["n"], bad["metric"], strict=True)) == [
        ("conv", 64, "flops"),
        ("conv", 256, "peak_bytes"),
        ("rnn", 32, "seq_steps"),
        ("rnn", 128, "bytes"),  # one byte more moved: the traffic is exact too
    ]
    assert c.failed("deterministic") and not c.failed("time")
    assert len(c.regressions("deterministic")) == 4
    # A tolerance on memory lets one byte of peak memory through, never the FLOPs or traffic.
    loose = compare_runs(base, new, Thresholds(memory_tolerance=0.01))
    assert len(loose.regressions("deterministic")) == 3


def test_the_verdicts_name_every_exact_count_and_a_count_from_zero_reads_no_nan(
    tmp_path: Path,
) -> None:
    """A new user's race read "elem. 0 -> 49.2 k (+nan%)", and verdicts.md named three of the
    exact counts that fail on any increase while elementwise work and bytes had failed too."""
    from attnbench.render.verdicts import count_changes, to_markdown

    base = make_run(tmp_path / "a", cases_grid(conv_64={"elements": 0}))
    new = make_run(tmp_path / "b", cases_grid(conv_64={"elements": 49_200}))
    c = compare_runs(base, new)
    said = count_changes(c, case("conv", 64).case_id)
    assert said == "!elem. 0 -> 49.2 k" and "nan" not in said
    note = to_markdown(c, "all")
    assert "The exact counts (FLOPs, elementwise work, bytes moved, state memory, " \
        "sequential steps, path length) fail on any increase" in note  # fmt: skip


@pytest.mark.slow
def test_a_change_of_kernel_is_named_beside_the_times_and_not_judged(tmp_path: Path) -> None:
    """torch choosing another convolution kernel (a torch upgrade, another CPU) explains a
    change of time: the comparison names it, gates nothing on it, and says nothing where a
    run did not record it (a run from before the backend column)."""
    base, new = make_run(tmp_path / "a", cases_grid()), make_run(tmp_path / "b", cases_grid())
    frame = pd.read_csv(new.path / "results.csv", keep_default_na=False)
    conv = (frame["layer"] == "conv") & (frame["n"] == 64)
    frame.loc[conv, "backend"] = "thnn_conv2d (torch's reference convolution)"
    frame.to_csv(new.path / "results.csv", index=False)
    c = compare_runs(base, load_results(new.path))
    row = c.times.set_index("case_id").loc[case("conv", 64).case_id]
    assert (row["kernel_base"], row["kernel_new"]) == ("", "thnn_conv2d")
    assert not c.failed("all")
    shown = display_table(c).set_index(["layer", "n"])
    assert shown.loc[("conv", "64"), "exact"] == "same; kernel none -> thnn_conv2d"
    assert "kernel" not in shown.loc[("rnn", "32"), "exact"]
    jsonschema.validate(to_json(c), schema("compare"))
    frame.drop(columns="backend").to_csv(new.path / "results.csv", index=False)
    meta = json.loads((new.path / "run.json").read_text())
    (new.path / "run.json").write_text(json.dumps({**meta, "schema_version": 1}))  # before it
    older = load_results(new.path)
    assert older.record.unrecorded == ("backend",)
    unjudged = compare_runs(base, older)  # kernels are compared only where both recorded them
    assert set(unjudged.times["kernel_new"]) == {""} and set(unjudged.times["kernel_base"]) == {""}


def test_a_case_that_stops_measuring_fails_every_gate(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid())
    new = make_run(tmp_path / "b", cases_grid(conv_256={"status": "oom"}))
    c = compare_runs(base, new)
    row = c.times.set_index("case_id").loc[case("conv", 256).case_id]
    assert row["status_verdict"] == REGRESSION and row["verdict"] == NOT_COMPARED
    for gate in ("all", "time", "deterministic"):
        assert c.regressions(gate) == [f"{case('conv', 256).case_id}: ok -> oom"]
    assert not c.failed("none")
    # And the reverse (it measures now) is an improvement, not a failure.
    assert not compare_runs(new, base).failed()
    # the table says why it broke, beside the baseline's time (ab and compare read
    # "baseline -  current -  REGRESSION (ok -> failed)", the error in results.csv alone)
    broke = make_run(
        tmp_path / "c", cases_grid(conv_256={"status": "failed", "error": "ValueError: regressed"})
    )
    judged = compare_runs(base, broke)
    shown = display_table(judged).set_index(["layer", "n"]).loc[("conv", "256")]
    assert shown["time"] == "REGRESSION (ok -> failed: ValueError: regressed)"
    assert shown["baseline"] not in ("", "–", "-") and shown["current"] in ("", "–", "-")
    assert shown["ratio"] == "–"
    jsonschema.validate(to_json(judged), schema("compare"))
    assert judged.times.set_index("case_id").loc[case("conv", 256).case_id, "error_new"] == (
        "ValueError: regressed"
    )


@pytest.mark.slow
def test_cases_on_one_side_only_are_listed_not_dropped(tmp_path: Path) -> None:
    grid = cases_grid()
    fewer = {k: v for k, v in grid.items() if k != ("rnn", 256)}
    more = {**grid, ("attention", 64): {}}
    c = compare_runs(make_run(tmp_path / "a", grid), make_run(tmp_path / "b", more))
    assert c.only_current == (case("attention", 64).case_id,) and c.only_baseline == ()
    c = compare_runs(make_run(tmp_path / "c", grid), make_run(tmp_path / "d", fewer))
    assert c.only_baseline == (case("rnn", 256).case_id,)
    assert any("only in the baseline" in w for w in c.warnings)
    assert len(c.times) == 7


def test_runs_with_no_case_in_common_are_an_error(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", {("conv", 32): {}})
    b = make_run(tmp_path / "b", {("rnn", 32): {}})
    with pytest.raises(AttnbenchError, match="no case in common"):
        compare_runs(a, b)


def test_a_mismatched_environment_is_warned_and_memory_left_alone(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid())
    new = make_run(
        tmp_path / "b",
        cases_grid(conv_64={"peak": 10**6}),
        env={"device_name": "Other CPU", "torch_version": "2.12.0+cpu"},
    )
    c = compare_runs(base, new)
    text = " ".join(c.warnings)
    assert "device differs: 'Test CPU 9000'" in text and "torch differs" in text
    assert "peak memory is compared only between runs on the same device" in text
    peak = c.counts[c.counts["metric"] == "peak_bytes"]
    assert set(peak["verdict"]) == {NOT_COMPARED}
    assert not c.failed()


def test_normalize_divides_by_each_runs_calibration(tmp_path: Path) -> None:
    """A machine twice as slow: every case and the GEMM take twice as long."""
    base = make_run(tmp_path / "a", cases_grid(), calibration_s=1e-3)
    slow_grid = {key: {"samples": noisy(2e-3, seed=50 + i)} for i, key in enumerate(cases_grid())}
    new = make_run(tmp_path / "b", slow_grid, calibration_s=2e-3)
    raw = compare_runs(base, new)
    assert raw.failed("time") and raw.overall["raw"].verdict == REGRESSION
    assert raw.calibration["ratio"] == pytest.approx(2.0, rel=0.02)
    assert raw.times["ratio_normalized"].between(0.95, 1.05).all()  # shown even when not judged
    assert any(  # the raw verdicts say the machine's speed moved with them
        w.startswith("the calibration kernel, timed between the cases, ran 2.00x the baseline's")
        for w in raw.warnings
    )
    judged = compare_runs(base, new, Thresholds(normalize=True))
    assert not judged.failed() and judged.judged_on == "normalized"
    assert not any("calibration kernel" in w for w in judged.warnings)  # divided out
    assert not any("calibration kernel" in w for w in compare_runs(base, base).warnings)
    assert judged.overall_verdict.ratio == pytest.approx(1.0, abs=0.03)


def test_normalize_needs_calibration_on_both_sides(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid(), calibration_s=None)
    new = make_run(tmp_path / "b", cases_grid())
    assert compare_runs(base, new).calibration == {}
    with pytest.raises(AttnbenchError, match="no calibration samples"):
        compare_runs(base, new, Thresholds(normalize=True))


def test_an_unknown_gate_is_an_error(tmp_path: Path) -> None:
    c = compare_runs(make_run(tmp_path / "a", cases_grid()), make_run(tmp_path / "b", cases_grid()))
    with pytest.raises(AttnbenchError, match="--fail-on 'sometimes'"):
        c.regressions("sometimes")


# ----------------------------------------------------------------------------- device models


def _two_models(slow_b: float = 1.0, gemm_b: float = 1e-3) -> dict[tuple[str, int], dict]:
    """conv on model A, rnn on model B (as a mixed Ray cluster spreads one grid)."""
    cases: dict[tuple[str, int], dict] = {}
    for i, n in enumerate((32, 64, 128, 256)):
        cases[("conv", n)] = {"device": "GPU A", "samples": noisy(1e-3, seed=i)}
        cases[("rnn", n)] = {
            "device": "GPU B",
            "samples": noisy(2e-3 * slow_b, seed=10 + i),
            "calibration": gemm_b,
        }
    return cases


def test_a_gate_that_could_not_decide_says_so_not_no_regression(tmp_path: Path) -> None:
    """A new user's three cases read 1.29-1.33x slower, none significant, and the gate printed
    "no regression": it says what it could not decide instead (and passes: nothing was
    shown), where the gate judges time; a gate on the counts alone does not speak of time."""
    from attnbench.render.verdicts import headline

    conv = {key: spec for key, spec in cases_grid().items() if key[0] == "conv"}
    c = compare_runs(make_run(tmp_path / "a", conv), make_run(tmp_path / "b", conv))
    assert c.undecided("time") == "" and headline(c, "time").startswith("no regression in")
    assert to_json(c, "time")["undecided"] == ""
    times = c.times.copy()
    assert len(times) >= 3
    times["verdict"] = [NOT_SIGNIFICANT] * (len(times) - 2) + [TOO_FEW, THROTTLED]
    # one past the threshold; the others under it, their intervals reaching past it (a run
    # compared with itself, every ratio 1.000, read "slower than +10%")
    times["ratio_judged"] = [1.3] + [1.0] * (len(times) - 1)
    unsure = dataclasses.replace(c, times=times)
    words = unsure.undecided("time")
    assert words == (
        f"time undecided for {len(times)} of {len(times)} shared case(s) (1 "
        "slower than +10% but not significant at p < 0.01; "
        f"{len(times) - 3} under +10% with an interval reaching past it; "
        "1 with too few samples for a test; "
        "1 throttled: the GPU's clock moved): the gate passes them, and sweeps with more "
        "--processes would decide them"
    )
    assert headline(unsure, "all") == f"no regression shown: {words}"
    assert to_json(unsure, "all")["undecided"] == words
    assert unsure.undecided("deterministic") == "" and not unsure.failed("time")


def test_an_overall_row_over_too_few_cases_says_so(tmp_path: Path) -> None:
    """Under 7 cases no overall test reaches alpha 0.01: said of the cases, not the samples (a
    new user's one-case ab read "too few samples" beside the case's own verdict)."""
    conv = {key: spec for key, spec in cases_grid().items() if key[0] == "conv"}
    c = compare_runs(make_run(tmp_path / "a", conv), make_run(tmp_path / "b", conv))
    assert 0 < len(c.times) < 7 and c.overall_verdict.verdict == TOO_FEW
    shown = display_table(c).set_index("layer")
    assert shown.loc["OVERALL", "time"] == "too few cases (needs 7)"
    assert shown.loc["conv", "time"].iloc[0] != shown.loc["OVERALL", "time"]
    assert to_json(c)["overall"]["raw"]["verdict"] == "too few samples"  # the JSON keeps its word
    # the count beside it is of the cases the test took: a throttled one is left out of both
    times = c.times.copy()
    times.loc[times.index[0], "verdict"] = THROTTLED
    shown = display_table(dataclasses.replace(c, times=times)).set_index("layer")
    assert shown.loc["OVERALL", "current"] == f"geomean of {len(times) - 1}"


def test_runs_over_two_device_models_are_compared_model_by_model(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", _two_models())
    new = make_run(tmp_path / "b", _two_models())
    assert base.devices == ["GPU A", "GPU B"]
    result = compare_runs(base, new)
    assert result.by_device
    assert list(result.times["device_new"]) == ["GPU A"] * 4 + ["GPU B"] * 4  # grouped
    assert set(result.times["verdict"]) == {UNCHANGED}
    assert any("span 2 device models" in w for w in result.warnings)
    table = display_table(result)
    assert list(table.columns[:3]) == ["layer", "device", "n"]
    assert table["device"].iloc[0] == "GPU A" and table["device"].iloc[-2] == "GPU B"


def test_a_case_on_another_model_in_each_run_is_not_compared(tmp_path: Path) -> None:
    moved = _two_models()
    moved[("conv", 64)] = {"device": "GPU B", "samples": noisy(3e-3, seed=1), "peak": 99999}
    result = compare_runs(make_run(tmp_path / "a", _two_models()), make_run(tmp_path / "b", moved))
    row = result.times.set_index("case_id").loc[case("conv", 64).case_id]
    assert row["verdict"] == NOT_COMPARED and row["device_base"] == "GPU A"
    assert not result.failed("all")  # 3x slower, but on another model; memory not compared
    counts = result.counts[result.counts["case_id"] == case("conv", 64).case_id]
    assert counts.set_index("metric").loc["peak_bytes", "verdict"] == NOT_COMPARED
    assert any("1 case(s) ran on another device model" in w for w in result.warnings)
    table = display_table(result)
    moved_row = table[(table["layer"] == "conv") & (table["n"] == "64")]
    assert list(moved_row["device"]) == ["GPU A -> GPU B"]


def test_normalising_uses_each_models_own_calibration(tmp_path: Path) -> None:
    """Model B's machines got twice as slow (GEMM and cases alike); model A did not."""
    base = make_run(tmp_path / "a", _two_models())
    new = make_run(tmp_path / "b", _two_models(slow_b=2.0, gemm_b=2e-3))
    raw = compare_runs(base, new, Thresholds(max_slowdown=0.1))
    assert set(raw.times.loc[raw.times["layer"] == "rnn", "verdict"]) == {REGRESSION}
    normalized = compare_runs(base, new, Thresholds(max_slowdown=0.1, normalize=True))
    assert set(normalized.times["verdict"]) == {UNCHANGED}
    rnn = normalized.times[normalized.times["layer"] == "rnn"]
    assert rnn["ratio_normalized"].between(0.9, 1.1).all()
    assert rnn["ratio"].between(1.8, 2.2).all()
    # the table's interval and the normalised ratio it brackets are the judged ones, and the
    # header says so: "98% CI" had switched to the normalised ratio beside a raw one, unsaid
    shown = display_table(normalized).iloc[:-1]
    assert "98% CI (norm.)" in shown and "98% CI" not in shown
    for r, judged in zip(shown.itertuples(), normalized.times.itertuples(), strict=True):
        assert float(r[shown.columns.get_loc("norm. ratio") + 1]) == round(judged.ratio_judged, 3)
    assert "98% CI" in display_table(raw)


def test_a_terminals_marks_come_from_the_verdicts_not_the_words(tmp_path: Path) -> None:
    """Each row of the displayed table is marked by its case's typed verdicts: the slower case
    red in time, the case whose FLOPs grew red in its counts, the OVERALL row last."""
    from attnbench.render.verdicts import row_marks

    base = make_run(tmp_path / "a", cases_grid())
    new = make_run(
        tmp_path / "b",
        cases_grid(rnn_128={"samples": noisy(1.5e-3, seed=9)}, conv_64={"flops": 128_000}),
    )
    c = compare_runs(base, new)
    marks = row_marks(c)
    assert len(marks) == len(display_table(c)) == len(c.times) + 1
    by_case = dict(zip(c.times["case_id"], marks, strict=False))
    assert by_case[case("rnn", 128).case_id].time == REGRESSION
    assert by_case[case("conv", 64).case_id].exact_regressed
    others = [m for cid, m in by_case.items() if cid != case("rnn", 128).case_id]
    assert {m.time for m in others} == {UNCHANGED}
    assert marks[-1].time == c.overall_verdict.verdict


def test_an_abs_pairs_with_a_busy_half_are_counted_and_judged_with_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten pairs, five with the current half read busy (its threads waited for a CPU) and twice
    as slow: every pair is judged (the median pair reads 1.5x: leaving the busy ones out would
    cut the test's power, and could drop the rounds a change that makes the layer's own
    threads wait slows), and the row and a note count them. compare counts none."""
    from synthetic import make_run

    from attnbench.compare.verdicts import pair_rounds, pairs_note
    from attnbench.estimators import kept_of
    from attnbench.measure.timing import contention
    from attnbench.results.loader import load_results
    from attnbench.thresholds import Thresholds

    monkeypatch.delenv(contention.BUSY_ENV, raising=False)  # conftest's: never busy
    assert kept_of([False, True, False]) == [0, 2] and kept_of([True, True, False]) == [0, 1, 2]
    assert kept_of([False, False, True], least=3) == [0, 1, 2] and kept_of([]) == []
    rounds = 10
    busy = set(range(2, rounds + 1, 2))  # rounds 2, 4, ..., 10

    def side(slowed: bool) -> list[float]:
        slow = [2.0 if slowed and r in busy else 1.0 for r in range(1, rounds + 1)]
        return [1e-3 * x for x in slow for _ in range(4)]

    base = make_run(tmp_path / "base", {("conv", 64): {"samples": side(False)}}, rounds=rounds)
    new = make_run(tmp_path / "new", {("conv", 64): {"samples": side(True)}}, rounds=rounds)
    samples = pd.read_csv(new.path / "samples.csv")
    samples["others_cores"] = [0.9 if r in busy else 0.0 for r in samples["round"]]
    samples.to_csv(new.path / "samples.csv", index=False)
    new = load_results(new.path)
    case_id = str(new.frame["case_id"].iloc[0])
    assert new.disturbed_of(case_id) == {r: r in busy for r in range(1, 11)}
    paired = compare_runs(base, new, Thresholds(alpha=0.05), paired=True)
    row = paired.times.iloc[0]
    assert row["ratio_judged"] == pytest.approx(1.5) and row["rounds_new"] == 10
    # the columns are over the pairs' rounds too (the run's time leaves the busy half out)
    assert new.frame["time_s"].iloc[0] == pytest.approx(1e-3)
    assert row["time_new_s"] == pytest.approx(1e-3 * 2**0.5)
    assert row["time_base_s"] == pytest.approx(1e-3)
    assert row["pairs_disturbed"] == 5 and row["verdict"] == "regression"
    note = "5 pair(s) of 1 case(s) had a half read disturbed (its machine reference slow"
    assert any(w.startswith(note) for w in paired.warnings)
    # a move the quiet pairs alone do not show is named: the neighbour's halves carry it
    assert row["verdict_quiet_pairs"] == "unchanged"
    named = "1 case(s) moved, judged on all their pairs, but not on their quiet pairs alone: "
    named += f"{case_id} ("
    assert any(w.startswith(named) for w in paired.warnings)
    strict = compare_runs(base, new, Thresholds(alpha=0.01), paired=True).times.iloc[0]
    assert strict["verdict"] != "regression" and strict["verdict_quiet_pairs"] == ""
    same = compare_runs(base, base, Thresholds(alpha=0.05), paired=True).times.iloc[0]
    assert same["verdict_quiet_pairs"] == ""  # no move, nothing to check
    unpaired = compare_runs(base, new)  # compare: each side's own kept rounds, no pairs
    assert unpaired.times.iloc[0]["pairs_disturbed"] == 0
    assert not any("pair(s)" in w for w in unpaired.warnings)
    # a round only one side has is no pair
    one, two = {1: [1.0], 2: [1.0]}, {2: [2.0], 3: [1.0]}
    assert pair_rounds(one, two, ({1: True}, {3: True})) == ([2], [2])  # 1 and 3: no pairs
    assert pair_rounds({2: [1.0]}, {2: [2.0]}, ({}, {2: True})) == ([2], [])
    assert pair_rounds({2: [1.0]}, {2: [2.0]}, ({2: True}, {})) == ([2], [])  # either half
    note = pairs_note(pd.DataFrame({"pairs_disturbed": [1, 0, 2]})) or ""
    assert note.startswith("3 pair(s) of 2 case(s) had a half read disturbed")
    assert pairs_note(pd.DataFrame({"pairs_disturbed": [0, 0]})) is None
    assert pairs_note(pd.DataFrame({"x": [1]})) is None


def test_compare_reads_each_runs_state_from_its_typical_reference(tmp_path: Path) -> None:
    """The current run's rounds read the slower state's reference but for one that read the
    faster's: its fast end is the baseline's state, its typical is not, and compare says the
    machine ran in another state in each run."""
    from synthetic import make_run

    from attnbench.results.loader import load_results

    base = make_run(tmp_path / "base", {("conv", 64): {}}, rounds=5)
    new = make_run(tmp_path / "new", {("conv", 64): {}}, rounds=5)
    for run, references in ((base, [1e-3] * 5), (new, [1e-3] + [1.5e-3] * 4)):
        samples = pd.read_csv(run.path / "samples.csv")
        samples["reference_s"] = [references[int(r) - 1] for r in samples["round"]]
        samples.to_csv(run.path / "samples.csv", index=False)
    warned = compare_runs(load_results(base.path), load_results(new.path)).warnings
    assert any(
        w.startswith("the machine ran in another state in each run (its reference read 1.50x")
        for w in warned
    )
    # ab's two sides took turns, pair by pair: a new user was told its one run ran in two states
    from attnbench.compare.caveats import environment_warnings

    sides = load_results(base.path), load_results(new.path)
    assert not [w for w in environment_warnings(*sides, paired=True) if "another state" in w]


def test_compare_and_table_say_which_times_are_a_busy_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new user's case timed only beside a neighbour (every round read busy) was published
    as any other: compare called its 7x ratio "not significant" and table fitted exponents
    over it, neither saying a word. Both now name such cases; a case with two quiet rounds
    left is not one of them, and ab counts its disturbed pairs instead."""
    from synthetic import make_run

    from attnbench.measure.timing import contention
    from attnbench.results.loader import load_results
    from attnbench.table import comparison_table, fit_notes

    monkeypatch.delenv(contention.BUSY_ENV, raising=False)  # conftest's: never busy
    cases = {("conv", 64): {}, ("conv", 128): {}}
    base = make_run(tmp_path / "base", cases, rounds=3)
    new = make_run(tmp_path / "new", cases, rounds=3)
    samples = pd.read_csv(new.path / "samples.csv")
    ids = list(dict.fromkeys(samples["case_id"]))
    busy_round = (samples["case_id"] == ids[0]) | (samples["round"] == 3)  # all of one case's
    samples["others_cores"] = np.where(busy_round, 0.9, 0.0)
    samples.to_csv(new.path / "samples.csv", index=False)
    new = load_results(new.path)
    assert new.busy_cases() == [ids[0]] and base.busy_cases() == []
    warned = compare_runs(base, new).warnings
    assert "1 case(s) in the current run had fewer than two quiet rounds" in " ".join(warned)
    assert not any("quiet rounds" in w for w in compare_runs(base, base).warnings)
    other = compare_runs(base, new, pairs=[(ids[1], ids[1])]).warnings  # not compared: none
    assert not any("quiet rounds" in w for w in other)
    assert not any("quiet rounds" in w for w in compare_runs(base, new, paired=True).warnings)
    notes = fit_notes(comparison_table(new), new)
    assert notes[-1].startswith("1 of 2 case(s) (conv) had fewer than two quiet rounds: their")
    assert not any("quiet rounds" in n for n in fit_notes(comparison_table(base), base))


def test_the_quiet_pairs_check_reads_both_sides_marks_and_only_pairs() -> None:
    """Five quiet pairs read 1, six whose base half read disturbed read 2: judged on every
    pair the median is 2, on the quiet pairs 1. A round one side lacks is no pair, a round a
    side's marks do not name is quiet, and under the test's least (5 at alpha 0.05) there is
    no check. The notes say what they count, word for word."""
    from attnbench.compare.verdicts import judge_pairs, pair_rounds, pairs_note, quiet_pairs_note
    from attnbench.thresholds import Thresholds

    loose = Thresholds(alpha=0.05)
    base = {r: [1.0] for r in range(1, 12)} | {20: [1.0]}  # round 20: the base side's only
    new = {r: [1.0 if r <= 5 else 2.0] for r in range(1, 12)}
    marks = ({r: True for r in range(6, 12)}, {})  # the base halves of rounds 6-11
    pairs, quiet = pair_rounds(base, new, marks)
    assert pairs == list(range(1, 12)) and quiet == [1, 2, 3, 4, 5]
    assert pair_rounds(base, new, (marks[1], marks[0]))[1] == quiet  # either side's marks
    alone = judge_pairs({r: base[r] for r in quiet}, {r: new[r] for r in quiet}, loose)
    assert alone.ratio == pytest.approx(1.0) and alone.verdict == "unchanged"
    assert judge_pairs(base, new, loose).ratio == pytest.approx(2.0)  # every pair
    fewer = ({r: True for r in range(5, 12)}, {})  # four quiet pairs: too few to judge
    four = pair_rounds(base, new, fewer)[1]
    few = judge_pairs({r: base[r] for r in four}, {r: new[r] for r in four}, loose)
    assert few.verdict == "too few samples"
    times = pd.DataFrame(
        {"case_id": ["a", "b", "c", "d"], "verdict": ["regression", "regression", "unchanged",
         "improvement"], "verdict_quiet_pairs": ["unchanged", "regression", "", None],
         "pairs_disturbed": [6, 2, 0, 1]}
    )  # fmt: skip
    assert quiet_pairs_note(times) == (
        "1 case(s) moved, judged on all their pairs, but not on their quiet pairs alone: a "
        "(unchanged); "
        "their pairs with a disturbed half may carry the move (a neighbour that slowed one "
        "side's halves, or that side's own threads waiting for each other)"
    )
    assert quiet_pairs_note(times.iloc[1:]) is None and quiet_pairs_note(times[["verdict"]]) is None
    throttled = times.assign(verdict=["throttled", "regression", "unchanged", "improvement"])
    assert quiet_pairs_note(throttled) is None  # a throttled move is no move to check
    two = times.assign(verdict_quiet_pairs=["unchanged", "too few samples", "", None])
    said = quiet_pairs_note(two) or ""
    assert said.startswith("1 case(s) moved, judged on all their pairs, but not on their quiet")
    # too few quiet pairs is no check made, not a move the quiet pairs do not show
    assert said.endswith("; 1 case(s) moved, judged on all their pairs, had too few quiet pairs "
                         "for the test to check the move on them alone: b")  # fmt: skip
    assert pairs_note(times) == (
        "9 pair(s) of 3 case(s) had a half read disturbed (its machine reference slow, or its "
        "threads kept waiting for a CPU: a neighbour's, or the layer's own threads); they are "
        "judged with the rest, as a pair's halves mostly share a neighbour's burst "
        "(pairs_disturbed in the JSON)"
    )


def test_a_layers_code_that_differs_is_told_by_its_digest_and_the_same_code_elsewhere_so() -> None:
    """Two builds of one package version read alike by their distribution alone; one file's
    code copied elsewhere read as 'differs' with one sha256 twice (a new user's compare)."""
    from attnbench.compare.caveats import layer_differences
    from attnbench.layers.entry import LayerSource

    def module(digest: str, spec: str = "convglu:make") -> dict[str, dict[str, str]]:
        return {"convglu:make": {"kind": "module", "spec": spec, "digest": digest,
                                 "distribution": "convglu 0.1.0"}}  # fmt: skip

    (line,) = layer_differences(module("d5559a9b8dd8"), module("d6fd2d1eb0b6"))
    assert line == (
        "layer convglu:make differs: convglu:make (sha256 d5559a9b8dd8, convglu 0.1.0) in the "
        "baseline, convglu:make (sha256 d6fd2d1eb0b6, convglu 0.1.0) in the current run"
    )
    (moved,) = layer_differences(module("d5559a9b8dd8", "a:make"), module("d5559a9b8dd8", "b:make"))
    assert moved == (
        "layer convglu:make ran the same code (sha256 d5559a9b8dd8) from another place: a:make "
        "in the baseline, b:make in the current run"
    )
    assert layer_differences(module("d5559a9b8dd8"), module("d5559a9b8dd8")) == []
    # a row's layer_source names both too: an edit under pip install -e keeps the version
    assert LayerSource(**module("d5559a9b8dd8")["convglu:make"]).describe() == (
        "convglu:make (sha256 d5559a9b8dd8, convglu 0.1.0)"
    )


def test_cases_that_ran_another_code_than_the_record_names_are_told(tiny_run: RunResults) -> None:
    """A --resume --force of a finished run after an edit rewrote run.json's layers, measuring
    nothing, and compare then named no code difference; one that went on left two codes."""
    from attnbench.compare.caveats import code_ran_differences

    layer = str(tiny_run.frame["layer"].iloc[0])
    ran = tiny_run.codes_ran[layer]
    assert len(ran) == 1 and tiny_run.mixed_code() == []

    def ran_code(code: str, rows: int | None = None) -> RunResults:
        frame = tiny_run.frame.copy()
        at = frame.index[frame["layer"] == layer][:rows]
        frame.loc[at, "layer_source"] = code
        return dataclasses.replace(tiny_run, frame=frame)

    mixed = ran_code("mine.py:make (sha256 aaaaaaaaaaaa)", rows=1)
    assert mixed.codes_ran[layer] == ["mine.py:make (sha256 aaaaaaaaaaaa)", ran[0]]
    (line,) = mixed.mixed_code()
    assert line.startswith(f"layer {layer}'s cases ran 2 codes (mine.py:make (sha256 aaaa")
    assert code_ran_differences(tiny_run, mixed) == [f"{line} (the current run)"]
    other = ran_code("mine.py:make (sha256 bbbbbbbbbbbb)")
    assert code_ran_differences(other, tiny_run) == [
        f"layer {layer}'s cases ran other code: mine.py:make (sha256 bbbbbbbbbbbb) in the "
        f"baseline, {ran[0]} in the current run, where both run.json files name one (a "
        "--resume --force rewrote one's record)"
    ]
    assert code_ran_differences(tiny_run, tiny_run) == []


def test_a_judged_ratio_carries_the_interval_its_test_is_dual_to() -> None:
    """A ratio read alone said nothing of its noise (an A/A ab read 1.50, "not significant");
    a 95% interval beside a one-sided test at 0.01 contradicted it (a regression whose interval
    held 1). The interval is the test's dual, two-sided at 1 - 2 alpha: a slowdown is
    significant exactly where its low end is above 1. ab's pairs: the Walsh averages of the
    log ratios (the Wilcoxon signed-rank's); compare's rounds: Welch's t, scipy's own where
    the sweeps add no spread, and with a spread between sweeps as well."""
    from scipy import stats

    from attnbench.compare.verdicts import judge_pairs, judge_rounds, walsh_interval
    from attnbench.estimators import Between

    ratios = [0.9, 1.6, 1.1, 1.3, 1.2, 1.5, 1.0, 1.4, 1.25, 1.35]
    base = {r: [1.0] for r in range(1, 11)}
    paired = judge_pairs(base, {r: [x] for r, x in zip(range(1, 11), ratios, strict=True)})
    assert paired.ratio == pytest.approx(1.275) and paired.verdict == "regression"
    assert (paired.low, paired.high) == walsh_interval(np.log(ratios), 0.01)
    assert 1 < paired.low < paired.ratio < paired.high
    few = judge_pairs({1: [1.0], 2: [1.0]}, {1: [1.2], 2: [1.3]})
    assert math.isnan(few.low) and math.isnan(few.high)  # no outcome of two pairs reaches 0.01
    rng = np.random.default_rng(3)
    for _ in range(300):  # significant exactly where the interval leaves 1 out
        logs = rng.normal(rng.normal(0, 0.05), 0.1, size=int(rng.integers(7, 20)))
        low, high = walsh_interval(logs, 0.01)
        p = stats.wilcoxon(logs, alternative="greater", method="exact").pvalue
        assert (p < 0.01) == (low > 1)
        faster = stats.wilcoxon(logs, alternative="less", method="exact").pvalue
        assert (faster < 0.01) == (high < 1)
    before = [[1.0, 1.01], [1.05, 1.04], [0.98, 0.99], [1.02, 1.0]]
    after = [[1.3, 1.31], [1.2, 1.22], [1.4, 1.38]]
    verdict, unit = judge_rounds(before, after)
    logs = [np.log([float(np.median(r)) for r in side]) for side in (after, before)]
    interval = stats.ttest_ind(*logs, equal_var=False).confidence_interval(0.98)
    assert unit == "rounds"
    assert verdict.low == pytest.approx(math.exp(interval.low))
    assert verdict.high == pytest.approx(math.exp(interval.high))
    for _ in range(300):  # the same duality with a spread between sweeps in the variance
        base_r = [[float(x)] for x in np.exp(rng.normal(0, 0.04, size=4))]
        new_r = [[float(x)] for x in np.exp(rng.normal(rng.normal(0.12, 0.05), 0.04, size=4))]
        found, _ = judge_rounds(base_r, new_r, between=Between(0.0004, 6.0, 3))
        if found.ratio > 1.1:  # past the threshold: significant decides the verdict
            assert (found.verdict == "regression") == (found.low > 1), found


def test_a_significant_move_under_the_threshold_says_it_moved(tmp_path: Path) -> None:
    """A +4.5% slowdown at p < 0.01 beside a +10% threshold passes the gate, but read plain
    "unchanged" as if nothing had moved: the words now say how far, by the ratio the test
    judged (with --normalize the calibrated one: a normalized +9.1% had read "+0.6%"), and
    that it was significant; a move the test could not tell from noise stays "unchanged"."""
    c = compare_runs(make_run(tmp_path / "a", cases_grid()), make_run(tmp_path / "b", cases_grid()))
    times = c.times.copy()
    first, second, third = times.index[0], times.index[1], times.index[2]
    times.loc[[first, second, third], "verdict"] = UNCHANGED
    times.loc[first, ["ratio", "ratio_judged", "p_value"]] = [1.006, 1.045, 0.001]
    times.loc[second, ["ratio", "ratio_judged", "p_value"]] = [1.045, 1.045, 0.2]
    times.loc[third, ["ratio", "ratio_judged", "p_value"]] = [1.0, 0.9996, 0.001]
    moved = dataclasses.replace(c, times=times)
    shown = display_table(moved)
    assert shown["time"].iloc[0] == "unchanged (+4.5%, significant; under the +10% threshold)"
    assert shown["time"].iloc[1] == "unchanged"
    assert shown["time"].iloc[2] == (
        "unchanged (by under 0.1%, significant; short of the -9.1% threshold)"
    )
    assert not moved.failed("time")  # the gate still passes it
    normalized = dataclasses.replace(
        moved, thresholds=dataclasses.replace(c.thresholds, normalize=True)
    )
    assert display_table(normalized)["time"].iloc[0].startswith("unchanged (normalized, +4.5%,")
    wide = times.copy()
    wide.loc[first, ["verdict", "ratio_high"]] = [NOT_SIGNIFICANT, 1.3]  # reaches past +10%
    reaching = display_table(dataclasses.replace(c, times=wide))["time"].iloc[0]
    assert reaching == "not significant past +10% (+4.5%, significant; its interval reaches +30.0%)"


def test_a_run_compared_with_itself_is_warned_of(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", cases_grid())
    same = compare_runs(run, run)
    assert any("every case is compared with itself" in w for w in same.warnings)
    other = compare_runs(run, make_run(tmp_path / "b", cases_grid()))
    assert not any("compared with itself" in w for w in other.warnings)


def test_an_interval_past_a_hundredfold_reads_as_such_not_as_digits() -> None:
    """Two kept rounds a side gave a ratio's interval of 2e-06..194200: "0.00..194200.00",
    cut at the column's edge."""
    from attnbench.compare.verdicts import fmt_interval

    assert fmt_interval(2e-06, 194200.0) == "<0.01..>100"
    assert fmt_interval(0.95, 1.08) == "0.95..1.08"
    assert fmt_interval(0.5, 150.0) == "0.50..>100"
    assert fmt_interval(float("nan"), 1.0) == ""


def test_the_comparison_table_folds_a_long_layer_name_never_cuts_it(
    tmp_path: Path,
    add_layer,  # type: ignore[no-untyped-def]
) -> None:
    """ab's table read "mylayer:mak… -> mylayer:make" at 100 columns: a name is read whole."""
    from rich.console import Console

    from attnbench.cli.render import comparison_table

    name = "a_plugin_with_a_long_name:make_the_layer"
    add_layer(name)
    base = make_run(tmp_path / "a", {(name, 64): {}})
    new = make_run(tmp_path / "b", {(name, 64): {}})
    console = Console(width=80, record=True)
    comparison_table(compare_runs(base, new), "time", console)
    text = console.export_text()
    column = "".join(line.split("│")[1].strip() for line in text.splitlines() if "│" in line)
    assert name in column


def test_two_ab_runs_of_one_grid_are_not_read_as_one_runs_pairs(tmp_path: Path) -> None:
    """compare of one ab run's two folders is judged on its pairs; two ab runs on two days
    had been too, their rounds paired as if interleaved and their machine states unsaid."""
    pairs = [[case("conv").case_id, case("conv").case_id]]
    grid = {("conv", 64): {}}
    base = make_run(tmp_path / "one" / "base", grid, meta={"ab": 0, "ab_pairs": pairs})
    same = make_run(tmp_path / "one" / "current", grid, meta={"ab": 1, "ab_pairs": pairs})
    other = make_run(tmp_path / "two" / "current", grid, meta={"ab": 1, "ab_pairs": pairs})
    assert compare_runs(base, same).paired
    assert not compare_runs(base, other).paired
