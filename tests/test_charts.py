"""Each chart builds from a small real run and draws the series it should (artists, not pixels)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from attnbench.errors import AttnbenchError
from attnbench.fits import analyse
from attnbench.layers import BUILTIN, entry
from attnbench.render import charts, style
from attnbench.render.charts import CHARTS, build_charts, parse_charts, parse_formats, save_charts
from attnbench.results.run import RunResults

LAYERS = ["conv", "rnn", "attention"]


@pytest.fixture(scope="module")
def figures(wide_run: RunResults) -> dict[str, Figure]:
    return build_charts(wide_run, analyse(wide_run))


def solid(ax):
    """The measured series (dashed lines are theory, "_" labels are unnamed)."""
    lines = ax.get_lines()
    return [x for x in lines if x.get_linestyle() == "-" and not x.get_label().startswith("_")]


def colour(layer):
    return style.layer_style(layer)["color"]


def dashed(ax):
    return [line for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_every_built_in_layer_has_a_style_of_its_own():
    """Eleven layers, each its own colour (and marker): none reads as another on a chart."""
    styles = [style.layer_style(x) for x in BUILTIN]  # plugins of other tests may be present
    assert len({s["color"] for s in styles}) == len(styles) == 11
    assert len({s["marker"] for s in styles}) == len(styles)
    # a plugin is never drawn as a built-in layer (a new user's mixer read as attention, in
    # its brown), and it is drawn alike in every process
    plugins = [style.layer_style(f"mine{i}.py:make") for i in range(40)]
    assert not {s["color"] for s in plugins} & {s["color"] for s in styles}
    assert not {s["marker"] for s in plugins} & {s["marker"] for s in styles}
    assert style.layer_style("mine0.py:make") == plugins[0]
    assert len({(s["color"], s["marker"]) for s in plugins}) > 10  # not five styles, locked


def test_the_plugins_of_one_run_never_share_a_colour():
    """Two plugins of a researcher's run (gla:make, gla:msconv: one crc32 slot) both drew
    lime: among a run's plugins, a taken slot moves to the next free one, the same in every
    chart of the run, and a plugin alone keeps its own."""
    alone = [colour(name) for name in ("gla:make", "gla:msconv")]
    assert alone[0] == alone[1]  # the collision, out of any run
    names = ["gla:make", "gla:msconv", *(f"mine{i}.py:make" for i in range(3))]
    with style.plugins_drawn([*names, "attention"]):
        drawn = [colour(name) for name in names]
    assert len(set(drawn)) == 5 and drawn[0] == alone[0]  # the first by name keeps its slot
    with style.plugins_drawn(reversed(names)):  # the same set, in any order: the same colours
        assert [colour(name) for name in names] == drawn
    assert colour("gla:msconv") == alone[1]  # the run's set is gone once its charts are


@pytest.mark.slow
def test_every_chart_is_built_for_a_full_run(figures):
    # every chart a forward run has data for: the state is a decode run's
    assert list(figures) == [name for name in CHARTS if name != "state"]
    assert all(isinstance(f, Figure) for f in figures.values())


def test_a_decode_runs_charts_speak_of_tokens_and_draw_the_state_on_its_formula():
    """The committed decode run: time per generated token against the context, with the
    orders of one step as guides (flat and n), and the state's bytes on its formula."""
    from pathlib import Path

    from attnbench.results.loader import load_results

    run = load_results(Path(__file__).resolve().parents[1] / "results" / "cpu-decode")
    found = build_charts(run, analyse(run), ["time", "state"])
    time_ax = found["time"].get_axes()[0]
    assert "per generated token" in time_ax.get_ylabel()
    assert "context" in time_ax.get_xlabel()
    guides = [t.get_text() for t in time_ax.texts]
    assert "∝ 1" in guides and "∝ n" in guides and "∝ n²" not in guides
    state_ax = found["state"].get_axes()[0]
    measured = {line.get_label().split()[0]: line for line in solid(state_ax)}
    attention = measured["attention"]
    formula = [line for line in dashed(state_ax) if line.get_color() == attention.get_color()]
    assert formula, "the state's formula is drawn"
    ns, held = attention.get_data()
    # the formula's line passes through the measured bytes: 2·(n+1)·d float32 values
    assert list(held) == [2 * (n + 1) * 64 * 4 for n in ns]
    fx, fy = formula[0].get_data()
    assert np.allclose(np.interp(ns, fx, fy), held, rtol=1e-6)


