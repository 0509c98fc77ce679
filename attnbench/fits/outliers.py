"""Cases whose time breaks their layer's trend: a burst of load on a shared machine can slow one
case hundreds of times while its samples stay tight (the burst lasts the whole block), so the
IQR mark cannot see it. Its neighbours can.

Time grows with n and with d. A case is flagged when it is more than ``TREND_FACTOR`` times
slower than both of the next two larger cases of the same layer and settings, or, the largest
case, more than that factor beyond growing as fast as ``GROWTH_MAX`` (cubic) from both of the two
cases below it. Only slowdowns are flagged (load slows a case, it does not speed one up), and one
fast neighbour does not make a case look slow: the bound is the slower of the two.
"""

from __future__ import annotations

import re

import pandas as pd

from attnbench.schema import numeric_column

TREND_FACTOR = 5.0  # a real layer is never this much slower at a smaller size
GROWTH_MAX = 3.0  # no layer here grows faster than cubic in n or d

OUTLIER_COLUMNS = ["case_id", "layer", "n", "d", "time_s", "along", "bound_s", "ratio"]


def _without(case_id: str, axis: str) -> str:
    return re.sub(rf"/{axis}=\d+", "", case_id)


def trend_outliers(measured: pd.DataFrame, factor: float = TREND_FACTOR) -> pd.DataFrame:
    """One row per flagged case (the larger ratio where both n and d flag it): its time, the
    bound it broke (``bound_s``), along which size, and time / bound."""
    frame = measured[numeric_column(measured, "time_s") > 0]
    found: dict[str, dict[str, object]] = {}
    ratios: dict[str, float] = {}  # the largest ratio flagged so far, a case
    for along in ("n", "d"):
        keys = frame["case_id"].map(lambda c, a=along: _without(str(c), a))
        for _, group in frame.groupby(keys, sort=False):
            if len(group) < 2:
                continue
            group = group.sort_values(along)
            sizes = group[along].astype(float).to_numpy()
            times = group["time_s"].astype(float).to_numpy()
            for i in range(len(group)):
                if i + 1 < len(group):  # no larger case should be faster
                    bound = times[i + 1 : i + 3].max()
                else:  # the largest: growing no faster than cubic
                    near = slice(max(i - 2, 0), i)
                    bound = (times[near] * (sizes[i] / sizes[near]) ** GROWTH_MAX).max()
                ratio = times[i] / bound
                row = group.iloc[i]
                case = str(row["case_id"])
                if ratio > factor and ratio > ratios.get(case, 0.0):
                    ratios[case] = float(ratio)
                    found[case] = {
                        "case_id": case,
                        "layer": row["layer"],
                        "n": int(row["n"]),
                        "d": int(row["d"]),
                        "time_s": float(times[i]),
                        "along": along,
                        "bound_s": float(bound),
                        "ratio": float(ratio),
                    }
    return pd.DataFrame(list(found.values()), columns=OUTLIER_COLUMNS)
