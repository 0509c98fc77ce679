"""Fits recover known exponents, coefficients, models and crossovers from synthetic data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnbench import fits
from attnbench.fits import (
    cost_models,
    crossover_table,
    exponent_table,
    fit_cost_model,
    fit_frame,
    formula_crossover,
    loglog_exponent,
    loglog_slope,
    measured_crossover,
    model_fits,
    model_table,
)
from attnbench.layers.registry import theory_of
from attnbench.results.run import RunResults

NS = (64, 128, 256, 512, 1024, 2048)
DS = (32, 64, 128, 256)


def synthetic(layer: str, time, *, noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    """Measured-like rows whose median time is ``time(n, d)`` times lognormal noise."""
    rng = np.random.default_rng(seed)
    rows = [
        {"layer": layer, "n": n, "d": d, "k": 3, "heads": 4, "window": 16, "batch": 1}
        for n in NS
        for d in DS
    ]
    frame = pd.DataFrame(rows)
    truth = np.array([time(r.n, r.d) for r in frame.itertuples()])
    frame["time_s"] = truth * np.exp(rng.normal(0, noise, len(frame)))
    theory = theory_of(layer)
    frame["flops"] = [
        theory.flops({"b": 1, "n": r.n, "d": r.d, "k": 3, "heads": 4, "window": 16})
        if theory is not None
        else 0.0
        for r in frame.itertuples()
    ]
    return frame


def model_named(name: str) -> fits.CostModel:
    return next(m for m in cost_models() if m.name == name)


def test_exponent_recovers_slope_and_interval_covers_truth():
    # 200 noisy lines of slope 1.7: the 95% interval should cover 1.7 about 95% of the time.
    rng = np.random.default_rng(1)
    x = np.array([64, 128, 256, 512, 1024, 2048], dtype=float)
    covered, slopes = 0, []
    for _ in range(200):
        y = 3e-9 * x**1.7 * np.exp(rng.normal(0, 0.1, len(x)))
        fit = loglog_exponent(x.tolist(), y.tolist())
        slopes.append(fit.slope)
        covered += fit.low <= 1.7 <= fit.high
    assert abs(np.mean(slopes) - 1.7) < 0.02
    assert 0.88 <= covered / 200 <= 0.99


def test_the_exponents_interval_is_no_narrower_than_its_points_intervals_allow():
    """Four times 5% uncertain (their intervals over processes) that happen to fall exactly on
    a line: the residuals say the slope is exact, the points say it is not; the interval is
    the wider, and the points' own standard errors decide it."""
    x = [512.0, 1024.0, 2048.0, 4096.0]
    y = [1e-3 * (n / 512) ** 2 for n in x]
    exact = loglog_exponent(x, y)
    assert exact.slope == pytest.approx(2.0) and exact.high - exact.low < 1e-9
    se = [0.05] * 4
    found = loglog_exponent(x, y, se)
    lx = np.log(x)
    expected = 1.959964 * 0.05 * math.sqrt(1 / np.sum((lx - lx.mean()) ** 2))
    assert found.slope == pytest.approx(2.0)
    assert (found.high - found.low) / 2 == pytest.approx(expected, rel=1e-4)
    noisy = [y[0] * 1.3, y[1] * 0.8, y[2] * 1.25, y[3] * 0.85]  # residuals wider than 5%
    assert loglog_exponent(x, noisy, se).high == loglog_exponent(x, noisy).high


def test_two_points_one_without_an_interval_leave_the_exponent_unknown():
    """A time with no interval (a one-round case on a prior of under one degree of freedom)
    read as exact: two lengths' exponent then rested on the other point's error alone. Now it
    is unknown; with a third point the residuals still bound it."""
    x, y = [512.0, 1024.0], [1e-3, 4e-3]
    two = loglog_exponent(x, y, [0.05, float("nan")])
    assert two.slope == pytest.approx(2.0) and math.isnan(two.low) and math.isnan(two.high)
    both = loglog_exponent(x, y, [0.05, 0.05])
    assert math.isfinite(both.low) and both.low < 2.0 < both.high
    three = loglog_exponent([*x, 2048.0], [*y, 1.5e-2], [0.05, float("nan"), 0.05])
    assert math.isfinite(three.low) and three.low < three.slope < three.high


def test_constant_metric_has_zero_exponent_and_zero_width():
    fit = loglog_exponent([64, 128, 256], [13.0, 13.0, 13.0])
    assert (fit.slope, fit.low, fit.high) == (0.0, 0.0, 0.0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 16, 64, 100, 256, 1024, 4096]),
            st.one_of(st.just(0.0), st.just(math.nan), st.floats(1e-9, 1e9)),
        ),
        max_size=8,
    )
)
def test_the_slope_alone_is_the_exponents_slope_to_the_last_bit(points):
    """The theory's, model's, work's and rate's slopes skip linregress (0.6 ms a call): the
    same points and the same arithmetic, so the golden files cannot move by a bit."""
    x, y = [a for a, _ in points], [b for _, b in points]
    full = loglog_exponent(x, y)
    assert loglog_slope(x, y) == (None if full is None else full.slope)


