"""A case's row: every timing column read from its samples, empty where it was not timed; and
the formula text a layer without a term shows."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from attnbench.measure.record import (
    DIED_ERROR,
    WORKER_DIED_ERROR,
    CaseResult,
    died_in,
    timing_columns,
)
from attnbench.measure.timing.loop import TimingStats
from attnbench.spec import Case
from attnbench.theory import formula

CASE = Case("conv", 16, 8, 1, "float32", "cpu", "forward", (("k", 3),))


def test_a_timed_case_fills_every_timing_column_from_its_samples() -> None:
    timing = TimingStats(
        (4e-3, 1e-3, 2e-3, 3e-3), calls_per_sample=5, total_s=0.05,
        faults=(7.0, 1.0, 3.0, 5.0), major_faults=40,
    )  # fmt: skip
    assert timing_columns(timing) == {
        "time_s": 2.5e-3,  # the median of the four samples
        "time_iqr_s": timing.iqr_s,
        "time_ci_low_s": None,  # under 6 samples: no interval
        "time_ci_high_s": None,
        "time_stop": None,  # not recorded
        "samples": 4,
        "calls_per_sample": 5,
        "time_total_s": 0.05,
        "page_faults": 4.0,  # the median sample's faults per call
        "major_faults": 2.0,  # 40 over 4 blocks of 5 calls
        "rounds": 1,  # one round: its samples' median and their interval
        "rounds_disturbed": 0,
        "spread_between": None,  # one round: no spread between rounds
        "spread_within": timing.iqr_s / 1.349 / 2.5e-3,
    }
    assert timing.iqr_s > 0
    row = CaseResult(CASE, "ok", 2, timing=timing, flops=100).to_row()
    assert row["time_s"] == 2.5e-3 and row["samples"] == 4 and row["page_faults"] == 4.0
    assert row["flops_per_s"] == 100 / 2.5e-3


def test_the_medians_interval_and_the_rule_that_stopped_sampling_are_columns() -> None:
    from attnbench.measure.timing.loop import Stop

    samples = (1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3)
    timing = TimingStats(samples, calls_per_sample=1, total_s=0.028, stop=Stop.BUDGET)
    found = timing_columns(timing)
    assert (found["time_ci_low_s"], found["time_ci_high_s"]) == (1e-3, 7e-3)  # 7: the extremes
    assert found["time_stop"] == "budget"


def test_an_untimed_case_leaves_the_timing_columns_empty() -> None:
    assert set(timing_columns(None).values()) == {None}
    row = CaseResult(CASE, "failed", 2, error="boom").to_row()
    assert row["time_s"] is None and row["samples"] is None and row["flops_per_s"] is None


def test_a_formula_without_terms_reads_zero() -> None:
    assert formula(()) == "0"


def test_an_uncounted_case_has_no_check_and_a_counted_one_without_theory_says_so() -> None:
    assert CaseResult(CASE, "failed", 2).flops_check == ""
    assert CaseResult(CASE, "failed", 2).elementwise_check == ""
    assert CaseResult(CASE, "ok", 2, flops=5).flops_check == "no theory"  # no formula given


def test_a_count_off_its_formula_by_over_1_percent_is_a_mismatch() -> None:
    assert CaseResult(CASE, "ok", 2, flops=1010, flops_analytic=1000.0).flops_check == "ok"
    off = CaseResult(CASE, "ok", 2, flops=1011, elementwise=5, elementwise_analytic=4.0)
    assert replace(off, flops_analytic=1000.0).flops_check == "mismatch"
    assert off.elementwise_check == "mismatch"
    assert replace(off, elementwise=4).to_row()["elementwise_check"] == "ok"


def test_rounds_in_several_processes_give_the_spread_between_them() -> None:
    """Two rounds 10% apart: their spread (the standard deviation of their medians' logs)."""
    timing = TimingStats((1e-3, 1e-3, 1.1e-3, 1.1e-3), 1, 0.01, rounds=(1, 1, 2, 2))
    found = timing_columns(timing)
    assert found["rounds"] == 2
    assert found["spread_between"] == pytest.approx(math.log(1.1) / math.sqrt(2))


def test_a_row_whose_process_died_in_its_case_is_read_so_from_its_error() -> None:
    assert died_in(DIED_ERROR)
    assert died_in(f"{WORKER_DIED_ERROR}: the process exited with status 1")
    assert not died_in(f"{DIED_ERROR} (and more)") and not died_in("boom")
    assert not died_in(None) and not died_in(float("nan"))


def test_a_row_names_where_its_layer_came_from() -> None:
    from attnbench.layers import REGISTRY

    built_in = CaseResult(CASE, "ok", 2).to_row()["layer_source"]
    assert built_in == REGISTRY["conv"].source.describe() and built_in
    given = CaseResult(CASE, "ok", 2, layer_source="mine.py sha256:ab").to_row()
    assert given["layer_source"] == "mine.py sha256:ab"  # what the run recorded is kept


def test_a_column_nothing_measures_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnbench.measure.record as record

    monkeypatch.setattr(record, "RESULT_COLUMNS", [*record.RESULT_COLUMNS, "warp", "flux"])
    with pytest.raises(KeyError, match=r"no value for results column\(s\) warp, flux'$"):
        CaseResult(CASE, "ok", 2).to_row()