def test_time_chart_has_a_panel_per_d_with_medians_bands_and_models(figures, wide_run):
    fig = figures["time"]
    axes = fig.get_axes()
    assert [ax.get_title().split()[2] for ax in axes] == ["8", "16"]
    for ax, d in zip(axes, (8, 16), strict=True):
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        assert ax.get_yscale() == "log"
        assert "[s]" in ax.get_ylabel() and "n" in ax.get_xlabel()
        lines = {line.get_label().split()[0]: line for line in solid(ax)}
        assert set(lines) == set(LAYERS)
        measured = wide_run.measured
        for layer, line in lines.items():
            rows = measured[(measured.layer == layer) & (measured.d == d)].sort_values("n")
            assert list(line.get_xdata()) == rows["n"].tolist()
            assert np.allclose(line.get_ydata(), rows["time_s"])
            assert "$n^{" in line.get_label()  # the fitted exponent is in the legend
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == len(LAYERS)  # one IQR band per layer
        assert len(dashed(ax)) == len(LAYERS)  # one fitted cost model per layer
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(legend) == len(LAYERS)


def test_iqr_band_is_the_samples_quartiles(figures, wide_run):
    ax = figures["time"].get_axes()[0]
    q = charts.quartiles(wide_run)
    band = next(c for c in ax.collections if isinstance(c, PolyCollection))
    measured = wide_run.measured
    rows = measured[(measured.layer == "conv") & (measured.d == 8)].sort_values("n")
    ys = band.get_paths()[0].vertices[:, 1]
    expected = q.loc[rows["case_id"]]
    assert np.isclose(ys, expected["q1"].min()).any()
    assert np.isclose(ys, expected["q3"].max()).any()


@pytest.mark.slow
def test_model_line_follows_the_fitted_cost_model(figures, wide_run):
    analysis = analyse(wide_run)
    ax = figures["time"].get_axes()[1]  # d = 16
    fit = next(f for f in analysis.fits["attention"] if "attention" in f.model.layers)
    line = next(x for x in dashed(ax) if x.get_color() == colour("attention"))
    n, y = line.get_xdata()[-1], line.get_ydata()[-1]
    assert n == 128
    size = {"b": 1, "n": 128, "d": 16, "heads": 2, "causal": 0}
    terms = [t.size(size) for t in fit.model.terms]
    assert [t.name for t in fit.model.terms][:2] == ["b·n·d²", "b·n²·d"]
    assert terms[:2] == [128 * 256, 128 * 128 * 16]
    model = sum(a * t for a, t in zip(fit.coefficients, terms, strict=True)) + fit.constant
    assert y == pytest.approx(model)


def test_flops_chart_draws_the_analytic_formula(figures, wide_run):
    ax = figures["flops"].get_axes()[0]
    line = next(x for x in dashed(ax) if x.get_color() == colour("attention"))
    assert list(line.get_ydata()) == [
        entry("attention").theory.flops({"b": 1, "n": n, "d": 8, "heads": 2})
        for n in (16, 32, 64, 128)
    ]


def test_structure_charts_are_one_panel_with_the_counts(figures, wide_run):
    ax = figures["seq_steps"].get_axes()
    assert len(ax) == 1
    rnn = next(x for x in solid(ax[0]) if x.get_label().startswith("rnn"))
    rows = wide_run.measured[(wide_run.measured.layer == "rnn") & (wide_run.measured.d == 16)]
    assert list(rnn.get_ydata()) == rows.sort_values("n")["seq_steps"].tolist()
    path = figures["path_len"].get_axes()[0]
    attention = next(x for x in solid(path) if x.get_label().startswith("attention"))
    assert set(attention.get_ydata()) == {1}


def test_normalized_chart_divides_time_by_the_analytic_flops(figures, wide_run):
    ax = figures["normalized"].get_axes()[0]
    conv = next(x for x in solid(ax) if x.get_label() == "conv")
    rows = wide_run.measured[(wide_run.measured.layer == "conv") & (wide_run.measured.d == 8)]
    rows = rows.sort_values("n")
    assert np.allclose(conv.get_ydata(), rows["time_s"] / rows["flops_analytic"] * 1e12)


def test_crossover_chart_plots_ratios_against_n_over_d_with_the_line_one(figures, wide_run):
    (ax,) = figures["crossover"].get_axes()
    ratios = [x for x in ax.get_lines() if x.get_label().startswith("/")]
    labels = sorted(x.get_label() for x in ratios)
    assert labels == ["/ conv, d = 16", "/ conv, d = 8", "/ rnn, d = 16", "/ rnn, d = 8"]
    ones = [x for x in ax.get_lines() if list(x.get_ydata()) == [1, 1]]
    assert ones, "the line y = 1 is missing"
    rnn8 = next(x for x in ratios if x.get_label() == "/ rnn, d = 8")
    assert list(rnn8.get_xdata()) == [2, 4, 8, 16]  # n / d
    m = wide_run.measured[wide_run.measured.d == 8].pivot_table(
        index="n", columns="layer", values="time_s"
    )
    assert np.allclose(rnn8.get_ydata(), m["attention"] / m["rnn"])