def test_cost_model_recovers_attention_coefficients_under_noise():
    a, b, e, c = 2e-11, 5e-13, 4e-10, 1e-4  # s per n·d², per n²·d, per h·n² score; overhead
    frame = synthetic("attention", lambda n, d: a * n * d * d + b * n * n * d + e * 4 * n * n + c)
    fit = fit_cost_model(frame, model_named("self-attention"))
    terms = [t.name for t in model_named("self-attention").terms]
    found = dict(zip(terms, fit.coefficients, strict=True))
    assert (found["b·n·d²"], found["b·n²·d"], found["b·h·n²"]) == pytest.approx((a, b, e), rel=0.1)
    assert found["causal·b·h·n²"] == 0  # no causal case: the term is not fitted
    assert fit.constant == pytest.approx(c, rel=0.2)
    assert fit.rms < 0.05
    assert fit.points == len(NS) * len(DS)


def test_the_softmax_term_fits_what_the_flop_formula_cannot():
    """Time set by the h·n² scores (the CPU's softmax), not by n²·d: the FLOP-only model of
    the same layer misses it by far more than the model with the elementwise terms."""
    frame = synthetic("attention", lambda n, d: 3e-11 * n * d * d + 2e-9 * 4 * n * n + 1e-4)
    full = fit_cost_model(frame, model_named("self-attention"))
    flop_only = fits.CostModel("flops", theory_of("attention").terms, ("attention",))
    assert full.rms < 0.05 < 3 * full.rms < fit_cost_model(frame, flop_only).rms


def test_cost_model_on_counted_flops_gives_the_formula_exactly():
    # FLOPs are exact: the fit must return the formula's own constants, 8 and 4, and no offset.
    frame = synthetic("attention", lambda n, d: 1.0, noise=0)
    fit = fit_cost_model(frame, model_named("self-attention"), metric="flops")
    assert fit.coefficients == pytest.approx((8, 4, 0, 0, 0), rel=1e-6, abs=1e-9)
    assert fit.constant == pytest.approx(0, abs=1e-3)
    assert fit.rms < 1e-9


def test_coefficients_are_never_negative():
    # A time that falls with d would need a negative n·d² coefficient; NNLS pins it at zero.
    frame = synthetic("attention", lambda n, d: 1e-9 * n * n / d + 1e-5)
    fit = fit_cost_model(frame, model_named("self-attention"))
    assert min(fit.coefficients) >= 0 and fit.constant >= 0


def test_at_one_width_terms_that_are_multiples_of_another_are_fitted_as_one():
    """At d = 64 attention's b·n·d is its b·n·d² over 64 and its b·h·n² its b·n²·d over 16:
    five parameters are three, and five lengths fit them (the default CPU sweep's attention
    had no model: "needs 7"). The twins say which; no "no time seen" is said of them."""
    from attnbench.render.costmodels import _coefficients

    a, b, c = 2e-11, 5e-13, 1e-4
    frame = synthetic("attention", lambda n, d: a * n * d * d + b * n * n * d + c, noise=0)
    one = frame[(frame["d"] == 64) & (frame["n"] <= 1024)]  # five lengths
    model = model_named("self-attention")
    fit = fit_cost_model(one, model)
    assert fit is not None and fit.rms < 1e-6
    assert dict(fit.twins) == {"b·n·d": "b·n·d²", "b·h·n²": "b·n²·d", "causal·b·h·n²": "0"}
    found = dict(zip((t.name for t in model.terms), fit.coefficients, strict=True))
    assert found["b·n·d"] == found["b·h·n²"] == 0  # their time is their twins'
    assert fit.predict(np.array([[64 * 64 * 64, 64 * 64 * 64, 64 * 64, 4 * 64 * 64, 0]]))[
        0
    ] == pytest.approx(a * 64**3 + b * 64**3 + c)
    row = model_table({"attention": [fit]}).iloc[0]
    shown = _coefficients(row)
    assert "δ in α's (a multiple of b·n·d² here)" in shown
    assert "ε in β's (a multiple of b·n²·d here)" in shown and "no time seen for b·n·d" not in shown
    # without --causal its mask's term is 0 at every size: no time to see, and said so
    assert "ζ=0 (causal·b·h·n² is 0 at every size here)" in shown and "no time seen" not in shown
    assert dict(fit_cost_model(frame, model).twins) == {"causal·b·h·n²": "0"}  # four widths
    ssm = synthetic("rnn", lambda n, d: 1e-9 * n * d * 16 + 1e-4, noise=0)  # (sizes only)
    ssm = ssm.assign(layer="ssm", state=16)
    ssm_fit = fit_cost_model(ssm[ssm["d"] == 64], model_named("state space"))
    assert ssm_fit is not None and dict(ssm_fit.twins)["d·N"] == "γ"
    shown = _coefficients(model_table({"ssm": [ssm_fit]}).iloc[0])
    assert "δ in γ (d·N is constant here)" in shown


def test_too_few_points_give_no_fit():
    frame = synthetic("attention", lambda n, d: 1e-9 * n * n * d).head(3)
    assert fit_cost_model(frame, model_named("self-attention")) is None


