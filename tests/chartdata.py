"""What a chart shows, read from its ``Figure`` without drawing it: each panel's titles, labels,
scales and limits, each line's points and style, each band, marker set, bar, text, legend and
image. Two figures with the same data draw the same chart; held to golden files, it catches a
change in what a committed run's charts show at a fraction of the cost of drawing them."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import Collection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Text

DIGITS = 10  # significant digits kept in a golden file
TOLERANCE = 1e-9  # relative: two numbers this close read the same (``first_difference``)


def number(x: Any) -> Any:
    """A float to ``DIGITS`` significant digits (nan and inf by name)."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    return float(f"{x:.{DIGITS}g}")


def numbers(values: Iterable[Any]) -> list[Any]:
    return [number(v) for v in np.asarray(values, dtype=float).ravel()]


def colors(values: Any) -> list[str]:
    array = np.atleast_2d(np.asarray(values, dtype=float)) if len(values) else []
    return [to_hex(tuple(c), keep_alpha=True) for c in array]


def text(item: Text) -> dict[str, Any]:
    return {
        "text": item.get_text(),
        "at": numbers(item.get_position()),
        "color": to_hex(item.get_color(), keep_alpha=True),
        "size": number(item.get_fontsize()),
    }


def line(item: Line2D) -> dict[str, Any]:
    x, y = item.get_data(orig=True)
    return {
        "label": item.get_label(),
        "x": numbers(x),
        "y": numbers(y),
        "color": to_hex(item.get_color(), keep_alpha=True),
        "style": str(item.get_linestyle()),
        "width": number(item.get_linewidth()),
        "marker": str(item.get_marker()),
        "marker_size": number(item.get_markersize()),
        "marker_face": to_hex(item.get_markerfacecolor(), keep_alpha=True),
        "fill": item.get_fillstyle(),
        "alpha": None if item.get_alpha() is None else number(item.get_alpha()),
        "zorder": number(item.get_zorder()),
        "visible": item.get_visible(),
    }


def collection(item: Collection) -> dict[str, Any]:
    return {
        "kind": type(item).__name__,
        "label": item.get_label(),
        "offsets": numbers(item.get_offsets()),
        "paths": [numbers(p.vertices) for p in item.get_paths()],
        "faces": colors(item.get_facecolor()),
        "edges": colors(item.get_edgecolor()),
        "alpha": None if item.get_alpha() is None else number(item.get_alpha()),
    }


def patch(item: Patch) -> dict[str, Any]:
    found: dict[str, Any] = {"kind": type(item).__name__, "label": item.get_label()}
    if isinstance(item, Rectangle):
        found["box"] = numbers([*item.get_xy(), item.get_width(), item.get_height()])
    found["face"] = to_hex(item.get_facecolor(), keep_alpha=True)
    return found


def legend(item: Legend | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {
        "title": item.get_title().get_text(),
        "texts": [t.get_text() for t in item.get_texts()],
        "handles": [
            to_hex(h.get_color(), keep_alpha=True) if isinstance(h, Line2D) else type(h).__name__
            for h in item.legend_handles
        ],
    }


def axes(ax: Axes) -> dict[str, Any]:
    images = []
    for image in ax.get_images():
        array = np.asarray(image.get_array(), dtype=float)
        rounded = np.array(numbers(array), dtype=object).astype(str)
        images.append(
            {
                "shape": list(array.shape),
                "digest": hashlib.sha256("\n".join(rounded).encode()).hexdigest(),
                "cmap": image.get_cmap().name,
            }
        )
    return {
        "titles": [ax.get_title(loc) for loc in ("left", "center", "right")],
        "labels": [ax.get_xlabel(), ax.get_ylabel()],
        "scales": [ax.get_xscale(), ax.get_yscale()],
        "limits": numbers([*ax.get_xlim(), *ax.get_ylim()]),
        "visible": ax.get_visible(),
        "lines": [line(x) for x in ax.get_lines()],
        "collections": [collection(x) for x in ax.collections],
        "patches": [patch(x) for x in ax.patches],
        "texts": [text(x) for x in ax.texts],
        "legend": legend(ax.get_legend()),
        "images": images,
    }


def figure_data(figure: Figure) -> dict[str, Any]:
    """What the figure shows, as JSON-ready data."""
    return {
        "size": numbers(figure.get_size_inches()),
        "suptitle": figure.get_suptitle(),
        "texts": [text(x) for x in figure.texts],
        "legends": [legend(x) for x in figure.legends],
        "axes": [axes(ax) for ax in figure.axes],
    }


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two JSON values first differ ("time/axes/2/lines/3/y/4: 1.2 != 1.3"), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}/{key}: only in {'the golden' if key in b else 'the drawn'} data"
            found = first_difference(a[key], b[key], f"{where}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{where}/{i}")
            if found:
                return found
        return None if len(a) == len(b) else f"{where}: {len(a)} items != {len(b)}"
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=TOLERANCE):
        return None  # a last bit of a fit or a log that another CPU rounds the other way
    return None if a == b else f"{where}: {a!r} != {b!r}"
