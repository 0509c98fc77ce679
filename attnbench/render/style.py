"""The look every chart shares: a layer's colour and marker, log-log axes, panels and small
multiples of kin, legends, and the time chart's key and guides."""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attnbench.layers import BUILTIN, CUSTOM, LayerEntry

if TYPE_CHECKING:  # matplotlib is imported where a chart is drawn: a sweep starts 0.4 s sooner
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import Formatter

# 12 colours and 11 markers: no two of the first 132 layers share both, and the built-in
# eleven differ in colour alone.
_COLOURS = (*(f"C{i}" for i in range(10)), "black", "navy")
_MARKERS = "osD^v<>Px*h"
# plugins' own, none of them a built-in layer's (tab10's ten, black, navy, and their markers)
_PLUGIN_COLOURS = ("magenta", "teal", "gold", "lime", "darkviolet")  # none near a built-in's
# filled shapes no built-in draws (the tri-stars 1-4 were all but invisible at chart size)
_PLUGIN_MARKERS = ("p", "X", "d", "H", "8")
_PANEL_W, _PANEL_H = 5.0, 4.0
MAX_PANELS = 4
MAX_X_TICKS = 9  # labelled sizes on a log axis, at most about
# Layers one panel draws: a layer is up to three lines (measured, model, kernels), so four is
# about a dozen lines, which a reader still tells apart by colour; more go to small multiples.
PANEL_LAYERS = 4
GRID_COLUMNS = 3  # small multiples: panels a row
# ... and rows of kins, one per d (or n): the largest two; a chart of a few layers (--layers)
# draws every d, two panels a row.
GRID_ROWS = 2


@dataclass(frozen=True)
class Panel:
    """One panel of a chart of several layers: what its title says, and the layers it draws."""

    title: str
    layers: tuple[str, ...]
    chapter: bool = False  # the chapter's own table: one layer of each of its rows


def layer_panels(layers: Sequence[str], known: Mapping[str, LayerEntry]) -> list[Panel]:
    """The layers of a chart as small multiples: all in one panel when there are at most
    ``PANEL_LAYERS``; otherwise the chapter's table first (the first layer of each of its
    families: conv, rnn, attention), then one panel per kin of families (convolutional,
    recurrent, self-attention, state space, your layers), at most ``PANEL_LAYERS`` each."""
    layers = list(dict.fromkeys(layers))
    if len(layers) <= PANEL_LAYERS:
        return [Panel("", tuple(layers))]
    family = {x: known[x].family if x in known else CUSTOM for x in layers}
    chapter: dict[str, str] = {}
    kin: dict[str, list[str]] = {}
    for layer in layers:
        if family[layer].chapter:
            chapter.setdefault(family[layer].row, layer)
        kin.setdefault(family[layer].panel, []).append(layer)
    found = []
    if len(chapter) > 1:
        found.append(Panel("the chapter's table", tuple(chapter.values()), chapter=True))
    for title, members in kin.items():
        parts = [members[i : i + PANEL_LAYERS] for i in range(0, len(members), PANEL_LAYERS)]
        for i, part in enumerate(parts):
            more = f" ({i + 1} of {len(parts)})" if len(parts) > 1 else ""
            found.append(Panel(title + more, tuple(part)))
    return found


