"""Comparison charts as matplotlib ``Figure`` objects (headless: no pyplot, no global state).

Every chart reads one ``Analysis`` (the measured rows and their fits), so what a chart draws is
what the report's tables say. Axes are log-log, base 2 for sizes; measured medians carry their
interquartile band from the raw samples, and theory is drawn dashed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attnbench.errors import AttnbenchError, NothingToPlot, did_you_mean
from attnbench.fits import (
    Analysis,
    analyse,
    own_fit,
    quadratic_layers,
    rival_layers,
    run_catalog,
    term_sizes,
    theory_values,
    time_ratios,
)
from attnbench.metrics import METRICS, Metric
from attnbench.render.kernels import kernel_changes, kernel_line
from attnbench.render.machine import roofline_chart, time_split_chart
from attnbench.render.parallel import DRAW_COST, draw_in_two
from attnbench.render.style import (
    Panel,
    in_decode_words,
    key_lines,
    last,
    layer_style,
    legend,
    log_axes,
    order_guides,
    panels,
    plugins_drawn,
    ratio_axis,
    small_multiples,
    spare_cell,
    time_key,
    time_key_title,
)
from attnbench.results.run import RunResults
from attnbench.schema import numeric_column
from attnbench.units import fmt_exponent

if TYPE_CHECKING:  # imported where a chart is drawn (render.style)
    from matplotlib.figure import Figure

CHARTS_DIR = "charts"
FORMATS = ("png", "svg", "pdf")
DEFAULT_FORMATS = ("png", "svg")

# name -> what the chart shows (also the --metric choices and the file stems): time's two
# charts, one per metric that the registry gives a chart, and the two drawn from time and theory.
CHARTS: dict[str, str] = {
    "time": "time per call against n, a panel per kin of layers at each d, with the fitted "
    "cost model",
    "time-d": "time per call against d, a panel per kin of layers at each n, with the fitted "
    "cost model",
    **{m.chart.name: m.chart.description for m in METRICS if m.chart is not None},
    "normalized": "time divided by the analytic FLOPs against n: flat where the theory holds",
    "crossover": "attention's time over each rival's (recurrent, convolutional, ...) against "
    "n/d, with the line 1",
    "roofline": "achieved FLOP/s against arithmetic intensity (FLOPs per byte), log-log, under "
    "the machine's measured ceilings; a path per layer and width, n growing along it",
    "time-split": "where the time goes: the machine model's compute, memory, latency and fault "
    "seconds against n, per layer, beside the measured time",
}


def quartiles(run: RunResults) -> pd.DataFrame:
    """Per case: the first and third quartile of its raw samples (seconds)."""
    if run.samples.empty:
        return pd.DataFrame(columns=["q1", "q3"], dtype="float64")
    grouped = run.samples.groupby("case_id")["time_s"]
    return pd.DataFrame({"q1": grouped.quantile(0.25), "q3": grouped.quantile(0.75)})


def _exponent_label(analysis: Analysis, layer: str, metric: str, along: str, fixed: int) -> str:
    row = analysis.exponent(layer, metric, along, fixed)
    if row is None:
        return layer
    power = f"${along}^{{{fmt_exponent(row.exponent)}}}$"
    if np.isnan(row.ci_low) or row.ci_low == row.ci_high:
        return f"{layer}  {power}"
    return f"{layer}  {power}  [{row.ci_low:.2f}, {row.ci_high:.2f}]"


def _model_line(analysis: Analysis, layer: str, line: pd.DataFrame, along: str) -> tuple[Any, Any]:
    """The layer's own fitted cost model on a dense grid along ``along`` (others held)."""
    fit = own_fit(analysis.fits, layer)
    if fit is None:
        return None, None
    lo, hi = line[along].min(), line[along].max()
    dense = np.geomspace(lo, hi, 48)
    template = line.iloc[[0] * len(dense)].copy()
    template[along] = dense
    predicted = fit.predict(term_sizes(template, fit.model.terms, analysis.layers))
    if np.isfinite(predicted).all():
        return dense, predicted
    # A plugin's recorded theory is known at its measured sizes (and along n): draw through those.
    at = line.sort_values(along)
    return at[along].to_numpy(), fit.predict(term_sizes(at, fit.model.terms, analysis.layers))