@pytest.mark.parametrize(
    ("span", "labels"),
    [
        ((0.15, 30), ["0.2", "0.5", "1", "2", "5", "10", "20"]),  # 10⁰ and 10¹ alone before
        ((0.004, 900), ["0.01", "0.1", "1", "10", "100", "1000"]),  # 1-2-5 would crowd: decades
        ((0.6, 3), ["0.6", "0.7", "0.8", "0.9", "1", "2", "3"]),  # under a decade: every one
        ((0.95, 1.05), ["0.96", "0.98", "1", "1.02", "1.04"]),  # too narrow for two: linear
    ],
)
def test_a_ratio_axis_labels_plain_numbers(span, labels, tmp_path):
    from matplotlib.figure import Figure

    from attnbench.render.style import log_axes, ratio_axis

    ax = Figure().add_subplot()
    ax.plot([1, 16], span)
    log_axes(ax, "n / d", "ratio")
    ratio_axis(ax)
    ax.figure.savefig(tmp_path / "r.svg")  # ticks and labels settle when drawn
    low, high = ax.get_ylim()
    shown = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    assert shown == labels
    assert not [t for t in ax.yaxis.get_minorticklabels() if t.get_text()]


def test_roofline_places_each_case_by_its_intensity_and_achieved_rate(figures, wide_run):
    """One point per case at (FLOPs / bytes, FLOPs / time), under min(peak, bandwidth x I)."""
    (ax,) = figures["roofline"].get_axes()
    assert ax.get_xscale() == ax.get_yscale() == "log"
    ceilings = wide_run.ceilings
    assert ceilings is not None
    roof = next(x for x in ax.get_lines() if x.get_label().startswith("ceilings"))
    x, y = roof.get_xdata(), roof.get_ydata()
    expected = np.minimum(ceilings.peak_flops_per_s, ceilings.bandwidth_bytes_per_s * x)
    assert np.allclose(y, expected)
    rows = wide_run.measured[(wide_run.measured.layer == "rnn") & (wide_run.measured.d == 16)]
    rows = rows.sort_values("n")
    path = next(
        line for line in ax.get_lines()
        if len(line.get_xdata()) == len(rows)
        and np.allclose(line.get_xdata(), rows["flops"] / rows["bytes"])
    )  # fmt: skip
    assert np.allclose(path.get_ydata(), rows["flops"] / rows["time_s"])
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= set(LAYERS)


@pytest.mark.slow
def test_time_split_draws_the_models_terms_and_the_measured_time(figures, wide_run):
    analysis = analyse(wide_run)
    every = figures["time-split"].get_axes()
    axes = [ax for ax in every if ax.get_title()]  # the panels; a spare cell holds the key
    assert [ax.get_title() for ax in axes] == [f"{x}, d = 16" for x in LAYERS]
    # one key for every panel (eleven copies ran into each other), the series named once
    (key,) = [ax.get_legend() for ax in every if ax.get_legend() is not None]
    said = [t.get_text() for t in key.get_texts()]
    assert len(said) == len(set(said)) and said[-2:] == ["predicted (their sum)", "measured"]
    assert "latency: ops x op latency, + a fused kernel's set-up" in said
    ax = axes[1]  # rnn: many small ops, so latency is drawn
    lines = {line.get_label(): line for line in ax.get_lines()}
    rows = analysis.frame[(analysis.frame.layer == "rnn") & (analysis.frame.d == 16)]
    rows = rows.sort_values("n")
    predicted = analysis.machine.loc[rows.index]
    assert np.allclose(lines["measured"].get_ydata(), rows["time_s"])
    assert np.allclose(lines["predicted (their sum)"].get_ydata(), predicted["predicted_time_s"])
    latency = lines["latency: ops x op latency, + a fused kernel's set-up"]
    assert np.allclose(latency.get_ydata(), predicted["latency_s"])