def layer_style(layer: str, points: int | None = None) -> dict[str, Any]:
    """The same colour and marker for a layer in every chart; for its line of ``points``
    sizes, a z-order that draws a shorter line over a longer one (matplotlib's lines sit at 2),
    which would otherwise hide it where the two read alike (ssm under ssm-scan)."""
    if layer in BUILTIN:
        i = BUILTIN.index(layer)
        style = {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)]}
    else:  # a plugin's style must not depend on what else this process loaded; zlib.crc32,
        # not hash(): the same in every process, so re-plotting is reproducible. Its own
        # palette: a plugin drawn in attention's brown read as attention beside it
        j = zlib.crc32(layer.encode())
        colours = len(_PLUGIN_COLOURS)  # colour and marker drawn apart: 25 styles, not 5
        style = {"color": _PLUGIN_COLOURS[_plugin_colour(layer, j)],
                 "marker": _PLUGIN_MARKERS[j // colours % len(_PLUGIN_MARKERS)]}  # fmt: skip
    return style if points is None else {**style, "zorder": 2 + 1 / (1 + points)}


_DRAWN: tuple[str, ...] = ()  # the plugins of the run being drawn (``plugins_drawn``), by name


@contextlib.contextmanager
def plugins_drawn(layers: Iterable[str]) -> Iterator[None]:
    """While a run's charts are drawn: its plugins, so that no two of them share a colour
    (two plugins of a researcher's run both drew lime, from crc32's five slots)."""
    global _DRAWN
    before, _DRAWN = _DRAWN, tuple(sorted({str(x) for x in layers} - set(BUILTIN)))
    try:
        yield
    finally:
        _DRAWN = before


def _plugin_colour(layer: str, j: int) -> int:
    """crc32's colour slot for a plugin; among the plugins drawn, taken in name order, the
    next free slot where one before it took its own: the same colours for the same plugins
    in every chart and run, and none shared while there are five or fewer."""
    slots = len(_PLUGIN_COLOURS)
    if layer not in _DRAWN:
        return j % slots
    used: set[int] = set()
    for name in _DRAWN:
        slot = zlib.crc32(name.encode()) % slots
        while slot in used and len(used) < slots:
            slot = (slot + 1) % slots
        used.add(slot)
        if name == layer:
            return slot
    return j % slots


def power_of_two(x: float, _pos: int) -> str:
    """A size on a base-2 axis: 64, 1024, 4096, then 16k, 64k, 1M (k = 1024, M = 1024²) where
    the digits would run into each other."""
    if x < 1 or x != round(x):
        return f"{x:g}"
    size = int(x)
    if size < 16384:
        return str(size)
    return f"{size // 2**20}M" if size % 2**20 == 0 else f"{size // 1024}k"


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_MATHTEXT = re.compile(r"\$\\mathdefault\{(.*)\}\$")
_POWER = re.compile(r"(?:(.+?)\\times)?(\d+)\^\{(-?\d+)\}")


def plain_power(label: str) -> str:
    """A log axis's tick label as matplotlib writes it in mathtext
    (``$\\mathdefault{2\\times10^{-4}}$``), as plain text with Unicode superscripts
    (``2×10⁻⁴``): the same label without a mathtext parse (pyparsing, about 5 ms for each
    label of each panel in each format): 178 of the 589 parses of saving the default run's
    charts, which save 11% faster without them (5 interleaved pairs)."""
    inner = _MATHTEXT.fullmatch(label)
    if inner is None:
        return label
    power = _POWER.fullmatch(inner.group(1))
    if power is None:
        return inner.group(1)
    coeff, base, exponent = power.groups()
    return f"{coeff + '×' if coeff else ''}{base}{exponent.translate(_SUPERSCRIPT)}"


def log_formatter(base: float) -> Formatter:
    """matplotlib's own tick labels of a log axis (which ticks are labelled, and how), written
    by ``plain_power``."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLogFormatter(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_power(super().__call__(x, pos))

    return PlainLogFormatter(base, labelOnlyBase=False)  # as LogScale sets them, subs None


def log_axes(ax: Axes, xlabel: str, ylabel: str, *, base_x: int = 2) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=base_x)
    # every power of the base while they fit, every other (or fourth...) over a wide range
    ax.xaxis.set_major_locator(LogLocator(base=base_x, numticks=MAX_X_TICKS))
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(power_of_two))
    ax.xaxis.set_minor_formatter(log_formatter(base_x))
    ax.yaxis.set_major_formatter(log_formatter(10))
    ax.yaxis.set_minor_formatter(log_formatter(10))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


RATIO_SUBS = (1.0, 2.0, 5.0)  # a ratio axis's labelled ticks in each decade: 0.2, 0.5, 1, 2, 5
RATIO_SUBS_DECADES = 3.0  # ... over this many decades at most; past them, the powers of ten


def ratio_label(x: float, pos: int | None = None) -> str:
    """A ratio's tick as a plain number (0.2, 1, 50), which reads at a glance as "how many times
    slower" where 2×10⁻¹ does not."""
    return f"{x:.10g}"


def ratio_subs(decades: float) -> tuple[float, ...]:
    """Which multiples of each power of ten a ratio axis spanning ``decades`` labels: every
    one under a decade (0.6, 0.7, ... 3), 1-2-5 up to ``RATIO_SUBS_DECADES``, then 1."""
    if decades > RATIO_SUBS_DECADES:
        return (1.0,)
    return RATIO_SUBS if decades > 1 else tuple(float(k) for k in range(1, 10))


def ratio_axis(ax: Axes) -> None:
    """The y axis of a log-scaled ratio in plain numbers, at least two of them in view (a plain
    linear spacing where the span is too narrow for two on the log ladder, 0.95-1.05). A ratio
    often spans two decades, where matplotlib labels only the powers of ten (a panel read 10⁰
    and 10¹ alone)."""
    from matplotlib.ticker import AutoLocator, FuncFormatter, LogLocator, NullFormatter

    class RatioLocator(LogLocator):
        def tick_values(self, vmin: float, vmax: float) -> Any:
            low, high = sorted((abs(vmin) or 1e-300, abs(vmax) or 1e-300))
            self.set_params(subs=ratio_subs(float(np.log10(high / low))))
            ticks = np.asarray(super().tick_values(vmin, vmax), dtype=float)
            if ((ticks >= low) & (ticks <= high)).sum() < 2:
                return AutoLocator().tick_values(low, high)
            return ticks

    ax.yaxis.set_major_locator(RatioLocator(base=10, numticks=12))
    ax.yaxis.set_major_formatter(FuncFormatter(ratio_label))
    ax.yaxis.set_minor_formatter(NullFormatter())


def panels(
    count: int,
    title: str,
    *,
    columns: int = 2,
    shared: bool = False,
    positions: Sequence[int] | None = None,
) -> tuple[Figure, list[Axes]]:
    """A figure of ``count`` panels, ``columns`` a row (at ``positions`` of that grid, row by
    row, where given); ``shared``: one scale on both axes for all of them, so that small
    multiples compare at a glance."""
    from matplotlib.figure import Figure

    places = list(positions) if positions is not None else list(range(count))
    cols = min(max(places) + 1, columns)
    rows = max(places) // cols + 1
    fig = Figure(figsize=(_PANEL_W * cols, _PANEL_H * rows + 0.4), layout="constrained")
    axes: list[Axes] = []
    for place in places:
        share = axes[0] if shared and axes else None
        axes.append(fig.add_subplot(rows, cols, place + 1, sharex=share, sharey=share))
    fig.suptitle(title)
    return fig, axes


def last(values: Iterable[int], limit: int = MAX_PANELS) -> list[int]:
    """The largest ``limit`` distinct values, ascending (panels for the biggest sizes)."""
    return sorted(set(values))[-limit:]


def legend(ax: Axes, named: Mapping[str, Artist] | None = None) -> None:
    """Below the panel, so that it never hides a series: its own, or ``named`` (label to
    handle: a key for several panels)."""
    handles, labels = ax.get_legend_handles_labels() if named is None else ([], [])
    if named is not None:
        labels, handles = list(named), list(named.values())
    if handles:
        ax.legend(
            handles,
            labels,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncol=2,
            frameon=False,
        )


def spare_cell(fig: Figure, axes: Sequence[Axes]) -> Axes | None:
    """The first cell of the panels' grid that no panel took, as an empty axes (for a key);
    None where the grid is full."""
    specs = [spec for spec in (ax.get_subplotspec() for ax in axes) if spec is not None]
    if len(specs) != len(axes):
        return None
    rows, cols = specs[0].get_gridspec().get_geometry()
    taken = {spec.num1 for spec in specs}
    free = [i for i in range(rows * cols) if i not in taken]
    if not free:
        return None
    cell = fig.add_subplot(rows, cols, free[0] + 1)
    cell.set_axis_off()
    return cell


def small_multiples(
    known: Mapping[str, LayerEntry],
    frame: pd.DataFrame,
    other: str,
    fixed_values: Sequence[Any],
    title: str,
) -> tuple[Figure, list[tuple[Any, Panel, Axes]]]:
    """A figure of one panel per value of ``other`` and kin of layers (``layer_panels``). With
    the layers in several panels they share one scale: one value's panels three a row, or,
    for several values, a row each, for the largest ``GRID_ROWS`` of them."""
    chosen = [
        [
            (fixed, panel)
            for panel in layer_panels(list(frame[frame[other] == fixed]["layer"]), known)
        ]
        for fixed in fixed_values
    ]
    grid = any(len(row) > 1 for row in chosen)
    if grid:  # the kins of layers a row: the largest GRID_ROWS values (--layers for the rest)
        chosen = chosen[-GRID_ROWS:]
        fixed_values = fixed_values[-GRID_ROWS:]
    if len(chosen) == 1 or not grid:  # one value (or one panel a value): wrapped
        flat = [cell for row in chosen for cell in row]
        fig, axes = panels(len(flat), title, columns=GRID_COLUMNS if grid else 2, shared=grid)
    else:
        flat, positions = [], []
        width = max(len(row) for row in chosen)
        for i, row in enumerate(chosen):
            flat += row
            positions += [i * width + j for j in range(len(row))]
        fig, axes = panels(len(flat), title, columns=width, shared=True, positions=positions)
    for ax, (fixed, panel) in zip(axes, flat, strict=True):
        heading = f"{other} = {fixed}" if len(fixed_values) > 1 or not panel.title else ""
        ax.set_title(" · ".join(x for x in (panel.title, heading) if x), fontsize=9)
    return fig, [(fixed, panel, ax) for ax, (fixed, panel) in zip(axes, flat, strict=True)]


NEAR_TOP = 1.5  # a guide's end this close to the panel's longest time has no room above
BACK = 1.5  # a label with no room at its guide's end sits this factor in n back along it


def order_guides(ax: Axes, at: pd.DataFrame, *, decode: bool = False) -> str:
    """Faint slopes of n and n² from the panel's fastest first point, so the chapter's two
    orders can be read off the lines at a glance (the fits' exponents are in the legend); in a
    decode run, the orders of one step: flat, and n. Returns their names, for the key ("":
    none drawn)."""
    n0, n1 = float(at["n"].min()), float(at["n"].max())
    t0, top = float(at.loc[at["n"] == n0, "time_s"].min()), float(at["time_s"].max())
    if not (n1 > n0 and top > t0 > 0):
        return ""
    orders = ((0, "∝ 1"), (1, "∝ n")) if decode else ((1, "∝ n"), (2, "∝ n²"))
    for power, name in orders:
        # up to the panel's longest time: a guide never widens the shared scale
        reach = n0 * (top / t0) ** (1 / power) if power else n1
        ns = np.array([n0, min(n1, reach)])
        ys = np.minimum(t0 * (ns / n0) ** power, top)  # the root's rounding must not overshoot
        ax.plot(ns, ys, color="0.6", lw=0.8, ls="-.", label=f"_{name}", zorder=0)
        # a guide that ends at (or within 1.5x of: the root's rounding, a label's height)
        # the panel's longest time is labelled beside its end, not above: there the label sat
        # on the panel's top edge; to the right where the panel goes on (the n² guide, along
        # attention's own line), else under it
        under = ys[-1] * NEAR_TOP >= top
        right = under and ns[-1] * 2 <= n1  # a doubling's room for the label, at least
        xy, offset, ha, va = (ns[-1], ys[-1]), (0, 0), "right", "bottom"
        if right:  # clear of the marker the guide ends on (attention's last point, 6 pt wide)
            offset, ha, va = (6, -1), "left", "top"
        elif under and power and ns[-1] / BACK > n0:
            # no room above the end nor right of it: above the guide a step back along it,
            # where its own line (rising to the right) does not cross the label
            back = ns[-1] / BACK
            xy, offset = (back, min(t0 * (back / n0) ** power, top)), (-2, 2)
        elif under:
            offset, va = (-3, -1), "top"
        ax.annotate(
            name, xy, xytext=offset, textcoords="offset points", fontsize=8, color="0.45",
            ha=ha, va=va,
        )  # fmt: skip
    return ", ".join(name for _, name in orders)


# The title's keys are packed into lines that fit the figure: about this many inches a
# character (three keys, 115 characters, took 10.07 in at 100 dpi), and this much left free.
KEY_CHAR_W, KEY_MARGIN_W = 0.0876, 0.8


def key_lines(keys: list[str], width: float) -> list[str]:
    """``keys`` packed in order into as few lines as fit ``width`` inches, "; " between them;
    a key longer than the width alone on its line."""
    lines: list[str] = []
    for key in keys:
        joined = f"{lines[-1]}; {key}" if lines else key
        if lines and len(joined) * KEY_CHAR_W <= width - KEY_MARGIN_W:
            lines[-1] = joined
        else:
            lines.append(key)
    return lines


def time_key_title(
    fig: Figure, title: str, models: bool, kernels: bool, changes: bool = False, guides: str = ""
) -> None:
    """The time chart's keys under its title, where its grid has no spare cell, packed into
    lines that fit the figure (one panel: a new user's chart of three layers lost both ends
    of a single line); what the spare cell's key says, the band and the brackets included."""
    keys = ["dashed: fitted cost model"] * models + [
        "dotted: kernels' time, hollow: overhead-bound"
    ] * kernels
    keys += ["a tick at the foot: a layer's convolution kernel changed"] * changes
    keys += [f"grey dash-dot: slopes {guides} from the fastest first point"] * bool(guides)
    keys += ["band: its samples' quartiles", "[lo, hi]: the fitted exponent's 95% interval"]
    fig.suptitle("\n".join([title, *key_lines(keys, fig.get_figwidth())]))


def time_key(
    cell: Axes, models: bool, kernels: bool, changes: bool = False, guides: str = ""
) -> None:
    """How to read a panel of the time chart, drawn in a spare cell of its grid; ``guides``:
    the slopes ``order_guides`` drew ("∝ n, ∝ n²"; a student found the lines that show the
    quadratic missing from the key, beside a dashed model line that looks alike)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grey = "0.3"
    entries: list[tuple[Any, str]] = [
        (Line2D([], [], color=grey, marker="o", lw=1.2), "the time per call"),
        (Patch(color=grey, alpha=0.18, lw=0), "its samples' quartiles"),
    ]
    if models:
        entries.append((Line2D([], [], color=grey, ls="--", lw=1), "the layer's fitted cost model"))
    if kernels:
        entries += [
            (Line2D([], [], color=grey, ls=":", lw=1.2), "the kernels' time alone"),
            (
                Line2D([], [], color=grey, marker="o", ls="none", markerfacecolor="white"),
                "overhead-bound: kernels under half the time",
            ),
        ]
    if changes:
        foot = Line2D([], [], color=grey, marker="|", ls="none", markersize=10, mew=2)
        entries.append((foot, "at the foot: its convolution kernel changed"))
    if guides:
        guide = Line2D([], [], color="0.6", ls="-.", lw=0.8)
        entries.append((guide, f"slopes {guides} from the fastest first point"))
    handles, labels = zip(*entries, strict=True)
    cell.legend(
        handles,
        labels,
        title="how to read a panel\n(n^a [lo, hi]: the fitted exponent, its 95% interval)",
        loc="center",
        fontsize=9,
        title_fontsize=9,
        frameon=False,
    )


# A decode run's call is one generated token, and its n the context the step sees.
_DECODE_WORDS = {
    "sequence length n": "context n (tokens before the step)",
    "time per call": "time per generated token",
    "Time per call": "Time per generated token",
    "against sequence length": "against context length",
    "per call": "per step",
    "of one call": "of one step",
    "chapter: n²d = nd²": "per token: nd = d²",
}


def in_decode_words(figure: Figure) -> Figure:
    """The figure's titles, labels and legends in a decode run's words (each text keeps its
    style: only its words change)."""
    from matplotlib.text import Text

    for text in figure.findobj(Text):
        words = text.get_text()
        for word, decode in _DECODE_WORDS.items():
            words = words.replace(word, decode)
        text.set_text(words)
    return figure
