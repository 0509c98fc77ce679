"""The look every chart shares: a layer's colour and marker, log-log axes, panels, legends."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from attnbench.layers import BUILTIN

if TYPE_CHECKING:  # matplotlib is imported where a chart is drawn: a sweep starts 0.4 s sooner
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import Formatter

# 12 colours and 11 markers: no two of the first 132 layers share both, and the built-in
# eleven differ in colour alone.
_COLOURS = (*(f"C{i}" for i in range(10)), "black", "navy")
_MARKERS = "osD^v<>Px*h"
_PANEL_W, _PANEL_H = 5.0, 4.0
MAX_PANELS = 4
MAX_X_TICKS = 9  # labelled sizes on a log axis, at most about


def layer_style(layer: str) -> dict[str, Any]:
    """The same colour and marker for a layer in every chart."""
    names = BUILTIN  # a plugin's style must not depend on what else this process loaded
    # zlib.crc32, not hash(): the same colour in every process, so re-plotting is reproducible.
    i = names.index(layer) if layer in names else len(names) + zlib.crc32(layer.encode()) % 10
    return {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)]}


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


def panels(count: int, title: str) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    cols = min(count, 2)
    rows = -(-count // cols)
    fig = Figure(figsize=(_PANEL_W * cols, _PANEL_H * rows + 0.4), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(count)]
    fig.suptitle(title)
    return fig, axes


def last(values: Iterable[int], limit: int = MAX_PANELS) -> list[int]:
    """The largest ``limit`` distinct values, ascending (panels for the biggest sizes)."""
    return sorted(set(values))[-limit:]


def legend(ax: Axes) -> None:
    """Below the panel, so that it never hides a series."""
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False
        )
