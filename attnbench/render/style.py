"""The look every chart shares: a layer's colour and marker, log-log axes, panels, legends."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from attnbench.layers import BUILTIN

if TYPE_CHECKING:  # matplotlib is imported where a chart is drawn: a sweep starts 0.4 s sooner
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# 12 colours and 11 markers: no two of the first 132 layers share both, and the built-in
# eleven differ in colour alone.
_COLOURS = (*(f"C{i}" for i in range(10)), "black", "navy")
_MARKERS = "osD^v<>Px*h"
_PANEL_W, _PANEL_H = 5.0, 4.0
MAX_PANELS = 4


def layer_style(layer: str) -> dict[str, object]:
    """The same colour and marker for a layer in every chart."""
    names = BUILTIN  # a plugin's style must not depend on what else this process loaded
    # zlib.crc32, not hash(): the same colour in every process, so re-plotting is reproducible.
    i = names.index(layer) if layer in names else len(names) + zlib.crc32(layer.encode()) % 10
    return {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)]}


def power_of_two(x: float, _pos: int) -> str:
    return f"{x:g}" if x < 1 or x != round(x) else f"{int(x)}"


def log_axes(ax: Axes, xlabel: str, ylabel: str, *, base_x: int = 2) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=base_x)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(power_of_two))
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