@pytest.mark.slow
def test_machine_charts_need_the_runs_ceilings(wide_run, tmp_path):
    meta = {k: v for k, v in wide_run.meta.items() if k != "ceilings"}
    old = dataclasses.replace(wide_run, meta=meta)
    assert old.ceilings is None
    found = build_charts(old, analyse(old), ["roofline", "time-split", "time"])
    assert list(found) == ["time"]
    assert "recorded no machine ceilings" in charts.not_drawn_reason("roofline", old)
    with pytest.raises(AttnbenchError, match=r"roofline: the run recorded no machine ceilings"):
        charts.plot_run(old, names=["roofline"], out_dir=tmp_path)


def test_the_state_chart_on_a_forward_run_says_it_is_decodes(wide_run, tmp_path):
    assert wide_run.mode == "forward"
    assert build_charts(wide_run, analyse(wide_run), ["state"]) == {}
    reason = charts.not_drawn_reason("state", wide_run)
    assert reason.startswith("it is a decode-mode chart and this run was swept in forward mode")
    with pytest.raises(AttnbenchError, match=r"state: it is a decode-mode chart"):
        charts.plot_run(wide_run, names=["state"], out_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_layers_and_chart_selection(wide_run):
    analysis = analyse(wide_run, layers=["rnn"])
    figures = build_charts(wide_run, analysis, ["time", "crossover"])
    assert list(figures) == ["time"]  # no attention layer: no crossover chart
    labels = [x.get_label() for x in solid(figures["time"].get_axes()[0])]
    assert [x.split()[0] for x in labels] == ["rnn"]


@pytest.mark.slow
def test_a_run_with_one_length_has_no_charts_against_n(tiny_run: RunResults):
    # The tiny run has one d and two n: charts against n exist, against d do not.
    figures = build_charts(tiny_run, analyse(tiny_run))
    assert "time" in figures and "time-d" not in figures


@pytest.mark.slow
def test_save_writes_each_format_and_is_reproducible(wide_run, tmp_path):
    def plot(out):
        figures = build_charts(wide_run, analyse(wide_run), ["time"])
        return save_charts(figures, tmp_path / out, ["png", "svg"])

    paths = plot("charts")
    assert [p.name for p in paths] == ["time.png", "time.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:2000]
    again = plot("again")  # the same results plotted again give the same bytes
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]


def test_a_saved_chart_is_laid_out_once_and_drawn_once_a_format(tmp_path, monkeypatch):
    """The layout is solved once, and each format draws the figure once: savefig draws it a
    second time, rendering nothing, wherever a layout engine is left on it (a third of what a
    sweep's charts took)."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    figure, axes = style.panels(2, "two panels")
    for ax in axes:
        ax.plot([1, 2, 3], [1, 4, 9], label="a line")
    drawn, solved = [], []
    real_draw, real_solve = Figure.draw, ConstrainedLayoutEngine.execute
    monkeypatch.setattr(Figure, "draw", lambda self, r: (drawn.append(1), real_draw(self, r))[1])
    monkeypatch.setattr(
        ConstrainedLayoutEngine,
        "execute",
        lambda self, f: (solved.append(1), real_solve(self, f))[1],
    )
    paths = save_charts({"two": figure}, tmp_path, ["png", "svg"])
    assert [p.name for p in paths] == ["two.png", "two.svg"]
    assert (len(solved), len(drawn)) == (1, 2)
    assert figure.get_layout_engine() is None


def test_parse_options():
    assert parse_charts(None) == list(CHARTS)
    assert parse_charts("time, memory") == ["time", "memory"]
    with pytest.raises(AttnbenchError, match="unknown chart speed"):
        parse_charts("time,speed")
    assert parse_formats("PNG,svg") == ["png", "svg"]
    with pytest.raises(AttnbenchError, match="unknown format gif"):
        parse_formats("gif")


@pytest.mark.slow
def test_a_run_over_two_device_models_gets_charts_per_model(wide_run: RunResults, tmp_path):
    """Cases of one grid on two GPU models (a mixed cluster): one set of charts per model."""
    from dataclasses import replace

    frame = wide_run.frame.copy()
    frame["device_name"] = np.where(frame["d"] == 8, "GPU model A", "GPU model B")
    mixed = replace(wide_run, frame=frame)
    assert mixed.devices == ["GPU model A", "GPU model B"]
    only_a = mixed.for_device("GPU model A")
    assert set(only_a.frame["d"]) == {8}
    assert set(only_a.samples["case_id"]) <= set(only_a.frame["case_id"])
    paths = charts.plot_run(mixed, names=["time"], formats=["svg"], out_dir=tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "gpu-model-a/time.svg",
        "gpu-model-b/time.svg",
    ]
    assert "on GPU model B" in (tmp_path / "gpu-model-b" / "time.svg").read_text()
    assert charts.device_folder("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_elementwise_chart_leaves_out_a_layer_without_elementwise_work(figures):
    ax = figures["elementwise"].get_axes()[0]
    assert {line.get_label().split()[0] for line in solid(ax)} == {"rnn", "attention"}


@pytest.mark.slow
def test_the_time_chart_names_dashed_lines_only_when_it_draws_them(wide_run, monkeypatch):
    monkeypatch.setattr(charts, "own_fit", lambda fits, layer: None)  # no cost model fitted
    fig = build_charts(wide_run, analyse(wide_run), ["time"])["time"]
    assert "dashed" not in fig.get_suptitle()
    for ax in fig.get_axes():
        assert dashed(ax) == []
        assert ax.get_title().startswith("d = ")


def test_a_one_panel_count_charts_dashed_note_is_packed_to_its_width(wide_run):
    """A new user's one-panel FLOPs chart cut its "(dashed: ...; hidden under the points
    where they agree)" line at both ends: it is packed as the time chart's keys are."""
    from attnbench.render import style

    narrow = wide_run.without(set(wide_run.frame.loc[wide_run.frame["d"] == 8, "case_id"]))
    fig = build_charts(narrow, analyse(narrow), ["flops"])["flops"]
    lines = fig.get_suptitle().splitlines()[1:]
    assert lines == ["dashed: analytic formula", "hidden under the points where they agree"]
    assert all(len(line) * style.KEY_CHAR_W <= fig.get_figwidth() for line in lines)