def _claim(analysis: Analysis, panel: Panel) -> str:
    """The chapter's orders of a panel's layers, as its table states them:
    "conv O(k n d^2), rnn O(n d^2), attention O(n^2 d)"."""
    orders = []
    for layer in panel.layers:
        known = analysis.layers.get(layer)
        theory = known.theory if known is not None else None
        if theory is not None:
            orders.append(f"{layer} {theory.complexity.replace('^2', '²')}")
    return ", ".join(orders)


def _time_chart(
    analysis: Analysis, q: pd.DataFrame, along: str, other: str, title: str
) -> Figure | None:
    frame = analysis.frame
    fixed_values = [v for v in last(frame[other]) if frame[frame[other] == v][along].nunique() > 1]
    if not fixed_values or not numeric_column(frame, "time_s").notna().any():
        return None  # too few sizes, or a run that counted instructions instead of timing
    fig, cells = small_multiples(analysis.layers, frame, other, fixed_values, title)
    models = kernels = changes = 0
    guides = ""  # the order guides drawn, named for the key
    for fixed, panel, ax in cells:
        marked = 0  # this panel's lines that marked a change of kernel
        at = frame[(frame[other] == fixed) & frame["layer"].isin(panel.layers)]
        for layer, line in at.groupby("layer", sort=False):
            line = line.sort_values(along)
            style = layer_style(str(layer), line[along].nunique())
            label = _exponent_label(analysis, str(layer), "time_s", along, int(fixed))
            ax.plot(line[along], line["time_s"], label=label, linestyle="-", lw=1.2, **style)
            kernels += kernel_line(ax, line, along, style)
            marked += kernel_changes(ax, line, along, style, marked)
            band = q.reindex(line["case_id"])
            ax.fill_between(
                line[along],
                band["q1"].to_numpy(),
                band["q3"].to_numpy(),
                color=style["color"],
                alpha=0.18,
                lw=0,
            )
            xs, ys = _model_line(analysis, str(layer), line, along)
            if xs is not None:
                ax.plot(xs, ys, linestyle="--", lw=1, color=style["color"])
                models += 1
        changes += marked
        size = "sequence length n" if along == "n" else "width d"
        log_axes(ax, size, "time per call [s]")
        legend(ax)
        if panel.chapter and along == "n":
            ax.set_title(f"{ax.get_title()}\n{_claim(analysis, panel)}", fontsize=9)
            guides = order_guides(ax, at, decode=analysis.mode == "decode") or guides
    # The key names the dashed and dotted lines only where some were drawn: in a spare cell of
    # the grid, or once under the title.
    cell = spare_cell(fig, [ax for _, _, ax in cells]) if len(cells) > 1 else None
    if cell is not None:
        time_key(cell, bool(models), bool(kernels), bool(changes), guides)
    else:
        time_key_title(fig, title, bool(models), bool(kernels), bool(changes), guides)
    return fig


