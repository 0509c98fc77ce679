"""What the time chart draws of a call's kernels: their time beside the wall time, the cases
they ran under half of, and where torch changed a layer's convolution kernel (its time bends
there: conv-dilated read faster at n = 512 than at 256 on the CPU, as oneDNN took over from
torch's reference kernel)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from attnbench.regime import overhead_bound
from attnbench.schema import numeric_column
from attnbench.table import kernel_changes as changed_at
from attnbench.table import kernel_runs

if TYPE_CHECKING:  # imported where a chart is drawn (render.style)
    from matplotlib.axes import Axes

CHANGE_FOOT, CHANGE_ROW = 0.03, 0.05  # of the panel's height
CHANGE_MARKER = "|"  # at the foot of the panel, under the first size of a new kernel: a rug
# tick, no layer's marker (``style._MARKERS``)


def kernel_line(ax: Axes, line: pd.DataFrame, along: str, style: dict[str, Any]) -> int:
    """The kernels' time beside the wall time (dotted), and the overhead-bound cases (their
    kernels under half the time) drawn hollow over the wall-time line; 0 where the run did
    not measure its kernels."""
    if "kernel_time_s" not in line:
        return 0
    kernel = numeric_column(line, "kernel_time_s")
    if not (kernel > 0).any():
        return 0
    color = style["color"]
    ax.plot(line[along], kernel.where(kernel > 0), linestyle=":", lw=1.2, color=color)
    share = numeric_column(line, "kernel_share")
    bound = line[overhead_bound(share)]
    ax.plot(
        bound[along],
        bound["time_s"],
        linestyle="none",
        marker=style["marker"],
        markerfacecolor="white",
        markeredgecolor=color,
        markersize=6,
        zorder=style["zorder"],  # over its own line, drawn just before at the same z-order
    )
    return 1


def kernel_changes(
    ax: Axes, line: pd.DataFrame, along: str, style: dict[str, Any], row: int = 0
) -> int:
    """A mark at the foot of the panel, in the layer's colour, under each size at which the
    line's convolution kernel changed (``table.kernel_runs``, the ``backend`` column): not on
    the line itself, where a tick would read as an error bar. ``row``: how many lines of the
    panel marked theirs before, each a row higher (conv and conv-dilated change at the same
    n). 1 where it marked, 0 where the kernel never changed."""
    starts = changed_at(kernel_runs(line, along))
    if not starts:
        return 0
    ax.plot(
        starts,
        [CHANGE_FOOT + row * CHANGE_ROW] * len(starts),
        linestyle="none",
        marker=CHANGE_MARKER,
        markersize=10,
        markeredgewidth=2,
        color=style["color"],
        transform=ax.get_xaxis_transform(),  # x in data, y in the panel's height
        clip_on=False,
    )
    return 1