def test_a_layer_without_its_cost_model_is_told_why():
    """One width and three lengths: the RNN's model, whose b·n·d is a multiple of its b·n·d²
    at one width (2 parameters), needs 4 cases. The note names the count, the width and the
    options that would give the fit enough."""
    rnn = synthetic("rnn", lambda n, d: 3e-10 * n * d * d + 2e-4)
    one_width = rnn[(rnn["d"] == 64) & (rnn["n"] <= 256)]
    model = model_named("recurrent")
    assert fit_cost_model(one_width, model) is None
    why = fits.why_unfitted(one_width, model)
    assert why == (
        f"its model {model.formula} has 2 parameters here (1 of its terms zero at every size "
        "measured; 1 a multiple of another there) and needs 4 measured cases; the run has 3, all "
        "at d=64: more lengths (--n) or widths (--d) give it enough"
    )
    assert fits.why_unfitted(rnn[rnn["n"] <= 128].head(3), model).endswith(
        "the run has 3: more lengths (--n) or widths (--d) give it enough"
    )  # two widths: no width named
    assert fits.why_unfitted(rnn, model) is None  # it fits
    slow = one_width.assign(time_s=0.0)
    assert fits.why_unfitted(slow, model) == "a measured time is not positive"
    both = pd.concat([one_width, rnn[rnn["d"] == 32]])
    found = model_fits(both)
    assert "rnn" in found  # enough cases together: nothing to explain
    assert fits.unfitted_models(both, found) == {}
    assert fits.unfitted_models(one_width, model_fits(one_width)) == {"rnn": why}


@pytest.mark.parametrize(
    ("layer", "time", "expected"),
    [
        ("attention", lambda n, d: 2e-11 * n * d * d + 5e-13 * n * n * d + 1e-4, "self-attention"),
        # Each with its elementwise work: an RNN's gates (n·d), the band's softmax (h·n·r).
        ("rnn", lambda n, d: 3e-10 * n * d * d + 2e-8 * n * d + 2e-4, "recurrent"),
        ("conv", lambda n, d: 1e-11 * 3 * n * d * d + 5e-5, "convolutional"),
        (
            "attention-local",
            lambda n, d: 2e-11 * n * d * d + 1e-9 * n * 16 * d + 5e-9 * 4 * n * 16 + 1e-4,
            "restricted self-attention",
        ),
    ],
)
def test_model_choice_picks_the_model_that_generated_the_data(layer, time, expected):
    frame = synthetic(layer, time, noise=0.03, seed=7)
    best = model_fits(frame)[layer][0]
    assert best.model.name == expected


def test_model_choice_prefers_the_smaller_model_when_the_extra_term_is_not_there():
    # n·d² and n·d data: the attention model nests it, but must not win on its spare terms.
    rnn = lambda n, d: 3e-10 * n * d * d + 2e-8 * n * d + 2e-4  # noqa: E731
    frame = synthetic("rnn", rnn, noise=0.03, seed=3)
    names = [f.model.name for f in model_fits(frame)["rnn"]]
    assert names.index("recurrent") < names.index("self-attention")


def test_a_term_held_at_zero_spends_no_degree_of_freedom():
    """Attention at one width and seven lengths (a default sweep's), time n²·d and a constant:
    its own model (four terms present, the causal one zero, and the constant) fits it with two.
    Charged five, AICc
    had named a two-term model 'best' whose RMS was several times the own one's (a new user's
    fit: 181% against 37%)."""
    rng = np.random.default_rng(1)
    ns = [64 * 2**i for i in range(7)]  # 64..4096
    frame = pd.DataFrame(
        [{"layer": "attention", "n": n, "d": 64, "heads": 4, "batch": 1} for n in ns]
    )
    frame["time_s"] = (5e-12 * frame["n"] ** 2 * 64 + 1e-4) * np.exp(rng.normal(0, 0.05, 7))
    found = model_fits(frame)["attention"]
    best, own = found[0], next(f for f in found if "attention" in f.model.layers)
    assert best is own and sum(c > 0 for c in own.coefficients) <= 2
    # the same fit charged its five present parameters: a smaller, worse model would win
    n, k = own.points, 5
    charged = own.aicc - (2 * 2 + 12 / (n - 3)) + (2 * k + 2 * k * (k + 1) / (n - k - 1))
    assert any(f.aicc < charged and f.rms > 2 * own.rms for f in found[1:])


def test_model_table_marks_own_and_best_and_reports_throughput():
    frame = synthetic("attention", lambda n, d: 2e-11 * n * d * d + 5e-13 * n * n * d + 1e-4)
    table = model_table(model_fits(frame))
    own = table[table["own"]].iloc[0]
    assert own["model"] == "self-attention" and own["best"]
    assert table["best"].sum() == 1
    # 8 FLOPs per n·d² unit at 2e-11 s per unit: 400 GFLOP/s.
    assert own["gflops_per_s"]["b·n·d²"] == pytest.approx(8 / 2e-11 / 1e9, rel=0.1)
    assert own["formula"] == "α·b·n·d² + β·b·n²·d + δ·b·n·d + ε·b·h·n² + ζ·causal·b·h·n² + γ"
    assert set(own["gelements_per_s"]) == {"b·n·d", "b·h·n²", "causal·b·h·n²"}