def _metric_chart(analysis: Analysis, metric: Metric) -> Figure | None:
    """A metric against n, one panel per d (or one panel at the largest d), as its registry
    entry's chart says; the theory's law for it dashed."""
    chart = metric.chart
    assert chart is not None
    column = metric.column
    frame = analysis.frame.copy()
    frame[column] = pd.to_numeric(frame[column], errors="coerce")
    # Log axes: a zero (conv's elementwise work) cannot be drawn, so the layer is left out.
    frame = frame[frame[column] > 0]
    ds = [d for d in last(frame["d"]) if frame[frame["d"] == d]["n"].nunique() > 1]
    if not ds:
        return None
    ds = ds if chart.per_d else ds[-1:]
    fig, cells = small_multiples(analysis.layers, frame, "d", ds, chart.title)
    if chart.theory_note:  # packed to the figure's width, as the time chart's keys (one
        # panel cut it at both ends); the dashes lie under the points where the counts are
        # the formula's: said, or a student looked for lines the chart did not seem to draw
        keys = [f"dashed: {chart.theory_note}", "hidden under the points where they agree"]
        fig.suptitle("\n".join([chart.title, *key_lines(keys, fig.get_figwidth())]))
    for d, panel, ax in cells:
        at = frame[(frame["d"] == d) & frame["layer"].isin(panel.layers)]
        for layer, line in at.groupby("layer", sort=False):
            line = line.sort_values("n")
            style = layer_style(str(layer), line["n"].nunique())
            label = _exponent_label(analysis, str(layer), column, "n", int(d))
            ax.plot(line["n"], line[column], label=label, lw=1.2, **style)
            law = theory_values(line, column, analysis.layers) if chart.theory_note else None
            if law is not None and analysis.layers.theory(str(layer)) is not None:
                expected = law.to_numpy()
                if chart.scale_theory and expected[-1] > 0:
                    expected = expected * line[column].iloc[-1] / expected[-1]
                ax.plot(line["n"], expected, linestyle="--", lw=1, color=style["color"])
        log_axes(ax, "sequence length n", chart.ylabel)
        legend(ax)
    return fig


def _normalized_chart(analysis: Analysis) -> Figure | None:
    frame = analysis.frame.copy()
    frame["per_flop"] = frame["time_s"] / numeric_column(frame, "flops_analytic")
    frame = frame.replace([np.inf], np.nan).dropna(subset=["per_flop"])
    ds = [d for d in last(frame["d"]) if frame[frame["d"] == d]["n"].nunique() > 1]
    if not ds:
        return None
    title = "Time divided by the analytic FLOPs: flat where the theory holds"
    fig, cells = small_multiples(analysis.layers, frame, "d", ds, title)
    for d, panel, ax in cells:
        at = frame[(frame["d"] == d) & frame["layer"].isin(panel.layers)]
        for layer, line in at.groupby("layer", sort=False):
            line = line.sort_values("n")
            ax.plot(
                line["n"],
                line["per_flop"] * 1e12,
                label=str(layer),
                lw=1.2,
                **layer_style(str(layer)),
            )
        log_axes(ax, "sequence length n", "time / analytic FLOPs [ps per FLOP]")
        legend(ax)
    return fig


def _crossover_chart(analysis: Analysis) -> Figure | None:
    frame = analysis.frame
    layers = list(dict.fromkeys(frame["layer"]))
    attention = quadratic_layers(layers, analysis.layers)
    rivals = rival_layers(layers, analysis.layers)
    if not attention or not rivals:
        return None
    fig, axes = panels(len(attention), "When attention becomes slower: time ratio against n/d")
    ratios = time_ratios(frame, analysis.layers)
    styles = dict(zip(sorted({d for d, _, _ in ratios}), ["-", "--", ":", "-."] * 8, strict=False))
    drew = False
    for ax, layer in zip(axes, attention, strict=True):
        firsts, values = [], []  # where the lines start, and all they span
        for (d, mine, rival), ratio in ratios.items():
            if mine != layer or len(ratio) < 2:
                continue
            firsts.append(float(ratio.iloc[0]))
            values += [float(ratio.min()), float(ratio.max())]
            style = layer_style(rival)
            ax.plot(
                ratio.index / d,
                ratio,
                linestyle=styles[d],
                lw=1.2,
                color=style["color"],
                marker=style["marker"],
                markersize=4,
                label=f"/ {rival}, d = {d}",
            )
            drew = True
        ax.axhline(1.0, color="black", lw=1)
        ax.axvline(1.0, color="grey", lw=1, linestyle=":")
        low = bool(firsts) and np.median(np.log(firsts)) < np.mean(np.log(values))
        y, va = (0.98, "top") if low else (0.02, "bottom")  # "n = d" where no line starts
        text = " n = d (chapter: n²d = nd²)"
        ax.text(1.0, y, text, transform=ax.get_xaxis_transform(), fontsize=7, color="grey", va=va)
        log_axes(ax, "n / d", f"{layer} time / rival time")
        ratio_axis(ax)
        ax.set_title(f"{layer}: above 1, attention is slower", fontsize=9)
        legend(ax)
    return fig if drew else None


