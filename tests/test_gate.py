"""The regression gate at its boundaries: constructed samples, never timed, default thresholds
pinned by value. Each test names the decision it pins, so a change of a default or of a test's
direction fails here, not on a busy CI runner."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from synthetic import cases_grid, make_run

from attnbench.compare import (
    IMPROVEMENT,
    NOT_COMPARED,
    NOT_SIGNIFICANT,
    REGRESSION,
    TOO_FEW,
    UNCHANGED,
    compare_runs,
    judge_count,
    judge_overall,
    judge_pairs,
    judge_rounds,
    judge_time,
    smallest_p,
)
from attnbench.compare.verdicts import pair_ratios
from attnbench.errors import AttnbenchError
from attnbench.thresholds import (
    DEFAULT_THRESHOLDS,
    GATE_OPTIONS,
    GATES,
    Thresholds,
    check_gate,
    gate_from,
    parse_fraction,
    rounds_to_reach,
)


def tight(median: float, count: int = 20) -> list[float]:
    """Samples within ±0.2% of ``median``, the same every time: a quiet machine, constructed."""
    return [median * (1 + 0.001 * ((i % 5) - 2)) for i in range(count)]


def rounds(*ratios: float) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """An interleaved run whose round r has the paired ratio ``ratios[r]`` (base 1 ms)."""
    base = {r + 1: [1e-3] for r in range(len(ratios))}
    new = {r + 1: [1e-3 * x] for r, x in enumerate(ratios)}
    return base, new


def spread(center: float, count: int) -> list[float]:
    """``count`` distinct ratios just above ``center`` (no ties: the exact signed-rank test)."""
    return [center * (1 + 0.001 * i) for i in range(count)]


# ----------------------------------------------------------------------------- the defaults


def test_the_default_thresholds_are_pinned_by_value() -> None:
    assert (
        Thresholds(
            max_slowdown=0.10,
            alpha=0.01,
            min_samples=5,
            memory_tolerance=0.0,
            normalize=False,
            instructions_tolerance=0.01,
        )
        == DEFAULT_THRESHOLDS
    )
    defaults = {o.key: o.default for o in GATE_OPTIONS}
    assert defaults == {
        "max_slowdown": 0.10,
        "alpha": 0.01,
        "min_samples": 5,
        "memory_tolerance": 0.0,
        "instructions_tolerance": 0.01,
        "normalize": False,
        "fail_on": "all",
    }
    helps = {o.key: o.full_help for o in GATE_OPTIONS}
    assert helps["max_slowdown"].endswith("Default: 10%.")
    assert helps["memory_tolerance"].endswith("Default: 0%.")
    assert GATES == ("all", "deterministic", "time", "none")
    assert gate_from({}) == (DEFAULT_THRESHOLDS, "all")
    assert gate_from({"max_slowdown": "5%", "fail_on": "time"}) == (
        Thresholds(max_slowdown=0.05),
        "time",
    )
    # ab's default rounds: enough for the paired test at alpha 0.01 with two pairs to spare.
    assert rounds_to_reach(0.01) == 10 and rounds_to_reach(0.01, slack=1) == 7


# ----------------------------------------------------------------------------- two runs' samples


@pytest.mark.parametrize(
    ("ratio", "verdict"),
    [
        (1.15, REGRESSION),  # past 10%, significant
        (1.1005, REGRESSION),  # just past the threshold
        (1.10, UNCHANGED),  # at the threshold: not past it
        (1.08, UNCHANGED),  # significant, but within 10%
        (1.0, UNCHANGED),
        (1 / 1.08, UNCHANGED),
        (1 / 1.10, UNCHANGED),
        (1 / 1.1005, IMPROVEMENT),
        (1 / 1.15, IMPROVEMENT),
    ],
)
def test_tight_samples_are_judged_against_ten_percent(ratio: float, verdict: str) -> None:
    base = [1.0] * 20 if ratio in (1.10, 1 / 1.10) else tight(1.0)
    new = [ratio] * 20 if ratio in (1.10, 1 / 1.10) else tight(ratio)
    found = judge_time(base, new)
    assert found.verdict == verdict, found
    assert found.ratio == pytest.approx(ratio)
    if ratio != 1.0:  # every new sample on one side of every base sample
        assert found.p_value < 1e-6


def test_a_large_ratio_from_overlapping_samples_is_not_significant() -> None:
    base = [1.0] * 5 + [2.0] * 5
    new = [1.0] * 4 + [2.0] * 6  # median 2.0 against 1.5: x1.33, the same two values
    found = judge_time(base, new)
    assert found.ratio == pytest.approx(4 / 3)
    assert found.verdict == NOT_SIGNIFICANT and found.p_value > 0.2
    faster = judge_time(new, base)  # the same the other way: not an improvement
    assert faster.verdict == UNCHANGED and faster.p_value > 0.2


def test_the_fewest_samples_boundary() -> None:
    assert judge_time(tight(1.0, 5), tight(2.0, 5)).verdict == REGRESSION  # 5 a side: decides
    four = judge_time(tight(1.0, 4), tight(2.0, 5))
    assert four.verdict == TOO_FEW and math.isnan(four.p_value) and four.ratio > 1.9
    # min_samples lowered to 2: 3 a side still cannot reach alpha (smallest p = 1/20).
    assert judge_time([1.0] * 3, [2.0] * 3, Thresholds(min_samples=2)).verdict == TOO_FEW
    assert smallest_p(5, 5) == pytest.approx(1 / 252) and smallest_p(3, 3) == pytest.approx(0.05)
    assert judge_time([], [1.0] * 20).verdict == NOT_COMPARED


def test_rounds_are_the_unit_from_two_a_side() -> None:
    """Welch's t-test on the rounds' log medians reaches alpha with a few rounds a side
    (Mann-Whitney's on 3 against 3 could not go below 1/20)."""
    slow = [tight(1.3, 4) for _ in range(5)]
    base = [tight(1.0, 4) for _ in range(5)]
    for count in (5, 3, 2):
        verdict, unit = judge_rounds(base[:count], slow[:count])
        assert (unit, verdict.verdict) == ("rounds", REGRESSION) and verdict.p_value < 0.01
    verdict, unit = judge_rounds([tight(1.0, 8)], [tight(1.3, 8)])  # one round a side
    assert unit == "samples" and verdict.verdict == REGRESSION


# ----------------------------------------------------------------------------- pairs (ab)


def test_consistent_pairs_past_the_threshold_are_a_regression() -> None:
    found = judge_pairs(*rounds(*spread(1.15, 10)))
    assert found.verdict == REGRESSION
    assert found.p_value == pytest.approx(0.5**10)  # every pair slower: the exact smallest p
    assert found.ratio == pytest.approx(1.15 * 1.0045, rel=1e-3)


def test_consistent_faster_pairs_are_an_improvement() -> None:
    found = judge_pairs(*rounds(*(1 / x for x in spread(1.15, 10))))
    assert found.verdict == IMPROVEMENT and found.p_value == pytest.approx(0.5**10)


def test_pairs_within_the_threshold_are_unchanged_however_significant() -> None:
    found = judge_pairs(*rounds(*spread(1.08, 10)))
    assert found.verdict == UNCHANGED and found.p_value == pytest.approx(0.5**10)
    assert judge_pairs(*rounds(*spread(1.08, 10)), Thresholds(max_slowdown=0.05)).verdict == (
        REGRESSION
    )


def test_pairs_of_mixed_signs_are_not_significant_whatever_their_median() -> None:
    ratios = [*spread(1.3, 6), 0.5, 0.55, 0.6, 0.65]  # median x1.3, four pairs much faster
    found = judge_pairs(*rounds(*ratios))
    assert found.ratio > 1.1  # the median alone would call it a regression
    assert found.verdict == NOT_SIGNIFICANT and found.p_value > 0.1
    mirrored = judge_pairs(*rounds(*(1 / x for x in ratios)))
    # faster at the median, but its interval reaches past +10%: not "unchanged", undecided
    assert mirrored.ratio < 1 / 1.1 and mirrored.verdict == NOT_SIGNIFICANT
    assert mirrored.p_value > 0.1 and mirrored.high > 1.1


def test_an_unchanged_ratio_whose_interval_reaches_past_the_threshold_is_undecided() -> None:
    """A new user's unchanged ab read "unchanged" at 1.039 with a 98% interval of 1.00..1.76
    (p 0.014): the gate could not tell it from a +76% slowdown. It reads "not significant",
    counted undecided; an interval within the threshold still reads unchanged."""
    wide = judge_pairs(*rounds(*[0.97, 0.99, 1.0, 1.02, 1.03, 1.04, 1.05, 1.08, 1.6, 1.8]))
    assert wide.ratio < 1.1 and wide.p_value >= 0.01 and wide.high > 1.1
    assert wide.verdict == NOT_SIGNIFICANT
    narrow = judge_pairs(*rounds(*[0.99, 0.995, 1.0, 1.0, 1.005, 1.01, 1.0, 0.998, 1.002, 1.0]))
    assert narrow.high < 1.1 and narrow.verdict == UNCHANGED
    # undecided for its interval, not for a move: a GPU clock that moved does not take it
    # (throttled cases leave OVERALL and are blamed on the clock)
    from attnbench.compare.verdicts import throttle

    assert throttle(wide, clock_ratio=1.2).verdict == NOT_SIGNIFICANT
    past = judge_pairs(*rounds(*[0.9, 0.95, 1.2, 1.25, 1.3, 1.3, 1.35, 1.4, 2.5, 0.8]))
    assert past.verdict == NOT_SIGNIFICANT and past.ratio > 1.1
    assert throttle(past, clock_ratio=1.2).verdict == "throttled"


def test_a_significant_move_whose_interval_reaches_past_the_threshold_is_undecided() -> None:
    """Every pair slower, so the move is significant (p 0.5^10), and its median +4.75% is
    under +10%, but three pairs read +30-50%: its interval reaches past +10%, which the test
    cannot tell from a regression. It read "unchanged (..., significant; under the +10%
    threshold)", which only its estimate was; it is "not significant" past the threshold."""
    found = judge_pairs(*rounds(*[1.01, 1.02, 1.03, 1.04, 1.045, 1.05, 1.06, 1.3, 1.4, 1.5]))
    assert found.ratio < 1.1 and found.p_value == pytest.approx(0.5**10) and found.high > 1.1
    assert found.verdict == NOT_SIGNIFICANT


def test_the_pairs_needed_for_a_verdict() -> None:
    six = judge_pairs(*rounds(*spread(1.5, 6)))  # 0.5^6 = 0.016: no outcome reaches 0.01
    assert six.verdict == TOO_FEW and math.isnan(six.p_value)
    seven = judge_pairs(*rounds(*spread(1.5, 7)))  # 0.5^7 = 0.0078
    assert seven.verdict == REGRESSION and seven.p_value == pytest.approx(0.5**7)
    # Ten pairs tolerate the two smallest going the other way (ab's default, rounds_to_reach).
    two_against = [0.999, 0.998, *spread(1.5, 8)]
    assert judge_pairs(*rounds(*two_against)).verdict == REGRESSION
    assert judge_pairs({}, {}).verdict == NOT_COMPARED
    identical = judge_pairs(*rounds(*[1.0] * 10))
    assert identical.verdict == UNCHANGED and identical.p_value == 1.0


# ----------------------------------------------------------------------------- the overall row


def test_the_overall_row_is_the_geometric_mean_tested_across_cases() -> None:
    found = judge_overall(spread(1.2, 8))
    assert found.verdict == REGRESSION
    assert found.ratio == pytest.approx(math.exp(sum(math.log(x) for x in spread(1.2, 8)) / 8))
    assert judge_overall([1 / x for x in spread(1.2, 8)]).verdict == IMPROVEMENT
    assert judge_overall(spread(1.2, 6)).verdict == TOO_FEW  # 0.5^6 > 0.01
    assert judge_overall(spread(1.2, 7)).verdict == REGRESSION
    assert judge_overall(spread(1.05, 8)).verdict == UNCHANGED  # significant, within 10%
    mixed = judge_overall([*spread(1.6, 5), 0.7, 0.75, 0.8])  # geomean x1.21, mixed signs
    assert mixed.ratio > 1.1 and mixed.verdict == NOT_SIGNIFICANT
    assert judge_overall([math.inf, math.nan, 0.0]).verdict == NOT_COMPARED


# ----------------------------------------------------------------------------- exact metrics


@pytest.mark.parametrize(
    ("base", "new", "tolerance", "verdict"),
    [
        (100, 101, 0.0, REGRESSION),
        (100, 100, 0.0, UNCHANGED),
        (100, 99, 0.0, IMPROVEMENT),
        (100, 101, 0.01, UNCHANGED),  # at the tolerance: not past it
        (100, 101.01, 0.01, REGRESSION),
        (100, 98.99, 0.01, IMPROVEMENT),
        (None, 100, 0.0, NOT_COMPARED),
        (100, math.nan, 0.0, NOT_COMPARED),
    ],
)
def test_an_exact_count_regresses_on_any_growth_beyond_its_tolerance(
    base: float | None, new: float, tolerance: float, verdict: str
) -> None:
    assert judge_count(base, new, tolerance) == verdict


# Per exact metric: the synthetic run's override key, its base value at n = 64, one step more.
GROWTH = {
    "flops": ("flops", 64_000, 64_001),
    "elementwise": ("elements", 640, 641),
    "seq_steps": ("steps", 1, 2),
    "path_len": ("path", 32, 33),
    "peak_bytes": ("peak", 4096, 4097),  # memory tolerance 0 by default
    "instructions": ("instructions", 100_000, 101_001),  # 1% tolerance: 1.001% is past it
}


@pytest.mark.slow
@pytest.mark.parametrize("metric", sorted(GROWTH))
def test_compare_fails_the_deterministic_gate_on_each_exact_metric(
    tmp_path: Path, metric: str
) -> None:
    key, before, after = GROWTH[metric]
    base = make_run(tmp_path / "base", cases_grid(conv_64={key: before}))
    new = make_run(tmp_path / "new", cases_grid(conv_64={key: after}))
    within = make_run(
        tmp_path / "within",
        cases_grid(conv_64={key: 100_900 if metric == "instructions" else before}),
    )
    comparison = compare_runs(base, new)
    counts = comparison.counts.set_index(["case_id", "metric"])["verdict"]
    case = "conv/n=64/d=16/k=3/b=1/float32/cpu/forward"
    assert counts[(case, metric)] == REGRESSION
    assert (counts.drop((case, metric)) != REGRESSION).all()
    assert comparison.failed("deterministic") and comparison.failed("all")
    assert not comparison.failed("time") and not comparison.failed("none")
    assert not compare_runs(base, within).failed("deterministic")
    # The other way round: a fall past the tolerance is an improvement (1% for instructions).
    shrunk = make_run(
        tmp_path / "shrunk",
        cases_grid(conv_64={key: 98_900 if metric == "instructions" else before - 1}),
    )
    assert (
        compare_runs(base, shrunk)
        .counts.set_index(["case_id", "metric"])
        .loc[(case, metric), "verdict"]
        == IMPROVEMENT
    )


# ----------------------------------------------------------------------------- edges (mutation)


def test_what_cannot_be_compared_reads_nan_and_one_sample_is_too_few() -> None:
    for found in (judge_time([], tight(1.0)), judge_pairs({}, {})):
        assert found.verdict == NOT_COMPARED
        assert math.isnan(found.ratio) and math.isnan(found.p_value)
    one = judge_time(tight(1.0), [1.5])  # one new sample: too few, not "not compared"
    assert one.verdict == TOO_FEW and one.ratio == pytest.approx(1.5)
    few = judge_pairs(*rounds(1.5, 1.6, 1.7))
    assert few.verdict == TOO_FEW and few.ratio == pytest.approx(1.6)  # the median, kept
    assert judge_pairs(*rounds(*[1.0] * 10)).ratio == 1.0


def test_pairs_reach_a_verdict_only_below_alpha_itself() -> None:
    at = Thresholds(alpha=0.125)  # 0.5^3: three pairs can only reach it, not go below
    assert judge_pairs(*rounds(*spread(1.5, 3)), at).verdict == TOO_FEW
    assert judge_pairs(*rounds(*spread(1.5, 4)), at).verdict == REGRESSION


def test_pair_ratios_take_the_rounds_both_sides_measured_above_zero() -> None:
    base = {1: [1.0], 2: [0.0], 3: [1.0]}  # round 2's base reads 0; round 3 has no new side
    new = {1: [2.0, 2.2, 1.8], 2: [1.0]}
    assert pair_ratios(base, new) == [2.0]


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # a side with no spread
def test_rounds_judge_either_direction_and_their_edges() -> None:
    base = [tight(1.0 + 0.01 * r, 4) for r in range(4)]  # rounds apart by 1%: a spread
    faster = [tight(0.7 + 0.01 * r, 4) for r in range(4)]
    verdict, unit = judge_rounds(base, faster)
    assert (unit, verdict.verdict) == ("rounds", IMPROVEMENT) and verdict.p_value < 0.01
    same = [tight(1.0, 4)] * 3  # no spread on either side: the medians say it all
    assert judge_rounds(same, same)[0].p_value == 1.0
    assert judge_rounds(same, [tight(1.2, 4)] * 3)[0].p_value == 0.0
    spread_new = [tight(1.3 + 0.01 * r, 4) for r in range(3)]  # one side spread: the t-test
    verdict, _ = judge_rounds(same, spread_new)
    assert verdict.verdict == REGRESSION and 0 < verdict.p_value < 0.01
    stopped = [[0.0] * 4, [0.0] * 4, tight(1.0, 4)]  # a clock that never moved in two rounds
    verdict, unit = judge_rounds(base, stopped)
    assert unit == "rounds" and verdict.verdict == TOO_FEW and math.isnan(verdict.p_value)
    assert verdict.ratio is not None and math.isfinite(verdict.ratio)
    never = [[0.0] * 4] * 3
    verdict, unit = judge_rounds(never, base)
    assert (unit, verdict.verdict, verdict.ratio) == ("rounds", TOO_FEW, math.inf)


def test_rounds_and_their_fallback_judge_with_the_thresholds_given() -> None:
    five = [tight(1.0, 4)] * 5
    assert judge_rounds(five, [tight(2.0, 4)] * 2, Thresholds(alpha=0.5))[1] == "rounds"
    verdict, unit = judge_rounds(five[:4], [tight(1.3, 4)] * 4, Thresholds(max_slowdown=0.5))
    assert unit == "rounds" and verdict.verdict == UNCHANGED  # 1.3 is within 50%
    verdict, unit = judge_rounds([tight(1.0, 8)], [tight(1.3, 8)], Thresholds(max_slowdown=0.5))
    assert unit == "samples" and verdict.verdict == UNCHANGED


def test_gate_and_fraction_errors_and_the_pairs_ab_needs() -> None:
    with pytest.raises(AttnbenchError) as bad:
        check_gate("bogus")
    assert bad.value.message == "--fail-on 'bogus': accepted: all, deterministic, time, none"
    # a bare number is a fraction below 1; 1.5 could be a ratio or 150%, and the error asks
    for text, ratio, percent in (("1", "0%", "100%"), ("1.5", "50%", "150%")):
        with pytest.raises(AttnbenchError) as asked:
            parse_fraction(text, "--max-slowdown")
        assert asked.value.message == (
            f"--max-slowdown '{text}': a fraction is under 1 (0.05 is 5%); write {text}% for "
            f"{text} percent, {ratio} for a ratio of {text}, or {percent}"
        )
    # 200 is no ratio anyone gates on: a new user read "19900% for a ratio of 200" as nonsense
    with pytest.raises(AttnbenchError) as asked:
        parse_fraction("200", "--precision")
    assert asked.value.message.endswith("(0.05 is 5%); write 200% for 200 percent")
    with pytest.raises(AttnbenchError) as asked:
        parse_fraction("1e3", "--precision")  # as a number reads, not as typed
    assert asked.value.message.endswith("write 1000% for 1000 percent")
    with pytest.raises(AttnbenchError, match="write a percentage such as 10%"):
        parse_fraction("inf", "--max-slowdown")
    assert parse_fraction("100%", "--max-slowdown") == 1.0
    assert parse_fraction("0.25", "--max-slowdown") == 0.25
    assert rounds_to_reach(0.01) == 10 and rounds_to_reach(1 / 16) == 7  # slack 8 by default


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_alpha_must_lie_strictly_between_0_and_1(alpha: float) -> None:
    with pytest.raises(AttnbenchError, match=f"^--alpha must lie between 0 and 1, got {alpha}$"):
        Thresholds(alpha=alpha)
    assert Thresholds(alpha=0.999).alpha == 0.999 and Thresholds(alpha=1e-9).alpha == 1e-9


@pytest.mark.parametrize("field", ["max_slowdown", "memory_tolerance", "instructions_tolerance"])
def test_each_tolerance_refuses_a_negative_value(field: str) -> None:
    message = "--max-slowdown, --memory-tolerance and --instructions-tolerance cannot be negative"
    with pytest.raises(AttnbenchError) as refused:
        Thresholds(**{field: -0.01})
    assert str(refused.value) == message
    assert getattr(Thresholds(**{field: 0.0}), field) == 0.0  # zero is allowed: exact


def test_a_base_median_of_zero_gives_an_infinite_ratio_not_a_crash() -> None:
    verdict = judge_time([0.0] * 10, [1e-3] * 10)
    assert verdict.ratio == math.inf
    assert verdict.verdict == REGRESSION


def test_too_few_at_the_exact_boundary_keeps_the_ratio_and_reports_no_p() -> None:
    # 3 against 3 samples: the smallest one-sided p is exactly 1/20 = alpha, so no outcome of
    # the test can be below alpha.
    thresholds = Thresholds(alpha=0.05, min_samples=2)
    assert smallest_p(3, 3) == 0.05
    verdict = judge_time([1.0, 1.01, 1.02], [2.0, 2.01, 2.02], thresholds)
    assert verdict.verdict == TOO_FEW
    assert verdict.ratio == pytest.approx(2.01 / 1.01)
    assert math.isnan(verdict.p_value)


def test_the_overall_row_at_its_boundaries() -> None:
    empty = judge_overall([])
    assert empty.verdict == NOT_COMPARED and math.isnan(empty.ratio) and math.isnan(empty.p_value)
    # 3 cases: the smallest p of the exact signed-rank test is 1/8 = alpha
    few = judge_overall([1.5, 1.6, 1.7], Thresholds(alpha=0.125))
    assert few.verdict == TOO_FEW and math.isnan(few.p_value)
    assert few.ratio == pytest.approx((1.5 * 1.6 * 1.7) ** (1 / 3))
    same = judge_overall([1.0] * 8)
    assert (same.verdict, same.ratio, same.p_value) == (UNCHANGED, 1.0, 1.0)
    # the fewest cases whose test can reach alpha: 0.5^k under it
    from attnbench.compare import cases_to_judge

    assert [cases_to_judge(a) for a in (0.125, 0.05, 0.01, 0.5, 2 / 256, 0.6)] == [4, 5, 7, 2, 8, 1]
    assert judge_overall([1.5] * 3 + [1.6], Thresholds(alpha=0.125)).verdict != TOO_FEW
    # ab's note reads the same floor: at alpha 2^-7 seven pairs all one way give p = alpha,
    # not under it, so every verdict of seven rounds is "too few samples", as the note says
    from attnbench.run.ab import _too_few
    from attnbench.spec import Grid

    seven = {r: [1e-3] for r in range(1, 8)}
    judged = judge_pairs(seven, {r: [2e-3] for r in seven}, Thresholds(alpha=2**-7))
    assert judged.verdict == TOO_FEW
    (note,) = _too_few(Grid(processes=7), 2**-7)
    assert "with 8 pairs at the least" in note and "every time verdict will be 'too few" in note


def test_a_p_value_equal_to_alpha_is_not_significant() -> None:
    # 8 cases, 7 slower and the smallest one faster: the exact one-sided p is 2/256.
    ratios = [0.99] + [1.5 + 0.01 * i for i in range(7)]
    at_alpha = judge_overall(ratios, Thresholds(alpha=2 / 256))
    assert at_alpha.p_value == 2 / 256
    assert at_alpha.verdict == NOT_SIGNIFICANT
    assert judge_overall(ratios, Thresholds(alpha=2 / 256 + 1e-9)).verdict == REGRESSION
