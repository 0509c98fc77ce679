"""The machine model's charts: the roofline, and where each layer's time goes.

Both read the ``Analysis`` of a run that recorded its machine's ceilings (``fits.roofline``):
the roofline places every case by its counted arithmetic intensity and its achieved FLOP/s
under the measured ceilings; the time split draws the model's four terms against n beside the
measured time, so a reader sees which term each layer's time follows and where it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from attnbench.devices import is_asynchronous
from attnbench.fits import Analysis
from attnbench.render.style import layer_style, legend, log_axes, panels, spare_cell
from attnbench.schema import numeric_column

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TERM_STYLE = {
    "compute_s": ("compute: work / its measured rate", "C3"),
    "memory_s": ("memory: bytes / bandwidth", "C0"),
    "latency_s": ("latency: ops x op latency, + a fused kernel's set-up", "C2"),
    "faults_s": ("faults: page faults x cost", "C4"),
}


def roofline_chart(analysis: Analysis) -> Figure | None:
    """Achieved FLOP/s against FLOPs per byte, log-log, under the measured ceilings: one point
    per case, a path per layer and width with n growing along it (the largest n ringed)."""
    ceilings = analysis.ceilings
    if ceilings is None:
        return None
    frame = analysis.frame.assign(
        intensity=numeric_column(analysis.frame, "flops") / numeric_column(analysis.frame, "bytes"),
        achieved=numeric_column(analysis.frame, "flops") / numeric_column(analysis.frame, "time_s"),
    )
    frame = frame.replace([np.inf, -np.inf], np.nan).dropna(subset=["intensity", "achieved"])
    frame = frame[(frame["intensity"] > 0) & (frame["achieved"] > 0)]
    if frame.empty:
        return None
    fig, (ax,) = panels(1, "Roofline: achieved FLOP/s against arithmetic intensity")
    fig.set_size_inches(7.5, 6.0)
    peak, bandwidth = ceilings.peak_flops_per_s, ceilings.bandwidth_bytes_per_s
    low = min(frame["intensity"].min(), peak / bandwidth) / 2
    high = max(frame["intensity"].max(), peak / bandwidth) * 2
    x = np.geomspace(low, high, 200)
    ax.plot(
        x,
        np.minimum(peak, bandwidth * x),
        color="black",
        lw=1.5,
        label=f"ceilings: {peak / 1e9:.3g} GFLOP/s, {bandwidth / 1e9:.3g} GB/s",
    )
    ax.axvline(peak / bandwidth, color="grey", lw=0.8, linestyle=":")
    for (layer, d), line in frame.groupby(["layer", "d"], sort=False):
        style = layer_style(str(layer))
        line = line.sort_values("n")
        first = d == frame.loc[frame["layer"] == layer, "d"].min()
        ax.plot(
            line["intensity"],
            line["achieved"],
            lw=0.8,
            alpha=0.7,
            markersize=4,
            label=str(layer) if first else None,
            **style,
        )
        ax.plot(
            line["intensity"].iloc[-1],
            line["achieved"].iloc[-1],
            marker="o",
            markersize=9,
            fillstyle="none",
            color=style["color"],
            lw=0,
        )
    log_axes(ax, "arithmetic intensity [FLOPs per byte moved]", "achieved FLOP/s", base_x=10)
    ax.set_title(
        f"{ceilings.device_name}, {ceilings.threads} thread(s), {ceilings.dtype}; "
        "each path: one layer and width, n growing (ringed: the largest n)\n"
        "bytes counted as if nothing stays in cache: a point above the slope reused it",
        fontsize=8,
    )
    legend(ax)
    return fig


def time_split_chart(analysis: Analysis) -> Figure | None:
    """Per layer, at its largest width: the machine model's compute, memory, latency and
    fault seconds against n, the predicted total dashed and the measured median as points."""
    machine = analysis.machine
    if machine.empty:
        return None
    frame = analysis.frame[["layer", "n", "d", "time_s"]].join(machine, how="inner")
    frame = frame[frame["d"] == frame.groupby("layer")["d"].transform("max")]
    layers = [x for x, line in frame.groupby("layer", sort=False) if line["n"].nunique() > 1]
    if not layers:
        return None
    overlap = analysis.ceilings is not None and is_asynchronous(analysis.ceilings.device)
    total = (
        "predicted (host and device overlap: the larger)" if overlap else "predicted (their sum)"
    )
    fig, axes = panels(len(layers), "Where the time goes: the machine model's terms against n")
    for ax, layer in zip(axes, layers, strict=True):
        line = frame[frame["layer"] == layer].sort_values("n")
        for column, (label, colour) in TERM_STYLE.items():
            values = line[column].where(line[column] > 0)
            if values.notna().any():
                ax.plot(line["n"], values, color=colour, lw=1.2, label=label)
        ax.plot(
            line["n"],
            line["predicted_time_s"],
            color="black",
            lw=1,
            linestyle="--",
            label=total,
        )
        ax.plot(
            line["n"],
            line["time_s"],
            color="black",
            lw=0,
            marker="o",
            markersize=4,
            label="measured",
        )
        log_axes(ax, "sequence length n", "seconds per call")
        ax.set_title(f"{layer}, d = {int(line['d'].iloc[0])}", fontsize=9)
    shared_key(fig, axes)
    return fig


def shared_key(fig: Figure, axes: Sequence[Axes]) -> None:
    """One key for panels that draw the same series (a new user read eleven copies of it, each
    wider than its panel, running into the next one's and cut at the image's edge): in a
    spare cell of the grid, else under the last panel; a series drawn in some panels only
    (the faults) is named once too."""
    if len(axes) == 1:
        legend(axes[0])
        return
    named: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            named.setdefault(label, handle)
    # the terms first, as each panel draws them; then the total and the measured points
    last = [label for label in named if label.startswith("predicted") or label == "measured"]
    named = {label: named[label] for label in [*(x for x in named if x not in last), *last]}
    cell = spare_cell(fig, axes)
    if cell is not None:
        cell.legend(list(named.values()), list(named), loc="center", fontsize=9, frameon=False)
        return
    legend(axes[-1], named)