def not_drawn_reason(name: str, run: RunResults, layers: Sequence[str] | None = None) -> str:
    """Why ``name`` drew nothing for this run, in words for the plot command."""
    if name == "crossover":
        known = run_catalog(run)
        names = list(dict.fromkeys(run.measured["layer"]))
        if layers:
            names = [x for x in names if x in layers]
        if not quadratic_layers(names, known):
            return "the run has no self-attention layer to race"
        if not rival_layers(names, known):
            plain = [x for x in names if x in known and known[x].family.row == "custom"]
            declare = plain and (
                f" ({', '.join(plain)}: a plugin without a family, as a factory alone is; a "
                "LayerEntry with family=RECURRENT, CONVOLUTIONAL, STATE_SPACE or LINEAR makes "
                "it a rival, docs/own-layer.md)"
            )
            return (
                "the run has no rival family to race attention against: no recurrent, "
                f"convolutional, state-space or linear-attention layer{declare or ''}"
            )
        return "attention and a rival were not both measured at two lengths of one width"
    if name == "state" and run.mode != "decode":
        return (
            f"it is a decode-mode chart and this run was swept in {run.mode} mode "
            "(attnbench sweep --mode decode)"
        )
    if name in ("roofline", "time-split") and run.ceilings is None:
        return (
            "the run recorded no machine ceilings (sweep it again, or see attnbench predict "
            "--machine)"
        )
    return "the run has no data for it: a line needs two sizes"


def build_charts(
    run: RunResults,
    analysis: Analysis,
    names: Sequence[str] | None = None,
) -> dict[str, Figure]:
    """The requested charts (all by default) that the run has data for, by name."""
    q = quartiles(run)
    builders: dict[str, Callable[[], Figure | None]] = {
        "time": lambda: _time_chart(analysis, q, "n", "d", "Time per call against sequence length"),
        "time-d": lambda: _time_chart(analysis, q, "d", "n", "Time per call against width"),
        **{
            m.chart.name: functools.partial(_metric_chart, analysis, m)
            for m in METRICS
            if m.chart is not None
        },
        "normalized": lambda: _normalized_chart(analysis),
        "crossover": lambda: _crossover_chart(analysis),
        "roofline": lambda: roofline_chart(analysis),
        "time-split": lambda: time_split_chart(analysis),
    }
    figures = {}
    with plugins_drawn(analysis.frame["layer"].astype(str)):
        for name in names or CHARTS:
            figure = builders[name]()
            if figure is not None:
                figures[name] = in_decode_words(figure) if run.mode == "decode" else figure
    return figures