def test_rival_models_share_a_name_per_table_row():
    names = [m.name for m in cost_models()]
    assert len(names) == len(set(names))
    assert set(model_named("recurrent").layers) == {"rnn", "gru", "lstm"}
    assert set(model_named("self-attention").layers) == {"attention", "attention-sdpa"}


def test_exponent_table_uses_overhead_rule_and_compares_with_theory():
    frame = synthetic("attention", lambda n, d: 5e-13 * n * n * d + 1e-3, noise=0.01)
    table = exponent_table(frame, model_fits(frame))
    row = table[(table.metric == "time_s") & (table.along == "n") & (table.fixed == 256)].iloc[0]
    # With 1 ms overhead, n·n·256·5e-13 s ≥ 2 ms needs n ≥ 4000: too few sizes, so the top 3.
    assert (row.range_from, row.range_to, row.points) == (512, 2048, 3)
    assert "overhead" in row.range_rule
    flops = table[(table.metric == "flops") & (table.along == "n") & (table.fixed == 32)].iloc[0]
    assert flops.exponent == pytest.approx(flops.theory)
    assert flops.agrees and flops.range_from == 64


def test_the_chapters_order_stands_beside_the_formulas_slope():
    """Attention's FLOPs grow slower than n² at short n (the n·d² projections): the formula
    column reads that, the chapter column n² exactly, and in d the other way round."""
    frame = synthetic("attention", lambda n, d: 5e-13 * n * n * d, noise=0.0)
    frame["peak_bytes"] = 4.0 * frame["n"] * frame["n"]
    table = exponent_table(frame)
    assert len(table.query("metric == 'peak_bytes'"))
    in_n = table.query("metric == 'flops' and along == 'n' and fixed == 256").iloc[0]
    in_d = table.query("metric == 'flops' and along == 'd' and fixed == 2048").iloc[0]
    assert in_n.order == pytest.approx(2.0) and in_n.theory < 1.8
    assert in_d.order == pytest.approx(1.0) and in_d.theory > 1.0
    assert table.query("metric == 'time_s'")["order"].notna().all()  # time has an order
    assert table.query("metric == 'peak_bytes'")["order"].isna().all()  # peak memory none


def test_the_chapters_order_is_read_from_the_layers_theory(add_layer):  # type: ignore[no-untyped-def]
    """A layer whose theory states another order reads another slope: nothing hard-coded."""
    from attnbench.layers.recurrent import RECURRENT
    from attnbench.theory import LayerTheory, Term

    flops = (Term(2, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] ** 2),)
    squared = LayerTheory("O(n^2 d)", flops, order=lambda s: s["n"] ** 2 * s["d"])
    add_layer("sq", None, family=RECURRENT, theory=squared)
    add_layer("none", None, family=RECURRENT, theory=LayerTheory("O(n d^2)", flops))
    frame = pd.concat(
        [synthetic(name, lambda n, d: 1e-9 * n * d, noise=0.0) for name in ("sq", "none")]
    )
    table = exponent_table(frame).query("metric == 'flops' and along == 'n' and fixed == 32")
    order = dict(zip(table.layer, table.order, strict=True))
    assert order["sq"] == pytest.approx(2.0)
    assert math.isnan(order["none"])  # no order stated: no slope, not a 0


def test_time_is_judged_against_all_the_work_flops_and_elementwise():
    """ssm-scan's Hillis-Steele scan is n·log n elementwise work beside products linear in n:
    its time's theory is the slope of both together, not of its FLOP formula alone."""
    theory = theory_of("ssm-scan")
    rows = [{"layer": "ssm-scan", "n": n, "d": 64, "batch": 1} for n in NS]
    frame = pd.DataFrame(rows)
    sizes = [{"b": 1, "n": n, "d": 64, "state": 16} for n in NS]
    work = [theory.flops(s) + theory.elements(s) for s in sizes]
    frame["time_s"] = [1e-10 * w for w in work]
    frame["flops"] = [theory.flops(s) for s in sizes]
    table = exponent_table(frame)
    row = table[(table.metric == "time_s") & (table.along == "n")].iloc[0]
    fitted = [i for i, n in enumerate(NS) if row.range_from <= n <= row.range_to]
    ns = [NS[i] for i in fitted]
    assert row.theory == pytest.approx(loglog_exponent(ns, [work[i] for i in fitted]).slope)
    flops_only = loglog_exponent(ns, [frame["flops"][i] for i in fitted]).slope
    assert flops_only == pytest.approx(1.0) and row.theory > flops_only + 0.05
    assert row.agrees


