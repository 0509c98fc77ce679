"""The chapter's positional-encoding figures, drawn from this package's own encoding table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnbench.errors import AttnbenchError
from attnbench.positional import binary_digits, sinusoidal_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pe_figures(
    n: int = 60, d: int = 32, columns: Sequence[int] = (6, 7, 8, 9)
) -> dict[str, Figure]:
    """The chapter's figures, drawn from this package's own encoding table."""
    from matplotlib.figure import Figure

    table = sinusoidal_table(n, d, dtype=torch.float64).numpy()  # (n, d)
    figures: dict[str, Figure] = {}

    fig = Figure(figsize=(7, 3), layout="constrained")
    ax = fig.add_subplot()
    for col in columns:
        ax.plot(np.arange(n), table[:, col], label=f"column {col}", lw=1.5)
    ax.set_xlabel("row (position i)")
    ax.set_ylabel("p[i, column]")
    ax.set_title(f"Sinusoidal encoding, columns {columns[0]}..{columns[-1]} (d = {d})")
    ax.legend(
        fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(columns), frameon=False
    )
    ax.grid(True, alpha=0.3)
    figures["pe-columns"] = fig

    fig = Figure(figsize=(4.5, 5), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(table, cmap="Blues", aspect="auto", interpolation="nearest")
    ax.set_xlabel("column (encoding dimension)")
    ax.set_ylabel("row (position)")
    ax.set_title(f"P, {n} positions x {d} columns")
    fig.colorbar(image, ax=ax, shrink=0.8)
    figures["pe-heatmap"] = fig

    bits = max(1, (n - 1).bit_length())
    fig = Figure(figsize=(8, 5), layout="constrained")
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.imshow(
        binary_digits(n, bits).numpy(), cmap="Blues", aspect="auto", interpolation="nearest"
    )
    left.set_xticks(range(bits))
    left.set_xlabel("bit (lowest first)")
    left.set_ylabel("number i")
    left.set_title("bits of i: lower bits flip faster", fontsize=10)
    right.imshow(table[:, : 2 * bits], cmap="Blues", aspect="auto", interpolation="nearest")
    right.set_xlabel("column (encoding dimension)")
    right.set_ylabel("row (position i)")
    right.set_title("P: lower columns change faster", fontsize=10)
    figures["pe-binary"] = fig
    return figures


def parse_columns(text: str) -> tuple[int, ...]:
    """``--columns`` of ``attnbench pe``: "6..9" (every column from 6 to 9) or "0,2,4"."""
    text = text.strip()
    try:
        if ".." in text:
            first, last = (int(x) for x in text.split("..", 1))
            values = tuple(range(first, last + 1))
        else:
            values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise AttnbenchError(
            f"--columns: expected a range such as 6..9 or a list such as 0,2,4, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise AttnbenchError(f"--columns: expected columns 0 or more, got {text!r}")
    return values