def save_charts(
    figures: dict[str, Figure], out_dir: Path, formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """Write each figure in each format as ``out_dir/<name>.<format>``; the paths written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnbenchError(f"cannot create {str(out_dir)!r}: {exc.strerror}") from exc
    from matplotlib import rc_context

    written = []
    for name, figure in figures.items():
        _fix_layout(figure)
        for fmt in formats:
            path = out_dir / f"{name}.{fmt}"
            with rc_context({"svg.hashsalt": "attnbench"}):  # stable SVG element ids
                figure.savefig(path, dpi=_DPI, metadata=_metadata(fmt))
            written.append(path)
    return written


_DPI = 110


def _fix_layout(figure: Figure) -> None:
    """Solve the layout once, at the PNG's resolution, and keep it for every format.

    A constrained layout measures text at the resolution of whatever draws first (an SVG saved
    alone would land its axes a fraction of a point off). The engine runs alone, then is taken
    off, since ``savefig`` draws once more wherever one is set: the same bytes, a third sooner."""
    engine = figure.get_layout_engine()
    if engine is None:
        return
    figure.set_dpi(_DPI)
    engine.execute(figure)
    from matplotlib import rc_context

    with rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        figure.set_layout_engine(None)  # no engine at all, as the rc asks for none


def _metadata(fmt: str) -> dict[str, str | None]:
    # No creation date or software version in the files, so re-plotting the same results
    # gives the same bytes (and committed charts do not churn).
    if fmt == "svg":
        return {"Date": None, "Creator": None}
    if fmt == "pdf":
        return {"CreationDate": None, "Creator": None, "Producer": None}
    return {"Software": None}


def existing_charts(folder: Path) -> list[Path]:
    """Chart files already in ``folder``, in CHARTS order (for a report that does not redraw)."""
    if not folder.is_dir():
        return []
    order = {name: i for i, name in enumerate(CHARTS)}
    found = [p for p in folder.iterdir() if p.stem in order and p.suffix[1:] in FORMATS]
    return sorted(found, key=lambda p: (order[p.stem], p.suffix))


def parse_charts(text: str | None) -> list[str]:
    """``--metric`` values: a comma list of CHARTS names; all of them when empty."""
    if not text:
        return list(CHARTS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in CHARTS]
    if unknown or not names:
        raise AttnbenchError(
            f"unknown chart {', '.join(unknown) or repr(text)}; choose from {', '.join(CHARTS)}"
        )
    return names


def parse_formats(text: str) -> list[str]:
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in FORMATS]
    if unknown or not names:
        raise AttnbenchError(
            f"unknown format {', '.join(unknown) or repr(text)}; choose from {', '.join(FORMATS)}"
        )
    return names


def select_layers(run: RunResults, text: str | None) -> list[str] | None:
    """``--layers`` for a saved run: names it measured; None (all) when empty."""
    if not text:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    present = list(dict.fromkeys(run.frame["layer"]))
    missing = [x for x in names if x not in present]
    if missing or not names:
        meant = did_you_mean(missing[0], present) if len(missing) == 1 else ""
        raise AttnbenchError(
            f"layer {', '.join(missing) or repr(text)} is not in {run.path}{meant}; "
            f"it has {', '.join(present)}"
        )
    return names


def plot_run(
    run: RunResults,
    *,
    names: Sequence[str] | None = None,
    layers: Sequence[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    out_dir: Path | None = None,
    analysis: Analysis | None = None,
) -> list[Path]:
    """Draw and save a run's charts (into ``<run>/charts`` by default); the files written."""
    if run.measured.empty:
        raise AttnbenchError(f"{run.path} has no measured cases to plot")
    out_dir = out_dir or run.path / CHARTS_DIR
    devices = run.devices
    if len(devices) > 1:
        # Cases of one sweep measured on different device models (a mixed cluster): one set of
        # charts per model, in its own folder, since times of two models are not one curve.
        written: list[Path] = []
        for device in devices:
            mine = run.for_device(device)
            figures = build_charts(mine, analyse(mine, layers), names)
            for figure in figures.values():
                figure.suptitle(f"{figure.get_suptitle()}\non {device}")
            written += save_charts(figures, out_dir / device_folder(device), formats)
        if not written:
            raise NothingToPlot(
                f"nothing to plot in {run.path}: no device has a layer measured "
                "at two sizes or more"
            )
        return written
    analysis = analysis or analyse(run, layers)
    chosen = analysis  # bound for the drawing below

    def draw(some: Sequence[str]) -> list[Path]:
        return save_charts(build_charts(run, chosen, some), out_dir, formats)

    asked = list(names or CHARTS)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)  # before the two processes draw into it
    except OSError as exc:
        raise AttnbenchError(f"cannot create {str(out_dir)!r}: {exc.strerror}") from exc
    written = draw_in_two(draw, asked, DRAW_COST)
    if not written and names:  # the charts asked for, each with its own reason
        reasons = "; ".join(f"{name}: {not_drawn_reason(name, run, layers)}" for name in names)
        raise NothingToPlot(f"nothing to plot in {run.path}: {reasons}")
    if not written:
        raise NothingToPlot(
            f"nothing to plot in {run.path}: each chart needs a layer measured at two sizes or more"
        )
    return written


def device_folder(device: str) -> str:
    """A folder name for a device model: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