def test_a_time_line_is_fitted_where_its_rate_settled():
    """Fixed costs first, then the work: the rate climbs to a plateau. The exponent is fitted
    on the plateau alone (its rule says so) and reads the work's; a line whose rate never
    settles is fitted the old way and says so."""
    from attnbench.fits.exponents import SETTLED_RULE
    from attnbench.render.report import _where

    ns = [64, 128, 256, 512, 1024, 2048, 4096]
    work = [1e6 * n for n in ns]
    rate = [1e9, 3e9, 8e9, 10e9, 10.4e9, 9.8e9, 10.1e9]  # settles from n = 512
    times = [w / r for w, r in zip(work, rate, strict=True)]
    frame = pd.DataFrame({"layer": "rnn", "n": ns, "d": 64, "batch": 1, "dtype": "float32",
                          "flops": work, "time_s": times})  # fmt: skip
    table = exponent_table(frame)
    row = table[(table.metric == "time_s") & (table.along == "n")].iloc[0]
    assert row.range_rule == SETTLED_RULE and _where(row.range_rule) == "rate settled"
    assert (row.range_from, row.range_to, row.points) == (512, 4096, 4)
    assert row.exponent == pytest.approx(1.0, abs=0.02) and row.agrees
    climbing = frame.assign(
        time_s=[w / (1e9 * n / 64) ** 0.5 for w, n in zip(work, ns, strict=True)]
    )
    table = exponent_table(climbing)
    row = table[(table.metric == "time_s") & (table.along == "n")].iloc[0]
    assert row.range_rule != SETTLED_RULE and row.exponent == pytest.approx(0.5)


def test_exponent_agreement_tolerates_lower_order_terms_of_exact_counts():
    # An RNN traces 3n + 2 steps: slope 0.997 with a tiny interval, still O(n).
    n = [64, 128, 256, 512, 1024]
    fit = loglog_exponent(n, [3 * x + 2 for x in n])
    assert not fit.low <= 1.0 <= fit.high
    assert fits.agrees(fit, 1.0)
    assert not fits.agrees(loglog_exponent(n, [x**1.5 for x in n]), 1.0)


def test_an_interval_too_wide_to_judge_is_not_called_agreement():
    wide = fits.Exponent(0.3, -2.0, 2.6, 3, 64, 256)
    assert fits.agrees(wide, 2.0) is None  # inside, but it would be inside for n or n² too
    assert fits.agrees(fits.Exponent(1.9, 1.7, 2.1, 6, 64, 2048), 2.0) is True
    assert fits.agrees(fits.Exponent(1.2, 1.0, 1.4, 6, 64, 2048), 2.0) is False


def test_measured_crossover_interpolates_in_log_log():
    # Ratio 0.5 at n=256 and 2 at n=1024: it crosses 1 at n=512 exactly.
    assert measured_crossover([256, 1024], [0.5, 2.0]) == pytest.approx(512)
    assert measured_crossover([64, 128], [1.5, 3.0]) == -math.inf
    assert measured_crossover([64, 128], [0.1, 0.2]) == math.inf
    assert measured_crossover([64, 128, 256], [1.2, 0.9, 0.8]) == math.inf  # faster at the end
    # Noise that dips and rises again: the last rise is the crossover.
    rises = 256 * 2 ** (np.log(1 / 0.8) / np.log(4))  # from 0.8 at 256 to 3.2 at 512
    assert measured_crossover([64, 128, 256, 512], [1.1, 0.9, 0.8, 3.2]) == pytest.approx(rises)


def test_formula_crossovers_match_the_algebra():
    d = 64
    attention, lstm, rnn = theory_of("attention"), theory_of("lstm"), theory_of("rnn")
    assert attention and lstm and rnn

    def at(n: float) -> dict[str, float]:
        return {"b": 1, "n": n, "d": d, "heads": 4}

    # 8nd² + 4n²d = 16nd²  ->  n = 2d.
    gap = lambda n: attention.flops(at(n)) - lstm.flops(at(n))  # noqa: E731
    assert formula_crossover(gap) == pytest.approx(2 * d)
    # The chapter's orders: n²d = nd²  ->  n = d.
    order = lambda n: attention.order(at(n)) - rnn.order(at(n))  # noqa: E731
    assert formula_crossover(order) == pytest.approx(d)
    # Attention's projections alone outweigh a plain RNN: more FLOPs at every n.
    flops = lambda n: attention.flops(at(n)) - rnn.flops(at(n))  # noqa: E731
    assert formula_crossover(flops) == 0
    assert math.isnan(formula_crossover(lambda n: -1.0))


def test_crossover_table_measured_and_predicted_side_by_side():
    att = synthetic("attention", lambda n, d: 1e-9 * n * n * d / 64, noise=0)
    rnn = synthetic("rnn", lambda n, d: 1e-9 * n * 512 * d / 64, noise=0)
    table = crossover_table(pd.concat([att, rnn]))
    assert len(table) == len(DS)
    row = table[table.d == 64].iloc[0]
    assert (row.layer, row.versus) == ("attention", "rnn")
    assert row.measured_n == pytest.approx(512)  # n² = 512 n
    assert row.measured == "≈ 512"
    assert row.theory_order_n == pytest.approx(64) and row.theory_flops == "from n = 1"


