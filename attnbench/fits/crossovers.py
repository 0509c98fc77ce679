"""Crossovers: the n at which attention becomes slower than a rival layer (the families marked
rival: recurrent, convolutional, state space), measured (interpolated between the sweep's
sizes) and predicted (FLOP formulas, chapter orders)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from attnbench.fits.models import Layers, layers_or_live, size_rows
from attnbench.theory import LayerTheory, Sizes

CROSSOVER_COLUMNS = [
    "d",
    "layer",
    "versus",
    "measured_n",  # interpolated in log-log between the sweep's sizes (nan: not inside the range)
    "measured",  # the same, in words: "≈ 362", "≤ 64 (slower at every n measured)", "> 1024 (…)"
    "theory_flops_n",  # where the full FLOP formulas cross (0: from n = 1 on; nan: never)
    "theory_flops",
    "theory_order_n",  # where the chapter's orders cross: n²·d = n·d² gives n = d
    "theory_order",
]


def quadratic_layers(names: Sequence[str], layers: Layers | None = None) -> list[str]:
    """The layers whose family sets every position against every other (attention's): the
    side of a crossover whose cost grows as n²."""
    known = layers_or_live(layers)
    return [x for x in names if x in known and known[x].family.pairwise]


def rival_layers(names: Sequence[str], layers: Layers | None = None) -> list[str]:
    """The layers whose family attention is raced against: the chapter's (recurrent,
    convolutional) and the state-space scans that answer it."""
    known = layers_or_live(layers)
    return [x for x in names if x in known and known[x].family.rival]


def measured_crossover(ns: Sequence[float], ratio: Sequence[float]) -> float:
    """The n where ``ratio`` (attention time / rival time) last rises through 1, log-log.

    -inf when attention is already slower at the smallest n; inf when it is faster throughout,
    or faster again at the largest n.
    """
    logs = np.log(np.asarray(ratio, dtype=float))
    if (logs >= 0).all():
        return -math.inf
    if (logs < 0).all():
        return math.inf
    rises = [i for i in range(1, len(logs)) if logs[i - 1] < 0 <= logs[i]]
    if not rises or logs[-1] < 0:
        return math.inf
    last = rises[-1]
    x0, x1 = math.log(ns[last - 1]), math.log(ns[last])
    y0, y1 = logs[last - 1], logs[last]
    return math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0))


def formula_crossover(cost: Callable[[float], float], upper: float = 2.0**40) -> float:
    """The smallest n ≥ 1 where ``cost(n)`` (attention minus rival) turns positive; nan if never.

    0 when it is positive from n = 1 on.
    """
    from scipy import optimize  # lazy: scipy costs 0.8 s to import

    grid = np.geomspace(1, upper, 481)
    values = np.array([cost(n) for n in grid])
    if values[0] > 0:
        return 0.0
    above = np.nonzero(values > 0)[0]
    if not len(above):
        return math.nan
    i = int(above[0])
    return float(optimize.brentq(cost, grid[i - 1], grid[i], xtol=1e-9, rtol=1e-12))


def _predicted(n: float) -> str:
    if n == 0:
        return "from n = 1"  # the formulas make attention the costlier at every n
    return "never" if math.isnan(n) else f"≈ {n:.0f}"


def describe_crossover(n: float, ns: Sequence[int]) -> str:
    """A measured crossover in words, within the sizes measured: "≈ 362"; where attention was
    the slower at every n measured, at or below the shortest, and where it was the faster at
    the longest, above it, each saying which."""
    if n == -math.inf:
        return f"≤ {min(ns)} (slower at every n measured)"
    if n == math.inf:
        return f"> {max(ns)} (faster at the longest n measured)"
    return f"≈ {n:.0f}"


def time_ratios(
    measured: pd.DataFrame, layers: Layers | None = None
) -> dict[tuple[int, str, str], pd.Series]:
    """Attention's median time over each rival's, per d, indexed by the n both measured.

    Keyed by (d, attention layer, rival); the crossover table and chart both read these.
    """
    names = list(dict.fromkeys(measured["layer"]))
    ratios = {}
    for d, at_d in measured.groupby("d"):
        medians = at_d.pivot_table(index="n", columns="layer", values="time_s")
        for layer in quadratic_layers(names, layers):
            for rival in rival_layers(names, layers):
                if layer in medians and rival in medians:
                    both = medians[[layer, rival]].dropna()
                    ratios[(int(d), layer, rival)] = both[layer] / both[rival]
    return ratios


def _gap(law: str, a: LayerTheory, o: LayerTheory, mine: Sizes, theirs: Sizes, n: float) -> float:
    """Attention's ``law`` (its FLOPs or its order) less its rival's, at length n."""
    if law == "flops":
        return float(a.flops({**mine, "n": n}) - o.flops({**theirs, "n": n}))
    return float(a.order({**mine, "n": n}) - o.order({**theirs, "n": n}))


def crossover_table(measured: pd.DataFrame, layers: Layers | None = None) -> pd.DataFrame:
    """For each d and each (attention, rival) pair: measured and predicted crossover n."""
    known = layers_or_live(layers)
    rows = []
    # Each layer's sizes at each d, from its first row there (its options; n is the variable).
    firsts = measured.drop_duplicates(["d", "layer"])
    sizes_at = dict(
        zip(zip(firsts["d"], firsts["layer"], strict=True), size_rows(firsts, known), strict=True)
    )
    for (d, layer, rival), ratio in time_ratios(measured, known).items():
        a, o = known[layer].theory, known[rival].theory
        if a is None or o is None:
            continue
        mine, theirs = sizes_at[(d, layer)], sizes_at[(d, rival)]
        d_ = int(d)

        flops_gap = functools.partial(_gap, "flops", a, o, mine, theirs)
        order_gap = functools.partial(_gap, "order", a, o, mine, theirs)

        # A theory that states no order reads 0 at every size (``LayerTheory.order``'s default):
        # a race against it would be against a free layer, so it is not predicted.
        declared = a.order(mine) > 0 and o.order(theirs) > 0
        found = math.nan
        words = "no common n"
        if len(ratio) >= 2:
            ns = ratio.index.tolist()
            found = measured_crossover(ns, ratio.tolist())
            words = describe_crossover(found, ns)
        rows.append(
            {
                "d": d_,
                "layer": layer,
                "versus": rival,
                "measured_n": found if math.isfinite(found) else math.nan,
                "measured": words,
                "theory_flops_n": (by_flops := formula_crossover(flops_gap)),
                "theory_flops": _predicted(by_flops),
                "theory_order_n": (by_order := formula_crossover(order_gap))
                if declared
                else math.nan,
                "theory_order": _predicted(by_order) if declared else "no order declared",
            }
        )
    return pd.DataFrame(rows, columns=CROSSOVER_COLUMNS)