def test_a_one_panel_time_charts_keys_stand_a_line_each(wide_run):
    """One width and no spare cell: the keys go under the title, and on one line they ran
    past both edges of a one-panel figure (a new user's chart of three layers). They say
    what the spare cell's key does, the band and the exponents' brackets too."""
    narrow = wide_run.without(set(wide_run.frame.loc[wide_run.frame["d"] == 8, "case_id"]))
    fig = build_charts(narrow, analyse(narrow), ["time"])["time"]
    assert len(fig.get_axes()) == 1
    keys = fig.get_suptitle().splitlines()[1:]
    assert keys == [
        "dashed: fitted cost model",
        "dotted: kernels' time, hollow: overhead-bound",
        "band: its samples' quartiles",
        "[lo, hi]: the fitted exponent's 95% interval",
    ]


def test_the_titles_keys_are_packed_into_lines_that_fit_the_figure():
    """Three keys on one line took 10.07 inches, past a 10-inch figure's edges."""
    keys = ["dashed: fitted cost model", "dotted: kernels' time, hollow: overhead-bound",
            "a tick at the foot: a layer's convolution kernel changed"]  # fmt: skip
    assert style.key_lines(keys, 30.0) == ["; ".join(keys)]
    assert style.key_lines(keys, 10.0) == ["; ".join(keys[:2]), keys[2]]
    assert style.key_lines(keys, 5.0) == keys
    assert style.key_lines(["a" * 200], 5.0) == ["a" * 200]  # too long: alone on its line
    for width in (5.0, 10.0, 15.0):
        for line in style.key_lines(keys, width):
            assert len(line) * style.KEY_CHAR_W <= width - style.KEY_MARGIN_W or "; " not in line


def test_a_shorter_line_is_drawn_over_a_longer_one(wide_run):
    """ssm's line hid under ssm-scan's in the README's chart up to the n where ssm stopped:
    a line of fewer lengths is drawn over one of more, and its hollow markers over it."""
    frame = wide_run.frame
    cut = wide_run.without(set(frame.loc[(frame["layer"] == "rnn") & (frame["n"] > 32), "case_id"]))
    ax = build_charts(cut, analyse(cut), ["time"])["time"].get_axes()[-1]  # d = 16
    solid = {x.get_color(): x for x in ax.get_lines() if x.get_linestyle() == "-"}
    rnn, conv = solid[colour("rnn")], solid[colour("conv")]
    assert len(rnn.get_xdata()) == 2 and len(conv.get_xdata()) == 4
    assert rnn.get_zorder() > conv.get_zorder() > 2  # over the dashed and dotted lines too
    hollow = [x for x in ax.get_lines() if x.get_markerfacecolor() == "white"]
    assert all(x.get_zorder() == solid[x.get_markeredgecolor()].get_zorder() for x in hollow)