def test_a_rival_that_declares_no_order_gets_no_order_crossover(add_layer):  # type: ignore[no-untyped-def]
    from attnbench.layers.recurrent import RECURRENT
    from attnbench.theory import LayerTheory, Term

    flops = (Term(2, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] ** 2),)
    add_layer("myrnn", None, family=RECURRENT, theory=LayerTheory("O(n d^2)", flops))
    att = synthetic("attention", lambda n, d: 1e-9 * n * n * d / 64, noise=0)
    mine = synthetic("myrnn", lambda n, d: 1e-9 * n * 512 * d / 64, noise=0)
    row = crossover_table(pd.concat([att, mine])).iloc[0]
    assert row.versus == "myrnn" and row.measured == "≈ 512"  # measured all the same
    assert math.isnan(row.theory_order_n) and row.theory_order == "no order declared"
    assert row.theory_flops == "from n = 1"  # its FLOP formula still predicts (2nd² is cheap)


def test_fit_frame_fills_options_from_the_run(tiny_run: RunResults):
    frame = fit_frame(tiny_run)
    assert frame["k"].notna().all() and frame["window"].notna().all()
    assert set(frame["window"]) == {16}
    assert len(frame) == len(tiny_run.measured)


def test_exponents_of_the_tiny_run_follow_the_table(tiny_run: RunResults):
    table = exponent_table(fit_frame(tiny_run))
    steps = table[(table.metric == "seq_steps") & (table.along == "n")].set_index("layer")
    assert steps.loc["rnn", "exponent"] == pytest.approx(1, abs=0.05)
    assert steps.loc["attention", "exponent"] == 0
    assert steps["agrees"].all()


def test_agreement_at_its_exact_boundaries() -> None:
    from dataclasses import dataclass

    from attnbench.fits.agreement import agrees

    @dataclass(frozen=True)
    class Fit:
        slope: float
        low: float
        high: float

    assert agrees(Fit(0.05, 0.5, 0.6), 0.0) is True  # exactly the exact-count tolerance away
    assert agrees(Fit(2.0, 1.5, 2.5), 2.5) is True  # an interval exactly 1 wide is judged...
    assert agrees(Fit(2.0, 1.5, 2.5001), 2.5) is None  # ...a wider one is not
    assert agrees(Fit(2.0, 1.5, 2.3), 1.5) is True  # the theory on the interval's low end
    assert agrees(Fit(2.0, 1.7, 2.5), 2.5) is True  # and on its high end
    assert agrees(Fit(2.0, 1.7, 2.4), 2.5) is False


def test_a_time_exponent_splits_exactly_into_the_work_and_the_rate_it_ran_at():
    """conv's counted work grows as n; a machine that runs it faster on longer inputs (rate
    ~ n^0.3 here) bends its time to n^0.7. The split reads the bend as the rate's, and the
    two slopes add up to the time's exactly, on the same sizes."""
    frame = synthetic("conv", lambda n, d: 1e-9 * 6 * n * d * d / (n**0.3), noise=0.05)
    table = exponent_table(frame)
    time = table[(table.metric == "time_s") & (table.along == "n") & (table.fixed == 256)].iloc[0]
    assert time.work_exponent == pytest.approx(1.0)
    assert time.rate_exponent == pytest.approx(0.3, abs=0.05)
    assert time.exponent == pytest.approx(time.work_exponent - time.rate_exponent, abs=1e-12)
    fitted = frame[(frame.d == 256) & frame.n.between(time.range_from, time.range_to)]
    rates = fitted.flops / fitted.time_s
    assert time.rate_from == pytest.approx(rates.iloc[0])
    assert time.rate_to == pytest.approx(rates.iloc[-1])
    # Another metric, or a time without counted work, has no split.
    flops = table[table.metric == "flops"].iloc[0]
    assert np.isnan(flops.work_exponent) and np.isnan(flops.rate_exponent)
    uncounted = exponent_table(frame.drop(columns="flops"))
    assert uncounted[uncounted.metric == "time_s"].work_exponent.isna().all()
    # Nor does a line with a size whose work is missing: the split is on the time's own
    # points, or it is not given.
    frame.loc[(frame.d == 256) & (frame.n == time.range_to), "flops"] = np.nan
    gap = exponent_table(frame)
    gap = gap[(gap.metric == "time_s") & (gap.along == "n") & (gap.fixed == 256)].iloc[0]
    assert np.isnan(gap.work_exponent) and not np.isnan(gap.exponent)


def test_the_split_counts_elementwise_work_as_the_theory_does():
    """ssm-scan's work is its products and its n·log n scan: the split's work is both, so its
    slope is the theory's, not the FLOPs' alone."""
    theory = theory_of("ssm-scan")
    sizes = [{"b": 1, "n": n, "d": 64, "state": 16} for n in NS]
    frame = pd.DataFrame([{"layer": "ssm-scan", "n": n, "d": 64, "batch": 1} for n in NS])
    frame["flops"] = [theory.flops(s) for s in sizes]
    frame["elementwise"] = [theory.elements(s) for s in sizes]
    frame["time_s"] = [1e-10 * (f + e) for f, e in zip(frame.flops, frame.elementwise, strict=True)]
    row = exponent_table(frame).query("metric == 'time_s' and along == 'n'").iloc[0]
    assert row.work_exponent == pytest.approx(row.theory)
    assert row.rate_exponent == pytest.approx(0.0, abs=1e-9)


def test_exact_counts_that_are_the_law_plus_a_constant_agree_with_it() -> None:
    """ssm-scan traces 3·log2(n) + 8 sequential steps: over n = 64..256 they read n^0.15,
    log n n^0.21 there, beyond the exact counts' tolerance, and were called a disagreement.
    They are the law up to a scale and a constant, which an order drops; counts of another
    order are not, over the same three sizes."""
    from attnbench.fits.agreement import AFFINE_TOLERANCE, law_fits

    n = [64, 128, 256]
    log = [math.log(x) for x in n]
    steps = [3 * math.log2(x) + 8 for x in n]
    assert not fits.agrees(loglog_exponent(n, steps), loglog_exponent(n, log).slope)
    assert law_fits(steps, log) and law_fits([3 * x + 2 for x in n], n)
    assert law_fits([x * x + 5 * x for x in n], [x * x for x in n])  # n² + 5n is O(n²)
    assert not law_fits([x * math.log2(x) for x in n], n)  # n log n is not O(n): 1.7% off
    assert not law_fits([x**1.1 for x in n], n)  # nor n^1.1: 1.0% of the spread
    assert not law_fits([x**0.5 for x in n], log)  # nor √n O(log n)
    assert not law_fits([1e6 + x * x for x in n], n)  # a constant hides no order: 0.5% a count
    assert not law_fits(steps[:2], log[:2])  # a line through two sizes fits any law
    assert not law_fits([10.0, 10.0, 10.0], n)  # flat counts: only a law scaled to nothing
    assert not law_fits([30.0, 20.0, 10.0], n)  # falling as n grows: a negative scale
    assert not law_fits(steps, [5.0, 5.0, 5.0]) and not law_fits(steps, [1.0, math.nan, 2.0])
    assert not law_fits(steps, log[:2]) and not law_fits([*steps[:2], math.inf], log)
    one_two_three = [1.0, 2.0, 3.0]
    assert not law_fits([-1.0, 5.0, 11.0], one_two_three)  # 6·law - 7, but a count under 0
    assert not law_fits([0.0, 6.0, 12.0], one_two_three)
    assert not law_fits([6.0, 12.0, 18.0], [0.0, 1.0, 2.0])
    assert law_fits([0.5, 1.0, 1.5], one_two_three)  # a scale under 1, counts under 1
    assert law_fits([0.5, 1.0, 1.5], [0.1, 0.2, 0.3])
    assert not law_fits([99.0, 99.5, 100.0], one_two_three)  # spread 1% of the largest: flat
    assert law_fits([99.0, 99.6, 100.2], one_two_three)  # a little more: judged, and exact
    # a middle count off the line: least squares leaves a third of the miss on each end, two
    # thirds on it, so the worst is 2/3 of the miss, against the tolerance of the spread (12)
    for miss, fitting in ((0.9, True), (1.1, False)):
        bent = [6.0, 12.0 + miss * AFFINE_TOLERANCE * 12 * 1.5, 18.0]
        assert law_fits(bent, one_two_three) is fitting, miss


def test_the_exponent_table_judges_exact_counts_by_the_law_plus_a_constant() -> None:
    from attnbench.fits.agreement import EXACT_TOLERANCE

    frame = pd.DataFrame([{"layer": "ssm-scan", "n": n, "d": 64, "state": 16, "batch": 1,
                           "seq_steps": 3 * math.log2(n) + 8} for n in (64, 128, 256)])  # fmt: skip
    row = exponent_table(frame).query("metric == 'seq_steps' and along == 'n'").iloc[0]
    assert abs(row.exponent - row.theory) > EXACT_TOLERANCE and bool(row.agrees) is True
    frame["seq_steps"] = [n * math.log2(n) for n in frame["n"]]
    row = exponent_table(frame).query("metric == 'seq_steps' and along == 'n'").iloc[0]
    assert row.agrees is not None and bool(row.agrees) is False


def test_a_cross_layer_model_reads_a_conv_of_kernel_1_without_failing() -> None:
    """A sweep of --k 1 (a conv that mixes no positions) is a valid conv, but no dilated stack
    can have that k: the dilated stack's term reads no value at it (NaN) instead of failing the
    whole table ("a dilated stack needs k >= 2"), and keeps its value at k = 3."""
    from attnbench.fits.models import term_sizes

    theory = theory_of("conv-dilated")
    assert theory is not None
    frame = pd.DataFrame({"batch": [1, 1], "n": [64, 64], "d": [8, 8], "k": [1, 3]})
    sizes = term_sizes(frame, theory.terms)
    assert math.isnan(sizes[0, 0]) and sizes[1, 0] == pytest.approx(4 * 64 * 3 * 8 * 8)


def test_a_no_says_which_way_the_measure_missed_its_formula():
    from attnbench.render.report import _agrees

    assert _agrees(False, 1.89, low=1.93) == "no: steeper"  # attention, its rate fell
    assert _agrees(False, 1.0, low=0.5) == "no: flatter"
    assert _agrees(True, 1.0, low=0.9) == "yes"
    assert _agrees(None, 1.0) == "can't tell"