@pytest.mark.slow
def test_matplotlib_is_imported_only_to_draw() -> None:
    """The command line and a sweep start without matplotlib (0.4 s of imports); the first
    chart drawn imports it."""
    import subprocess
    import sys

    code = (
        "import sys, attnbench.cli, attnbench.render.charts; print('matplotlib' in sys.modules); "
        "from attnbench.render.style import panels; panels(1, 't'); "
        "print('matplotlib' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.split() == ["False", "True"], loaded.stderr


def test_log_tick_labels_are_matplotlibs_own_without_mathtext(figures):
    """A mathtext parse per tick label (178 of 589 parses in saving the default run's charts):
    the labels are the ones matplotlib chooses, written with Unicode superscripts."""
    assert style.plain_power(r"$\mathdefault{10^{-4}}$") == "10⁻⁴"
    assert style.plain_power(r"$\mathdefault{2\times10^{-4}}$") == "2×10⁻⁴"
    assert style.plain_power(r"$\mathdefault{10^{12}}$") == "10¹²"
    assert style.plain_power(r"$\mathdefault{1}$") == "1"
    assert style.plain_power("") == ""
    from matplotlib.ticker import LogFormatterSciNotation

    ours, theirs = style.log_formatter(10), LogFormatterSciNotation(10, labelOnlyBase=False)
    for formatter in (ours, theirs):
        formatter.create_dummy_axis()
        formatter.axis.set_view_interval(1e-5, 3e-2)  # type: ignore[union-attr]
        formatter.set_locs([1e-5, 1e-4, 1e-3, 1e-2])
    for x in (1e-5, 1e-4, 2e-4, 1e-3, 1e-2, 3e-2):
        assert ours(x) == style.plain_power(theirs(x))  # labelled where matplotlib labels
    fig = figures["time"]
    fig.canvas.draw()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            texts = [t.get_text() for t in axis.get_ticklabels(which="both")]
            assert not any("$" in t for t in texts)
        assert any("10⁻" in t.get_text() for t in ax.yaxis.get_ticklabels())


@pytest.mark.slow
def test_the_time_chart_draws_the_kernels_time_beside_the_wall_time(figures, wide_run):
    """Each layer's kernels' time dotted in its colour, never above its wall time, and its
    overhead-bound cases (kernels under half the time) hollow on the wall-time line."""
    ax = figures["time"].get_axes()[-1]  # d = 16
    at = wide_run.measured[wide_run.measured["d"] == 16]
    dotted = {x.get_color(): x for x in ax.get_lines() if x.get_linestyle() == ":"}
    assert "dotted: kernels' time" in figures["time"].get_suptitle()  # the key, once a figure
    for layer in LAYERS:
        line = at[at["layer"] == layer].sort_values("n")
        kernel = dotted[colour(layer)]
        assert list(kernel.get_ydata()) == pytest.approx(list(line["kernel_time_s"]))
        assert (line["kernel_time_s"] <= line["time_s"]).all()
        hollow = [x for x in ax.get_lines() if x.get_markerfacecolor() == "white"
                  and x.get_markeredgecolor() == colour(layer)]  # fmt: skip
        bound = line[line["kernel_share"] < 0.5]
        assert list(hollow[0].get_xdata()) == list(bound["n"])
    old = dataclasses.replace(
        wide_run, frame=wide_run.frame.assign(kernel_time_s=np.nan, kernel_share=np.nan)
    )
    fig = build_charts(old, analyse(old), ["time"])["time"]
    assert not [x for x in fig.get_axes()[-1].get_lines() if x.get_linestyle() == ":"]
    assert "dotted" not in fig.get_suptitle()


def test_many_layers_are_drawn_as_small_multiples_by_kin():
    """Eleven layers would be 33 lines in one axis: one panel for the chapter's three rows,
    then one per kin of families, each layer in its colour, on one scale."""
    known = {name: entry(name) for name in BUILTIN}
    found = style.layer_panels(BUILTIN, known)
    assert [(p.title, p.layers) for p in found] == [
        ("the chapter's table", ("conv", "rnn", "attention")),
        ("convolutional", ("conv", "conv-dilated")),
        ("recurrent", ("rnn", "gru", "lstm")),
        ("self-attention", ("attention", "attention-sdpa", "attention-local", "attention-linear")),
        ("state space", ("ssm", "ssm-scan")),
    ]
    assert all(len(p.layers) <= style.PANEL_LAYERS for p in found)
    # a few layers stay in one panel, as before; a crowd of plugins is split
    assert style.layer_panels(["rnn", "attention"], known) == [
        style.Panel("", ("rnn", "attention"))
    ]
    many = style.layer_panels([*BUILTIN[:2], *(f"mine{i}" for i in range(6))], known)
    assert [p.title for p in many] == [
        "convolutional",
        "your layers (1 of 2)",
        "your layers (2 of 2)",
    ]
    assert many[1].layers == ("mine0", "mine1", "mine2", "mine3")


@pytest.mark.slow
def test_the_time_chart_of_every_layer_has_a_panel_per_kin(wide_run):
    """The wide run's layers copied under the other built-in names: each layer's series sits
    in its kin's panel and in the chapter's table, the panels share their scales."""
    frames = []
    for name, twin in zip(
        BUILTIN,
        ["conv", "conv", "rnn", "rnn", "rnn", *["attention"] * 4, "rnn", "rnn"],
        strict=True,
    ):
        frames.append(
            wide_run.frame[wide_run.frame.layer == twin].assign(
                layer=name, case_id=lambda f, n=name, t=twin: f.case_id.str.replace(t, n, n=1)
            )
        )
    import pandas as pd

    many = dataclasses.replace(wide_run, frame=pd.concat(frames, ignore_index=True))
    fig = build_charts(many, analyse(many, layers=None), ["time"])["time"]
    axes = fig.get_axes()
    titles = [ax.get_title() for ax in axes]
    assert titles[0].splitlines()[0] == "the chapter's table · d = 8" and len(axes) == 2 * 5
    first = {line.get_label().split()[0] for line in solid(axes[0])}
    assert first == {"conv", "rnn", "attention"}
    attention = axes[titles.index("self-attention · d = 16")]
    assert {line.get_label().split()[0] for line in solid(attention)} == {
        "attention",
        "attention-sdpa",
        "attention-local",
        "attention-linear",
    }
    assert all(ax.get_shared_y_axes().joined(axes[0], ax) for ax in axes)
    assert "dashed: fitted cost model" in fig.get_suptitle()  # the grid is full: the key there
    one_d = dataclasses.replace(many, frame=many.frame[many.frame.d == 8])
    fig = build_charts(one_d, analyse(one_d), ["time"])["time"]
    *panels, key = fig.get_axes()  # five panels three a row, and the key in the sixth cell
    assert len(panels) == 5 and not key.axison
    assert panels[0].get_title().splitlines() == [
        "the chapter's table",
        "conv O(k n d²), rnn O(n d²), attention O(n² d)",
    ]
    guides = [x for x in panels[0].get_lines() if x.get_label() in ("_∝ n", "_∝ n²")]
    (x0, x1), (y0, y1) = guides[1].get_xdata(), guides[1].get_ydata()
    assert len(guides) == 2 and y1 / y0 == pytest.approx((x1 / x0) ** 2)  # the n² slope
    assert y1 <= max(line.get_ydata().max() for line in solid(panels[0]))  # within the data
    # a guide's label beside its end where the guide reaches (within 1.5x) the panel's
    # longest time, to the right where the panel goes on: above it, the label sat on the
    # panel's top edge
    labels = {t.get_text(): t for t in panels[0].texts}
    top = max(line.get_ydata().max() for line in solid(panels[0]))
    right_end = max(line.get_xdata().max() for line in solid(panels[0]))
    # (a new user's n² label sat on attention's last marker, which the guide ends on: it
    # clears the marker now; and where there is no room right either, the label sits above
    # the guide a step back along it, where the guide's own line no longer strikes it through)
    for name, guide in zip(("∝ n", "∝ n²"), guides, strict=True):
        end = (guide.get_xdata()[-1], guide.get_ydata()[-1])
        at_top = end[1] * style.NEAR_TOP >= top
        before_edge = at_top and end[0] * 2 <= right_end
        label = labels[name]
        assert label.get_va() == ("top" if before_edge else "bottom"), name
        assert label.get_ha() == ("left" if before_edge else "right"), name
        if before_edge:
            assert label.xy == end and label.xyann[0] >= 6, name  # clear of a 6 pt marker
        elif at_top:  # back along the guide, above it
            assert label.xy[0] == pytest.approx(end[0] / style.BACK) and label.xyann[1] > 0
        else:
            assert label.xy == end, name
    assert guides[1].get_ydata()[-1] * style.NEAR_TOP >= top  # n² here runs to the longest time
    assert not [x for x in panels[1].get_lines() if x.get_label().startswith("_∝")]
    texts = [t.get_text() for t in key.get_legend().get_texts()]
    assert texts[:3] == [
        "the time per call",
        "its samples' quartiles",
        "the layer's fitted cost model",
    ]
    assert "dashed" not in fig.get_suptitle()


def test_a_run_that_counted_instructions_draws_no_time_chart(wide_run):
    """--metric instructions times nothing: the time chart is left out (it failed the whole
    plot on a log scale of nothing), the other charts are drawn."""
    frame = wide_run.frame.copy()
    frame["time_s"] = float("nan")
    counted = dataclasses.replace(wide_run, frame=frame)
    found = build_charts(counted, analyse(counted), ["time", "flops"])
    assert list(found) == ["flops"]


def test_a_change_of_convolution_kernel_is_marked_at_the_foot_of_its_panel():
    """Where torch changed a layer's convolution kernel along n (the backend column), the time
    chart marks the first length of the new one under the line, in the layer's colour, a row
    up for each line of the panel marked before. No mark where one kernel ran throughout, where
    none was recorded, or where a stretch recorded none (an older count cache's rows)."""
    from matplotlib.figure import Figure as Fresh

    from attnbench.render.kernels import CHANGE_FOOT, CHANGE_MARKER, CHANGE_ROW, kernel_changes

    ref, onednn = "thnn_conv2d (torch's reference convolution)", "mkldnn_convolution (oneDNN)"
    line = pd.DataFrame(
        {"n": [512, 64, 256, 128], "time_s": [4e-4, 1e-4, 3e-4, 2e-4],
         "backend": [onednn, ref, onednn, ref]}
    )  # fmt: skip
    ax = Fresh().add_subplot()
    style_ = {"color": "C1", "zorder": 3}
    assert kernel_changes(ax, line, "n", style_) == 1
    assert kernel_changes(ax, line.assign(n=line["n"] * 2), "n", style_, row=1) == 1
    first, second = ax.get_lines()
    assert list(first.get_xdata()) == [256] and first.get_marker() == CHANGE_MARKER
    assert CHANGE_MARKER not in style._MARKERS  # no layer's marker
    assert list(first.get_ydata()) == [CHANGE_FOOT] and first.get_color() == "C1"
    assert list(second.get_xdata()) == [512]
    assert list(second.get_ydata()) == [pytest.approx(CHANGE_FOOT + CHANGE_ROW)]
    unmarked = [
        line.assign(backend=ref),  # one kernel
        line.drop(columns="backend"),  # not recorded
        line.assign(backend=np.nan),
        line.assign(backend=[np.nan, np.nan, ref, ref]),  # recorded from n = 128 on: one kernel
        line.assign(backend=[ref, ref, 3.0, ref]),  # a stray value
    ]
    assert [kernel_changes(ax, frame, "n", style_) for frame in unmarked] == [0] * 5
    gap = line.assign(backend=[onednn, ref, np.nan, ref])  # 64, 128 ref; 256 none; 512 oneDNN
    assert kernel_changes(ax, gap, "n", style_) == 1
    assert list(ax.get_lines()[-1].get_xdata()) == [512]  # not 256, where none was recorded


def test_the_runs_of_kernels_along_a_line():
    from attnbench.table import kernel_changes, kernel_runs

    ref, onednn = "thnn_conv2d (reference)", "mkldnn_convolution (oneDNN)"
    line = pd.DataFrame({"n": [64, 128, 256, 512], "backend": [ref, np.nan, onednn, ref]})
    runs = kernel_runs(line)
    assert runs == [
        ("thnn_conv2d", [64]), ("", [128]), ("mkldnn_convolution", [256]), ("thnn_conv2d", [512])
    ]  # fmt: skip
    assert kernel_changes(runs) == [256, 512]
    same = pd.DataFrame({"n": [64, 64, 128, 128], "backend": [ref, ref, onednn, onednn]})
    assert kernel_changes(kernel_runs(same)) == [128]


@pytest.mark.slow
def test_the_time_chart_keys_the_mark_of_a_changed_kernel(wide_run):
    frame = wide_run.frame
    conv = frame["layer"] == "conv"
    switched = frame.assign(
        backend=np.where(conv & (frame["n"] >= 64), "mkldnn_convolution (oneDNN)", "thnn_conv2d")
    ).assign(backend=lambda f: f["backend"].where(conv))
    run = dataclasses.replace(wide_run, frame=switched)
    fig = build_charts(run, analyse(run), ["time"])["time"]
    marks = [x for x in fig.get_axes()[-1].get_lines() if x.get_marker() == "|"]
    assert [list(m.get_xdata()) for m in marks] == [[64]]
    assert "a tick at the foot: a layer's convolution kernel changed" in fig.get_suptitle()
    plain = build_charts(wide_run, analyse(wide_run), ["time"])["time"]
    assert "kernel changed" not in plain.get_suptitle()
    assert not [x for x in plain.get_axes()[-1].get_lines() if x.get_marker() == "|"]