def test_a_better_model_is_named_by_the_terms_it_adds_not_by_its_layer():
    """lstm's time, bending up at long n, fits self-attention's model best: the column says
    what that model adds (a square term), not that lstm is attention."""
    from attnbench.layers.registry import REGISTRY
    from attnbench.render.costmodels import BETTER, model_display

    frame = synthetic("lstm", lambda n, d: 1e-9 * n * d * d + 2e-11 * n * n, noise=0)

    class Fitted:  # what model_display reads of an Analysis
        models = model_table(model_fits(frame))
        layers = REGISTRY

    Fitted.frame = frame  # type: ignore[attr-defined]

    row = model_display(Fitted()).iloc[0]  # type: ignore[arg-type]
    assert row["layer"] == "lstm"
    # the term it adds, read as its growth in n over lstm's lengths: a square
    assert row[BETTER].startswith("own + a term in n^2.00 (") and "n²" in row[BETTER]
    assert row[BETTER].endswith("from self-attention's model")
    plain = model_table(model_fits(synthetic("lstm", lambda n, d: 1e-9 * n * d * d, noise=0)))

    class Own:
        models = plain

    assert model_display(Own()).iloc[0][BETTER] == "own"  # type: ignore[arg-type]


@pytest.mark.parametrize("layer", ["rnn", "gru", "lstm"])
def test_a_shared_models_throughput_is_read_with_the_layers_own_count(layer: str) -> None:
    """rnn, gru and lstm share one cost model, named and counted after rnn (4·b·n·d²): gru's
    12·b·n·d² priced at rnn's count read a third of the rate its sweep ran at."""
    frame = synthetic(layer, lambda n, d: 0.0, noise=0.0)
    frame["time_s"] = frame["flops"] / 4e9  # every FLOP at 4 GFLOP/s
    table = model_table(model_fits(frame))
    own = table[(table.layer == layer) & table.own].iloc[0]
    assert own.gflops_per_s["b·n·d²"] == pytest.approx(4.0, rel=0.02)


def test_a_better_model_that_lacks_the_own_terms_is_not_called_own_plus():
    """conv's best on a reference run was state space's model, which has no b·n·k·d²: "own +
    b·n·d·N" claimed conv's formula held plus a term; it reads as another model instead."""
    from attnbench.render.costmodels import _better

    own = pd.Series({"layer": "conv", "best": False, "coefficients": {"b·n·k·d²": 1e-11},
                     "rms": 0.2})  # fmt: skip
    best = pd.Series({"model": "state space", "formula": "α·b·n·d·N + β·d·N + γ",
                      "coefficients": {"b·n·d·N": 1e-9, "d·N": 0.0}, "rms": 0.1})  # fmt: skip
    assert _better(own, best) == "state space's model instead (adds b·n·d·N; lacks b·n·k·d²)"
    both = pd.Series({**best.to_dict(), "coefficients": {"b·n·k·d²": 1e-11, "b·n·d·N": 1e-9}})
    assert _better(own, both) == "own + b·n·d·N, from state space's model"
    # ranked first by AICc but with the larger rel. RMS: best on neither alone, said so (a
    # student read attention's own 6.3% beside a "best" at 100.6% as not quadratic)
    worse = pd.Series({**best.to_dict(), "rms": 1.006})
    assert _better(own, worse) == (
        "own by rel. RMS; by AICc, state space's model instead (adds b·n·d·N; lacks b·n·k·d²)"
    )


def test_a_crossover_outside_the_measured_sizes_says_which_side_it_lies_on() -> None:
    """Attention slower at every n measured crosses at or below the shortest, faster at the
    longest above it: the words say which, not a bare bound."""
    ns = [64, 128, 256]
    assert fits.describe_crossover(-math.inf, ns) == "≤ 64 (slower at every n measured)"
    assert fits.describe_crossover(math.inf, ns) == "> 256 (faster at the longest n measured)"
    assert fits.describe_crossover(181.0, ns) == "≈ 181"
    assert fits.describe_crossover(fits.measured_crossover(ns, [2.0, 3.0, 4.0]), ns).startswith(
        "≤ 64"
    )


def test_a_model_ranked_first_with_the_larger_rms_is_explained() -> None:
    """ssm-scan's "best by AICc: convolutional's model instead, its rel. RMS 59.6%" beside its
    own 34.4% read as a contradiction to a new user: AICc ranks on relative errors, the RMS is
    google-benchmark's, on absolute ones. A note names the layers where the two part."""
    from attnbench.render.costmodels import BETTER, _ranked_apart

    models = pd.DataFrame(
        {"layer": ["conv", "ssm-scan", "ssm-scan", "lstm", "lstm"],
         "own": [True, True, False, True, False], "best": [True, False, True, False, True],
         "rms": [0.305, 0.344, 0.596, 0.09, 0.024]}
    )  # fmt: skip
    (note,) = _ranked_apart(models)
    assert note.startswith(f"{BETTER} ranks by each case's relative error")
    assert note.endswith("as for ssm-scan (59.6% against its own 34.4%)")
    assert _ranked_apart(models[models["layer"] != "ssm-scan"]) == []
